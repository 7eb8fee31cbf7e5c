"""pace-avx512 as a plugin: registration, `pace plugins`, build cache and failure handling.

Failure cases use an empty ``PACE_CACHE_DIR`` (so nothing is cached) and a fake compiler;
nothing here compiles for real (the session ``ext`` fixture did that once).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from pace_core.cpu import detect_cpu

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import build
from pace_avx512.plugin import BACKEND, PRIORITY

from pace_core import cli
from pace_core.builds import run_builds
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.plugins import get_host
from pace_core.registry import OpContext, backends

OPS = ("linear", "qkv_proj", "gated_mlp", "rms_norm", "layer_norm", "rope", "attention",
       "decoder_stack")  # fmt: skip
LINEAR = OpContext("linear", torch.float32, {"in_features": 64, "out_features": 64})


@pytest.fixture
def no_cache(clean_env, tmp_path, monkeypatch):
    """An empty kernel cache and no kernel module loaded in this process (restored after)."""
    clean_env.setenv("PACE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build.EXT, "module", None)
    monkeypatch.setattr(build.EXT, "error", None)
    return tmp_path


def fake_compiler(tmp_path) -> str:
    """A "compiler" that reports a version (torch checks it) and fails every compile."""
    path = tmp_path / "fake-c++"
    path.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --version|-dumpversion|-dumpfullversion)'
        ' echo "c++ (GCC) 12.2.0"; exit 0;; esac; done\n'
        "echo 'simulated compiler failure' >&2\nexit 1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_pace_plugins_lists_avx512(ext, clean_env, capsys):
    assert cli.main(["plugins"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("avx512 "))
    assert "pace-avx512" in line and " ok " in line and "12 kernels" in line


def test_registrations(ext, clean_env):
    ops = get_host().ops
    for op in OPS:
        spec = next(s for s in ops.where(op=op) if s.backend == BACKEND)
        assert spec.priority == PRIORITY > 0
        assert spec.cpu_features == frozenset(build.AVX2_FEATURES)  # the least target's
        assert spec.dtypes == {torch.float32, torch.bfloat16}
        assert ops.where(op=op)[0].backend == BACKEND  # auto picks it on this CPU


def test_build_is_tagged_and_threaded(ext):
    tag = build.target()
    bf16 = detect_cpu().has("avx512_bf16")
    avx512 = detect_cpu().has(*build.BASE_FEATURES)
    assert tag == ("avx512bf16" if bf16 else "avx512" if avx512 else "avx2")
    assert ext.has_bf16 == bf16
    directory = build.extension(tag).directory
    assert directory.name.startswith(f"avx512-{tag}-torch{torch.__version__}-")
    assert build.extension(tag).library is not None
    assert "-march=native" not in build.TARGETS[tag][1]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ext.parallel_width() == 2  # -fopenmp reached compiler and linker
    finally:
        torch.set_num_threads(threads)


def test_every_kernel_source_is_a_build_input():
    """Each csrc file is compiled (.cpp) or hashed (.h): an edit to any of them rebuilds."""
    ext = build.extension(build.target() or "avx2")
    on_disk = {p.name for p in build.CSRC.iterdir() if p.suffix in (".cpp", ".h")}
    inputs = {Path(p).name for p in (*ext.sources, *ext.headers)}
    assert inputs == on_disk
    assert {"q6k_tile.h", "ksuper_tile.h"} <= set(build.HEADERS)  # the two a list once missed


def test_missing_compiler_fails_the_plugin(no_cache, clean_env):
    clean_env.setenv("CXX", "/nonexistent/c++")
    info = get_host().plugins["avx512"]
    assert info.status == "failed" and "no C++ compiler" in info.error
    assert BACKEND not in backends(get_host().ops)


@pytest.mark.skipif(not detect_cpu().has("avx512_bf16"), reason="names the avx512bf16 build")
def test_failed_build_falls_back_then_fails_the_plugin(no_cache, clean_env):
    """A build that fails at first resolution: native with the reason, then recorded."""
    clean_env.setenv("CXX", fake_compiler(no_cache))
    assert get_host().plugins["avx512"].status == "ok"  # the hook does not compile
    resolver = OpResolver(get_host().ops, OperatorConfig(linear="avx512"))
    res = resolver.resolve(LINEAR)
    assert res.backend == "native"
    assert "kernels unavailable" in res.fallback_reason and "failed" in res.fallback_reason
    failure = build.extension().failure()
    assert failure is not None and "simulated compiler failure" in failure
    from pace_core.plugins import reset_host

    reset_host()  # a later process: the recorded failure makes the plugin register nothing
    info = get_host().plugins["avx512"]
    assert info.status == "failed" and "simulated compiler failure" in info.error
    assert "pace build-kernels avx512" in info.error  # ... and says how to retry,
    outcome = run_builds(get_host(), ["avx512"])[0]  # which is offered though the plugin failed
    assert outcome.status == "failed"
    assert "JIT build of the avx512bf16 kernels failed" in outcome.detail


def test_build_kernels_cli(ext, clean_env, capsys):
    assert cli.main(["build-kernels", "avx512"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("avx512 "))
    assert " ok " in row and build.target() in row


def test_build_kernels_skips_a_cpu_without_avx2(clean_env):
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", "avx2,avx512f,avx512_bf16")
    detect_cpu.cache_clear()
    outcome = run_builds(get_host(), ["avx512"])[0]
    assert outcome.status == "skipped" and "lacks avx2, fma, f16c" in outcome.detail


def test_cpu_without_avx2_registers_but_declines(clean_env):
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", "avx2,avx512f,avx512_bf16")
    detect_cpu.cache_clear()
    host = get_host()
    assert host.plugins["avx512"].status == "ok"
    res = OpResolver(host.ops, OperatorConfig(linear="avx512")).resolve(LINEAR)
    assert res.backend == "native" and "missing CPU features: avx2" in res.fallback_reason


@pytest.mark.parametrize(
    ("disabled", "tag"),
    [("avx512_bf16", "avx512"), ("avx512f,avx512bw,avx512vl,avx512_bf16,avx512_vnni", "avx2")],
)
def test_the_build_target_follows_the_cpu(clean_env, disabled, tag):
    if tag != "avx2" and not detect_cpu().has(*build.BASE_FEATURES, "avx512_vnni"):
        pytest.skip("this CPU has no AVX-512 with VNNI")
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", disabled)
    detect_cpu.cache_clear()
    assert build.target() == tag
    assert build.int8_dot_problem() is None  # the avx2 target emulates vpdpbusd
