"""DLRMv2 weights: random ones (seeded, with a calibrated output layer), and state dict files in
torchrec's ``DLRM_DCN`` naming (:mod:`pace_core.dlrm.names`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from pace_core.dlrm import names
from pace_core.dlrm.config import MLPERF_MULTI_HOT, DLRMConfig
from pace_core.errors import ModelLoadError

State = dict[str, torch.Tensor]
FILE_FORMAT = "pace-dlrm-v1"
# The random model's click logits: mean and spread over its synthetic features (a click rate
# of ~25% with a wide spread of probabilities, so AUC and log loss mean something).
LOGIT_MEAN, LOGIT_STD = -1.2, 1.5
CALIBRATION_SAMPLES = 2048


def random_state(config: DLRMConfig, seed: int = 0) -> State:
    """fp32 weights drawn from ``seed``: He-normal MLPs, tables scaled so that every feature
    contributes alike (``0.5 / sqrt(multi-hot)``), cross kernels that keep ``x_l``'s scale, and
    an output layer calibrated to logits of mean -1.2 and spread 1.5 on the synthetic features
    of the same seed (:class:`~pace_core.dlrm.data.SyntheticClicks`)."""
    gen = torch.Generator().manual_seed(seed)
    state: State = {}

    def normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std

    for name, rows, hot in zip(names.tables(config), config.table_rows, config.multi_hot,
                               strict=True):  # fmt: skip
        state[name] = normal((rows, config.embedding_dim), 0.5 / math.sqrt(max(hot, 1)))
    for name, shape in names.shapes(config).items():
        if name in state:
            continue
        if len(shape) == 1:  # biases
            state[name] = normal(shape, 0.01)
        elif ".V_kernels." in name:
            state[name] = normal(shape, 1.0 / math.sqrt(shape[1]))
        elif ".W_kernels." in name:
            state[name] = normal(shape, 0.5 / math.sqrt(shape[1]))
        else:
            state[name] = normal(shape, math.sqrt(2.0 / shape[1]))
    _calibrate_output(config, state, seed)
    return state


def _calibrate_output(config: DLRMConfig, state: State, seed: int) -> None:
    from pace_core.dlrm.data import SyntheticClicks
    from pace_core.dlrm.features import fixed_hotness
    from pace_core.dlrm.reference import ReferenceDLRM

    gen = torch.Generator().manual_seed(seed + 1)
    dense, sparse = SyntheticClicks(config, seed=seed).features(CALIBRATION_SAMPLES, gen)
    with torch.no_grad():
        z = ReferenceDLRM(config, state)(dense, *fixed_hotness(sparse))
    last = names.top(config)[-1]
    w, b = state[f"{last}.weight"], state[f"{last}.bias"]
    scale = LOGIT_STD / max(float(z.std()), 1e-6)
    state[f"{last}.weight"] = w * scale
    state[f"{last}.bias"] = LOGIT_MEAN - scale * (float(z.mean()) - b)


def save(path: str | Path, config: DLRMConfig, state: Mapping[str, torch.Tensor]) -> Path:
    """Write ``{"format", "config", "state_dict"}`` with ``torch.save``."""
    path = Path(path)
    torch.save({"format": FILE_FORMAT, "config": config.to_dict(), "state_dict": dict(state)},
               path)  # fmt: skip
    return path


def infer_config(state: Mapping[str, torch.Tensor]) -> DLRMConfig:
    """The architecture a torchrec-named state dict holds (multi-hot sizes: MLPerf's for 26
    tables, else 1 per table)."""
    tables = sorted(
        (int(k.split(".t_cat_")[1].split(".")[0]), v.shape)
        for k, v in state.items() if k.startswith(names.TABLES)
    )  # fmt: skip
    if not tables:
        raise ModelLoadError(f"no embedding tables ({names.TABLES}.t_cat_<i>.weight) in the file")
    rows = tuple(int(s[0]) for _, s in tables)
    dim = int(tables[0][1][1])

    def mlp(prefix: str) -> tuple[int, ...]:
        out, i = [], 0
        while f"{prefix}.{i}._linear.weight" in state:
            out.append(int(state[f"{prefix}.{i}._linear.weight"].shape[0]))
            i += 1
        return tuple(out)

    layers = sum(1 for k in state if k.startswith(f"{names.CROSS}.V_kernels."))
    rank = int(state[f"{names.CROSS}.V_kernels.0"].shape[0]) if layers else 1
    top = (*mlp(f"{names.TOP}.0._mlp"), int(state[f"{names.TOP}.1.weight"].shape[0]))
    hot = MLPERF_MULTI_HOT if len(rows) == len(MLPERF_MULTI_HOT) else (1,) * len(rows)
    dense = int(state[f"{names.BOTTOM}.0._linear.weight"].shape[1])
    return DLRMConfig(table_rows=rows, multi_hot=hot, dense_features=dense, embedding_dim=dim,
                      bottom_mlp=mlp(names.BOTTOM), top_mlp=top, cross_layers=layers,
                      cross_rank=rank, name="loaded")  # fmt: skip


def check_state(config: DLRMConfig, state: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`ModelLoadError` naming missing, unexpected or misshapen tensors."""
    want = names.shapes(config)
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    wrong = [f"{k} {tuple(state[k].shape)} (expected {want[k]})" for k in want
             if k in state and tuple(state[k].shape) != want[k]]  # fmt: skip
    for what, items in (("missing", missing), ("unexpected", extra), ("misshapen", wrong)):
        if items:
            shown = ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
            raise ModelLoadError(f"DLRM state dict: {what} tensors: {shown}")


def load(path: str | Path, config: DLRMConfig | None = None) -> tuple[DLRMConfig, State]:
    """A file written by :func:`save`, or a plain torchrec ``DLRM_DCN`` state dict (keys may
    carry MLPerf's ``model.`` prefix; the architecture is read from the shapes unless given)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"no DLRM weights file at {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch save, truncated, or pickled objects beyond tensors
        raise ModelLoadError(
            f"cannot read {path} as DLRM weights ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); pass a file torch.save wrote (a state dict)"
        ) from None
    if isinstance(data, Mapping) and data.get("format") == FILE_FORMAT:
        config = config or DLRMConfig.from_dict(dict(data["config"]))
        state = dict(data["state_dict"])
    elif isinstance(data, Mapping):
        state = {k.removeprefix("model."): v for k, v in data.items()}
        config = config or infer_config(state)
    else:
        raise ModelLoadError(f"{path} holds a {type(data).__name__}, not a DLRM state dict")
    check_state(config, state)
    return config, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
