"""Bad speculative configurations fail early with a clear ConfigError."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.spec_models import prompts, save_llama

from pace_core import LLMModel, SamplingConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import SeqSpec, Token
from pace_core.engine.offline import OFFLINE_ENGINE
from pace_core.errors import ConfigError
from pace_core.sampling.processors import BUILTIN_PROCESSORS
from pace_core.speculative import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
    check_vocab_compatible,
    coerce_spec_config,
)


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_k_must_be_positive_int(k, tmp_path):
    for make in (
        lambda: PromptLookupConfig(num_speculative_tokens=k),
        lambda: DraftSpecDecodeConfig(tmp_path, num_speculative_tokens=k),
        lambda: PardSpecDecodeConfig(tmp_path, num_speculative_tokens=k),
    ):
        with pytest.raises(ConfigError, match="num_speculative_tokens must be an int >= 1"):
            make()


def test_large_k_is_allowed(tmp_path):
    assert PardSpecDecodeConfig(tmp_path, num_speculative_tokens=64).num_speculative_tokens == 64


def test_ngram_bounds():
    with pytest.raises(ConfigError, match="min_ngram"):
        PromptLookupConfig(max_ngram=2, min_ngram=3)
    with pytest.raises(ConfigError, match="max_ngram"):
        PromptLookupConfig(max_ngram=0)


def test_dict_configs():
    assert coerce_spec_config({"method": "ngram", "max_ngram": 2}) == PromptLookupConfig(
        max_ngram=2
    )
    with pytest.raises(ConfigError, match="speculative decoding needs a 'method'"):
        coerce_spec_config({"k": 3})
    with pytest.raises(ConfigError, match="unknown key"):
        coerce_spec_config({"method": "prompt_lookup", "k": 3})
    with pytest.raises(ConfigError, match="speculative decoding takes"):
        coerce_spec_config(4)


def test_bad_dict_rejected_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="speculative"):
        LLMModel(tmp_path / "does-not-exist", spec_config={"k": 3})


def test_pard_without_mask_token(target_dir, draft_dir):
    with pytest.raises(ConfigError, match="no mask token.*pard_token"):
        LLMModel(
            target_dir,
            dtype=torch.float32,
            load_tokenizer=False,
            spec_config=PardSpecDecodeConfig(draft_dir),
        )
    with pytest.raises(ConfigError, match="not a token id"):
        LLMModel(
            target_dir,
            dtype=torch.float32,
            load_tokenizer=False,
            spec_config=PardSpecDecodeConfig(draft_dir, pard_token=500),
        )
    # given explicitly, any draft with a spare id works
    llm = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=PardSpecDecodeConfig(draft_dir, pard_token=0),
    )
    assert len(llm.generate(prompts()[:1], SamplingConfig(max_new_tokens=4)).sequences) == 1


def test_pard_mask_token_read_from_config(target_dir, pard_dir):
    llm = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config={"method": "pard", "model_name_or_path": pard_dir},
    )
    assert llm.speculator.new_proposer().mask_token == 128


def test_vocab_mismatch(target_dir, tmp_path):
    small = save_llama(tmp_path / "small", vocab=64, hidden=32, layers=1)
    with pytest.raises(ConfigError, match="vocab mismatch"):
        LLMModel(
            target_dir,
            dtype=torch.float32,
            load_tokenizer=False,
            spec_config=DraftSpecDecodeConfig(small),
        )


class _Tok:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_tokenizer_mismatch():
    same = _Tok({"a": 0, "b": 1})
    check_vocab_compatible(2, 3, same, _Tok({"a": 0, "b": 1, "<mask>": 2}))
    with pytest.raises(ConfigError, match="another id"):
        check_vocab_compatible(2, 2, same, _Tok({"a": 1, "b": 0}))


class _Unsafe:
    def __call__(self, logits, state):
        return logits


class _Safe(_Unsafe):
    speculative_safe = True


@pytest.mark.parametrize("proc", [_Unsafe, _Safe])
def test_plugin_processors_must_be_marked_safe(proc, target_dir):
    llm = LLMModel(
        target_dir, dtype=torch.float32, load_tokenizer=False, spec_config=PromptLookupConfig()
    )
    specs = [*BUILTIN_PROCESSORS, ("custom", 900, lambda cfgs: proc())]
    handle = dataclasses.replace(llm.handle, processors=specs)
    core = EngineCore(handle, OFFLINE_ENGINE, cache=llm.new_cache(), offline=True)
    cfg = SamplingConfig(max_new_tokens=3)
    core.submit([SeqSpec(str(i), p.tolist(), cfg) for i, p in enumerate(prompts()[:2])])
    if proc is _Unsafe:
        with pytest.raises(ConfigError, match="'custom'.*speculative_safe"):
            list(core.drive())
    else:
        events = [e for step in core.drive() for e in step if isinstance(e, Token)]
        assert len(events) == 6
