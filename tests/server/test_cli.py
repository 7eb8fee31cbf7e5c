"""`pace serve` argument parsing and set-up errors (no model load)."""

from __future__ import annotations

import argparse

import pytest

from pace_core.engine.config import EngineConfig
from pace_core.errors import ConfigError
from pace_core.server.launch.cli import add_serve_parser, build_server


def _parse(argv):
    parser = argparse.ArgumentParser(prog="pace")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_defaults():
    args = _parse(["serve"])
    assert args.model is None and args.host == "127.0.0.1" and args.port == 8000
    assert args.kv_cache_type == "paged" and args.instances == 1
    assert args.max_prefill_tokens == 512 and callable(args.func)


@pytest.mark.parametrize("flag", ["--threads", "--tensor-parallel"])
def test_counts_below_one_exit_2(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(["serve", flag, "0"])
    assert exc.value.code == 2 and f"argument {flag}: '0': expected a value >= 1" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(("argv", "expected"), [
    (["--port", "70000"], "expected a value in [0, 65535]"),
    (["--kv-cache-memory-gb", "0"], "expected a value > 0"),
    (["--prefix-cache-disk-gb", "nan"], "expected a value > 0"),
    (["--max-cache-tokens", "0"], "expected a value >= 1"),
    (["--max-running", "-1"], "expected a value >= 1"),
    (["--max-queue", "-1"], "expected a value >= 0"),
    (["--max-prefill-tokens", "x"], "'x' is not a int"),
    (["--prefill-slice-ms", "-5"], "expected a value >= 0"),
    (["--request-timeout", "-1"], "expected a value >= 0"),
    (["--max-request-bytes", "0"], "expected a value >= 1"),
    (["--default-max-tokens", "0"], "expected a value >= 1"),
    (["--replicas", "0"], "expected a value >= 1"),
])  # fmt: skip
def test_numbers_out_of_range_exit_2(argv, expected, capsys):
    """Every numeric flag is checked by argparse: one line naming it, before any load."""
    with pytest.raises(SystemExit) as exc:
        _parse(["serve", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {argv[0]}: " in err and expected in err


def test_flags():
    args = _parse(
        [
            "serve",
            "smollm2",
            "--port",
            "9001",
            "--instances",
            "2",
            "--api-key",
            "k",
            "--max-cache-tokens",
            "4096",
            "--request-timeout",
            "0",
            "--served-model-name",
            "m",
        ]
    )
    assert (args.model, args.port, args.instances, args.api_key) == ("smollm2", 9001, 2, "k")
    assert args.max_cache_tokens == 4096 and args.request_timeout == 0


@pytest.mark.parametrize("cache", ["dynamic", "bmc"])
def test_contiguous_cache_is_rejected(cache):
    with pytest.raises(ConfigError, match="block cache"):
        build_server(_parse(["serve", "--kv-cache-type", cache]))


def test_engine_rejects_a_contiguous_cache(tiny_llama_dir):
    from pace_core.engine.llm import LLMModel

    llm = LLMModel(tiny_llama_dir, kv_cache_type="dynamic", load_tokenizer=False, quiet=True)
    with pytest.raises(ConfigError, match="'dynamic' cannot serve.*'paged'"):
        llm.handle.serving_cache(prefix_caching=True)


def test_engine_config_validation():
    with pytest.raises(ConfigError):
        EngineConfig(max_running=0)
    with pytest.raises(ConfigError):
        EngineConfig(max_prefill_tokens=0)
