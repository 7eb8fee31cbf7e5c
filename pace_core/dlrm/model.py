"""The DLRMv2 model of pace: every layer an op of the catalogue, resolved once when the model
is built (``linear`` for the MLPs, ``embedding_bag`` per table, ``cross_interaction`` for the
DCNv2 stack) and called as bound functions: a forward pass is plain calls, no registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from pace_core.binder import KernelBinder
from pace_core.dlrm import names, weights
from pace_core.dlrm.calibrate import activation_scales
from pace_core.dlrm.config import DLRMConfig
from pace_core.dlrm.features import (
    DLRMInputError,
    Sparse,
    check_dense,
    check_ranges,
    sparse_bags,
)
from pace_core.dlrm.quantize import DLRMQuantization, coerce_quantization
from pace_core.errors import ConfigError
from pace_core.opconfig import OperatorConfig
from pace_core.quant import formats_of

DTYPES = (torch.float32, torch.bfloat16)


class _Bound:
    """``fn(*args, w)``: a kernel and its prepared weight."""

    __slots__ = ("fn", "w")

    def __init__(self, fn: Callable[..., Any], w: Any) -> None:
        self.fn, self.w = fn, w


class DLRM:
    """DLRMv2 for inference: ``DLRM(config, state).predict(dense, sparse) -> probabilities``.

    ``state``: fp32 tensors in torchrec's ``DLRM_DCN`` naming (:mod:`pace_core.dlrm.names`);
    ``dtype``: float32 or bfloat16 activations and float weights; ``quantization``: ``None``,
    ``"int8"`` (int8 tables, W8A8 matrices) or a :class:`DLRMQuantization`; ``opconfig``:
    which backend runs each op (as for ``LLMModel``; ``None`` reads ``$PACE_OPCONFIG``);
    ``calibration``: sample batches (``ClickBatch`` or ``(dense, sparse)``) that fix static
    activation scales (``quantization="int8-static"``; :mod:`pace_core.dlrm.calibrate`).
    """

    def __init__(
        self,
        config: DLRMConfig,
        state: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        quantization: DLRMQuantization | str | None = None,
        opconfig: OperatorConfig | Mapping[str, Any] | str | None = None,
        calibration: Iterable[Any] | None = None,
    ) -> None:
        from pace_core.plugins import get_host

        if dtype not in DTYPES:
            raise DLRMInputError(f"DLRM dtype {dtype} unsupported: use float32 or bfloat16")
        weights.check_state(config, state)
        self.config, self.dtype, self.state = config, dtype, dict(state)
        self.quantization = coerce_quantization(quantization)
        q = self.quantization
        if q is not None and q.activations == "static" and q.scales is None:
            if calibration is None:
                raise ConfigError(
                    "DLRM int8-static needs calibration=batches (or a DLRMQuantization with "
                    "its scales)"
                )
            self.quantization = q.calibrated(activation_scales(config, state, calibration))
        self.resolver = get_host().resolver(OperatorConfig.coerce(opconfig))
        self.binder = KernelBinder(dtype, self.resolver)
        self.op_plan = self.binder.plan  # sites named bottom.0, table.3, cross, top.1, ...
        q = self.quantization
        self.bottom = [self._linear(f"bottom.{i}", n) for i, n in enumerate(names.bottom(config))]
        self.tables = []
        for i, (name, rows) in enumerate(zip(names.tables(config), config.table_rows,
                                             strict=True)):  # fmt: skip
            table = q.table(state[name], dtype) if q else state[name].to(dtype)
            attrs = {
                "rows": rows,
                "dim": config.embedding_dim,
                "weight_format": formats_of([table]),
            }
            self.tables.append(self._bind(f"table.{i}", "embedding_bag", attrs, table))
        layers = [
            (self._matrix(v), self._matrix(u), state[b].to(dtype))
            for v, u, b in names.cross(config)
        ]
        attrs = {
            "in_features": config.interaction_dim,
            "rank": config.cross_rank,
            "layers": config.cross_layers,
            "weight_format": formats_of([w for layer in layers for w in layer[:2]]) or "dense",
        }
        self.cross = self._bind("cross", "cross_interaction", attrs, layers)
        self.top = [self._linear(f"top.{i}", n) for i, n in enumerate(names.top(config))]

    # -- construction -------------------------------------------------------------------------
    def _bind(self, site: str, op: str, attrs: dict[str, Any], *args: Any) -> _Bound:
        kernel, prepared = self.binder.prepared(op, attrs, *args, site=site)
        return _Bound(kernel.fn, prepared)

    def _matrix(self, name: str):
        q, weight = self.quantization, self.state[name]
        return q.matrix(weight, self.dtype, name) if q else weight.to(self.dtype)

    def _linear(self, site: str, module: str) -> _Bound:
        w = self._matrix(f"{module}.weight")
        b = self.state[f"{module}.bias"].to(self.dtype)
        attrs = {"in_features": int(w.shape[1]), "out_features": int(w.shape[0]),
                 "weight_format": formats_of([w])}  # fmt: skip
        return self._bind(site, "linear", attrs, w, b)

    @classmethod
    def random(cls, config: DLRMConfig, *, seed: int = 0, **options: Any) -> DLRM:
        """Random weights from ``seed`` (:func:`pace_core.dlrm.weights.random_state`)."""
        return cls(config, weights.random_state(config, seed), **options)

    @classmethod
    def load(cls, path: str | Path, config: DLRMConfig | None = None, **options: Any) -> DLRM:
        """From a file of :meth:`save` or a torchrec ``DLRM_DCN`` state dict."""
        config, state = weights.load(path, config)
        return cls(config, state, **options)

    def save(self, path: str | Path) -> Path:
        """The fp32 weights this model was built from (quantization is redone at load)."""
        return weights.save(path, self.config, self.state)

    # -- inference ------------------------------------------------------------------------------
    def logits(self, dense: torch.Tensor, sparse: Sparse) -> torch.Tensor:
        """Click logits ``[B]`` (fp32) for ``dense [B, F]`` and ``sparse`` (see
        :data:`pace_core.dlrm.features.Sparse`)."""
        dense = check_dense(dense, self.config)
        indices, offsets = sparse_bags(sparse, self.config, int(dense.shape[0]))
        try:
            return self._forward(dense, indices, offsets)
        except (IndexError, RuntimeError):  # a kernel refused an id: say which and why
            check_ranges(indices, offsets, self.config)
            raise

    def predict(self, dense: torch.Tensor, sparse: Sparse) -> torch.Tensor:
        """Click probabilities ``[B]`` (fp32)."""
        return torch.sigmoid(self.logits(dense, sparse))

    __call__ = predict

    @torch.no_grad()
    def _forward(self, dense: torch.Tensor, indices: list[torch.Tensor],
                 offsets: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        x = dense.to(self.dtype).contiguous()
        for layer in self.bottom:
            x = torch.relu_(layer.fn(x, layer.w))
        bags = [t.fn(i, o, t.w) for t, i, o in zip(self.tables, indices, offsets, strict=True)]
        z = self.cross.fn(torch.cat([x, *bags], dim=1), self.cross.w)
        for layer in self.top[:-1]:
            z = torch.relu_(layer.fn(z, layer.w))
        last = self.top[-1]
        return last.fn(z, last.w).float().reshape(-1)
