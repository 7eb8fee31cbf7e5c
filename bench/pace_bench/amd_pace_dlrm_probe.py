"""Does the AMD PACE in this interpreter have its DLRMv2 path? Prints one JSON object.

Run by the python of AMD PACE's peer venv (``python -I amd_pace_dlrm_probe.py``, from
``pace_bench.dlrm``); it imports nothing of pace-bench. AMD PACE's INT8 DLRMv2 path (its
``docs/DLRMv2.md``, shipped in amd-pace up to 1.2.0) is a torch.ao FX-quantized model traced to
TorchScript, rewritten by ``pace.graph.optimize_qdq`` and a TorchScript pass switched on by
``pace.core.enable_pace_fusion`` into the ``torch.ops.pace`` int8 ops below. The JSON says which
of those pieces are missing: ``{"version", "torch", "missing": [...]}``, or ``"import_error"``
when ``import pace`` fails; with ``--check`` it exits 1 unless the whole path is there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from typing import Any

DLRM_OPS = ("qmerged_embedding_bag_nbit_cat", "qlinear", "qlinear_relu", "qlinear_sigmoid",
            "qlinear_mul_add", "qmul_add")  # fmt: skip


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        out["version"] = importlib.metadata.version("amd-pace")
    except importlib.metadata.PackageNotFoundError:
        out["version"] = None
    try:
        import torch

        out["torch"] = torch.__version__
        import pace
    except Exception as exc:  # any failure of the import is the answer
        out["import_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return out
    missing = []
    if not hasattr(getattr(pace, "core", None), "enable_pace_fusion"):
        missing.append("pace.core.enable_pace_fusion")
    try:
        importlib.import_module("pace.graph").optimize_qdq  # noqa: B018
    except (ImportError, AttributeError):
        missing.append("pace.graph.optimize_qdq")
    missing += [f"torch.ops.pace.{op}" for op in DLRM_OPS if not hasattr(torch.ops.pace, op)]
    out["missing"] = missing
    return out


if __name__ == "__main__":
    found = probe()
    print(json.dumps(found))
    # --check (make bench-dlrm-peers): exit 1 unless the whole path is there
    sys.exit(int("--check" in sys.argv and bool(found.get("import_error") or found["missing"])))
