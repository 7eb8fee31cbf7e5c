"""AMD PACE's INT8 DLRMv2 path as a worker process, for ``pace bench dlrm --engines amd-pace``.

Run by the python of AMD PACE's DLRM peer venv (``python -I amd_pace_dlrm_runner.py SPEC``;
``make bench-dlrm-peers``: amd-pace 1.2.0, the last release with the path); it imports nothing of
pace-bench. ``SPEC`` is a ``torch.save`` of a dict: ``state`` (pace's torchrec-named DLRMv2
weights), ``names`` (``tables``, ``bottom``, ``cross``, ``top`` as in ``pace_core.dlrm.names``),
``calibration`` (``(dense, indices, offsets)`` batches), ``threads``, ``buffer`` (a file the
logits are written to) and ``max_batch``.

The model is AMD PACE's recipe (its ``docs/DLRMv2.md``): a plain torch DLRMv2 of those weights
(``nn.Linear`` / ``nn.ReLU`` / ``nn.EmbeddingBag`` sum, the DCNv2 cross stack, a sigmoid),
quantized by ``torch.ao`` FX with its qconfig (activations per-tensor affine quint8 from a
histogram observer, weights per-channel symmetric qint8; tables weight-only 8-bit with a float
scale and offset per row; the concat of bottom output and bags left in float so its fusion
applies), calibrated on the given batches, traced to TorchScript, frozen, rewritten by
``pace.graph.optimize_qdq`` and run with ``pace.core.enable_pace_fusion(True)``, which turns the
graph into ``pace::qlinear`` / ``qlinear_relu`` / ``qlinear_sigmoid`` and
``pace::qmerged_embedding_bag_nbit_cat``.

Protocol, one line each way: the worker prints ``ready {json}`` (versions, the executed graph's
ops); then per request ``load PATH`` (a ``torch.save`` of ``(dense, indices, offsets)``) ->
``ok``, ``run`` -> ``ok N SECONDS`` with the N logits (``logit`` of its probabilities) written
as float32 to the buffer and the seconds of the model call, ``quit``. Failures answer
``error <text>``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import Any

import torch
from torch import nn


class DLRMv2(nn.Module):
    """``forward(dense, indices, offsets) -> probabilities [B, 1]``, with modules (not
    functions) so FX quantization fuses each linear with its ReLU."""

    def __init__(self, state: dict[str, torch.Tensor], names: dict[str, Any]) -> None:
        super().__init__()

        def linear(weight: str, bias: str | None) -> nn.Linear:
            w = state[weight]
            m = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
            m.weight.data.copy_(w)
            if bias is not None:
                m.bias.data.copy_(state[bias])
            return m

        self.bottom = nn.ModuleList([linear(f"{n}.weight", f"{n}.bias") for n in names["bottom"]])
        self.bottom_relu = nn.ModuleList([nn.ReLU() for _ in names["bottom"]])
        self.embedding_bags = nn.ModuleList()
        for n in names["tables"]:
            t = state[n]
            bag = nn.EmbeddingBag(t.shape[0], t.shape[1], mode="sum", include_last_offset=True)
            bag.weight.data.copy_(t)
            self.embedding_bags.append(bag)
        self.cross_v = nn.ModuleList([linear(v, None) for v, _, _ in names["cross"]])
        self.cross_u = nn.ModuleList([linear(u, b) for _, u, b in names["cross"]])
        self.top = nn.ModuleList([linear(f"{n}.weight", f"{n}.bias") for n in names["top"]])
        self.top_relu = nn.ModuleList([nn.ReLU() for _ in names["top"][:-1]])

    def forward(
        self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]
    ) -> torch.Tensor:
        x = dense
        for lin, relu in zip(self.bottom, self.bottom_relu, strict=True):
            x = relu(lin(x))
        bags = [x]
        for i, bag in enumerate(self.embedding_bags):
            bags.append(bag(indices[i], offsets[i]))
        x0 = torch.cat(bags, dim=1)
        xl = x0
        for v, u in zip(self.cross_v, self.cross_u, strict=True):
            xl = x0 * u(v(xl)) + xl
        for lin, relu in zip(self.top[:-1], self.top_relu, strict=True):
            xl = relu(lin(xl))
        return torch.sigmoid(self.top[-1](xl))


def quantize(model: nn.Module, calibration: list[tuple]) -> torch.jit.ScriptModule:
    """AMD PACE's INT8 recipe over ``model``: FX static quantization calibrated on the batches,
    traced, frozen and rewritten by ``pace.graph.optimize_qdq``; fusion on."""
    import warnings

    import pace
    import pace.graph
    from torch.ao.quantization import (
        HistogramObserver,
        PerChannelMinMaxObserver,
        QConfig,
        QConfigMapping,
        float_qparams_weight_only_qconfig,
    )
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    qconfig = QConfig(
        activation=HistogramObserver.with_args(
            qscheme=torch.per_tensor_affine, dtype=torch.quint8, reduce_range=False
        ),
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_channel_symmetric
        ),
    )
    mapping = (
        QConfigMapping()
        .set_global(qconfig)
        .set_module_name_regex(r"embedding_bags\..*", float_qparams_weight_only_qconfig)
        .set_object_type(torch.cat, None)
    )
    with warnings.catch_warnings():  # torch.ao's FX API warns that it moved to torchao
        warnings.simplefilter("ignore")
        prepared = prepare_fx(model.eval(), mapping, example_inputs=calibration[0])
        with torch.no_grad():
            for batch in calibration:
                prepared(*batch)
        quantized = convert_fx(prepared).eval()
    with torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(quantized, calibration[0], check_trace=False))
    traced = pace.graph.optimize_qdq(traced)
    pace.core.enable_pace_fusion(True)
    return traced


def executed_ops(model: torch.jit.ScriptModule, batch: tuple) -> dict[str, int]:
    """The ops of the graph TorchScript ran last (after AMD PACE's fusion pass)."""
    with torch.no_grad():
        for _ in range(3):  # the profiling executor optimizes (and fuses) on the second run
            model(*batch)
    graph = torch.jit.last_executed_optimized_graph()
    kinds = (n.kind() for n in graph.nodes())
    return dict(Counter(k for k in kinds if not k.startswith("prim::")))


def serve(spec: dict[str, Any]) -> None:
    import importlib.metadata

    import numpy as np

    torch.set_num_threads(int(spec["threads"]))
    model = quantize(DLRMv2(spec["state"], spec["names"]), spec["calibration"])
    info = {
        "version": importlib.metadata.version("amd-pace"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "ops": executed_ops(model, spec["calibration"][0]),
    }
    out = np.memmap(spec["buffer"], dtype=np.float32, mode="w+", shape=(spec["max_batch"],))
    print("ready " + json.dumps(info), flush=True)
    inputs: tuple | None = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "load":
                inputs = torch.load(arg)
                print("ok", flush=True)
            elif cmd == "run":
                start = time.perf_counter()
                with torch.no_grad():
                    p = model(*inputs).reshape(-1)
                seconds = time.perf_counter() - start
                n = p.shape[0]
                out[:n] = torch.logit(p.float(), eps=1e-7).numpy()
                print(f"ok {n} {seconds:.9f}", flush=True)
            elif cmd == "quit":
                return
            else:
                print(f"error unknown command {cmd!r}", flush=True)
        except Exception as exc:  # the parent raises it
            print(f"error {type(exc).__name__}: {exc}".replace("\n", " ")[:500], flush=True)


if __name__ == "__main__":
    serve(torch.load(sys.argv[1]))
