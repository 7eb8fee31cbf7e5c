"""pace-tpp registration: what it provides, and how it says why it cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pace_core import jit
from pace_core.cpu import detect_cpu
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.plugins import PluginHost, get_host
from pace_core.registry import OpContext, backends

# the bf16 kernels need AVX512-BF16 (vdpbf16ps / brgemm avx512_core_bf16); without it the
# resolver correctly falls back to native, which these tests would then not measure
NEEDS_BF16 = pytest.mark.skipif(
    not detect_cpu().has("avx512_bf16"), reason="bf16 kernels need an AVX512-BF16 CPU"
)

build = pytest.importorskip("pace_tpp.build", reason="pace-tpp is not installed")
locate = pytest.importorskip("pace_tpp.locate")


def test_registers_three_kernels_at_priority_40():
    info = get_host().plugins["tpp"]
    assert (info.status, info.distribution, info.provides["kernels"]) == ("ok", "pace-tpp", 3)
    for op in ("linear", "qkv_proj", "gated_mlp"):
        spec = next(s for s in get_host().ops.where(op=op) if s.backend == "tpp")
        assert spec.priority == 40 and spec.cpu_features == {"avx512f"}
        assert spec.dtypes == {torch.float32, torch.bfloat16}


def test_missing_libxsmm_fails_the_plugin_with_the_reason(monkeypatch):
    monkeypatch.setenv("LIBXSMM_ROOT", "/nonexistent/libxsmm")
    info = PluginHost().plugins["tpp"]
    assert info.status == "failed"
    assert info.error.startswith("TppUnavailable: libxsmm not found")
    assert "LIBXSMM_ROOT=/nonexistent/libxsmm" in info.error and "libxsmm-dev" in info.error


def test_pace_plugins_says_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACE_")}
    env["LIBXSMM_ROOT"] = str(tmp_path)
    script = Path(sys.executable).with_name("pace")
    proc = subprocess.run([str(script), "plugins"], capture_output=True, text=True, env=env,
                          timeout=120, check=True)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tpp "))
    assert "failed" in row and "TppUnavailable: libxsmm not found" in row


def test_earlier_build_failure_blocks_registration(monkeypatch, tmp_path):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path))
    out = build.GLUE.directory()
    assert out.parent == tmp_path / "kernels"
    assert out.name.startswith(f"tpp-{detect_cpu().isa_level}-torch")
    out.mkdir(parents=True)
    (out / jit.FAILURE_FILE).write_text("JIT build of the libxsmm glue failed (simulated)\n\nlog")
    info = PluginHost().plugins["tpp"]
    assert info.status == "failed"
    record = out / jit.FAILURE_FILE
    assert f"failed earlier: JIT build of the libxsmm glue failed (simulated) (log: {record}; " in (
        info.error
    )
    assert "`pace build-kernels tpp` or delete it to retry)" in info.error


def test_build_failure_in_process_falls_back(monkeypatch):
    monkeypatch.setattr(build.GLUE, "module", None)
    failed = locate.TppUnavailable("JIT build of the libxsmm glue failed (simulated)")
    monkeypatch.setattr(build.GLUE, "error", failed)
    resolver = OpResolver(get_host().ops, OperatorConfig(linear="tpp"))
    res = resolver.resolve(OpContext("linear", torch.float32, {"in_features": 8}))
    assert res.backend != "tpp" and "failed (simulated)" in res.fallback_reason


def test_unfused_activation_falls_back():
    resolver = OpResolver(get_host().ops, OperatorConfig(gated_mlp="tpp", default="native"))
    ctx = OpContext("gated_mlp", torch.float32, {"activation": "swish", "hidden": 8})
    res = resolver.resolve(ctx)
    assert res.backend == "native"
    assert res.fallback_reason.startswith("activation 'swish' is not fused")


def test_bf16_needs_avx512_bf16(monkeypatch):
    if not detect_cpu().has("avx512_bf16"):
        pytest.skip("this CPU has no avx512_bf16")
    monkeypatch.setenv("PACE_CPU_FEATURES_DISABLE", "avx512_bf16")
    detect_cpu.cache_clear()
    try:
        resolver = OpResolver(get_host().ops, OperatorConfig(linear="tpp"))
        bf16 = resolver.resolve(OpContext("linear", torch.bfloat16, {}))
        fp32 = resolver.resolve(OpContext("linear", torch.float32, {}))
    finally:
        monkeypatch.delenv("PACE_CPU_FEATURES_DISABLE")
        detect_cpu.cache_clear()
    assert bf16.backend != "tpp" and bf16.fallback_reason == "bf16 BRGEMM needs avx512_bf16"
    assert fp32.backend == "tpp"


@pytest.mark.slow
def test_real_build_failure_is_reported_then_blocks_registration(tmp_path):
    """A libxsmm whose header does not compile: the build fails, later processes refuse."""
    fake = tmp_path / "libxsmm"
    (fake / "include").mkdir(parents=True)
    (fake / "lib").mkdir()
    header = f"#error broken on purpose /* {locate.REQUIRED_SYMBOL} */\n"
    (fake / "include" / "libxsmm.h").write_text(header)
    (fake / "lib" / "libxsmm.a").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACE_")}
    env.update(LIBXSMM_ROOT=str(fake), PACE_CACHE_DIR=str(tmp_path / "cache"))
    code = "from pace_tpp import build; print(build.unavailable_reason())"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=600, check=True)  # fmt: skip
    assert first.stdout.startswith("JIT build of the libxsmm glue failed")
    proc = subprocess.run([str(Path(sys.executable).with_name("pace")), "plugins"], env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tpp "))
    assert "failed" in row and "JIT build of the libxsmm glue failed" in row
    assert "delete it to retry" in row


@NEEDS_BF16
def test_auto_prefers_tpp_over_onednn_without_avx512(monkeypatch):
    """The measured preference (docs/performance.md): avx512 > tpp > onednn > native."""
    from pace_core.opconfig import OperatorConfig, OpResolver

    host = PluginHost()
    ctx = OpContext("linear", torch.bfloat16, {"in_features": 576, "out_features": 1536})
    auto = OpResolver(host.ops, OperatorConfig()).resolve(ctx)
    if "avx512" in backends(host.ops):
        assert auto.backend == "avx512"
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "avx512")
    without = OpResolver(PluginHost().ops, OperatorConfig()).resolve(ctx)
    assert without.backend == "tpp", without
