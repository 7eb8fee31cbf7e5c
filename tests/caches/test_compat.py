"""Attention backends declare the cache layouts they read; pairs are validated at build."""

from __future__ import annotations

import pytest
import torch
from pace_native import kernels

from pace_core import LLMModel, hookimpl
from pace_core.errors import ConfigError
from pace_core.ops import CONTRACT_VERSION
from pace_core.plugins import get_host, reset_host


class ContiguousOnly:
    """A plugin whose attention reads only contiguous caches."""
    PACE_CONTRACT_VERSION = CONTRACT_VERSION


    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel(
            "attention", "flat", kernels.attention, priority=5, cache_layouts=("contiguous",)
        )


@pytest.fixture
def host_with_flat(monkeypatch):
    # Only native and "flat" provide attention here, whatever else is installed.
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "avx512,tpp,onednn")
    reset_host()
    host = get_host()
    host.register(ContiguousOnly(), "flat")
    yield host
    reset_host()


def pool(cache: str) -> dict[str, int]:
    """A small pool for a block cache; the contiguous ones grow (a budget is refused)."""
    return {} if cache in ("dynamic", "bmc") else {"max_cache_tokens": 1024}


@pytest.mark.parametrize("cache", ["dynamic", "bmc", "paged", "slab_pool"])
def test_auto_picks_a_compatible_backend(host_with_flat, tiny_llama_dir, cache):
    model = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                     kv_cache_type=cache, **pool(cache))  # fmt: skip
    chosen = model.op_plan.backends()["attention"]
    assert chosen == ({"flat"} if cache in ("dynamic", "bmc") else {"native"})
    assert model.generate(torch.tensor([[1, 2, 3]])).sequences[0].token_ids


def test_pinned_incompatible_pair_is_an_error(host_with_flat, tiny_llama_dir):
    with pytest.raises(ConfigError, match="'flat' cannot be used.*compatible backends: native"):
        LLMModel(
            tiny_llama_dir,
            load_tokenizer=False,
            kv_cache_type="paged",
            opconfig={"attention": "flat"},
        )


def test_all_caches_give_identical_greedy_tokens(tiny_llama_dir):
    prompts = [
        torch.tensor([5, 6, 7]),
        torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1]),
        torch.tensor([4]),
    ]
    outs = []
    for cache in ("dynamic", "bmc", "paged", "slab_pool"):
        model = LLMModel(
            tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, kv_cache_type=cache,
            **pool(cache),
        )  # fmt: skip
        outs.append(model.generate(prompts).generated_token_ids)
    assert all(o == outs[0] for o in outs)


def test_kv_cache_type_enum_is_accepted_wherever_a_name_is(tiny_llama_dir):
    from pace_core import KVCacheType

    assert [t.value for t in KVCacheType] == ["dynamic", "bmc", "paged", "slab_pool"]
    assert set(KVCacheType) <= set(get_host().caches)  # every member names a registered cache
    model = LLMModel(
        tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, kv_cache_type=KVCacheType.PAGED
    )
    assert model.kv_cache_type == "paged" and type(model.kv_cache_type) is str
    by_name = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                       kv_cache_type="paged")  # fmt: skip
    prompt = [torch.tensor([5, 6, 7])]
    tokens = model.generate(prompt).generated_token_ids
    assert tokens == by_name.generate(prompt).generated_token_ids
    with pytest.raises(ConfigError, match="unknown kv_cache_type 'pagd'"):
        LLMModel(tiny_llama_dir, load_tokenizer=False, kv_cache_type="pagd")
