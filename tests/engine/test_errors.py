"""Bad input gets a clear error that names the bad value and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pace_core import LLMModel, SamplingConfig
from pace_core.errors import ConfigError, ModelLoadError


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unsupported_dtype(tiny_llama_dir):
    with pytest.raises(ConfigError, match="float16"):
        LLMModel(tiny_llama_dir, dtype=torch.float16, load_tokenizer=False)


def test_unknown_cache_type(tiny_llama_dir):
    with pytest.raises(ConfigError, match="kv_cache_type 'pagd'.*dynamic"):
        LLMModel(tiny_llama_dir, kv_cache_type="pagd", load_tokenizer=False)


def test_bad_opconfig(tiny_llama_dir):
    with pytest.raises(ConfigError, match="unknown op 'linaer'.*did you mean 'linear'"):
        LLMModel(tiny_llama_dir, opconfig={"linaer": "native"}, load_tokenizer=False)
    with pytest.raises(ConfigError, match="unknown backend 'fastest'"):
        LLMModel(tiny_llama_dir, opconfig="linear=fastest", load_tokenizer=False)


def test_missing_model_dir_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not a local directory.*HF_HUB_OFFLINE"):
        LLMModel("no-such-org/no-such-model", load_tokenizer=False)


def test_a_gguf_file_without_its_suffix_is_named(tmp_path):
    (tmp_path / "model.GGUF").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelLoadError, match="GGUF file named without the .gguf suffix"):
        LLMModel(tmp_path / "model.GGUF", load_tokenizer=False)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="is a file but not a GGUF model"):
        LLMModel(tmp_path / "notes.txt", load_tokenizer=False)


def test_dir_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LLMModel(tmp_path, load_tokenizer=False)


def test_truncated_weights(tiny_llama_dir, tmp_path):
    path = copy_model(tiny_llama_dir, tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors.*truncated or corrupt"):
        LLMModel(path, load_tokenizer=False)


def test_missing_and_unexpected_tensors(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = copy_model(tiny_llama_dir, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.extra.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        LLMModel(path, load_tokenizer=False)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"unexpected tensors: model\.extra\.weight.*strict=False"
    ):
        LLMModel(path, load_tokenizer=False)
    LLMModel(path, load_tokenizer=False, strict=False)  # tolerated when asked


def test_unsupported_model_type(tiny_llama_dir, tmp_path):
    path = copy_model(tiny_llama_dir, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "bert"  # transformers knows it (BertLMHeadModel): not these weights
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="'bert' checkpoint.*missing tensors"):
        LLMModel(path, load_tokenizer=False)
    cfg["model_type"] = "no_such_arch"  # neither pace nor transformers knows it
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="no_such_arch"):
        LLMModel(path, load_tokenizer=False)


def test_bad_prompts(tiny):
    with pytest.raises(ConfigError, match="empty"):
        tiny.generate([[1, 2], []])
    with pytest.raises(ConfigError, match="token id 500 outside the vocabulary"):
        tiny.generate(torch.tensor([[1, 500]]))
    with pytest.raises(ConfigError, match="context window is 64"):
        tiny.generate(torch.ones(1, 64, dtype=torch.long))
    with pytest.raises(ConfigError, match="need a tokenizer"):
        tiny.generate("hello")
    with pytest.raises(ConfigError, match="unsupported generate"):
        tiny.generate(3.5)
    with pytest.raises(ConfigError, match="2 sampling configs for 1 prompts"):
        tiny.generate(torch.tensor([[1, 2]]), [SamplingConfig(), SamplingConfig()])


def test_bad_inputs_of_every_shape(tiny):
    """Inputs the engine cannot read are ConfigErrors naming the fix, never an internal error
    (a KeyError, torch's ragged-list error, truncated float ids, an empty batch)."""
    beams = SamplingConfig(max_new_tokens=2, num_beams=2)
    bad = [
        ({"foo": 1}, "needs input_ids"),
        ({"input_ids": [[1, 2, 3], [4]]}, "pad them"),
        (torch.zeros(0, 3, dtype=torch.long), "no prompts"),
        (torch.tensor([1.5, 2.0]), "integer tensor, not torch.float32"),
        (torch.tensor([True, False]), "integer tensor, not torch.bool"),
        (b"hi", "decode them"),
    ]
    for inputs, match in bad:
        with pytest.raises(ConfigError, match=match):
            tiny.generate(inputs, SamplingConfig(max_new_tokens=2))
    assert tiny.generate([1, 2, 3], SamplingConfig(max_new_tokens=2)).output_token_ids.shape[0] == 1
    # beam search and logits check their prompts as generate does
    with pytest.raises(ConfigError, match="token id 500 outside the vocabulary"):
        tiny.generate(torch.tensor([[1, 500]]), beams)
    with pytest.raises(ConfigError, match="token id 500 outside the vocabulary"):
        tiny.logits(torch.tensor([[1, 500]]))
    with pytest.raises(ConfigError, match="context window is 64"):
        tiny.generate(torch.ones(1, 64, dtype=torch.long), beams)
    with pytest.raises(ConfigError, match="sampling_config must be SamplingConfig"):
        tiny.generate([1, 2], {"max_new_tokens": 2})
    with pytest.raises(ConfigError, match="a streamer takes 1 prompt, not 2"):
        tiny.generate([[1, 2], [3, 4]], SamplingConfig(max_new_tokens=2), streamer=object())
    with pytest.raises(ConfigError, match="not stream"):
        list(tiny.stream([1, 2], beams))


def test_stop_strings_without_a_tokenizer_are_refused(tiny):
    """They match text, which a model without a tokenizer has none of (they were ignored:
    the output ran to max_new_tokens)."""
    with pytest.raises(ConfigError, match="stop strings match the text.*eos_token_id"):
        tiny.generate([1, 2], SamplingConfig(max_new_tokens=2, stop=["."]))


def test_beam_search_refuses_what_it_would_ignore(tiny):
    """Settings beam search does not apply are refused, never dropped; ids it applies are
    checked against the vocabulary."""
    for kw in ({"stop": ["x"]}, {"logprobs": 2}, {"prompt_logprobs": 1}):
        cfg = SamplingConfig(max_new_tokens=2, num_beams=2, **kw)
        with pytest.raises(ConfigError, match=f"beam search does not support {next(iter(kw))}"):
            tiny.generate([1, 2], cfg)
    cfg = SamplingConfig(max_new_tokens=2, num_beams=2, logit_bias={500: 1.0})
    with pytest.raises(ValueError, match="logit_bias token ids must be < vocab_size=128"):
        tiny.generate([1, 2], cfg)


def test_bad_sampling_config():
    with pytest.raises(ValueError, match="stop must be a list"):
        SamplingConfig(stop=5)
    with pytest.raises(ValueError, match="stop must be a list"):
        SamplingConfig(stop={"a": 1})
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokenz.*max_new_tokens"):
        SamplingConfig.from_dict({"max_new_tokenz": 3})


def test_spec_config_rejected_clearly(tiny_llama_dir):
    with pytest.raises(ConfigError, match="speculative"):
        LLMModel(tiny_llama_dir, spec_config={"k": 3}, load_tokenizer=False)
    with pytest.raises(ConfigError, match="method 'draft' needs \\['model_name_or_path'\\]"):
        LLMModel(tiny_llama_dir, spec_config={"method": "draft"}, load_tokenizer=False)


@pytest.mark.parametrize(("kw", "match"), [
    ({"max_cache_tokens": 0}, "max_cache_tokens must be a count >= 1 \\(got 0\\)"),
    ({"max_cache_tokens": "100"}, "max_cache_tokens must be a count >= 1 \\(got '100'\\)"),
    ({"kv_cache_memory_gb": "1"}, "kv_cache_memory_gb must be a number > 0"),
    ({"kv_cache_memory_gb": 1e6}, "kv_cache_memory_gb=1000000.0 asks for a 1000000.0 GiB KV "
                                  "pool, more than the .* GiB of memory"),
    ({"kv_cache_type": "dynamic", "kv_cache_memory_gb": 1}, "kv_cache_type 'dynamic' grows per "
                                                           "sequence instead"),
    ({"kv_cache_type": ["paged"]}, "unknown kv_cache_type \\['paged'\\]; available: bmc"),
    ({"prefix_cache_dir": "unused", "prefix_cache_disk_gb": "x"},
     "prefix_cache_disk_gb must be a number > 0 \\(got 'x'\\)"),
])  # fmt: skip
def test_bad_kv_options_are_named_before_the_load(tiny_llama_dir, kw, match, monkeypatch):
    """A budget of the wrong type, 0, more than the machine has (was an OSError from mmap at
    the first generate) or for a cache that ignores it; a cache type that is no name."""
    import pace_core.engine.llm as llm_module

    def no_load(*args, **kwargs):
        raise AssertionError("the model was looked up before its options were checked")

    monkeypatch.setattr(llm_module, "resolve_model_path", no_load)
    with pytest.raises(ConfigError, match=match):
        LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, **kw)


