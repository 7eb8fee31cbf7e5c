"""End to end: a tiny random Llama on the avx512 kernels against the native plan.

Shapes are chosen to hit the tails: hidden 96 (6 heads of 16, 2 KV heads: QKV N = 160),
intermediate 200 and vocab 250 (not multiples of 16), prompts longer than 16 tokens (the
prefill GEMM path) and single-token decode steps (the GEMV path).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from pace_core.cpu import detect_cpu

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_core import LLMModel, SamplingConfig

OPS = ("linear", "qkv_proj", "gated_mlp", "rms_norm", "rope", "attention", "decoder_stack")
AVX512 = {**dict.fromkeys(OPS, "avx512"), "default": "native", "strict": True}
NATIVE = {"default": "native"}
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_llama(odd_llama_dir):
    return odd_llama_dir


def load(path, dtype, opconfig):
    return LLMModel(path, dtype=dtype, opconfig=opconfig, load_tokenizer=False)


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids):
    cfg = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    out = model.generate(ids, cfg, output_logits=True)
    return out.sequences[0].token_ids, out.logits[0]


def ragged_batch() -> dict[str, torch.Tensor]:
    """3 left-padded prompts of 14, 9 and 3 tokens (tiny vocabularies)."""
    ids = torch.zeros(3, 14, dtype=torch.long)
    mask = torch.zeros(3, 14, dtype=torch.long)
    for i, n in enumerate((14, 9, 3)):
        ids[i, 14 - n :], mask[i, 14 - n :] = prompt(n, seed=i)[0] % 60 + 3, 1
    return {"input_ids": ids, "attention_mask": mask}


@contextlib.contextmanager
def wrapped_stack(model, every_position: bool, calls: list | None = None):
    """Inside, ``model``'s fused stack calls record (output shape, last_only) into ``calls``;
    with ``every_position`` the last layer runs every position."""
    stack = model.model.stack.weight
    cpp = stack.cpp

    def run(*args, **kwargs):
        if every_position:
            kwargs = {**kwargs, "last_only": False}
        x, residual = cpp.run(*args, **kwargs)
        if calls is not None:
            calls.append((tuple(x.shape), kwargs["last_only"]))
        return x, residual

    object.__setattr__(stack, "cpp", SimpleNamespace(run=run))
    try:
        yield
    finally:
        object.__setattr__(stack, "cpp", cpp)


def test_plan_uses_avx512(tiny_llama, ext, clean_env):
    model = load(tiny_llama, torch.float32, AVX512)
    backends = model.op_plan.backends()
    for op in OPS:
        assert backends[op] == {"avx512"}, str(model.op_plan)


def test_fp32_matches_native(tiny_llama, ext, clean_env):
    ours, ref = load(tiny_llama, torch.float32, AVX512), load(tiny_llama, torch.float32, NATIVE)
    ids = prompt(40)  # prefill M = 40: GEMM path
    torch.testing.assert_close(ours.logits(ids), ref.logits(ids), rtol=0, atol=1e-4)
    tokens, logits = greedy(ours, ids[:, :8])  # decode M = 1: GEMV path
    ref_tokens, ref_logits = greedy(ref, ids[:, :8])
    assert tokens == ref_tokens
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)


def test_fp32_left_padded_batch_matches_native(tiny_llama, ext, clean_env):
    """Batch of 3 (M = 3 GEMV rows, padded attention masks) against native and alone."""
    ours, ref = load(tiny_llama, torch.float32, AVX512), load(tiny_llama, torch.float32, NATIVE)
    prompts = [prompt(n, seed=7)[0] for n in (5, 8, 11)]
    ids = torch.zeros(3, 11, dtype=torch.long)
    mask = torch.zeros(3, 11, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 11 - len(p) :], mask[i, 11 - len(p) :] = p, 1
    batch = {"input_ids": ids, "attention_mask": mask}
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    together = ours.generate(batch, sampling).generated_token_ids
    assert together == ref.generate(batch, sampling).generated_token_ids
    assert together[1] == ours.generate(prompts[1].view(1, -1), sampling).generated_token_ids[0]


def bf16_errors(path, ours: LLMModel, ids: torch.Tensor) -> tuple[float, float, LLMModel]:
    """(max |logit error| of ``ours`` bf16, of native bf16) against native fp32, and that
    fp32 model."""
    exact = load(path, torch.float32, NATIVE)
    truth = exact.logits(ids).float()
    native = load(path, torch.bfloat16, NATIVE).logits(ids).float()
    ours_err = (ours.logits(ids).float() - truth).abs().max()
    return float(ours_err), float((native - truth).abs().max()), exact


def test_bf16_close_to_native(tiny_llama, ext, clean_env):
    """bf16 logits: no further from the fp32 reference than native bf16 is (with margin)."""
    ours = load(tiny_llama, torch.bfloat16, AVX512)
    ids = prompt(40)
    ours_err, native_err, exact = bf16_errors(tiny_llama, ours, ids)
    assert ours_err <= 2 * native_err + 1e-2, (ours_err, native_err)
    _, truth_steps = greedy(exact, ids[:, :8])
    tokens, steps = greedy(ours, ids[:, :8])
    assert len(tokens) == NEW_TOKENS
    # compare the first step only (later steps may follow different tokens)
    assert (steps[0].float() - truth_steps[0]).abs().max() <= 2 * native_err + 1e-2


def test_simulated_cpu_without_avx2_falls_back(tiny_llama, ext, clean_env):
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", "avx2,avx512f,avx512_bf16")
    detect_cpu.cache_clear()
    model = load(tiny_llama, torch.float32, {**AVX512, "strict": False})
    for (op, backend, reason), _ in model.op_plan.sites.items():
        if op in OPS:
            assert backend == "native"
            assert "missing CPU features: avx2" in reason, reason
    ref = load(tiny_llama, torch.float32, NATIVE)
    ids = prompt(10)
    torch.testing.assert_close(model.logits(ids), ref.logits(ids), rtol=0, atol=0)


def test_without_bf16_dot_bf16_matmuls_stay_on_avx512(tiny_llama, ext, clean_env):
    """AVX-512 without AVX512-BF16 (Skylake-SP .. Ice Lake): bf16 matmuls keep the avx512
    kernels (bf16 widened to fp32 for FMAs where the build lacks vdpbf16ps), no further from
    the fp32 reference than native bf16 is (with margin)."""
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", "avx512_bf16")
    detect_cpu.cache_clear()
    bf16 = load(tiny_llama, torch.bfloat16, AVX512)
    assert bf16.op_plan.backends()["linear"] == {"avx512"}
    ours_err, native_err, _ = bf16_errors(tiny_llama, bf16, prompt(40))
    assert ours_err <= 2 * native_err + 1e-2, (ours_err, native_err)


@pytest.mark.parametrize("cache", ["dynamic", "bmc", "paged", "slab_pool"])
def test_every_cache_layout_matches_native(tiny_llama, ext, clean_env, cache):
    """Attention reads each cache layout in place (paged/slab through the block table):
    a ragged batch (prefill tiles + decode) gives native's tokens and logits in fp32."""
    blocks = cache in ("paged", "slab_pool")  # the per-layer path reads the block views
    opconfig = {**AVX512, "decoder_stack": "native"} if blocks else AVX512
    ours = LLMModel(tiny_llama, dtype=torch.float32, opconfig=opconfig, kv_cache_type=cache,
                    load_tokenizer=False)  # fmt: skip
    ref = load(tiny_llama, torch.float32, NATIVE)
    assert ours.op_plan.backends()["attention"] == {"avx512"}
    prompts = [prompt(n, seed=3)[0] for n in (20, 37)]
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    ids = torch.zeros(2, 37, dtype=torch.long)
    mask = torch.zeros(2, 37, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 37 - len(p) :], mask[i, 37 - len(p) :] = p, 1
    batch = {"input_ids": ids, "attention_mask": mask}
    got = ours.generate(batch, sampling, output_logits=True)
    want = ref.generate(batch, sampling, output_logits=True)
    assert got.generated_token_ids == want.generated_token_ids
    for row in range(2):
        torch.testing.assert_close(got.logits[row], want.logits[row], rtol=0, atol=1e-4)


