"""DLRMv2 inference: samples/s of pace fp32 / bf16 / int8 (dynamic activation scales) /
int8-static (activation scales calibrated on ``--calibration-samples`` synthetic samples of
their own seed) against torch eager, torch.compile (inductor), torch's own int8 path
(fbgemm byte-rowwise embedding bags + dynamic int8 linears) and AMD PACE's INT8 DLRMv2
(``amd-pace``: amd-pace 1.2.0 from ``make bench-dlrm-peers``, a worker process in its own venv,
:class:`AmdPaceDLRM`), plus the int8 and bf16 models' quality on synthetic clicks.

All engines run the same seeded random weights (``DLRM.random``: the MLPerf shapes with the
tables capped at ``--max-rows``) on the same synthetic batches. Per batch size the engines run
round-robin (``--repeats`` rounds after one warm-up call each, which for torch.compile is the
compile); the table shows the median, samples/s and the ratio to torch eager fp32. Engines that
cannot run here (torchrec/fbgemm-gpu-cpu not installed or not loadable with this torch; AMD
PACE without its peer venv, or whose peer venv has no DLRMv2 path: amd-pace 1.3.0 has none, see
``amd_pace_dlrm_probe.py``) get a row saying why. AMD PACE's time is the model call timed in its
worker; the pipe round trip is in the row's note. Quality: log loss and AUC against
teacher labels (the fp32 model is the teacher), their deltas to fp32 and the largest
probability difference, on ``--eval-samples`` samples.

    pace bench dlrm --batches 1 64 256 1024 2048 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pace_bench.common import emit, interleaved, note, progress
from pace_core.arg_types import at_least

ENGINES = ("pace-fp32", "pace-bf16", "pace-int8", "pace-int8-static", "torch-eager",
           "torch-compile", "torch-int8-fbgemm", "torchrec-fbgemm", "amd-pace")  # fmt: skip
COLUMNS = {
    "throughput": ["engine", "batch", "ms", "samples_s", "vs_eager", "note"],
    "quality": ["engine", "samples", "logloss", "auc", "vs_fp32"],
}
QUICK = {"batches": [1, 256], "repeats": 3, "max_rows": 20000, "eval_samples": 4096,
         "engines": ["pace-fp32", "pace-int8", "torch-eager"]}  # fmt: skip


class PeerUnavailable(RuntimeError):
    """An engine that cannot run on this machine; the message says why."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=at_least(1), nargs="+", default=[1, 16, 64, 256, 1024, 2048])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--repeats", type=at_least(1), default=5, help="round-robin rounds per batch")
    p.add_argument("--max-rows", type=at_least(1), default=100_000, help="rows per table (cap)")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--eval-samples", type=at_least(0), default=16384, help="0: skip the quality rows"
    )
    p.add_argument("--calibration-samples", type=at_least(1), default=4096,
                   help="pace-int8-static: samples fixing its activation scales (their own "
                   "seed, not the throughput or quality batches)")  # fmt: skip


class TorchInt8:
    """torch's fbgemm int8 path over the same weights: byte-rowwise int8 embedding bags
    (``quantized::embedding_bag_byte_rowwise_offsets``) and dynamic int8 linears with
    per-channel weights (``quantized::linear_dynamic``)."""

    def __init__(self, config: Any, state: dict[str, torch.Tensor]) -> None:
        from pace_core.dlrm import names

        self.tables = [torch.ops.quantized.embedding_bag_byte_prepack(state[n])
                       for n in names.tables(config)]  # fmt: skip
        self.bottom = [self._linear(state, n) for n in names.bottom(config)]
        self.top = [self._linear(state, n) for n in names.top(config)]
        self.cross = [(self._packed(state[v], None), self._packed(state[u], state[b]))
                      for v, u, b in names.cross(config)]  # fmt: skip

    @staticmethod
    def _packed(w: torch.Tensor, b: torch.Tensor | None) -> Any:
        scales = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
        qw = torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long),
                                        0, torch.qint8)  # fmt: skip
        return torch.ops.quantized.linear_prepack(qw, b)

    def _linear(self, state: dict[str, torch.Tensor], name: str) -> Any:
        return self._packed(state[f"{name}.weight"], state[f"{name}.bias"])

    def __call__(self, dense: torch.Tensor, indices: list, offsets: list) -> torch.Tensor:
        lin = torch.ops.quantized.linear_dynamic
        x = dense
        for p in self.bottom:
            x = torch.relu(lin(x, p, False))
        bag = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
        bags = [
            bag(t, i, o, False, 0, False, None, None, True)
            for t, i, o in zip(self.tables, indices, offsets, strict=True)
        ]
        x0 = torch.cat([x, *bags], dim=1)
        xl = x0
        for v, u in self.cross:
            xl = x0 * lin(lin(xl, v, False), u, False) + xl
        for p in self.top[:-1]:
            xl = torch.relu(lin(xl, p, False))
        return lin(xl, self.top[-1], False).reshape(-1)


