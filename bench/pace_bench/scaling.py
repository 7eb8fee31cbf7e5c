"""Scaling with cores: DRAM read rate, decode and prefill vs threads, and a bandwidth model.

At each thread count of ``--threads`` (default: 1, 2, 4, ... up to the allowed physical cores,
plus that count) this measures, round-robin over the thread counts in every round (medians;
``best``: the fastest round, what the machine does when a shared host lets it):

- ``read``: the streaming DRAM read rate (pace-avx512's ``stream_read`` over ``--read-mib``,
  else ``torch.sum``);
- ``gemm``: a bf16 (``--dtype``) GEMM through pace's linear kernel, ``M`` x 2048 x 2048 with
  ``M`` = ``--gemm-m``: the compute a core delivers;
- ``model``: per model, decode tok/s at each ``--batches`` (time of ``--new-tokens`` minus time
  to the first token) and prefill tok/s (a ``--prompt-len`` prompt, batch 1).

Next to each measurement it prints what the model predicts (``pred``, ``of_pred``):

    BW(t)        = 1 / (1 / (c * t) + 1 / B)          read rate of t threads: c GB/s per core,
                                                      saturating at B GB/s per NUMA node
    decode(t, b) = min(b * BW(t) / bytes_step(b),     bytes_step(b) = weight bytes + b x KV bytes
                       t * F * e / flops_token)
    prefill(t)   = t * F * e / prefill_flops_token(prompt)  (the head once per prompt)

``c`` and ``B`` are the least-squares fit of ``1/BW = (1/c)(1/t) + 1/B`` to the read rows
(``B`` infinite when the rows show no saturation; ``--node-gbs`` fixes it), ``F`` is the GEMM
rate per core at the fewest threads and ``e`` the prefill efficiency there (measured prefill
FLOP/s over ``F``), so the prediction is calibrated at the smallest thread count and checked at
the others. Weight bytes and FLOPs come from the model's config (parameters counted on the meta
device; a tied head counts once, as the head; dense models: an MoE counts every expert).

On a machine with several NUMA nodes the sweep runs inside one node (``--node``, default 0:
pinned to its cores, memory preferred on it, as ``pace serve --instances auto`` places an
instance) and ``machine`` rows give nodes x the node's figures at full width, the throughput
of one instance per node. ``--predict CORES:NODES:GBS`` adds rows for a machine not at hand
(GB/s achievable per node) from this run's ``c``, ``F`` and ``e``; ``--predict-models`` are
only predicted (config only, no weights), ``--predict-formats`` prices their weights, and
``--fit C:F:E`` gives them ``c``, ``F`` and ``e`` from elsewhere (a quiet run).

On a many-core machine, pin OpenMP threads to cores so t threads sit on t adjacent physical
cores: ``OMP_PROC_BIND=close OMP_PLACES=cores pace bench scaling ...`` (recorded in
machine.json). The prepared command for a larger machine:

    OMP_PROC_BIND=close OMP_PLACES=cores pace bench scaling \\
        --models smollm2 random:llama-3.2-1b --batches 1 8 --repeats 3 \\
        --predict-models random:llama-3.1-8b --predict 64:1:360 128:2:360
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_bench.common import emit, model_path, note, read_buffer, stream_read_fn, warn
from pace_core.arg_types import above, at_least

COLUMNS = {
    "read": ["threads", "gbs", "best", "fit_gbs"],
    "gemm": ["threads", "gflops", "gflops_per_core"],
    "fit": ["core_gbs", "node_gbs", "core_gflops", "prefill_eff", "formula"],
    "model": ["model", "format", "threads", "what", "tok_s", "best", "pred", "of_pred", "bound"],
    "machine": ["model", "format", "nodes", "threads", "what", "tok_s", "pred"],
    "prediction": ["model", "format", "cores", "nodes", "node_gbs", "what", "pred", "bound"],
}
QUICK = {"threads": [1], "batches": [1], "prompt_len": 32, "new_tokens": 8, "repeats": 1,
         "read_mib": 64, "gemm_m": 64}  # fmt: skip

# bytes per parameter of each weight format: (body, head). Approximate storage (assumptions):
# int8 = groups of 32 with a 2-byte scale; int4 = groups of 32 with 2-byte scale and min, its
# head kept int8 (pace's ``int4`` preset); q4_0 = GGUF's 18 bytes per 32.
FORMATS: dict[str, tuple[float, float]] = {
    "float32": (4.0, 4.0),
    "bfloat16": (2.0, 2.0),
    "int8": (1.0625, 1.0625),
    "int4": (0.625, 1.0625),
    "q4_0": (0.5625, 0.5625),
}
GEMM_KN = 2048


# -- the model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What one token of a dense model costs: streamed parameters and attention sizes."""

    body_params: int  # decoder-layer weights (read once per step)
    head_params: int  # the LM head (the embedding matrix when tied)
    layers: int
    kv_width: int  # K + V values per token per layer (2 x KV heads x head dim)
    q_width: int  # query heads x head dim

    def weight_bytes(self, fmt: str) -> float:
        body, head = FORMATS[fmt]
        return self.body_params * body + self.head_params * head

    def kv_bytes(self, context: int, kv_bytes_per_value: float = 2.0) -> float:
        """KV bytes one sequence reads per decode step at ``context`` tokens."""
        return self.layers * self.kv_width * context * kv_bytes_per_value

    def flops_per_token(self, context: int) -> float:
        """Matmul FLOPs of one decoded token attending to ``context`` tokens (QK^T and PV
        included, the LM head too)."""
        attention = 4.0 * self.layers * self.q_width * context
        return 2.0 * (self.body_params + self.head_params) + attention

    def prefill_flops_per_token(self, prompt: int) -> float:
        """Matmul FLOPs per token of a ``prompt``-token prefill: the head runs once, on the
        last token; a token attends to ``prompt / 2`` others on average."""
        attention = 4.0 * self.layers * self.q_width * (prompt / 2)
        return 2.0 * self.body_params + 2.0 * self.head_params / prompt + attention


