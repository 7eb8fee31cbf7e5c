"""``pace bench batch``: many prompts in one ``generate`` call, each workload in its own process.

Tiny counts: these check the plumbing and the targets' verdicts, not speed.
"""

from __future__ import annotations

import json

from pace_bench.batch import MIXED_WORDS, mixed_texts

from pace_core.cli import main


def test_mixed_texts_are_seeded_and_within_the_word_range():
    texts = mixed_texts(20)
    assert texts == mixed_texts(20) and texts != mixed_texts(20, seed=1)
    lengths = [len(t.split()) for t in texts]
    assert all(MIXED_WORDS[0] <= n <= MIXED_WORDS[1] for n in lengths)
    assert len(set(lengths)) > 10


def test_both_workloads_report_speed_memory_and_identity(smollm2_dir, tmp_path, capfd):
    argv = ["bench", "batch", "--models", str(smollm2_dir), "--dtype", "float32",
            "--mixed-prompts", "3", "--new-tokens", "4", "--many-prompts", "2", "3",
            "--many-tokens", "24", "--check", "2", "--max-rss-gb", "0.001", "--threads", "1",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    printed = capfd.readouterr().out
    payload = json.loads((tmp_path / "batch.json").read_text())
    rows = payload["results"]
    assert [(r["workload"], r["prompts"]) for r in rows] == [("mixed", 3), ("many", 2), ("many", 3)]
    for r in rows:
        assert r["output_tokens"] > 0 and r["output_tok_s"] > 0
        assert r["peak_rss_mb"] >= r["load_peak_rss_mb"] > 100
        assert r["checked"] == 2 and r["identical"] == 2  # float32: batched == alone
    assert rows[0]["batch1_tok_s"] > 0 and rows[0]["vs_batch1"] > 0
    assert rows[1]["output_tokens"] == 2 * 16 and rows[2]["output_tokens"] == 3 * 16
    assert [r["batch1_tok_s"] for r in rows[1:]] == [None, None]
    verdicts = {s["target"]: s["met"] for s in payload["summary"]}
    assert verdicts == {
        "peak RSS of the many workload (GB) <= 0.001": False,  # no process fits in 1 MB
        "float32 greedy tokens identical to one at a time >= 1.0": True,
    }
    assert "NOT met" in printed


def test_a_failing_workload_names_itself(tmp_path, capsys):
    argv = ["bench", "batch", "--models", str(tmp_path), "--workloads", "many",
            "--many-prompts", "1", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert main(argv) != 0
    assert "the many workload failed" in capsys.readouterr().err
