"""Quantized weights: formats (:mod:`.weight`), quantize-on-load (:mod:`.config`,
:mod:`.quantize`) and the GGUF block types (:mod:`.gguf_blocks`)."""

from pace_core.quant.config import PRESETS, QuantizationConfig, coerce_quantization
from pace_core.quant.quantize import quantize
from pace_core.quant.weight import (
    DENSE,
    QUANTIZED_FORMATS,
    WEIGHT_FORMATS,
    QuantizedWeight,
    formats_of,
    weight_format,
)

__all__ = [
    "DENSE",
    "PRESETS",
    "QUANTIZED_FORMATS",
    "WEIGHT_FORMATS",
    "QuantizationConfig",
    "QuantizedWeight",
    "coerce_quantization",
    "formats_of",
    "quantize",
    "weight_format",
]
