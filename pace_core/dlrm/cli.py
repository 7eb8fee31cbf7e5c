"""``pace dlrm``: run DLRMv2 over synthetic or given features; print probabilities and, with
labels, AUC and log loss.

    pace dlrm --preset tiny --batch 8                       # random weights, synthetic batch
    pace dlrm --weights dlrm.pt --features batch.npz        # your weights and features
    pace dlrm --preset scaled --quantization int8 --batch 4096 --eval
    pace dlrm --quantization int8-static --calibration-samples 4096   # calibrated int8

Features files (``.npz`` or ``.pt``): ``dense`` ``[B, 13]`` float, ``sparse`` either
``[B, 26]`` / ``[B, 26, L]`` integers or ``sparse_0`` ... ``sparse_25`` ``[B, L_i]`` each;
optional ``labels`` ``[B]`` (0/1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from pace_core.arg_types import at_least
from pace_core.dlrm.config import PRESETS, preset
from pace_core.dlrm.features import DLRMInputError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16}  # fmt: skip
SHOW = 10  # probabilities printed (the rest are summarised)


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.from_numpy(value)
    except TypeError:
        raise DLRMInputError(f"{what} in the features file is a {type(value).__name__}, not an "
                             "array") from None  # fmt: skip


def read_features(path: Path) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
    """``(dense, sparse, labels | None)`` from an ``.npz`` or ``.pt`` file."""
    if not path.is_file():
        raise DLRMInputError(f"no features file at {path}")
    if path.suffix not in (".npz", ".pt"):
        raise DLRMInputError(f"features file {path}: use .npz or .pt (got {path.suffix!r})")
    try:
        if path.suffix == ".npz":
            import numpy as np

            with np.load(path) as f:
                data = {k: f[k] for k in f.files}
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not such a file, or truncated
        raise DLRMInputError(
            f"cannot read features file {path} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})"
        ) from None
    if not isinstance(data, dict):
        raise DLRMInputError(f"{path} holds a {type(data).__name__}; save a dict of tensors")
    if "dense" not in data:
        raise DLRMInputError(f"{path} has no 'dense' array (has: {', '.join(sorted(data))})")
    dense = _as_tensor(data["dense"], "'dense'")
    if dense.dim() == 0 or dense.shape[0] == 0:
        raise DLRMInputError(f"{path} holds no samples: its 'dense' array has shape "
                             f"{tuple(dense.shape)}, one row per sample expected")  # fmt: skip
    if "sparse" in data:
        sparse: Any = _as_tensor(data["sparse"], "'sparse'")
    else:
        numbered = [k for k in data if k.startswith("sparse_") and k[7:].isdigit()]
        keys = sorted(numbered, key=lambda k: int(k[7:]))
        if not keys:
            raise DLRMInputError(f"{path} has neither 'sparse' nor 'sparse_0', 'sparse_1', ...")
        sparse = [_as_tensor(data[k], repr(k)) for k in keys]
    labels = _as_tensor(data["labels"], "'labels'") if "labels" in data else None
    return dense, sparse, labels


def add_dlrm_parser(sub: Any) -> None:
    """Add ``pace dlrm`` to the ``pace`` subcommands."""
    p = sub.add_parser("dlrm", help="DLRMv2 click probabilities (synthetic or given features)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="architecture of random weights (ignored with --weights)")  # fmt: skip
    p.add_argument("--weights", type=Path, default=None, help="a saved DLRM / torchrec state dict")
    p.add_argument("--features", type=Path, default=None, help=".npz or .pt features file")
    p.add_argument("--batch", type=at_least(1), default=8,
                   help="synthetic samples (without --features)")  # fmt: skip
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument(
        "--quantization", default="none", choices=["none", "int8", "int8-static", "int8-weights"]
    )
    p.add_argument("--calibration-samples", type=at_least(1), default=4096,
                   help="int8-static: synthetic samples fixing the activation scales")  # fmt: skip
    p.add_argument("--opconfig", default=None, help="e.g. 'cross_interaction=native' or JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="also print AUC and log loss (labels)")
    p.add_argument("--show-plan", action="store_true", help="print the op plan to stderr")
    p.add_argument("--threads", type=at_least(1), default=None)
    p.set_defaults(func=run)


def calibration_batches(config: Any, samples: int, seed: int) -> list[tuple[Any, Any]]:
    """Synthetic ``(dense, sparse)`` batches of at most 2048 (their own seed) for int8-static."""
    from pace_core.dlrm import SyntheticClicks

    if samples < 1:
        raise DLRMInputError(f"--calibration-samples {samples}: give at least 1 sample")
    data = SyntheticClicks(config, seed=seed + 2)
    gen = torch.Generator().manual_seed(seed + 2)
    return [data.features(min(2048, samples - s), gen) for s in range(0, samples, 2048)]


def run(args: argparse.Namespace) -> int:
    from pace_core.dlrm import DLRM, SyntheticClicks, auc, logloss, weights

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch < 1:
        raise DLRMInputError(f"--batch {args.batch}: give at least 1 sample")
    options = {"dtype": DTYPES[args.dtype], "quantization": args.quantization,
               "opconfig": args.opconfig}  # fmt: skip
    if args.weights is not None:
        config, state = weights.load(args.weights)
    else:
        config = preset(args.preset)
        state = weights.random_state(config, args.seed)
    if args.quantization == "int8-static":
        options["calibration"] = calibration_batches(config, args.calibration_samples, args.seed)
    model = DLRM(config, state, **options)
    if args.show_plan:
        print(model.op_plan, file=sys.stderr)
    if args.features is not None:
        dense, sparse, labels = read_features(args.features)
    else:
        gen = torch.Generator().manual_seed(args.seed + 1)
        batch = SyntheticClicks(model.config, model.state, seed=args.seed).batch(args.batch, gen)
        dense, sparse, labels = batch.dense, batch.sparse, batch.labels
    probs = model.predict(dense, sparse)
    for i, p in enumerate(probs[:SHOW].tolist()):
        print(f"{i}\t{p:.6f}")
    if len(probs) > SHOW:
        print(f"... {len(probs)} samples: mean {float(probs.mean()):.4f}, "
              f"min {float(probs.min()):.4f}, max {float(probs.max()):.4f}")  # fmt: skip
    if args.eval:
        if labels is None:
            raise DLRMInputError("--eval needs labels: add a 'labels' array to the features file")
        labels = labels.float().reshape(-1)
        if labels.numel() != probs.numel():
            raise DLRMInputError(f"{labels.numel()} labels for {probs.numel()} samples")
        odd = labels[(labels != 0) & (labels != 1)]
        if odd.numel():
            raise DLRMInputError(
                f"labels are clicks, 0 or 1; the features file has {odd.numel()} other "
                f"value(s), e.g. {float(odd[0]):g}"
            )
        print(f"logloss {logloss(probs, labels):.6f}")
        try:
            print(f"auc {auc(probs, labels):.6f}")
        except ValueError as exc:
            print(f"auc - ({exc})")
    return 0
