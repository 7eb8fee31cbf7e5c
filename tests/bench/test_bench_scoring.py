"""``pace bench scoring`` with tiny settings: rows per engine and point, pace's log-probabilities
against transformers' (offline fp32 and bf16, served bf16), the targets and the plot."""

from __future__ import annotations

import json

import pytest
import torch
from pace_bench.scoring import make_ids, served_scorer

from pace_core.cli import main

TINY = ["bench", "scoring", "--batches", "1", "3", "--lengths", "12", "--repeats", "1",
        "--threads", "1"]  # fmt: skip


def test_pace_offline_and_served_against_transformers(smollm2_dir, tmp_path):
    argv = [*TINY, "--models", str(smollm2_dir), "--out", str(tmp_path),
            "--engines", "pace-fp32", "pace-bf16", "pace-served", "transformers"]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((tmp_path / "scoring.json").read_text())
    rows = payload["results"]
    engines = ["pace-fp32", "pace-bf16", "pace-served", "transformers"]
    assert [(r["batch"], r["engine"]) for r in rows] == [(b, e) for b in (1, 3) for e in engines]
    by = {(r["batch"], r["engine"]): r for r in rows}
    for r in rows:
        assert r["length"] == 12 and r["tokens_s"] > 0 and r["ms"] > 0
    for b in (1, 3):
        assert by[b, "pace-fp32"]["max_abs_diff"] <= 1e-3
        assert by[b, "transformers"]["max_abs_diff"] == 0 and by[b, "transformers"]["vs_hf"] == 1
        # the server and the offline engine score alike (both bf16, the same kernels)
        served, offline = by[b, "pace-served"], by[b, "pace-bf16"]
        assert abs(served["mean_abs_diff"] - offline["mean_abs_diff"]) <= 0.02
    targets = {s["target"]: s["met"] for s in payload["summary"]}
    assert targets == {
        "pace-fp32 max |logprob diff| vs transformers <= 0.01": True,
        "pace-bf16 mean |logprob diff| vs transformers <= 0.1": True,
        "pace-served mean |logprob diff| vs transformers <= 0.1": True,
    }
    assert (tmp_path / f"scoring-{smollm2_dir.name}.png").is_file()


def test_prompts_have_the_asked_length_and_differ(smollm2_dir):
    from transformers import AutoTokenizer

    ids = make_ids(AutoTokenizer.from_pretrained(str(smollm2_dir)), 4, 40)
    assert ids.shape == (4, 40)
    assert len({tuple(row.tolist()) for row in ids}) == 4


def test_a_served_error_is_reported_with_its_answer():
    import httpx

    answer = {"error": {"message": "max_tokens 0 answers nothing"}}
    client = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(400, json=answer)))
    with client, pytest.raises(RuntimeError, match="pace serve answered 400: .*max_tokens 0"):
        served_scorer("http://127.0.0.1:9", client)(torch.tensor([[1, 2, 3]]))


def test_a_prompt_too_short_to_score_is_a_clear_error(smollm2_dir, tmp_path, capsys):
    argv = ["bench", "scoring", "--models", str(smollm2_dir), "--lengths", "1", "--out",
            str(tmp_path)]  # fmt: skip
    assert main(argv) != 0
    assert "--lengths must be >= 2" in capsys.readouterr().err
    assert not (tmp_path / "scoring.json").exists()