def shape_of(config: Any) -> Shape:
    """The :class:`Shape` of a transformers config: parameters counted on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight is embed or getattr(text, "tie_word_embeddings", False)
    total = sum(p.numel() for p in model.parameters())  # shared tensors counted once
    head_params = embed.numel() if tied else head.weight.numel()
    body = total - embed.numel() - (0 if tied else head_params)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return Shape(body, head_params, text.num_hidden_layers, 2 * kv_heads * head_dim,
                 heads * head_dim)  # fmt: skip


def config_of(name: str) -> Any:
    """The config of a zoo name, a directory or ``random:<shape>`` (no weights written)."""
    import transformers

    from pace_bench.random_models import PREFIX, SHAPES, is_random_name

    if is_random_name(name):
        config_cls, _, kwargs = SHAPES[name[len(PREFIX) :]]
        return getattr(transformers, config_cls)(**kwargs, bos_token_id=None, eos_token_id=None)
    return transformers.AutoConfig.from_pretrained(str(model_path(name)))


@dataclass(frozen=True)
class Fit:
    """The bandwidth and compute model of one NUMA node; see the module docstring."""

    core_gbs: float  # c
    node_gbs: float  # B (inf: no saturation seen)
    core_gflops: float  # F
    prefill_eff: float  # e

    def bandwidth(self, threads: float) -> float:
        return 1.0 / (1.0 / (self.core_gbs * threads) + 1.0 / self.node_gbs)

    def compute(self, threads: float) -> float:
        """FLOP/s ``threads`` cores deliver on prefill-like work."""
        return threads * self.core_gflops * 1e9 * self.prefill_eff

    def decode(self, shape: Shape, fmt: str, threads: float, batch: int, context: int):
        """(tok/s, bound) of a decode step of ``batch`` sequences at ``context`` tokens."""
        kv = shape.kv_bytes(context, 4.0 if fmt == "float32" else 2.0)
        step = shape.weight_bytes(fmt) + batch * kv
        memory = batch * self.bandwidth(threads) * 1e9 / step
        compute = self.compute(threads) / shape.flops_per_token(context)
        return (memory, "bandwidth") if memory <= compute else (compute, "compute")

    def prefill(self, shape: Shape, threads: float, prompt: int) -> float:
        return self.compute(threads) / shape.prefill_flops_per_token(prompt)


def fit_bandwidth(points: Sequence[tuple[int, float]], node_gbs: float | None = None):
    """(c, B) of ``BW(t) = 1 / (1/(c t) + 1/B)`` from (threads, GB/s) points, least squares
    in ``1/BW`` against ``1/t``; ``B`` is ``node_gbs`` when given and infinite when the
    points show no saturation (an intercept <= 0)."""
    xs = [1.0 / t for t, _ in points]
    ys = [1.0 / gbs for _, gbs in points]
    if node_gbs:
        d = 1.0 / node_gbs
        slope = sum(x * (y - d) for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        return 1.0 / max(slope, 1e-12), node_gbs
    if len(set(xs)) < 2:
        return xs[0] / ys[0], math.inf  # one point: BW = c t
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    if slope <= 0:  # more threads read no faster: a flat line at the best rate
        return math.inf, max(g for _, g in points)
    if intercept <= 0:
        slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        return 1.0 / slope, math.inf
    return 1.0 / slope, 1.0 / intercept


def parse_machine(text: str) -> tuple[int, int, float]:
    """``--predict CORES:NODES:GBS`` -> (cores, nodes, GB/s per node)."""
    try:
        cores, nodes, gbs = text.split(":")
        out = int(cores), int(nodes), float(gbs)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--predict {text!r}: write CORES:NODES:GBS_PER_NODE, e.g. 64:1:360"
        ) from None
    if out[0] < out[1] or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"--predict {text!r}: need CORES >= NODES >= 1, GBS > 0")
    return out


def parse_fit(text: str) -> tuple[float, float, float]:
    """``--fit C:F:E`` -> (c GB/s, F GFLOP/s per core, e)."""
    try:
        c, f, e = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fit {text!r}: write C:F:E, e.g. 75:217:0.89") from None
    return c, f, e


def default_threads(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, then ``cores``."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return [*out, cores]


def prediction_rows(
    fit: Fit,
    shapes: dict[str, Shape],
    formats: Sequence[str],
    machines,
    batches: Sequence[int],
    prompt: int,
    context: int,
) -> list[dict[str, Any]]:
    """Rows for machines not at hand: one instance per node, each on cores/nodes threads of
    a node reading ``gbs`` at most; the machine is nodes x one node."""
    rows = []
    for cores, nodes, gbs in machines:
        node = Fit(fit.core_gbs, gbs, fit.core_gflops, fit.prefill_eff)
        per = cores // nodes
        for name, shape in shapes.items():
            for fmt in formats:
                base = {"section": "prediction", "model": name, "format": fmt, "cores": cores,
                        "nodes": nodes, "node_gbs": gbs}  # fmt: skip
                for b in batches:
                    tok, bound = node.decode(shape, fmt, per, b, context)
                    rows.append({**base, "what": f"decode b{b}", "pred": nodes * tok,
                                 "bound": bound})  # fmt: skip
                rows.append({**base, "what": f"prefill {prompt}", "bound": "compute",
                             "pred": nodes * node.prefill(shape, per, prompt)})  # fmt: skip
    return rows


# -- measurement -------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        nargs="*",
        default=["smollm2"],
        help="zoo names, directories or random:<shape> (measured)",
    )
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--quantization", default=None, help="pace preset for the measured models")
    p.add_argument(
        "--threads",
        nargs="+",
        type=at_least(1),
        default=None,
        help="thread counts (default: 1, 2, 4, ... up to the node's cores)",
    )
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--prompt-len", type=at_least(1), default=128)
    p.add_argument("--new-tokens", type=at_least(1), default=32)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--read-mib", type=at_least(1), default=512, help="streaming-read buffer size")
    p.add_argument(
        "--gemm-m", type=at_least(1), default=256, help="rows of the GEMM (M x 2048 x 2048)"
    )
    p.add_argument(
        "--node",
        type=int,
        default=0,
        help="NUMA node the sweep runs in on multi-node machines (-1: all)",
    )
    p.add_argument(
        "--node-gbs",
        type=above(0),
        default=None,
        help="fix the per-node read ceiling B (GB/s) instead of fitting it",
    )
    p.add_argument(
        "--predict",
        nargs="+",
        type=parse_machine,
        default=[],
        metavar="CORES:NODES:GBS",
        help="also predict these machines",
    )
    p.add_argument(
        "--fit",
        type=parse_fit,
        default=None,
        metavar="C:F:E",
        help="the prediction rows use these c (GB/s), F (GFLOP/s per core) and e instead of "
        "this run's (e.g. from a quiet run)",
    )
    p.add_argument(
        "--predict-models",
        nargs="+",
        default=[],
        help="models only predicted (config only), e.g. random:llama-3.1-8b",
    )
    p.add_argument(
        "--predict-formats",
        nargs="+",
        default=None,
        choices=list(FORMATS),
        help="weight formats of the prediction rows (default: the measured one)",
    )


def bind_to_node(args: argparse.Namespace) -> tuple[int, int]:
    """(nodes, cores of the sweep): pin to ``--node`` on a multi-node machine."""
    from pace_core.platform import current_topology
    from pace_core.platform.binding import apply_plan
    from pace_core.platform.placement import plan_instances

    topo = current_topology()
    nodes = len(topo.nodes)
    if nodes < 2 or args.node < 0:  # the whole machine as one "node"
        return 1, len(topo.physical_cpus())
    plan = plan_instances(topo, "auto")[args.node]
    apply_plan(plan, f"scaling (node {args.node})")
    if getattr(args, "machine", None):
        args.machine["cores"]["usable"] = len(plan.cores)
        args.machine["bound_to"] = plan.describe()
    note(args, f"scaling: in NUMA node {args.node}: {plan.describe()}; machine rows x {nodes}")
    return nodes, len(plan.cores)


def gemm_fn(dtype: torch.dtype, m: int) -> Callable[[], Any]:
    """One ``M x K x N`` matmul through the fastest usable registered linear kernel."""
    from pace_bench.common import usable_kernels

    w = torch.randn(GEMM_KN, GEMM_KN).to(dtype)
    x = torch.randn(m, GEMM_KN).to(dtype)
    specs = usable_kernels("linear", dtype, in_features=GEMM_KN, out_features=GEMM_KN)
    for backend in ("avx512", "onednn", "tpp", "native"):
        if backend in specs:
            spec = specs[backend]
            packed = spec.prepare(w, None)
            return lambda: spec.fn(x, packed)
    return lambda: torch.nn.functional.linear(x, w)


def model_fns(name: str, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    """what -> fn for one measured model: ttft and whole generation per batch."""
    from pace_bench.common import random_prompts, vocab_size
    from pace_bench.offline import pace_runner
    from pace_core import LLMModel

    path = model_path(name)
    model = LLMModel(path, dtype=getattr(torch, args.dtype), quantization=args.quantization,
                     quiet=True, load_tokenizer=False, prefix_caching=False)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    vocab = vocab_size(path)
    fns = {}
    for b in args.batches:
        ids = random_prompts(vocab, b, args.prompt_len, gen)
        fns[f"ttft b{b}"] = pace_runner(model, ids, 1)
        fns[f"total b{b}"] = pace_runner(model, ids, args.new_tokens)
    return fns


def measure(args: argparse.Namespace, threads: list[int]) -> dict[tuple, list[float]]:
    """Seconds per round of every (threads, what) point, thread counts round-robin."""
    stream = stream_read_fn()
    buf = read_buffer(args.read_mib << 20)
    if stream is not None:
        read = lambda: stream(buf)  # noqa: E731
    else:
        data = buf.view(torch.bfloat16) if buf.numel() % 2 == 0 else buf
        read = data.sum
    fns: dict[tuple, Callable[[], Any]] = {("", "read"): read,
                                           ("", "gemm"): gemm_fn(getattr(torch, args.dtype),
                                                                 args.gemm_m)}  # fmt: skip
    for name in args.models:
        fns.update({(name, what): fn for what, fn in model_fns(name, args).items()})
    times: dict[tuple, list[float]] = {(t, *key): [] for t in threads for key in fns}
    for t in threads:  # warm-up: one call of each at each width
        torch.set_num_threads(t)
        for fn in fns.values():
            fn()
    for r in range(args.repeats):
        for t in threads:
            torch.set_num_threads(t)
            for key, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[(t, *key)].append(time.perf_counter() - start)
        note(args, f"scaling: round {r + 1}/{args.repeats} done")
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes, cores = bind_to_node(args)
    threads = args.threads or default_threads(cores)
    if max(threads) > cores:
        warn(f"scaling: {max(threads)} threads on {cores} cores: rows past {cores} oversubscribe")
    fmt = args.quantization or args.dtype
    if fmt not in FORMATS:
        raise SystemExit(f"pace bench scaling: no byte count for {fmt!r}; use {list(FORMATS)}")
    saved = torch.get_num_threads()
    try:
        times = measure(args, threads)
    finally:
        torch.set_num_threads(saved)
    med = {k: statistics.median(v) for k, v in times.items()}
    fast = {k: min(v) for k, v in times.items()}  # the best round: a shared host only slows
    rows: list[dict[str, Any]] = []
    reads = [(t, (args.read_mib << 20) / med[(t, "", "read")] / 1e9) for t in threads]
    c, b = fit_bandwidth(reads, args.node_gbs)
    flops = 2.0 * args.gemm_m * GEMM_KN * GEMM_KN
    gemm = {t: flops / med[(t, "", "gemm")] / 1e9 for t in threads}
    t0 = min(threads)
    core_gflops = gemm[t0] / t0
    shapes = {name: shape_of(config_of(name)) for name in args.models}
    context = args.prompt_len + args.new_tokens // 2
    measured: dict[tuple, float] = {}
    best: dict[tuple, float] = {}
    for name in args.models:
        for t in threads:
            for stat, out in ((med, measured), (fast, best)):
                for bs in args.batches:
                    ttft, total = stat[(t, name, f"ttft b{bs}")], stat[(t, name, f"total b{bs}")]
                    out[(name, t, f"decode b{bs}")] = (
                        bs * (args.new_tokens - 1) / max(total - ttft, 1e-9)
                    )
                out[(name, t, f"prefill {args.prompt_len}")] = (
                    args.batches[0] * args.prompt_len / stat[(t, name, f"ttft b{args.batches[0]}")]
                )
    effs = [measured[(n, t0, f"prefill {args.prompt_len}")]
            * shapes[n].prefill_flops_per_token(args.prompt_len) / (core_gflops * 1e9 * t0)
            for n in args.models]  # fmt: skip
    eff = statistics.fmean(effs) if effs else 0.5  # no model measured: an assumed 50%
    fit = Fit(c, b, core_gflops, eff)
    for t, gbs in reads:
        top = (args.read_mib << 20) / fast[(t, "", "read")] / 1e9
        rows.append({"section": "read", "threads": t, "gbs": gbs, "best": top,
                     "fit_gbs": fit.bandwidth(t)})  # fmt: skip
    for t in threads:
        rows.append({"section": "gemm", "threads": t, "gflops": gemm[t],
                     "gflops_per_core": gemm[t] / t})  # fmt: skip
    rows.append({"section": "fit", "core_gbs": c, "node_gbs": b, "core_gflops": core_gflops,
                 "prefill_eff": eff, "formula": "BW(t)=1/(1/(c t)+1/B); decode=min(b BW/bytes,"
                 " t F e/flops); prefill=t F e/flops"})  # fmt: skip
    for (name, t, what), tok in measured.items():
        shape = shapes[name]
        if what.startswith("decode"):
            pred, bound = fit.decode(shape, fmt, t, int(what.split("b")[-1]), context)
        else:
            pred, bound = fit.prefill(shape, t, args.prompt_len), "compute"
        rows.append({"section": "model", "model": name, "format": fmt, "threads": t,
                     "what": what, "tok_s": tok, "best": best[(name, t, what)], "pred": pred,
                     "of_pred": tok / pred,
                     "bound": bound})  # fmt: skip
        if nodes > 1 and t == max(threads):
            rows.append({"section": "machine", "model": name, "format": fmt, "nodes": nodes,
                         "threads": t * nodes, "what": what, "tok_s": nodes * tok,
                         "pred": nodes * pred})  # fmt: skip
    if args.predict:
        names = list(dict.fromkeys([*args.models, *args.predict_models]))
        all_shapes = {n: shapes.get(n) or shape_of(config_of(n)) for n in names}
        given = Fit(*args.fit[:1], b, *args.fit[1:]) if args.fit else fit
        if args.fit:
            rows.append({"section": "fit", "core_gbs": given.core_gbs, "node_gbs": "per machine",
                         "core_gflops": given.core_gflops, "prefill_eff": given.prefill_eff,
                         "formula": "given (--fit), for the prediction rows"})  # fmt: skip
        rows += prediction_rows(given, all_shapes, args.predict_formats or [fmt], args.predict,
                                args.batches, args.prompt_len, context)  # fmt: skip
    return emit("scaling", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench scaling [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("scaling", argv)
