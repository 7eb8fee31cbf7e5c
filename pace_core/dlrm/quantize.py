"""DLRMv2's int8 scheme: int8 tables with one scale per row, per-channel int8 weights with
int8 activations (W8A8: dynamic scales per sample and group of 64 values (32 where the row
length is not a multiple of 64: ``QuantizedWeight.activation_group``), or static ones per 32
calibrated on sample batches, :mod:`pace_core.dlrm.calibrate`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from pace_core.errors import ConfigError
from pace_core.quant import QuantizationConfig, QuantizedWeight, quantize

ACT_GROUP = 32  # quantized matmuls need K a multiple of it (static scales: one per 32 values)
ACTIVATIONS = ("int8", "static", "float")


@dataclass(frozen=True)
class DLRMQuantization:
    """What to quantize. ``tables``: every embedding table to int8, one scale per row
    (``amax / 127``). ``weights``: every MLP and cross matrix with a row length that is a
    multiple of 32 to int8 with one scale per output channel, taking int8 activations
    (``activations="int8"``: each sample's values quantized when the layer runs, a scale per
    64 or 32 values; ``activations="static"``: with the calibrated ``scales`` by weight name, one
    per 32 inputs for all samples) or float ones (``activations="float"``: weight-only int8).
    The bottom MLP's
    first layer (13 inputs) stays in the model dtype: its row length is not a multiple of 32,
    and it is 0.04% of the multiply-adds."""

    tables: bool = True
    weights: bool = True
    activations: str = "int8"
    scales: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.activations not in ACTIVATIONS:
            raise ConfigError(
                f"DLRM activations {self.activations!r}: choose 'int8' (W8A8, dynamic scales), "
                "'static' (W8A8, calibrated scales) or 'float'"
            )

    @property
    def name(self) -> str:
        parts = [p for p, on in (("tables", self.tables), ("weights", self.weights)) if on]
        return "int8(" + "+".join(parts) + f", activations {self.activations})"

    def table(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | QuantizedWeight:
        """A table as the model keeps it: int8 rows with one scale each, or ``weight``."""
        if not self.tables:
            return weight.to(dtype)
        return quantize(weight, QuantizationConfig(bits=8)).with_dtype(dtype)

    def calibrated(self, scales: Mapping[str, torch.Tensor]) -> DLRMQuantization:
        """This scheme with static activation ``scales`` (by weight name)."""
        return replace(self, activations="static", scales=dict(scales))

    def matrix(
        self, weight: torch.Tensor, dtype: torch.dtype, name: str = ""
    ) -> torch.Tensor | QuantizedWeight:
        """A linear layer's ``[N, K]`` matrix (the state's ``name``) as the model keeps it."""
        if not self.weights or weight.shape[1] % ACT_GROUP:
            return weight.to(dtype)
        q = quantize(weight, QuantizationConfig(bits=8)).with_dtype(dtype)
        if self.activations == "float":
            return q
        if self.activations == "int8":
            return replace(q, activations="int8")
        if self.scales is None or name not in self.scales:
            raise ConfigError(
                f"DLRM static int8 activations: no calibrated scales for {name!r} (calibrate "
                "with DLRM(..., calibration=batches) or pace_core.dlrm.calibrate)"
            )
        return replace(q, activations="int8", activation_scales=self.scales[name].float())


def coerce_quantization(value: DLRMQuantization | str | None) -> DLRMQuantization | None:
    """``None`` / ``"none"`` / ``"fp"``: no quantization; ``"int8"``: the full scheme;
    ``"int8-static"``: the full scheme with calibrated activation scales (the model is built
    with ``calibration=`` batches); ``"int8-weights"``: int8 matrices and tables with float
    activations."""
    if value is None or isinstance(value, DLRMQuantization):
        return value
    choices = {
        "none": None,
        "fp": None,
        "int8": DLRMQuantization(),
        "int8-static": DLRMQuantization(activations="static"),
        "int8-weights": DLRMQuantization(activations="float"),
    }
    if value not in choices:
        raise ConfigError(f"DLRM quantization {value!r}: choose one of {', '.join(choices)}")
    return choices[value]
