"""LLMModel.embed: pooled hidden states through the engine core, checked against
transformers' ``last_hidden_state`` on the same weights (fp32), with the sentence-transformers
rules a model directory may carry."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from transformers import AutoModel

from pace_core import LLMModel, SamplingConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import Embedding, EmbedSpec, SeqSpec, Token
from pace_core.engine.offline import OFFLINE_ENGINE
from pace_core.errors import ConfigError, ModelLoadError

PROMPTS = [[5, 6, 7], [9, 3, 11, 12, 40, 41, 42, 43, 44, 2, 17], [60]]
TOL = 2e-5


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)


@pytest.fixture(scope="module")
def states(tiny_llama_dir):
    """transformers' last_hidden_state of each prompt, ``[T, H]``."""
    hf = AutoModel.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return [hf(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


def test_default_is_the_last_token_normalised(tiny, states):
    got = tiny.embed(PROMPTS)
    want = torch.stack([unit(h[-1]) for h in states])
    assert got.shape == (3, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert tiny.embedding_head.config.source == "default"


@pytest.mark.parametrize(
    ("pooling", "reference"),
    [
        ("mean", lambda h: h.mean(0)),
        ("cls", lambda h: h[0]),
        ("max", lambda h: h.amax(0)),
        (("cls", "mean"), lambda h: torch.cat([h[0], h.mean(0)])),
    ],
)
def test_pooling_modes_match_transformers_states(tiny, states, pooling, reference):
    got = tiny.embed(PROMPTS, pooling=pooling, normalize=False)
    torch.testing.assert_close(got, torch.stack([reference(h) for h in states]), atol=TOL, rtol=0)


def test_chunked_prefill_pools_across_chunks(tiny_llama_dir, states):
    """Prompts prefilled 4 tokens per step pool the same vectors as whole ones."""
    llm = LLMModel(
        tiny_llama_dir, dtype=torch.float32, load_tokenizer=False,
        engine_config=replace(OFFLINE_ENGINE, max_prefill_tokens=4),
    )  # fmt: skip
    got = llm.embed(PROMPTS, pooling="mean")
    want = torch.stack([unit(h.mean(0)) for h in states])
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_embeddings_and_generation_share_one_core(tiny, states):
    """An embedding and a generation in the same engine steps: each answers as if alone."""
    greedy = SamplingConfig(max_new_tokens=6, ignore_eos=True)
    alone = tiny.generate([PROMPTS[0]], greedy).sequences[0].token_ids
    core = EngineCore(tiny.handle, OFFLINE_ENGINE, cache=tiny.new_cache(), offline=True)
    core.submit([
        SeqSpec("gen", PROMPTS[0], greedy),
        SeqSpec("emb", PROMPTS[1], greedy, embed=EmbedSpec(("mean",))),
    ])  # fmt: skip
    tokens, vectors = [], {}
    for events in core.drive():
        for ev in events:
            if isinstance(ev, Token):
                tokens.append(ev.token)
            elif isinstance(ev, Embedding):
                vectors[ev.key] = ev
    assert tokens == alone
    assert vectors["emb"].prompt_tokens == len(PROMPTS[1])
    torch.testing.assert_close(vectors["emb"].vector, unit(states[1].mean(0)), atol=TOL, rtol=0)
    assert core.cache.num_free_blocks == core.cache.num_blocks  # every KV block came back


def _sentence_transformers_dir(src, dst, *, dense_out=16, prompt="query: "):
    """``src`` with sentence-transformers files: cls+mean pooling, a tanh Dense layer,
    Normalize, a default prompt."""
    shutil.copytree(src, dst)
    st = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": st + "Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": st + "Normalize"},
    ]
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_cls_token": True,
               "pooling_mode_mean_tokens": True, "include_prompt": True}  # fmt: skip
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (dst / "2_Dense").mkdir()
    dense = {"in_features": 128, "out_features": dense_out, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    (dst / "2_Dense" / "config.json").write_text(json.dumps(dense))
    torch.manual_seed(1)
    weights = {"linear.weight": torch.randn(dense_out, 128), "linear.bias": torch.randn(dense_out)}
    from safetensors.torch import save_file

    save_file(weights, str(dst / "2_Dense" / "model.safetensors"))
    (dst / "3_Normalize").mkdir()
    st = {"prompts": {"query": prompt}, "default_prompt_name": "query"}
    (dst / "config_sentence_transformers.json").write_text(json.dumps(st))
    return weights


def test_sentence_transformers_rules_are_followed(tiny_llama_dir, tmp_path, states):
    path = tmp_path / "st"
    w = _sentence_transformers_dir(tiny_llama_dir, path)
    llm = LLMModel(path, dtype=torch.float32, load_tokenizer=False)
    cfg = llm.embedding_head.config
    assert (cfg.source, cfg.pooling, cfg.normalize, cfg.dimensions, cfg.prompt) == (
        "sentence-transformers",
        ("cls", "mean"),
        True,
        16,
        "query: ",
    )
    got = llm.embed(PROMPTS)
    pooled = torch.stack([torch.cat([h[0], h.mean(0)]) for h in states])
    want = unit(torch.tanh(pooled @ w["linear.weight"].T + w["linear.bias"]))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_dimensions_only_where_the_model_allows_them(tiny_llama_dir, tmp_path, tiny, states):
    with pytest.raises(ConfigError, match="not trained for shortened"):
        tiny.embed(PROMPTS, dimensions=8)
    path = tmp_path / "matryoshka"
    shutil.copytree(tiny_llama_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [64, 32, 8]}))
    llm = LLMModel(path, dtype=torch.float32, load_tokenizer=False)
    got = llm.embed(PROMPTS, dimensions=8)
    want = torch.stack([unit(h[-1][:8]) for h in states])
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    with pytest.raises(ConfigError, match="dimensions=12 is not one this model allows: 64, 32, 8"):
        llm.embed(PROMPTS, dimensions=12)


def test_bad_embedding_input_is_a_clear_error(tiny_llama_dir, tmp_path, tiny):
    with pytest.raises(ConfigError, match="pooling 'median'"):
        tiny.embed(PROMPTS, pooling="median")
    with pytest.raises(ConfigError, match="prompt 0 is empty"):
        tiny.embed([[]])
    path = tmp_path / "bad_st"
    shutil.copytree(tiny_llama_dir, path)
    (path / "modules.json").write_text(
        json.dumps([{"path": "1_X", "type": "sentence_transformers.models.WeightedLayerPooling"}])
    )
    with pytest.raises(ModelLoadError, match="WeightedLayerPooling"):
        LLMModel(path, dtype=torch.float32, load_tokenizer=False).embed(PROMPTS)
    both_ways = tmp_path / "encoder"
    shutil.copytree(tiny_llama_dir, both_ways)
    config = json.loads((both_ways / "config.json").read_text())
    config["use_bidirectional_attention"] = True
    (both_ways / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="bidirectionally"):
        LLMModel(both_ways, dtype=torch.float32, load_tokenizer=False).embed(PROMPTS)


def test_a_prompt_as_long_as_the_context_window_embeds(tiny):
    """An embedding decodes no token, so a prompt may fill the window (64 here), as served;
    generation keeps one position for its first new token."""
    full = torch.randint(4, 100, (1, 64))
    assert tiny.embed(full).shape[0] == 1
    with pytest.raises(ConfigError, match=r"65 tokens; the model's context window is 64$"):
        tiny.embed(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"64 tokens; .* is 64 \(one position is left for"):
        tiny.generate(full)
