"""``pace bench quantized``: ratios and target rows for both activation modes of pace."""

from __future__ import annotations

import pytest

from pace_core.bench.quantized import summary, with_ratios


def test_ratios_and_targets_cover_both_pace_engines():
    measured = {
        "pace bf16": {"prefill_tok_s": 1000.0, "decode_tok_s": 100.0},
        "pace q4_0": {"prefill_tok_s": 950.0, "decode_tok_s": 250.0},
        "pace-a8 q4_0": {"prefill_tok_s": 1250.0, "decode_tok_s": 260.0},
        "llama.cpp q4_0": {"prefill_tok_s": 500.0, "decode_tok_s": 130.0},
    }
    with_ratios(measured)
    assert measured["pace q4_0"]["prefill_vs_bf16"] == pytest.approx(0.95)
    assert measured["pace-a8 q4_0"]["prefill_vs_bf16"] == pytest.approx(1.25)
    assert measured["pace-a8 q4_0"]["decode_vs_llama"] == pytest.approx(2.0)
    assert "decode_vs_bf16" not in measured["llama.cpp q4_0"]
    rows = [{"engine": label.split(" ")[0], "format": label.split(" ")[1], **r}
            for label, r in measured.items()]  # fmt: skip
    met = {r["target"]: r["met"] for r in summary(rows)}
    assert met["pace q4_0 prefill_vs_bf16 >= 1.0"] is False
    assert met["pace-a8 q4_0 prefill_vs_bf16 >= 1.0"] is True
    assert met["pace-a8 q4_0 decode_vs_llama >= 1.2"] is True
