"""pace-onednn registration: what it provides, and how it says why it cannot run."""

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
from pace_core.registry import OpContext

build = pytest.importorskip("pace_onednn.build", reason="pace-onednn is not installed")


def resolve(op: str, dtype: torch.dtype, **attrs) -> tuple[str, str]:
    res = OpResolver(get_host().ops, OperatorConfig({op: "onednn"})).resolve(
        OpContext(op, dtype, attrs)
    )
    return res.backend, res.fallback_reason


def test_registers_two_kernels_at_priority_30():
    info = get_host().plugins["onednn"]
    assert (info.status, info.distribution, info.provides["kernels"]) == ("ok", "pace-onednn", 2)
    for op in ("linear", "gated_mlp"):
        spec = next(s for s in get_host().ops.where(op=op) if s.backend == "onednn")
        assert spec.priority == 30 and spec.cpu_features == frozenset()
        assert spec.dtypes == {torch.float32, torch.bfloat16}
        attrs = {"activation": "silu"} if op == "gated_mlp" else {}
        assert resolve(op, torch.float32, **attrs) == ("onednn", "")


def test_missing_library_fails_the_plugin_with_the_reason(monkeypatch):
    monkeypatch.setattr(build, "LIB_DIST", "onednn-cpu-gomp-absent")
    build.toolchain.cache_clear()
    try:
        info = PluginHost().plugins["onednn"]
    finally:
        build.toolchain.cache_clear()
    assert info.status == "failed"
    assert info.error == (
        "OneDNNUnavailable: onednn-cpu-gomp-absent is not installed "
        "(pip install onednn-cpu-gomp-absent==2023.2.0)"
    )


def test_pace_plugins_shows_an_earlier_build_failure(monkeypatch, tmp_path):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path))
    out = build.GLUE.directory()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACE_")}
    env["PACE_CACHE_DIR"] = str(tmp_path)
    assert out.parent == tmp_path / "kernels"
    assert out.name.startswith(f"onednn-{detect_cpu().isa_level}-torch{torch.__version__[:4]}")
    out.mkdir(parents=True)
    (out / jit.FAILURE_FILE).write_text("RuntimeError: ...\nglue.cpp:1:1: error: simulated\n")
    script = Path(sys.executable).with_name("pace")
    proc = subprocess.run([str(script), "plugins"], capture_output=True, text=True, env=env,
                          timeout=120, check=True)  # fmt: skip
    row = next(line for line in proc.stdout.splitlines() if line.startswith("onednn "))
    assert "failed" in row and "JIT build of the oneDNN glue failed earlier" in row
    assert "error: simulated" in row and "`pace build-kernels onednn` or delete it to retry" in row


def test_build_failure_in_process_falls_back(monkeypatch):
    monkeypatch.setattr(build.GLUE, "module", None)
    failed = build.OneDNNUnavailable("building the oneDNN glue failed (simulated)")
    monkeypatch.setattr(build.GLUE, "error", failed)
    backend, reason = resolve("linear", torch.float32)
    assert backend != "onednn" and reason == "building the oneDNN glue failed (simulated)"


def test_unknown_activation_falls_back():
    backend, reason = resolve("gated_mlp", torch.float32, activation="swish")
    assert backend != "onednn" and reason.startswith("activation 'swish' unsupported")


def test_bf16_needs_avx512_bf16(monkeypatch):
    if not detect_cpu().has("avx512_bf16"):
        pytest.skip("this CPU has no avx512_bf16")
    monkeypatch.setenv("PACE_CPU_FEATURES_DISABLE", "avx512_bf16")
    detect_cpu.cache_clear()
    try:
        bf16, fp32 = resolve("linear", torch.bfloat16), resolve("linear", torch.float32)
    finally:
        monkeypatch.delenv("PACE_CPU_FEATURES_DISABLE")
        detect_cpu.cache_clear()
    assert bf16[0] != "onednn"
    assert bf16[1] == "bf16 needs avx512_bf16 (oneDNN brgemm avx512_core_bf16)"
    assert fp32 == ("onednn", "")


def test_isa_cap_only_when_features_are_overridden():
    def cpu(features: set[str], source: str):
        return type(detect_cpu())(frozenset(features), "x", source, 2)

    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx2", "fma"}
    assert build.onednn_isa(cpu(avx512, "/proc/cpuinfo")) == "all"
    override = "/proc/cpuinfo minus PACE_CPU_FEATURES_DISABLE"
    assert build.onednn_isa(cpu(avx512 | {"avx512_bf16"}, override)) == "avx512_core_bf16"
    assert build.onednn_isa(cpu(avx512, override)) == "avx512_core_vnni"
    assert build.onednn_isa(cpu({"avx2", "fma", "avx512f"}, "PACE_CPU_FEATURES")) == "avx2"
    assert build.onednn_isa(cpu(set(), "PACE_CPU_FEATURES")) == "sse41"
