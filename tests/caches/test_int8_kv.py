"""The int8 KV cache (``kv_cache_dtype="int8"``) on the block caches, with the native kernels.

- The format (``pace_core.caches.kv_quant``): each (token, KV head) row is ``D`` int8 values
  and an fp32 scale per group of 32; read back within half a quantization step (``scale /
  2``) per value.
- Pools: int8 rows cost ``D + D / 8`` bytes, so a memory budget holds 1.78x the tokens at
  head dim 64 in bf16; the block layout identity and the prefix-caching namespace differ.
- Tiny models generate through int8 KV on paged and slab_pool. Rule vs bf16 KV, greedy: the
  tokens agree up to the first step whose bf16 top-2 logprob margin is under 0.1 (a near
  tie), and at every step up to that one KL(bf16 || int8) <= 0.02 (head dim 16 here: the
  real models' bound is measured by ``pace bench quality``, docs/quantization.md).
- Prefix caching adopts int8 blocks (same tokens as without); the disk tier keeps them.
- Bad combinations are ConfigErrors naming the value and the fix.
"""

from __future__ import annotations

import pytest
import torch
from pace_native import kernels as native
from support.tiny import FACTORIES

from pace_core import LLMModel, SamplingConfig, hookimpl
from pace_core.caches.blocks import PagedCache, SlabPoolCache
from pace_core.caches.disk_tier import DiskTier
from pace_core.caches.kv_quant import coerce_kv_dtype, pack_rows, quantize_rows, unpack_rows
from pace_core.errors import ConfigError, PluginError
from pace_core.ops import CONTRACT_VERSION
from pace_core.plugins import get_host, reset_host
from pace_core.registry import Registrations

NATIVE = {"default": "native"}
BLOCK_CACHES = ("paged", "slab_pool")


def load(path, cache: str = "paged", kv: str = "int8", **kw) -> LLMModel:
    return LLMModel(path, dtype=torch.bfloat16, kv_cache_type=cache, kv_cache_dtype=kv,
                    opconfig=NATIVE, load_tokenizer=False, **kw)  # fmt: skip


def prompts(rows: int = 2, length: int = 20) -> torch.Tensor:
    return torch.randint(3, 150, (rows, length), generator=torch.Generator().manual_seed(1))


