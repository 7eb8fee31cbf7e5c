"""pace-avx512's quantized linear against an exact model of what it computes.

The VNNI path (csrc/qlinear.cpp) quantizes each activation row per group of 32 (round half to even)
to 15 bits (``amax / 16256``), or, bf16 rows of a weight packed with ``int8_activations``
(``PACE_QUANT_ACTIVATIONS=int8``), to int8 (``amax / 127``); it takes integer dot products with the
weight codes and scales per group in fp32 (the avx2 build's calls of 2+ rows on 15-bit activations
as int16 words, csrc/qwords_tile.h; the two int8 planes otherwise). The bf16 panel path
(csrc/qpanel.cpp: bf16 activations, AVX512-BF16 and avx2 builds, calls of ``qpanel_rows`` rows or
more) rounds the de-quantized weights to bf16
and multiplies the activations as they are. The reference does the same in float64 from the same
codes: the two agree to fp32 rounding (``rtol 1e-5``; a bf16 output adds one bf16 rounding), so any
layout, nibble-order, offset or tail bug shows. On int8 activations the kinds without mins fold
their offset into the integer sum, and ``support.quant_kernels.folded`` states that arithmetic
bit for bit (every row count and tile width); q4_k and q6_k (kinds q4k and q6) quantize their
int8 activations per 256 and sum integers per super-block, ``support.quant_kernels.q4k_super``
and ``q6k_super`` bit for bit. Separately, the packed weight's rows de-quantize to exactly what
``QuantizedWeight.dequantize`` gives (the k-quant kinds keep the file's tables), and
end to end a tiny quantized model on avx512 agrees with the native plan within the
activation-quantization error.

Runs on any AVX-512 CPU with VNNI (the panel cases are skipped without AVX512-BF16).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from support.isa import needs_avx512_int8

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")
pytest.importorskip("gguf", reason="the GGUF block writers need the gguf package")

from pace_avx512 import qpacking, settings
from support.kernel_threads import every_thread
from support.quant_kernels import (
    PACE,
    activation_span,
    folded,
    panel_rows,
    q4k_super,
    q6k_super,
    reference,
    signed_codes,
    tile_blocks,
    tuned,
    weight,
)

from pace_core import LLMModel, SamplingConfig
from pace_core.quant import QuantizedWeight, quantize

pytestmark = needs_avx512_int8  # the int8 kernels use vpdpbusd

GGUF = ("q8_0", "q5_0", "q4_0", "q4_1", "q4_k", "q6_k")
# The kinds without mins (w = q s): their int8-activation kernels fold the offset.
FOLDED = ("int8-g32", "int8-channel", "int8-g64", "int4-sym-g128", "q8_0", "q5_0", "q4_0")


MODES = {  # (the weight's int8_activations, qpanel_rows, the avx2 build's word tiles)
    "split-activations": (False, 0, True),
    "split-activations-planes": (False, 0, False),
    "int8-activations": (True, 0, True),
    "bf16-panel-from-4": (False, 4, True),
}


@pytest.fixture(params=list(MODES))
def mode(ext, request):
    """The weight's int8 activations flag, with the bf16 panel from 4 rows (0: never) and the
    word tiles of 15-bit activations (csrc/qwords_tile.h) on or off."""
    int8, panel_from, words = MODES[request.param]
    if panel_from and not ext.has_bf16_panel:
        pytest.skip("the bf16 panel path needs an AVX512-BF16 or avx2 build")
    if not words and not ext.has_word_tiles:
        pytest.skip("the word tiles are the avx2 build's (AVX-512 builds always take the planes)")
    with panel_rows(ext, panel_from), tuned(ext, "qword_tiles", words):
        yield int8


@pytest.mark.parametrize("kind", [*PACE, *GGUF])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qlinear_matches_its_model(ext, kind, dtype, mode):
    n, k = 100, 512  # N: 6 full blocks of 16 + a tail of 4; K: 16 groups (2 q4_k super-blocks)
    q = weight(kind, n, k)
    packed = qpacking.prepare_linear(q, bias=torch.linspace(-1, 1, n), int8_activations=mode)
    w = packed.rows(torch.arange(n)).float()  # the packed rows, as the kernel reads them
    for m in (1, 2, 3, 4, 9, 16, 18, 19):  # every tile height (1-4, panel 1-6 rows)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        x[0, :32] = 0.0  # an all-zero activation group
        got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, packed.int8_activations)
        path = qpacking.qlinear_path(m, dtype, mode, packed.kind)
        want = reference(x, w, path, activation_span(packed.kind, path)) + packed.bias
        assert got.dtype == dtype and got.shape == (m, n)
        tol = 1e-5 if dtype == torch.float32 else 2**-8  # one bf16 rounding at the end
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("kind", [*PACE, *GGUF])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("rows", "dtype", "int8"),
    [(1, torch.float32, False), (19, torch.bfloat16, False), (1, torch.bfloat16, True),
     (19, torch.bfloat16, True)],
)  # fmt: skip
def test_many_blocks_over_threads(ext, kind, threads, rows, dtype, int8):
    """Every block, the tail rows and (where the format allows) an odd number of groups, as
    the threads split them: one row (the decode path reads several blocks side by side, the
    rest one at a time) and 19 bf16 rows (the default prefill path: the bf16 panel where built,
    over 5 groups of 4 blocks, the last one short), and both on int8 activations."""
    n = 300  # 19 blocks (a tail of 12 rows); K: an odd number of groups of 32 where allowed
    k = {"q4_k": 256, "q6_k": 256, "int8-g64": 192, "int4-sym-g128": 384}.get(kind, 160)
    packed = qpacking.prepare_linear(weight(kind, n, k), bias=torch.linspace(-1, 1, n),
                                     int8_activations=int8)  # fmt: skip
    w = packed.rows(torch.arange(n)).float()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    with every_thread(ext, threads):
        got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, int8)
    path = qpacking.qlinear_path(rows, dtype, int8, packed.kind)
    want = reference(x, w, path, activation_span(packed.kind, path)) + packed.bias
    tol = 1e-5 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_in_chunks(ext, int8, threads):
    """Many rows of a long K: the tiles take the rows in chunks whose activation codes fit L2
    (qlinear.cpp ROW_CHUNK_BYTES, 256 KB: 128 split / 256 int8 rows of K = 1024), every chunk
    over all of a thread's blocks, the last one short with a tail row (301 rows). int8
    activations are for bf16 rows (fp32 ones keep the split)."""
    n, k, rows = 40, 1024, 301
    dtype = torch.bfloat16 if int8 else torch.float32
    packed = qpacking.prepare_linear(weight("q4_0", n, k), bias=torch.linspace(-1, 1, n),
                                     int8_activations=int8)  # fmt: skip
    w = packed.rows(torch.arange(n)).float()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    with every_thread(ext, threads):
        got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, packed.int8_activations)
    path = qpacking.qlinear_path(rows, dtype, int8, packed.kind)
    assert path == ("int8" if int8 else "split")
    want = reference(x, w, path) + packed.bias
    tol = 2**-8 if int8 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("kind", ["int4-mins-g32", "int8-g32", "q4_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_rows_are_the_same_alone_or_batched(ext, kind, threads):
    """With int8 activations a row's output does not depend on the rows it is computed with
    (decode, batched decode, speculative verification and prefill agree bit for bit): every
    row is quantized on its own, every tile height sums in the same order, and the decode
    GEMV's (one row) power-of-two rescalings leave its bits a tile's."""
    n, k = 100, 512
    packed = qpacking.prepare_linear(weight(kind, n, k), int8_activations=True)
    x = torch.randn(24, k, generator=torch.Generator().manual_seed(11)).bfloat16()
    with every_thread(ext, threads):
        batched = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, True)
        for m in (1, 2, 3, 5, 8):
            alone = ext.qlinear(x[:m], packed.weight, packed.bias, n, packed.kind, True)
            assert torch.equal(alone, batched[:m]), m


@pytest.mark.parametrize("kind", FOLDED)
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_activations_fold_bit_for_bit(ext, kind, threads):
    """With int8 activations a kind without mins sums the signed codes exactly and adds each
    scale span's sum times ``s xs`` with one FMA (``folded``): bit for bit at one row (the
    decode GEMV), every tile height and tail, and tiles of 1, 2 or 3 row blocks side by side
    (0: the kind's own), over 7 blocks (the last one short) at 1 and 2 threads; fp32 rows
    (``all_rows``) show every bit of the sums, bf16 ones add the output rounding."""
    n, k = 100, 512
    q = weight(kind, n, k)
    bias = torch.linspace(-1, 1, n)
    packed = qpacking.prepare_linear(q, bias=bias, int8_activations=True)
    codes, scales = signed_codes(q, packed.kind)
    for m in (1, 2, 3, 4, 5, 7, 13, 19):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
        x[0, :32] = 0.0  # an all-zero activation group
        want = folded(x, codes, scales) + bias
        for dtype, blocks in itertools.product((torch.float32, torch.bfloat16), (0, 1, 2, 3)):
            with every_thread(ext, threads), tile_blocks(ext, blocks):
                got = ext.qlinear(x.to(dtype), packed.weight, packed.bias, n, packed.kind, True,
                                  all_rows=True)  # fmt: skip
            assert torch.equal(got, want.to(dtype)), (m, dtype, blocks)


@pytest.mark.parametrize(("fmt", "kind", "model"), [("q4_k", "q4k", q4k_super),
                                                     ("q6_k", "q6", q6k_super)])  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_k_quant_super_blocks_bit_for_bit(ext, fmt, kind, model, threads):
    """With int8 activations a q4_k or q6_k weight (kinds q4k, q6) takes activations per 256
    and integer sums per super-block, one or two FMAs per 256 k (``q4k_super``,
    ``q6k_super``): bit for bit at one row (the decode GEMV), every tile height and tail, and
    tiles of 1, 2 or 3 row blocks side by side (0: the kind's own), over 7 blocks (the last one
    short; row 1 all zero) at 1 and 2 threads; an all-zero activation group and super-block.
    fp32 rows (``all_rows``) show every bit of the sums, bf16 ones add the output rounding."""
    n, k = 100, 768
    q = weight(fmt, n, k)
    bias = torch.linspace(-1, 1, n)
    packed = qpacking.prepare_linear(q, bias=bias, int8_activations=True)
    assert packed.kind == qpacking.KINDS[kind]
    for m in (1, 2, 3, 4, 5, 7, 13, 19):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
        x[0, :32] = 0.0  # an all-zero activation group
        x[-1, 256:512] = 0.0  # an all-zero super-block (row 0 too when m = 1)
        want = model(x, q) + bias
        for dtype, blocks in itertools.product((torch.float32, torch.bfloat16), (0, 1, 2, 3)):
            with every_thread(ext, threads), tile_blocks(ext, blocks):
                got = ext.qlinear(x.to(dtype), packed.weight, packed.bias, n, packed.kind, True,
                                  all_rows=True)  # fmt: skip
            assert torch.equal(got, want.to(dtype)), (m, dtype, blocks)


@pytest.mark.parametrize("kind", [*PACE, *GGUF])
@pytest.mark.parametrize("threads", [1, 2])
def test_wide_int8_tiles_are_the_one_block_tiles(ext, kind, threads):
    """With int8 activations, tiles of 2 or 3 row blocks side by side give the bits of one
    block at a time, kinds with mins too: every row count 4-19 (whole tiles of 4 and 1-3 rows
    over), and 7, 8 or 12 blocks (the last one short at N = 100 and 180), which leave 0, 1 or
    2 blocks over a thread's wide tiles at 1 and 2 threads."""
    k = {"q4_k": 512, "q6_k": 512, "int8-g64": 192, "int4-sym-g128": 384}.get(kind, 160)
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(13)).bfloat16()
    x[0, :32] = 0.0  # an all-zero activation group
    for n in (100, 128, 180):
        packed = qpacking.prepare_linear(weight(kind, n, k), bias=torch.linspace(-1, 1, n),
                                         int8_activations=True)  # fmt: skip
        args = (packed.weight, packed.bias, n, packed.kind, True)
        for m in range(4, 20):
            with every_thread(ext, threads), tile_blocks(ext, 1):
                want = ext.qlinear(x[:m], *args)
            for blocks in (2, 3):
                with every_thread(ext, threads), tile_blocks(ext, blocks):
                    assert torch.equal(ext.qlinear(x[:m], *args), want), (n, m, blocks)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_k", "q6_k"])
