"""``pace bench embeddings`` with tiny settings: rows per engine and point, the cosine check
against transformers, the plot, and llama.cpp skipped with its reason when absent."""

from __future__ import annotations

import json

import pytest
from pace_bench import peers
from pace_bench.common import make_texts

from pace_core.cli import main

TINY = ["bench", "embeddings", "--batches", "1", "3", "--lengths", "12", "--repeats", "1",
        "--threads", "1"]  # fmt: skip


def test_pace_and_transformers_side_by_side(smollm2_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers, "find_llama_cpp", lambda: None)
    argv = [*TINY, "--models", str(smollm2_dir), "--out", str(tmp_path),
            "--engines", "pace-fp32", "transformers", "llama.cpp-bf16"]  # fmt: skip
    assert main(argv) == 0
    assert "llama.cpp-bf16 skipped: llama-cpp-python is not installed" in capsys.readouterr().err
    payload = json.loads((tmp_path / "embeddings.json").read_text())
    rows = payload["results"]
    assert [(r["batch"], r["engine"]) for r in rows] == [
        (1, "pace-fp32"), (1, "transformers"), (3, "pace-fp32"), (3, "transformers"),
    ]  # fmt: skip
    for r in rows:
        assert r["length"] == 12 and r["inputs_s"] > 0 and r["tokens_s"] > r["inputs_s"]
        assert r["cosine_vs_hf"] >= 0.999
    assert [r["vs_hf"] for r in rows if r["engine"] == "transformers"] == [1.0, 1.0]
    (target,) = payload["summary"]
    assert target["target"] == "pace-fp32 cosine vs transformers >= 0.999" and target["met"]
    assert (tmp_path / f"embeddings-{smollm2_dir.name}.png").is_file()


def test_texts_differ_per_row_and_have_the_asked_length(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    texts = make_texts(tok, 4, 40)
    assert len(set(texts)) == 4
    assert all(abs(len(tok(t)["input_ids"]) - 40) <= 1 for t in texts)


@pytest.mark.skipif(peers.find_llama_cpp() is None, reason="llama-cpp-python not installed")
def test_llama_cpp_embeds_like_transformers(smollm2_dir, tmp_path):
    if peers.find_converter() is None:
        pytest.skip("llama.cpp converter not extracted (make bench-peers)")
    argv = [*TINY, "--models", str(smollm2_dir), "--out", str(tmp_path), "--no-plots",
            "--quiet", "--engines", "transformers", "llama.cpp-fp32"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "embeddings.json").read_text())["results"]
    llama = [r for r in rows if r["engine"] == "llama.cpp-fp32"]
    assert len(llama) == 2 and all(r["cosine_vs_hf"] >= 0.999 for r in llama)
