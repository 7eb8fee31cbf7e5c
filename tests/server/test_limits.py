"""The context window comes from one rule (pace_core.models.limits) for both front doors."""

from __future__ import annotations

from support.tiny import FACTORIES

from pace_core.engine.config import EngineConfig
from pace_core.engine.llm import LLMModel
from pace_core.models.limits import serving_context_window
from pace_core.models.loader import load_config
from pace_core.server.frontdoor.server import Server


def test_multi_instance_gets_the_longrope_clamp(tmp_path, word_tokenizer):
    """A tiny Phi-3 LongRoPE (64 positions, original 16): the multi-instance front door,
    which never loads the weights, serves the same context window as the in-process one."""
    path = FACTORIES["phi3-longrope"](tmp_path / "phi3")
    word_tokenizer.save_pretrained(str(path))
    model_args = {"model": str(path), "dtype": "float32", "kv_cache_type": "paged"}
    llm = LLMModel(**model_args, max_cache_tokens=256, quiet=True)
    engine = EngineConfig(threads=1)
    local = Server.in_process(llm, engine)
    multi = Server.multi_instance({**model_args, "max_cache_tokens": 256}, 1, engine, cores=[0])
    assert llm.model.reprefill_at == 16 and load_config(path).max_position_embeddings == 64
    assert multi.max_context == local.max_context == 16
    assert serving_context_window(llm.model.config) == 16
    assert multi.vocab_size == local.vocab_size == llm.model.vocab_size
    assert multi.gen_defaults == local.gen_defaults
    assert not multi.frontend.instances[0].healthy  # constructed, never started