def test_many_bf16_rows_take_their_kinds_path(ext, kind):
    """A prefill-size bf16 call with the default knobs: AVX512-BF16 builds take the bf16 panel
    for every kind; the avx2 build only for kinds with a scale per 16 k (q6_k), every other kind
    keeps its word tiles; AVX-512 without BF16 keeps the split tiles. The result is the chosen
    path's model."""
    n, k, rows = 40, 512, 260
    packed = qpacking.prepare_linear(weight(kind, n, k), bias=torch.linspace(-1, 1, n),
                                     int8_activations=False)  # fmt: skip
    path = qpacking.qlinear_path(rows, torch.bfloat16, False, packed.kind)
    if ext.has_word_tiles:  # the avx2 build
        assert path == ("bf16-panel" if kind == "q6_k" else "split")
    else:
        assert path == ("bf16-panel" if ext.has_bf16_panel else "split")
    with panel_rows(ext, 1):  # forced: every kind takes the panel where built
        forced = qpacking.qlinear_path(rows, torch.bfloat16, False, packed.kind)
        assert forced == ("bf16-panel" if ext.has_bf16_panel else "split")
    w = packed.rows(torch.arange(n)).float()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, False)
    want = reference(x, w, path, activation_span(packed.kind, path)) + packed.bias
    tol = 2**-8
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_fp32_rows_never_take_int8_activations(ext):
    """An fp32 model keeps the 15-bit split at any row count, on a weight packed for int8."""
    int8 = qpacking.KINDS["int8"]
    assert qpacking.qlinear_path(64, torch.float32, True, int8) == "split"
    assert qpacking.qlinear_path(64, torch.bfloat16, True, int8) == "int8"
    packed = qpacking.prepare_linear(weight("q8_0", 32, 256), int8_activations=True)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))
    got = ext.qlinear(x, packed.weight, packed.bias, 32, packed.kind, packed.int8_activations)
    want = reference(x, packed.rows(torch.arange(32)).float(), "split")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max())