def test_a_token_budget_beyond_memory_is_named(tiny_llama_dir):
    """A token count's pool size needs the model's dims: checked when the cache is made."""
    llm = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
                   max_cache_tokens=10**13)  # fmt: skip
    with pytest.raises(ConfigError, match="max_cache_tokens=10000000000000 asks for a .* GiB"):
        llm.generate([1, 2], SamplingConfig(max_new_tokens=2))


def test_model_and_tokenizer_of_the_wrong_kind(tiny_llama_dir, smollm2_dir):
    with pytest.raises(ConfigError, match="model must be a directory.*not int 5"):
        LLMModel(5)
    with pytest.raises(ConfigError, match="tokenizer must be a tokenizer .* not int 3"):
        LLMModel(tiny_llama_dir, tokenizer=3)
    # a path (or name) loads the tokenizer there, as vLLM's tokenizer= does
    llm = LLMModel(smollm2_dir, dtype=torch.float32, quiet=True, load_tokenizer=False,
                   tokenizer=str(smollm2_dir))  # fmt: skip
    assert llm.generate("Hello", SamplingConfig(max_new_tokens=2)).generated_token_ids[0]


def test_bad_chat_messages_are_named(smollm2_dir):
    llm = LLMModel(smollm2_dir, dtype=torch.float32, quiet=True)
    with pytest.raises(ConfigError, match="chat template cannot render these messages"):
        llm.generate([{"role": "user"}], SamplingConfig(max_new_tokens=2))
    with pytest.raises(ConfigError, match="a chat message needs a 'role'.*\\['content'\\]"):
        llm.generate([{"content": "hi"}], SamplingConfig(max_new_tokens=2))