from support.tiny import FACTORIES  # noqa: E402


@pytest.mark.parametrize("family", sorted(FACTORIES))
def test_every_family_matches_native(family, tmp_path, ext, clean_env):
    """Every tiny family with every op avx512 can take (sliding windows, sinks, LayerNorm,
    GELU, partial rotary, QK-norm): fp32 logits and greedy tokens equal the native plan's."""
    path = FACTORIES[family](tmp_path)
    ours = load(path, torch.float32, {"default": "avx512"})
    ref = load(path, torch.float32, NATIVE)
    uses = {op for op, backends in ours.op_plan.backends().items() if "avx512" in backends}
    attention = "latent_attention" if family.startswith("deepseek") else "attention"
    assert {"linear", attention} <= uses, str(ours.op_plan)
    ids = prompt(24, seed=5) % 60 + 3  # tiny vocabularies
    torch.testing.assert_close(ours.logits(ids), ref.logits(ids), rtol=0, atol=1e-4)
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    assert (
        ours.generate(ids, sampling).generated_token_ids
        == ref.generate(ids, sampling).generated_token_ids
    )


FUSED = ("llama", "llama-llama3", "qwen2-sliding", "qwen3-sliding", "smollm3-nope",
         "phi3-partial-sliding", "gemma3")  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FUSED)
