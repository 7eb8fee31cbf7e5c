"""``PACE_QUANT_ACTIVATIONS``: how quantized matmuls of many rows take their activations."""

from __future__ import annotations

import types

import pytest

from pace_core.errors import ConfigError
from pace_core.ops import ACTIVATIONS

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import build, settings


class FakeKernels(types.SimpleNamespace):
    def set_int8_activation_rows(self, rows: int) -> None:
        self.rows = rows


@pytest.mark.parametrize(
    ("value", "mode", "rows"),
    [(None, "int8", 1), ("", "int8", 1), ("int8", "int8", 1), (" EXACT ", "exact", 0)],
)
def test_choices(value, mode, rows):
    env = {} if value is None else {settings.ENV_VAR: value}
    assert settings.quant_activations(env) == mode
    kernels = FakeKernels()
    settings.apply(kernels, env)
    assert kernels.rows == rows


def test_a_bad_value_is_named_with_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match=r"PACE_QUANT_ACTIVATIONS='int4'.*int8, exact"):
        settings.quant_activations({settings.ENV_VAR: "int4"})
    # and loading the kernels with it fails the same way (no silent default)
    monkeypatch.setenv(settings.ENV_VAR, "fast")
    with pytest.raises(ConfigError, match="'fast'"):
        build.after_load(FakeKernels(ACTIVATIONS=ACTIVATIONS))


def test_the_loaded_kernels_follow_the_environment(ext, monkeypatch):
    before = ext.int8_activation_rows()
    try:
        monkeypatch.delenv(settings.ENV_VAR, raising=False)
        build.after_load(ext)
        assert ext.int8_activation_rows() == settings.CHOICES["int8"]
        monkeypatch.setenv(settings.ENV_VAR, "exact")
        build.after_load(ext)
        assert ext.int8_activation_rows() == 0
    finally:
        ext.set_int8_activation_rows(before)