# 16 groups of 32 (runs of 2) for every kind; 17 (an odd last run) where the format allows K
# = 544 (its groups or super-blocks divide it).
ODD_GROUPS = ("int8-g32", "int8-channel", "int4-mins-g32", "q8_0", "q5_0", "q4_0", "q4_1")


@pytest.mark.parametrize(
    "kind,k", [(kind, 512) for kind in (*PACE, *GGUF)] + [(kind, 544) for kind in ODD_GROUPS]
)
def test_packed_rows_are_the_weight(kind, k):
    q = weight(kind, 37, k)
    packed = qpacking.prepare_linear(q)
    ids = torch.tensor([0, 1, 15, 16, 36])
    want = q.dequantize(ids, torch.float32)
    assert torch.equal(packed.rows(ids), want)


def test_problems_are_named():
    assert "q5_k not implemented" in qpacking.problem("q5_k", 256)
    assert "not a multiple of 32" in qpacking.problem("int8", 48)
    assert qpacking.problem("q4_0", 64) is None
    with pytest.raises(ValueError, match="not a multiple of 32"):
        qpacking.prepare_linear(quantize(torch.randn(4, 48), PACE["int8-channel"]))


# -- end to end: a tiny quantized Llama, avx512 vs native -----------------------------------
OPS = ("linear", "qkv_proj", "gated_mlp")