def test_fused_decoder_stack_equals_the_python_loop(family, dtype, tmp_path, ext, clean_env):
    """The C++ layer loop runs the same kernels in the same order: bitwise equal logits on a
    ragged (left-padded) batch through prefill and decode, and it is really taken (with every
    position through the last layer: its last-token-only prefill is tested below)."""
    path = FACTORIES[family](tmp_path)
    fused = load(path, dtype, {"default": "avx512", "decoder_stack": "avx512"})
    loop = load(path, dtype, {"default": "avx512", "decoder_stack": "native"})
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}
    batch = ragged_batch()
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    calls = []
    with wrapped_stack(fused, every_position=True, calls=calls):
        got = fused.generate(batch, sampling, output_logits=True)
    want = loop.generate(batch, sampling, output_logits=True)
    assert len(calls) == NEW_TOKENS  # prefill + every decode step went through C++
    assert got.generated_token_ids == want.generated_token_ids
    for row in range(3):
        assert torch.equal(got.logits[row], want.logits[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_fused_stack_splits_the_small_ops_of_a_long_step_over_threads(family, dtype, tmp_path,
                                                                      ext, clean_env):  # fmt: skip
    """8 prompts of 48 tokens on 2 threads: enough rows that the norms, rope and Gemma's
    QK-norms (from ~8k values a thread) split their rows between the threads, with logits
    bitwise equal to the Python layer loop's."""
    path = FACTORIES[family](tmp_path)
    fused = load(path, dtype, {"default": "avx512", "decoder_stack": "avx512"})
    loop = load(path, dtype, {"default": "avx512", "decoder_stack": "native"})
    ids = torch.randint(3, 150, (8, 48), generator=torch.Generator().manual_seed(8))
    sampling = SamplingConfig(max_new_tokens=4, ignore_eos=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with wrapped_stack(fused, every_position=True):
            got = fused.generate(ids, sampling, output_logits=True)
        want = loop.generate(ids, sampling, output_logits=True)
    finally:
        torch.set_num_threads(threads)
    assert got.generated_token_ids == want.generated_token_ids
    for row in range(8):
        assert torch.equal(got.logits[row], want.logits[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_fused_stack_prefills_the_last_layer_for_the_last_tokens(family, dtype, tmp_path, ext,
                                                                 clean_env):  # fmt: skip
    """A forward that wants the next token only runs the last layer's attention, projection
    and MLP for each row's last token: the stack returns [B, 1, H] for the ragged prefill
    (decode steps have nothing to drop), the logits equal those of the full last layer within
    the rounding of one attention call (fp32 1e-4, bf16 a few ulps of the largest logit) and
    the tokens are the same."""
    path = FACTORIES[family](tmp_path)
    model = load(path, dtype, {"default": "avx512", "decoder_stack": "avx512"})
    batch = ragged_batch()
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    shapes: list = []
    with wrapped_stack(model, every_position=False, calls=shapes):
        got = model.generate(batch, sampling, output_logits=True)
    with wrapped_stack(model, every_position=True):
        want = model.generate(batch, sampling, output_logits=True)
    hidden = model.model.config.hidden_size
    assert shapes[0] == ((3, 1, hidden), True)  # the prefill: 3 last tokens of 14, 9, 3
    assert all(shape == (3, 1, hidden) for shape, _ in shapes)  # decode steps: [B, 1, H] too
    assert got.generated_token_ids == want.generated_token_ids
    for row in range(3):
        g, w = got.logits[row], want.logits[row]
        tol = 1e-4 if dtype == torch.float32 else 2**-6 * float(w.abs().max())
        torch.testing.assert_close(g, w, rtol=0, atol=tol)


def test_fused_stack_declines_odd_bf16_sizes(tmp_path, ext, clean_env):
    """bf16 weights multiply k-pairs and the C++ step's rows carry no pad lane: an odd
    intermediate size keeps the per-layer kernels, says why, and gives the same tokens."""
    from support.tiny import DIMS, NO_SPECIAL, save
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**DIMS, **NO_SPECIAL, "intermediate_size": 75})
    path = save(LlamaForCausalLM, cfg, tmp_path)
    model = load(path, torch.bfloat16, {"default": "avx512"})
    sites = [s for s in model.op_plan.sites if s[0] == "decoder_stack"]
    assert [s[1] for s in sites] == ["native"] and "odd K" in sites[0][2], sites
    ref = load(path, torch.bfloat16, {"default": "avx512", "decoder_stack": "native"})
    sampling = SamplingConfig(max_new_tokens=4, ignore_eos=True)
    ids = prompt(6, seed=1)[0] % 60 + 3
    assert model.generate(ids[None], sampling).generated_token_ids == ref.generate(
        ids[None], sampling
    ).generated_token_ids


def test_fused_stack_declines_with_reasons(tiny_llama, ext, clean_env):
    from pace_avx512.plugin import _stack_supports

    from pace_core.registry import OpContext

    profiled = LLMModel(tiny_llama, dtype=torch.float32, opconfig={"default": "avx512"},
                        profile=True, load_tokenizer=False)  # fmt: skip
    mixed = load(tiny_llama, torch.float32, {"default": "avx512", "gated_mlp": "native"})
    for model, reason in ((profiled, "per-op profiling"), (mixed, "also on native")):
        sites = [s for s in model.op_plan.sites if s[0] == "decoder_stack"]
        assert [s[1] for s in sites] == ["native"] and reason in sites[0][2], sites
    flat = _stack_supports(OpContext("decoder_stack", torch.float32, {"cache_layout": "flat"}))
    assert flat == "fuses steps over contiguous, paged, slab caches only, not 'flat'"
    for cache in ("paged", "slab_pool"):  # block caches are fused (block_buffers)
        model = LLMModel(tiny_llama, dtype=torch.float32, kv_cache_type=cache,
                         opconfig={"default": "avx512"}, load_tokenizer=False)  # fmt: skip
        assert model.op_plan.backends()["decoder_stack"] == {"avx512"}, cache
