"""``pace bench compile --families`` on a tiny MoE model: eager and profiled rows with the
split of a decode step into kernel time and the rest, and the families' target row."""

from __future__ import annotations

import json

from support import tiny

from pace_core.cli import main


def test_family_rows_split_a_step(tmp_path):
    path = tiny.qwen3_moe(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["bench", "compile", "--models", "--families", str(path), "--batches", "1",
            "--new-tokens", "4", "--repeats", "1", "--prompt-len", "6", "--family-engines",
            "pace", "--no-plots", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((out / "compile.json").read_text())
    rows = {r["engine"]: r for r in payload["results"] if r["section"] == "families"}
    assert set(rows) == {"pace", "pace-profiled"}
    assert rows["pace"]["stack"] == "native"  # MoE blocks: the per-layer loop
    prof = rows["pace-profiled"]
    assert 0 < prof["in_kernels"] < 1 and prof["outside_us_per_layer"] > 0
    assert prof["compile_bound"] > 1 and prof["layer_bound"] > 1
    assert [s["target"] for s in payload["summary"]] == [
        "families: layer / its kernels (compile's bound) >= 1.2"
    ]