@pytest.fixture(params=settings.CHOICES)
def quant_activations(clean_env, monkeypatch, request):
    """Models loaded under ``PACE_QUANT_ACTIVATIONS`` = ``exact`` or ``int8``."""
    monkeypatch.setenv(settings.ENV_VAR, request.param)
    return request.param


def packed_linears(model: LLMModel) -> list[qpacking.QPackedLinear]:
    """Every quantized packed matrix the model's blocks hold (QKV and MLP parts included)."""
    found, seen = [], set()

    def visit(obj) -> None:
        if id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, qpacking.QPackedLinear):
            found.append(obj)
            return
        if isinstance(obj, (list, tuple, set)):
            children = list(obj)
        elif isinstance(obj, dict):
            children = list(obj.values())
        else:
            slots = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
            children = [*getattr(obj, "__dict__", {}).values(),
                        *(getattr(obj, n) for n in slots if hasattr(obj, n))]  # fmt: skip
        for child in children:
            visit(child)

    visit(model.model.layers)
    return found


# How far the avx512 logits may be from native's (exact de-quantized matmuls) on the tiny
# random model: relative L2 distance, mean KLD. exact (an fp32 model): 15-bit activations per
# 32, ~3e-5 relative per matmul. int8 (a bf16 model: int8 takes bf16 rows only; the kernels'
# int8 numerics are checked exactly above, so this only catches wiring): ~0.4% per matmul,
# amplified by this model's large random weights to 4-8% (mean KLD 0.02-0.05). Real models:
# tests/quant.
MODEL_DTYPE = {"exact": torch.float32, "int8": torch.bfloat16}
LOGIT_BOUNDS = {"exact": (1e-3, 1e-5), "int8": (0.15, 0.1)}


