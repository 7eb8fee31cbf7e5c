"""The quality measure (KLD, top-1, perplexity) and, under ``slow``, the quality bars of
quantized real models against transformers' fp32 model."""

from __future__ import annotations

import math

import pytest
import torch

from pace_core.quality import TEXT, compare, text_ids, windows


def test_windows_cut_whole_windows_with_optional_bos():
    ids = torch.arange(10, 30)
    plain = windows(ids, 8)
    assert [w.shape for w in plain] == [(1, 8), (1, 8)]
    assert torch.equal(plain[1][0], torch.arange(18, 26))
    with_bos = windows(ids, 8, bos=1)
    assert all(int(w[0, 0]) == 1 and w.shape == (1, 8) for w in with_bos)
    assert torch.equal(with_bos[0][0, 1:], torch.arange(10, 17))


def test_compare_is_zero_for_one_engine_and_positive_for_another():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(50, 50, generator=gen) * 3

    def ref(ids):
        return table[ids]

    def noisy(ids):
        return table[ids] + torch.randn(*ids.shape, 50, generator=gen)

    chunks = [torch.randint(0, 50, (1, 64), generator=gen) for _ in range(3)]
    same = compare(ref, ref, chunks)
    assert same.tokens == 3 * 63 and same.kld_mean == pytest.approx(0, abs=1e-6)
    assert same.top1 == 1.0 and same.ppl == pytest.approx(same.ppl_reference)
    # perplexity of the reference = exp(mean NLL of the actual next tokens)
    lp = torch.log_softmax(table, -1)
    nll = -sum(float(lp[c[0, :-1], c[0, 1:]].sum()) for c in chunks) / same.tokens
    assert same.ppl_reference == pytest.approx(math.exp(nll), rel=1e-5)
    other = compare(ref, noisy, chunks)
    assert other.kld_mean > 0.01 and other.top1 < 1.0 and other.kld_max >= other.kld_p99


def test_the_text_is_a_few_thousand_tokens(smollm2_dir):
    from transformers import AutoTokenizer

    ids = text_ids(AutoTokenizer.from_pretrained(str(smollm2_dir)))
    assert 2000 < ids.numel() < 5000
    assert "We hold these truths to be self-evident" in TEXT.read_text()


# -- real models (slow) ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["int8", "int4"])
def test_pace_check_quantization_passes_on_smollm2(smollm2_dir, preset):
    from pace_core.check import check_quantized

    rows = check_quantized(str(smollm2_dir), preset, plans=["auto"])
    assert len(rows) == 2 and all(r.passed for r in rows), [r.note for r in rows]


@pytest.mark.slow
def test_pace_check_runs_a_gguf_file_against_transformers_reading_it():
    from pace_core import zoo
    from pace_core.check import run_check

    gguf = zoo.gguf_paths("smollm2")[0]
    rows = run_check(str(gguf), new_tokens=12, plans=["auto"])
    fp32 = next(r for r in rows if r.dtype == "float32")
    assert fp32.passed and fp32.mismatches == 0, rows
    assert all(r.passed for r in rows), rows
