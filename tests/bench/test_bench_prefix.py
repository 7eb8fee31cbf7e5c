"""``pace bench prefix`` with tiny settings: a cached system prompt's TTFT against cold ones,
the cached tokens the server reports and the answers against a server without caching."""

from __future__ import annotations

import json

from pace_core.cli import main


def test_a_cached_system_prompt_is_reported_with_its_answers(smollm2_dir, tmp_path):
    argv = ["bench", "prefix", "--models", str(smollm2_dir), "--engines", "pace", "pace-nocache",
            "--system-tokens", "300", "--repeats", "1", "--threads", "1",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    rows = {r["engine"]: r for r in json.loads((tmp_path / "prefix.json").read_text())["results"]}
    assert set(rows) == {"pace", "pace-nocache"}
    cached, uncached = rows["pace"], rows["pace-nocache"]
    assert cached["cached_tokens"] >= 256 and uncached["cached_tokens"] == 0  # whole blocks
    assert cached["answers"] == "same" and uncached["answers"] == "same"
    assert cached["ttft_warm_ms"] < cached["ttft_cold_ms"]  # 300 prompt tokens not prefilled