@pytest.mark.parametrize("preset", ["int8", "int4"])
def test_quantized_model_on_avx512_matches_native(tiny_llama_dir, clean_env, preset,
                                                  quant_activations):  # fmt: skip
    dtype = MODEL_DTYPE[quant_activations]

    def load(opconfig):
        return LLMModel(tiny_llama_dir, dtype=dtype, quantization=preset, opconfig=opconfig,
                        load_tokenizer=False)  # fmt: skip

    ours = load({**dict.fromkeys(OPS, "avx512"), "default": "native", "strict": True})
    ref = load({"default": "native"})
    assert all(ours.op_plan.backends()[op] == {"avx512"} for op in OPS), str(ours.op_plan)
    packed = packed_linears(ours)
    assert len(packed) >= 4 and {w.int8_activations for w in packed} == {
        quant_activations == "int8"
    }
    ids = torch.randint(3, 120, (1, 24), generator=torch.Generator().manual_seed(0))
    a, b = ours.logits(ids).float(), ref.logits(ids).float()
    rel, kld_bound = LOGIT_BOUNDS[quant_activations]
    assert float((a - b).norm() / b.norm()) < rel
    kld = torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True,
                                     reduction="none").sum(-1)  # fmt: skip
    assert float(kld.mean()) < kld_bound
    cfg = SamplingConfig(max_new_tokens=8, ignore_eos=True)
    assert len(ours.generate(ids, cfg).sequences[0].token_ids) == 8


@pytest.mark.parametrize("preset", ["int8", "int4"])
def test_fused_stack_runs_quantized_layers(tiny_llama_dir, preset, quant_activations):
    """The C++ decoder stack runs the quantized layers: same logits and tokens as the
    per-layer calls of the same kernels (prefill M = 24, then decode M = 1), in either
    activation mode (int8: a bf16 model, bit for bit; a stack that ignored the weights' int8
    flag would be ~8% off)."""

    def load(stack):
        return LLMModel(tiny_llama_dir, dtype=MODEL_DTYPE[quant_activations],
                        quantization=preset, opconfig={"decoder_stack": stack},
                        load_tokenizer=False)  # fmt: skip

    fused, per_layer = load("avx512"), load("native")
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}, str(fused.op_plan)
    assert per_layer.op_plan.backends()["linear"] == {"avx512"}
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fused.logits(ids), per_layer.logits(ids), rtol=0, atol=1e-5)
    cfg = SamplingConfig(max_new_tokens=10, ignore_eos=True)
    assert (
        fused.generate(ids, cfg).generated_token_ids
        == per_layer.generate(ids, cfg).generated_token_ids
    )


FUSED_IDS = torch.randint(3, 120, (1, 20), generator=torch.Generator().manual_seed(3))


