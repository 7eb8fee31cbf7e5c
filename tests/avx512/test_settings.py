"""``PACE_QUANT_ACTIVATIONS``: how quantized weights take bf16 activations, chosen at packing."""

from __future__ import annotations

import pytest
import torch

from pace_core.errors import ConfigError

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import settings


@pytest.mark.parametrize(
    ("value", "mode"), [(None, "exact"), ("", "exact"), ("exact", "exact"), (" INT8 ", "int8")]
)
def test_choices(value, mode):
    env = {} if value is None else {settings.ENV_VAR: value}
    assert settings.quant_activations(env) == mode
    assert settings.int8_activations(env) == (mode == "int8")


def test_a_bad_value_is_named_with_the_fix():
    with pytest.raises(ConfigError, match=r"PACE_QUANT_ACTIVATIONS='int4'.*exact, int8"):
        settings.quant_activations({settings.ENV_VAR: "int4"})


def test_packing_reads_the_environment(ext, monkeypatch):
    """Each packed weight keeps the choice made when it was packed; a bad value fails the
    packing (the model load) with the message above, nothing falls back silently."""
    from pace_avx512 import qpacking

    from pace_core.quant import QuantizationConfig, quantize

    q = quantize(torch.randn(16, 64), QuantizationConfig(bits=8, group_size=32))
    monkeypatch.delenv(settings.ENV_VAR, raising=False)
    assert qpacking.prepare_linear(q).int8_activations is False
    monkeypatch.setenv(settings.ENV_VAR, "int8")
    assert qpacking.prepare_linear(q).int8_activations is True
    assert qpacking.prepare_linear(q, int8_activations=False).int8_activations is False
    monkeypatch.setenv(settings.ENV_VAR, "fast")
    with pytest.raises(ConfigError, match="'fast'"):
        qpacking.prepare_linear(q)