def _torchrec() -> Callable[..., Any]:
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception as exc:  # ImportError, or a library built for another torch (OSError)
        raise PeerUnavailable(
            f"torchrec/fbgemm-gpu-cpu not usable with torch {torch.__version__}: "
            f"{type(exc).__name__}: {str(exc)[:160]}"
        ) from None
    raise PeerUnavailable("torchrec found, but its int8 inference path is not wired in here")


def amd_pace_venv() -> Path:
    """The venv the ``amd-pace`` engine runs in: ``$PACE_CACHE_DIR/peers/amd-pace-dlrm-venv``
    (``make bench-dlrm-peers``: amd-pace 1.2.0, which has the DLRMv2 path) when present, else
    the serving peer ``amd-pace-venv`` (amd-pace 1.3.0, which has not: the row says so)."""
    from pace_core.paths import cache_root

    peers = cache_root() / "peers"
    for name in ("amd-pace-dlrm-venv", "amd-pace-venv"):
        if (peers / name).is_dir():
            return peers / name
    return peers / "amd-pace-dlrm-venv"


def probe_amd_pace(venv: Path, timeout: float = 300.0) -> dict[str, Any]:
    """Run ``amd_pace_dlrm_probe.py`` with the venv's python (isolated: ``-I``, so neither this
    repo nor pace-bench is on its path): AMD PACE's version, torch's, and which pieces of its
    DLRMv2 path are missing (or why ``import pace`` failed)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise PeerUnavailable(f"AMD PACE peer venv {venv} has no bin/python: run "
                              "`make bench-dlrm-peers`")  # fmt: skip
    script = Path(__file__).with_name("amd_pace_dlrm_probe.py")
    try:
        done = subprocess.run([str(python), "-I", str(script)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"AMD PACE probe in {venv} took over {timeout:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise PeerUnavailable(f"AMD PACE probe in {venv} failed (exit {done.returncode}): "
                              f"{tail}") from None  # fmt: skip


def amd_pace_reason(found: dict[str, Any], venv: Path) -> str | None:
    """Why the ``amd-pace`` engine cannot run, from :func:`probe_amd_pace`'s answer (None: it
    can)."""
    name = f"AMD PACE {found.get('version') or '(amd-pace not installed)'} in {venv}"
    if "import_error" in found:
        return f"{name}: import pace fails: {found['import_error']}"
    missing = found.get("missing", [])
    if missing:
        return (f"{name} (torch {found.get('torch')}) has no DLRMv2 path: missing "
                f"{', '.join(missing)}; `make bench-dlrm-peers` installs amd-pace 1.2.0, "
                "which has it")  # fmt: skip
    return None


class AmdPaceDLRM:
    """AMD PACE's INT8 DLRMv2 in its peer venv (``amd_pace_dlrm_runner.py``, a worker process
    fed through its stdin): the same weights and calibration batches as pace-int8-static, each
    new batch handed over once as a file, logits back through a shared float32 buffer. A call
    is one ``run`` round trip; the worker times the model call itself (``times``), which is
    what the bench reports (a pipe message each way costs ~1-5 ms on a busy 2-core machine)."""

    def __init__(self, venv: Path, config: Any, state: dict[str, torch.Tensor],
                 calibration: list[Any], threads: int, max_batch: int,
                 timeout: float = 1800.0) -> None:  # fmt: skip
        import select
        import tempfile

        from pace_core.dlrm import names
        from pace_core.dlrm.features import fixed_hotness

        self.dir = Path(tempfile.mkdtemp(prefix="pace-bench-dlrm-amd-pace-"))
        self.buffer = self.dir / "logits.f32"
        spec = {
            "state": dict(state),
            "names": {"tables": names.tables(config), "bottom": names.bottom(config),
                      "cross": [list(c) for c in names.cross(config)], "top": names.top(config)},
            "calibration": [(d, *fixed_hotness(s)) for d, s in calibration],
            "threads": threads, "buffer": str(self.buffer), "max_batch": max_batch,
        }  # fmt: skip
        torch.save(spec, self.dir / "spec.pt")
        del spec
        self.log = open(self.dir / "worker.log", "w")  # noqa: SIM115 - closed in close()
        runner = Path(__file__).with_name("amd_pace_dlrm_runner.py")
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "python"), "-I", str(runner), str(self.dir / "spec.pt")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            bufsize=1, env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )  # fmt: skip
        self._loaded: torch.Tensor | None = None
        self.times: list[float] = []  # seconds of each model call, timed in the worker
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("ready "):
            reason = self._tail() if line == "" else line.strip()
            self.close()
            raise PeerUnavailable(f"AMD PACE DLRMv2 worker in {venv} did not start: {reason}")
        self.info = json.loads(line.removeprefix("ready "))
        self.note = f"amd-pace {self.info['version']} int8, torch {self.info['torch']}"

    def _tail(self) -> str:
        self.log.flush()
        lines = (self.dir / "worker.log").read_text(errors="replace").strip().splitlines()
        return (lines or ["no output"])[-1][:300]

    def _ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer == "ok" or answer.startswith("ok "):
            return answer.removeprefix("ok").strip()
        raise RuntimeError(f"AMD PACE DLRMv2 worker: {answer or 'exited: ' + self._tail()}")

    def __call__(self, dense: torch.Tensor, sparse: Any, indices: list, offsets: list) -> Any:
        import numpy as np

        if dense is not self._loaded:
            path = self.dir / "inputs.pt"
            torch.save((dense, list(indices), list(offsets)), path)
            self._ask(f"load {path}")
            self._loaded = dense
        n, seconds = self._ask("run").split()
        self.times.append(float(seconds))
        return torch.from_numpy(np.fromfile(self.buffer, dtype=np.float32, count=int(n)))

    def close(self) -> None:
        import shutil

        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _amd_pace(args: argparse.Namespace, config: Any, state: dict) -> AmdPaceDLRM:
    venv = amd_pace_venv()
    if not venv.is_dir():
        raise PeerUnavailable(f"AMD PACE peer venv absent ({venv}): run "
                              "`make bench-dlrm-peers`")  # fmt: skip
    reason = amd_pace_reason(probe_amd_pace(venv), venv)
    if reason:
        raise PeerUnavailable(reason)
    return AmdPaceDLRM(venv, config, state, _calibration(args, config),
                       threads=torch.get_num_threads(),
                       max_batch=max([*args.batches, 2048]))  # fmt: skip


def _engines(args: argparse.Namespace, config: Any, state: dict) -> dict[str, Any]:
    """name -> callable(dense, sparse, indices, offsets) or the PeerUnavailable."""
    from pace_core.dlrm import DLRM, ReferenceDLRM

    out: dict[str, Any] = {}
    for name in args.engines:
        try:
            if name.startswith("pace-"):
                kind = name.removeprefix("pace-")
                m = DLRM(config, state, dtype=torch.bfloat16 if kind == "bf16" else torch.float32,
                         quantization=kind if kind.startswith("int8") else None,
                         calibration=_calibration(args, config)
                         if kind == "int8-static" else None)  # fmt: skip
                note(args, f"dlrm: {name} op plan\n{m.op_plan}")
                out[name] = lambda d, s, i, o, m=m: m.logits(d, s)
            elif name in ("torch-eager", "torch-compile"):
                ref = ReferenceDLRM(config, state).eval()
                if name == "torch-compile":
                    ref = torch.compile(ref, backend="inductor")
                out[name] = lambda d, s, i, o, r=ref: r(d, i, o)
            elif name == "torch-int8-fbgemm":
                t8 = TorchInt8(config, state)
                out[name] = lambda d, s, i, o, t=t8: t(d, i, o)
            elif name == "torchrec-fbgemm":
                out[name] = _torchrec()
            else:
                out[name] = _amd_pace(args, config, state)
                note(args, f"dlrm: amd-pace ops run {out[name].info['ops']}")
        except PeerUnavailable as exc:
            out[name] = exc
    return out


def _calibration(args: argparse.Namespace, config: Any) -> list[Any]:
    """The batches (of at most 2048) pace-int8-static calibrates on: synthetic features of
    their own seed."""
    from pace_core.dlrm import SyntheticClicks

    data = SyntheticClicks(config, seed=args.seed + 11)
    gen = torch.Generator().manual_seed(args.seed + 11)
    n = args.calibration_samples
    return [data.features(min(2048, n - s), gen) for s in range(0, n, 2048)]


def _quality(args: argparse.Namespace, engines: dict[str, Any], config: Any, state: dict,
             rows: list[dict[str, Any]]) -> None:  # fmt: skip
    from pace_core.dlrm import SyntheticClicks, auc, logloss
    from pace_core.dlrm.features import fixed_hotness

    batch = SyntheticClicks(config, state, seed=args.seed + 7).batch(args.eval_samples)
    chunks = []  # (dense, sparse, indices, offsets) of at most 2048 samples
    for s in range(0, batch.size, 2048):
        sparse = [t[s : s + 2048] for t in batch.sparse]
        chunks.append((batch.dense[s : s + 2048], sparse, *fixed_hotness(sparse)))
    probs = {}
    with torch.no_grad():
        for name, fn in engines.items():
            if name != "torch-compile":  # the same graph as torch-eager
                probs[name] = torch.cat([torch.sigmoid(fn(*c)) for c in chunks])
    base = probs.get("torch-eager", probs.get("pace-fp32"))
    for name, p in probs.items():
        ll, a = logloss(p, batch.labels), auc(p, batch.labels)
        row = {"section": "quality", "engine": name, "samples": batch.size,
               "logloss": round(ll, 5), "auc": round(a, 5)}  # fmt: skip
        if base is not None:
            row["d_logloss"] = ll - logloss(base, batch.labels)
            row["d_auc"] = a - auc(base, batch.labels)
            row["max_dprob"] = float((p - base).abs().max())
            row["vs_fp32"] = (f"logloss {row['d_logloss']:+.5f}, AUC {row['d_auc']:+.5f}, "
                              f"max |dp| {row['max_dprob']:.4f}")  # fmt: skip
        rows.append(row)


def _throughput(args: argparse.Namespace, config: Any, live: dict[str, Any],
                rows: list[dict[str, Any]]) -> None:  # fmt: skip
    from pace_core.dlrm import SyntheticClicks
    from pace_core.dlrm.features import fixed_hotness

    data = SyntheticClicks(config, seed=args.seed)
    for b in progress(args.batches, "dlrm", args.quiet):
        dense, sparse = data.features(b, torch.Generator().manual_seed(args.seed + b))
        inputs = (dense, sparse, *fixed_hotness(sparse))
        fns = {name: (lambda f=fn, x=inputs: f(*x)) for name, fn in live.items()}
        for fn in live.values():
            if hasattr(fn, "times"):
                fn.times.clear()
        with torch.no_grad():
            times = interleaved(fns, args.repeats, time.perf_counter)
        med = {k: statistics.median(v) for k, v in times.items()}
        notes = {}
        for name, fn in live.items():  # a worker's own timing, without the pipe round trip
            if getattr(fn, "times", None):
                wall, med[name] = med[name], statistics.median(fn.times[-args.repeats :])
                notes[name] = f"{fn.note}; timed in its process (round trip {wall * 1e3:.3g} ms)"
        eager = med.get("torch-eager")
        for name, t in med.items():
            rows.append({"section": "throughput", "engine": name, "batch": b, "ms": t * 1e3,
                         "samples_s": b / t, "vs_eager": eager / t if eager else None,
                         "note": notes.get(name, "-")})  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pace_core.dlrm import DLRMConfig
    from pace_core.dlrm.weights import random_state

    if args.threads:
        torch.set_num_threads(args.threads)
    config = DLRMConfig.scaled(args.max_rows)
    note(args, f"dlrm: {config.name}, {sum(config.table_rows)} rows, threads "
               f"{torch.get_num_threads()}, load {os.getloadavg()}")  # fmt: skip
    state = random_state(config, args.seed)
    engines = _engines(args, config, state)
    rows: list[dict[str, Any]] = []
    for name, fn in engines.items():
        if not callable(fn):
            rows.append({"section": "throughput", "engine": name, "note": f"skipped: {fn}"})
    live = {k: v for k, v in engines.items() if callable(v)}
    try:
        _throughput(args, config, live, rows)
        if args.eval_samples:
            _quality(args, live, config, state, rows)
    finally:
        for fn in live.values():
            if hasattr(fn, "close"):
                fn.close()
    return emit("dlrm", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench dlrm [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("dlrm", argv)