def fused_against_native(gguf, dtype) -> tuple[LLMModel, float]:
    """``gguf`` loaded fused (its decoder stack on avx512, asserted) and on native kernels: the
    fused model and the relative norm of the two models' logits' difference on
    :data:`FUSED_IDS`."""
    fused = LLMModel(gguf, dtype=dtype, load_tokenizer=False)
    native = LLMModel(gguf, dtype=dtype, load_tokenizer=False, opconfig={"default": "native"})
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}, str(fused.op_plan)
    a, b = fused.logits(FUSED_IDS).float(), native.logits(FUSED_IDS).float()
    return fused, float((a - b).norm() / b.norm())


def test_mixed_format_ops_fuse_too(tmp_path, tiny_llama_dir, clean_env, quant_activations):
    """A GGUF whose QKV and gate/up mix formats (as Q4_K_M does) runs in the fused stack."""
    from support.tiny_gguf import write_gguf

    out = write_gguf(tiny_llama_dir, tmp_path / "mixed.gguf",
                     {"attn_v": "q8_0", "ffn_up": "q8_0", "": "q4_0"})  # fmt: skip
    _, error = fused_against_native(out, MODEL_DTYPE[quant_activations])
    assert error < LOGIT_BOUNDS[quant_activations][0]


def test_fused_stack_still_runs_dense_fp32_layers(tiny_llama_dir, clean_env):
    """Dense and quantized layers share the stack's code paths (the MLP kind is read from the
    packed weights): fp32 dense runs here on any AVX-512 CPU (no AVX512-BF16 needed)."""

    def load(stack):
        return LLMModel(tiny_llama_dir, dtype=torch.float32, opconfig={"decoder_stack": stack},
                        load_tokenizer=False)  # fmt: skip

    fused, per_layer = load("avx512"), load("native")
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}, str(fused.op_plan)
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(fused.logits(ids), per_layer.logits(ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["int8-g32", "int4-mins-g32", "q4_k", "q6_k"])
@pytest.mark.parametrize("rows", [(32, 48, 16), (20, 12)])
def test_stacked_parts_pack_as_their_concatenation(kind, rows):
    """QKV and gate/up pack their parts straight into one buffer: the same bytes as packing
    the stacked weight (parts of rows that are not a multiple of 16 are stacked first)."""
    k = 256
    parts = [weight(kind, n, k) for n in rows]
    stacked, stacked_kind = qpacking.pack(QuantizedWeight.cat(parts))
    packed, packed_kind = qpacking.pack(parts)
    assert packed_kind == stacked_kind and torch.equal(packed, stacked)


def test_q4_k_m_mix_of_q4_k_and_q6_k_runs_fused(tmp_path, clean_env, quant_activations):
    """Q4_K_M keeps some V and down projections in q6_k next to q4_k Q/K and gate/up: the QKV
    packs per format (kinds q4k and q6, both keeping the file's tables), the fused stack runs
    it as near native as one format alone, and prefill and decode give the same tokens as the
    per-layer calls of the same kernels."""
    from support.tiny_gguf import TINY, write_gguf

    hf = TINY["llama"](tmp_path / "hf")
    out = write_gguf(hf, tmp_path / "q4_k_m.gguf",
                     {"attn_v": "q6_k", "ffn_down": "q6_k", "": "q4_k"})  # fmt: skip
    dtype = MODEL_DTYPE[quant_activations]
    fused, error = fused_against_native(out, dtype)
    kinds = {w.kind for w in packed_linears(fused)}
    assert kinds == {qpacking.KINDS["q6"], qpacking.KINDS["q4k"]}, kinds
    assert error < LOGIT_BOUNDS[quant_activations][0], error
    per_layer = LLMModel(out, dtype=dtype, load_tokenizer=False,
                         opconfig={"decoder_stack": "native"})  # fmt: skip
    assert per_layer.op_plan.backends()["linear"] == {"avx512"}
    torch.testing.assert_close(fused.logits(FUSED_IDS), per_layer.logits(FUSED_IDS), rtol=0,
                               atol=1e-5)  # fmt: skip
    cfg = SamplingConfig(max_new_tokens=6, ignore_eos=True)
    assert (
        fused.generate(FUSED_IDS, cfg).generated_token_ids
        == per_layer.generate(FUSED_IDS, cfg).generated_token_ids
    )