# -- the format ------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 16, 64, 80, 256])
def test_rows_round_trip_within_half_a_step(d):
    x = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(d)).bfloat16()
    x[0, 0] = 0  # a zero row: zeros, scale 0
    x[1, 1, :5] *= 50  # an outlier channel costs its own group only
    q, scale = quantize_rows(x)
    groups = -(-d // 32)
    assert q.dtype == torch.int8 and scale.shape == (3, 5, groups) and q.abs().max() <= 127
    for g in range(groups):
        assert torch.equal(scale[..., g], x[..., 32 * g : 32 * g + 32].float().abs().amax(-1) / 127)
    rows = pack_rows(x)
    assert rows.shape == (3, 5, d + 4 * groups) and rows.dtype == torch.int8
    back = unpack_rows(rows)
    step = scale.repeat_interleave(32, -1)[..., :d]
    assert torch.all((back - x.float()).abs() <= step * (0.5 + 1e-5))  # + fp32 ulps
    assert torch.equal(back[0, 0], torch.zeros(d))


def test_kv_dtype_names():
    assert coerce_kv_dtype(None) == "auto" and coerce_kv_dtype("INT8") == "int8"
    assert coerce_kv_dtype(torch.int8) == "int8"
    with pytest.raises(ConfigError, match="kv_cache_dtype 'fp8'.*auto, int8"):
        coerce_kv_dtype("fp8")


# -- pools -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [PagedCache, SlabPoolCache])
def test_a_budget_holds_int8_rows_and_their_scales(cls):
    heads, dims = [3] * 4, [64] * 4
    bf16 = cls(heads, dims, torch.bfloat16, memory_gb=0.01, block_size=32)
    int8 = cls(heads, dims, torch.bfloat16, memory_gb=0.01, block_size=32, kv_dtype="int8")
    assert bf16.bytes_per_block == 4 * 3 * 2 * 64 * 2 * 32
    assert int8.bytes_per_block == 4 * 3 * 2 * (64 + 2 * 4) * 32  # int8 values + fp32 scales
    assert int8.num_blocks == int(0.01 * (1 << 30)) // int8.bytes_per_block
    assert int8.num_blocks / bf16.num_blocks == pytest.approx(128 / 72, rel=0.01)
    assert int8.keys[0].dtype == torch.int8 and int8.keys[0].shape[-1] == 72
    assert DiskTier.identity(int8) != DiskTier.identity(bf16)


def test_slab_blocks_fit_l2_with_int8_rows(monkeypatch):
    from pace_core.caches import blocks

    # K+V of a token: 8 heads x 2 x 128 values, 4096 bytes in bf16, 2304 as int8 rows
    monkeypatch.setattr(blocks, "l2_cache_bytes", lambda: 2 * 2304 * 128)
    monkeypatch.delenv("PACE_SLAB_BLOCK_TOKENS", raising=False)
    assert blocks.slab_block_tokens([8], [128], torch.bfloat16) == 64
    assert blocks.slab_block_tokens([8], [128], torch.bfloat16, kv_dtype="int8") == 128


@pytest.mark.parametrize("cls", [PagedCache, SlabPoolCache])
def test_update_stores_rows_that_read_back(cls):
    cache = cls([2], [16], torch.bfloat16, block_size=4, max_tokens=64, kv_dtype="int8")
    (seq,) = cache.add_sequences(1)
    k, v = (torch.randn(1, 2, 7, 16).bfloat16() for _ in range(2))
    cache.begin_step([seq], [7], 7)
    cache.update(0, k, v)
    cache.end_step()
    ((gk, gv),) = cache.get_kv_states(seq)
    assert gk.dtype == torch.bfloat16 and gk.shape == (2, 7, 16)
    assert torch.equal(gk, unpack_rows(pack_rows(k[0]), torch.bfloat16))
    assert torch.equal(gv, unpack_rows(pack_rows(v[0]), torch.bfloat16))


# -- models ----------------------------------------------------------------------------------
def assert_close_to_bf16(want, got) -> None:
    """The module doc's rule, per row: tokens agree until a bf16 near tie; KL bounded."""
    for r, (ta, tb) in enumerate(zip(want.generated_token_ids, got.generated_token_ids)):
        la = want.logits[r].float().log_softmax(-1)
        lb = got.logits[r].float().log_softmax(-1)
        top = la.topk(2).values
        tie = next((i for i, m in enumerate((top[:, 0] - top[:, 1]).tolist()) if m < 0.1), None)
        upto = len(ta) if tie is None else tie + 1
        agree = next((i for i in range(len(ta)) if ta[i] != tb[i]), len(ta))
        assert agree >= min(upto, len(ta)) - (0 if tie is None else 1), (r, agree, tie)
        steps = min(agree + 1, len(ta))
        kl = (la[:steps].exp() * (la[:steps] - lb[:steps])).sum(-1)
        assert kl.max() <= 0.02, (r, kl)


@pytest.mark.parametrize("cache", BLOCK_CACHES)
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding", "gemma3"])
def test_tiny_models_generate_through_int8_kv(family, cache, tmp_path):
    path = FACTORIES[family](tmp_path)
    sampling = SamplingConfig(max_new_tokens=10, ignore_eos=True)
    want = load(path, cache, "auto").generate(prompts(), sampling, output_logits=True)
    model = load(path, cache, "int8")
    assert model.op_plan.backends()["attention"] == {"native"}
    assert_close_to_bf16(want, model.generate(prompts(), sampling, output_logits=True))


def test_prefix_caching_adopts_int8_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "8")
    path = FACTORIES["llama"](tmp_path / "m")
    sampling = SamplingConfig(max_new_tokens=6, ignore_eos=True)
    prompt = torch.randint(3, 150, (1, 40), generator=torch.Generator().manual_seed(2))
    fresh = load(path, prefix_caching=False).generate(prompt, sampling).generated_token_ids
    model = load(path, prefix_cache_dir=tmp_path / "disk")
    assert model.generate(prompt, sampling).generated_token_ids == fresh
    assert model.generate(prompt, sampling).generated_token_ids == fresh  # adopted blocks
    cache = model._prefix_cache
    assert cache.prefix_hits >= 32 and cache.keys[0].dtype == torch.int8
    assert b"kv=int8" in model.kv_namespace and b"kv=" not in load(path, kv="auto").kv_namespace
    cache.disk.spill()
    cache.disk.store.flush()
    again = load(path, prefix_cache_dir=tmp_path / "disk")  # restored from disk
    assert again.generate(prompt, sampling).generated_token_ids == fresh
    assert again._prefix_cache.disk_hits >= 32


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["dynamic", "bmc"])
def test_contiguous_caches_refuse_int8(cache, tmp_path):
    with pytest.raises(ConfigError, match=f"kv_cache_dtype 'int8'.*'{cache}'.*paged"):
        load(FACTORIES["llama"](tmp_path), cache)


