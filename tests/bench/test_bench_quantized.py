"""``pace bench quantized`` / ``quality``: ratios, target rows and loading for both of pace's
quantized-activation modes."""

from __future__ import annotations

import importlib.util
import os

import pytest
from pace_bench.quantized import summary, with_ratios


def targets_met(measured: dict) -> dict:
    """``with_ratios`` on ``measured`` (``"<engine> <format>"`` -> rates) in place, then each
    summary target -> met."""
    with_ratios(measured)
    rows = [{"engine": label.split(" ")[0], "format": label.split(" ")[1], **r}
            for label, r in measured.items()]  # fmt: skip
    return {r["target"]: r["met"] for r in summary(rows)}


def test_ratios_and_targets_cover_both_pace_engines():
    measured = {
        "pace bf16": {"prefill_tok_s": 1000.0, "decode_tok_s": 100.0},
        "pace q4_0": {"prefill_tok_s": 950.0, "decode_tok_s": 250.0},
        "pace-a8 q4_0": {"prefill_tok_s": 1250.0, "decode_tok_s": 260.0},
        "llama.cpp q4_0": {"prefill_tok_s": 500.0, "decode_tok_s": 130.0},
    }
    met = targets_met(measured)
    assert measured["pace q4_0"]["prefill_vs_bf16"] == pytest.approx(0.95)
    assert measured["pace-a8 q4_0"]["prefill_vs_bf16"] == pytest.approx(1.25)
    assert measured["pace-a8 q4_0"]["decode_vs_llama"] == pytest.approx(2.0)
    assert "decode_vs_bf16" not in measured["llama.cpp q4_0"]
    assert met["pace q4_0 prefill_vs_bf16 >= 1.0"] is False
    assert met["pace-a8 q4_0 prefill_vs_bf16 >= 1.0"] is True
    assert met["pace-a8 q4_0 decode_vs_llama >= 1.2"] is True


def test_models_load_under_a_mode_and_the_environment_comes_back(monkeypatch):
    from pace_bench import activations

    monkeypatch.setenv(activations.ENV_VAR, "exact")
    with activations.loaded_under("int8"):
        assert os.environ[activations.ENV_VAR] == "int8"
    assert os.environ[activations.ENV_VAR] == "exact"
    monkeypatch.delenv(activations.ENV_VAR)
    with activations.loaded_under("int8"):
        pass
    assert activations.ENV_VAR not in os.environ


def test_int8_is_dropped_with_a_note_without_pace_avx512(monkeypatch, capsys):
    import argparse

    from pace_bench import activations

    args = argparse.Namespace(activations=["exact", "int8"], quiet=False)
    real = importlib.util.find_spec

    def find_spec(name, *rest):
        return None if name == "pace_avx512" else real(name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert activations.modes(args) == ["exact"]
    assert "pace-a8 skipped" in capsys.readouterr().err


def test_the_env_var_is_the_plugins():
    pytest.importorskip("pace_avx512")
    from pace_avx512 import settings
    from pace_bench import activations

    assert activations.ENV_VAR == settings.ENV_VAR
    assert set(activations.ENGINES) == set(settings.CHOICES)


def test_only_quantized_bf16_models_run_in_both_modes():
    import torch
    from pace_bench import activations

    both = ["exact", "int8"]
    assert activations.for_model(both, quantized=True, dtype=torch.bfloat16) == both
    assert activations.for_model(both, quantized=True, dtype=torch.float32) == ["exact"]
    assert activations.for_model(both, quantized=False, dtype=torch.bfloat16) == ["exact"]


def test_llama_quantized_rows_score_llama_cpp_against_the_dense_reference(
    monkeypatch, tmp_path, capsys
):
    """``pace bench quality --llama-quantized``: each llama.cpp quantization of the weights is
    scored against the reference the presets use; a missing peer is a note, not a row."""
    import argparse

    import torch
    from pace_bench import peers, quality

    table = torch.randn(40, 40, generator=torch.Generator().manual_seed(0))
    chunks = [torch.randint(0, 40, (1, 32), generator=torch.Generator().manual_seed(1))]
    made = {}

    def quantized_gguf(path, ftype):
        if ftype == "q4_0":
            raise peers.PeerUnavailable("llama-cpp-python is not installed: run `make bench-peers`")
        made[ftype] = tmp_path / f"m.{ftype}.gguf"
        made[ftype].write_bytes(b"x" * 2_000_000)
        return made[ftype]

    monkeypatch.setattr(peers, "quantized_gguf", quantized_gguf)
    monkeypatch.setattr(quality, "_llama_cpp_scorer", lambda file, window, threads: (
        lambda ids: table[ids] + (0.5 if file == made["q8_0"] else 0.0)))  # fmt: skip
    args = argparse.Namespace(llama_quantized=["q8_0", "q4_0"], window=32, quiet=False)
    rows = quality.llama_quantized_rows(args, "m", tmp_path, lambda ids: table[ids], chunks,
                                        "pace bfloat16 (dense)")  # fmt: skip
    assert [r["variant"] for r in rows] == ["llama.cpp q8_0"]
    row = rows[0]
    assert row["engine"] == "llama.cpp" and row["reference"] == "pace bfloat16 (dense)"
    assert row["kld_mean"] == pytest.approx(0.0, abs=1e-6)  # a constant shift: same softmax
    assert row["top1"] == 1.0 and row["weight_mb"] == 2.0
    assert "llama.cpp q4_0 skipped" in capsys.readouterr().err


def test_ratios_against_the_newest_llama_cpp_and_their_targets():
    measured = {
        "pace bf16": {"prefill_tok_s": 100.0, "decode_tok_s": 10.0},
        "pace q4_k_m": {"prefill_tok_s": 180.0, "decode_tok_s": 30.0},
        "llama-bench q4_k_m": {"prefill_tok_s": 60.0, "decode_tok_s": 25.0},
    }
    met = targets_met(measured)
    pace = measured["pace q4_k_m"]
    assert pace["prefill_vs_newest"] == pytest.approx(3.0)
    assert pace["decode_vs_newest"] == pytest.approx(1.2)
    assert "decode_vs_llama" not in pace  # no llama-cpp-python row in this run
    assert met["pace q4_k_m prefill_vs_newest >= 2.5"] is True
    assert met["pace q4_k_m decode_vs_newest >= 1.4"] is False
    assert met["pace q4_k_m prefill_vs_bf16 >= 1.7"] is True