def test_more_tensor_parallel_ranks_than_cores_are_named():
    from pace_core.parallel.config import TensorParallelConfig

    with pytest.raises(ConfigError, match="tensor_parallel=100000: .* use at most"):
        TensorParallelConfig(100_000).rank_plans()


def test_bad_embedding_options_are_named(smollm2_dir):
    llm = LLMModel(smollm2_dir, dtype=torch.float32, quiet=True)
    for kw, match in (({"pooling": 5}, "pooling 5: use one or more of"),
                      ({"dimensions": "10"}, "dimensions must be a positive integer, not '10'"),
                      ({"dimensions": 576.0}, "not 576.0"),
                      ({"normalize": "no"}, "normalize must be True, False or None")):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            llm.embed("Hello", **kw)
    assert llm.embed("Hello", dimensions=576).shape == (1, 576)


def test_no_cache_plugin_is_named_with_the_fix():
    """With pace.caches disabled the message showed an enum repr and an empty list."""
    from pace_core.caches import KVCacheType
    from pace_core.engine.kv_choice import choose_kv_cache
    from pace_core.registry import Registry

    none = Registry("KV cache", lambda s: s.name)
    message = (r"unknown kv_cache_type 'paged'; available: none: no plugin registers a KV cache "
               r"\(is pace.caches in PACE_DISABLE_PLUGINS")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        choose_kv_cache(none, KVCacheType.PAGED, None)