def test_unknown_kv_dtype_is_refused_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="kv_cache_dtype 'fp8'"):
        load(tmp_path / "nowhere", kv="fp8")


def test_latent_caches_refuse_int8(tmp_path):
    with pytest.raises(ConfigError, match="latent_attention.*not .int8.*kv_cache_dtype"):
        load(FACTORIES["deepseek-v3"](tmp_path))


class Bf16Only:
    """A plugin whose attention reads paged caches in the model dtype only, and whose own
    block cache does not declare int8."""

    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel("attention", "flat", native.attention, priority=5,
                            cache_layouts=("paged",))  # fmt: skip

    @hookimpl
    def pace_register_kv_caches(self, registry):
        registry.add_cache("plain_paged", PagedCache, layout="paged")


@pytest.fixture
def host_with_flat(monkeypatch):
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "avx512,tpp,onednn")
    reset_host()
    get_host().register(Bf16Only(), "flat")
    yield
    reset_host()


def test_kernels_that_cannot_read_int8_fall_back_or_refuse(host_with_flat, tmp_path):
    path = FACTORIES["llama"](tmp_path)
    auto = LLMModel(path, kv_cache_type="paged", kv_cache_dtype="int8", load_tokenizer=False)
    assert auto.op_plan.backends()["attention"] == {"native"}  # flat passed over, said why
    res = next(r for r in auto.op_plan.resolutions if r.op == "attention")
    assert ("flat", "reads KV cache dtypes auto, not 'int8'") in res.rejected
    with pytest.raises(ConfigError, match="'flat' cannot be used.*'int8'.*kv_cache_dtype"):
        LLMModel(path, kv_cache_type="paged", kv_cache_dtype="int8", load_tokenizer=False,
                 opconfig={"attention": "flat"})  # fmt: skip
    with pytest.raises(ConfigError, match="'int8' is not supported by kv_cache_type 'plain_"):
        LLMModel(path, kv_cache_type="plain_paged", kv_cache_dtype="int8")


def test_plugins_declare_known_kv_dtypes():
    reg = Registrations("p")
    with pytest.raises(PluginError, match="unknown KV cache dtype"):
        reg.add_cache("c", PagedCache, layout="paged", kv_dtypes=("fp8",))
    reg.add_cache("c", PagedCache, layout="paged")
    assert reg.caches[0].kv_dtypes == {"auto"}  # a plugin cache stores the model dtype only


def test_cli_flags_reach_the_model_options():
    import argparse

    from pace_core.cli import build_parser
    from pace_core.server.launch.cli import add_serve_parser, serve_configs

    parser = argparse.ArgumentParser(prog="pace")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    options = serve_configs(parser.parse_args(["serve", "--kv-cache-dtype", "int8"]))[0]
    assert options["kv_cache_dtype"] == "int8"
    assert serve_configs(parser.parse_args(["serve"]))[0]["kv_cache_dtype"] == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--kv-cache-dtype", "fp8"])
    args = build_parser().parse_args(["generate", "hi", "--kv-cache-dtype", "int8"])
    assert args.kv_cache_dtype == "int8"
