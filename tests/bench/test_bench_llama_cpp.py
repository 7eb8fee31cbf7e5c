"""The newest llama.cpp as a benchmark peer (``pace_bench.llama_cpp_tools``): where its programs
are looked for, how ``llama-bench`` turns are timed by its own clock next to pace's, and how
``llama-server`` is started. The programs here are stand-in scripts that print what the real
ones print; the real ones come from ``make bench-llama-cpp``."""

from __future__ import annotations

import argparse
import stat

import pytest
import torch
from pace_bench import llama_cpp_tools, serving, serving_peers
from pace_bench.offline import measure_point

# A llama-bench that reports 1 ms per prompt token and 10 ms per generated one (its -pg test
# reports the prompt and the generated tokens as one time), in its JSON output.
FAKE_BENCH = """#!/usr/bin/env python3
import json, sys
a = sys.argv
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
if "-pg" in a:
    p, n = map(int, a[a.index("-pg") + 1].split(","))
print(json.dumps([{"n_prompt": p, "n_gen": n, "avg_ns": int((p * 1e-3 + n * 1e-2) * 1e9)}]))
"""


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """An empty peers cache; returns where llama.cpp's programs would be built."""
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    return llama_cpp_tools.tree() / "build" / "bin"


def _install(bin_dir, name, text="#!/bin/sh\n"):
    bin_dir.mkdir(parents=True, exist_ok=True)
    program = bin_dir / name
    program.write_text(text)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def test_absent_programs_say_how_to_build_them(tools, tmp_path):
    assert llama_cpp_tools.find_tool("llama-bench") is None
    with pytest.raises(llama_cpp_tools.PeerUnavailable, match="make bench-llama-cpp"):
        llama_cpp_tools.LlamaBenchRunner(tmp_path / "m.gguf")
    with pytest.raises(llama_cpp_tools.PeerUnavailable, match="make bench-llama-cpp"):
        serving_peers.llama_server_spec(tmp_path / "m.gguf", threads=2, slots=8, ctx_per_slot=512)
    args = argparse.Namespace(engines=["pace", "llama-server"], modes=["continuous"], quiet=True)
    plan, skipped = serving.contenders(args)
    assert plan == [("pace", "continuous")]
    assert "make bench-llama-cpp" in skipped["llama-server"]


def test_llama_bench_turns_are_timed_by_its_own_clock(tools, tmp_path):
    _install(tools, "llama-bench", FAKE_BENCH)
    runner = llama_cpp_tools.LlamaBenchRunner(tmp_path / "m.gguf")
    ids = torch.zeros(1, 100, dtype=torch.long)
    out = measure_point({"llama-bench": runner}, ids, argparse.Namespace(new_tokens=11, repeats=2))
    r = out["llama-bench"]
    assert r["ttft_s"] == pytest.approx(0.1)  # 100 prompt tokens, no process start counted
    assert r["prefill_tok_s"] == pytest.approx(1000.0)
    assert r["decode_tok_s"] == pytest.approx(100.0)  # 10 tokens after the first, 10 ms each
    with pytest.raises(ValueError, match="batches of one"):
        runner(torch.zeros(2, 100, dtype=torch.long), 4)


def test_a_failing_llama_bench_is_an_error_with_its_output(tools, tmp_path):
    _install(tools, "llama-bench", "#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    with pytest.raises(RuntimeError, match="failed to load model"):
        llama_cpp_tools.bench_seconds(tmp_path / "m.gguf", 1, ["-p", "8", "-n", "0"])


def test_llama_server_gets_its_slots_threads_and_context(tools, tmp_path):
    _install(tools, "llama-server")
    spec = serving_peers.llama_server_spec(tmp_path / "m.gguf", threads=2, slots=32,
                                           ctx_per_slot=500)  # fmt: skip
    cmd = spec.cmd
    assert cmd[cmd.index("-m") + 1] == str(tmp_path / "m.gguf")
    assert cmd[cmd.index("-np") + 1] == "32" and cmd[cmd.index("-c") + 1] == str(32 * 500)
    assert cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-tb") + 1] == "2"
    assert cmd[cmd.index("--port") + 1] == str(spec.port)
    assert spec.exact_length(16) == {"ignore_eos": True}  # it takes no min_tokens


def test_status_lists_every_program(tools, capsys):
    _install(tools, "llama-server")
    assert llama_cpp_tools.main(["status"]) == 0
    out = capsys.readouterr().out
    assert str(tools / "llama-server") in out
    assert "llama-bench" in out and "not built (run `make bench-llama-cpp`)" in out


def _serving_args(argv):
    p = argparse.ArgumentParser()
    serving.add_arguments(p)
    return serving.resolve_defaults(p.parse_args(argv))


def test_gguf_serving_gives_every_engine_the_same_file(tools, tmp_path, monkeypatch):
    """``--gguf q4_k_m``: pace and llama-server serve the model's llama.cpp-made GGUF; an
    engine that reads no GGUF is refused with the reason."""
    from pace_bench import peers

    made = tmp_path / "m.q4_k_m.gguf"
    monkeypatch.setattr(peers, "quantized_gguf", lambda model_dir, ftype: made)
    _install(tools, "llama-server")
    args = _serving_args(["--engines", "pace", "llama-server", "--gguf", "q4_k_m",
                          "--threads", "2", "--concurrency", "8", "32"])  # fmt: skip
    pace = serving.server_spec("pace", "continuous", args, tmp_path)
    assert pace.cmd[pace.cmd.index("serve") + 1] == str(made)
    llama = serving.server_spec("llama-server", "continuous", args, tmp_path)
    assert llama.cmd[llama.cmd.index("-m") + 1] == str(made)
    assert llama.cmd[llama.cmd.index("-np") + 1] == "32"  # the top concurrency
    with pytest.raises(serving.PeerUnavailable, match="does not serve GGUF"):
        serving.server_spec("vllm", "continuous", args, tmp_path)
    plain = _serving_args(["--engines", "pace"])
    assert serving.served_weights(plain, tmp_path) == tmp_path
