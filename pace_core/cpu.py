"""CPU feature detection: what ISA extensions this process may use.

Features come from /proc/cpuinfo (Linux reports AVX-512/AMX only when the OS saves their
state) cross-checked with torch's own probe. ``PACE_CPU_FEATURES`` replaces the detected set
and ``PACE_CPU_FEATURES_DISABLE`` removes entries from it, so tests can simulate other CPUs.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

import torch

# Canonical names used in kernel registrations (the Linux cpuinfo spelling).
KNOWN_FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512cd",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx512vbmi",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


@dataclass(frozen=True)
class CpuInfo:
    """The usable features of this CPU and where the answer came from."""

    features: frozenset[str]
    model_name: str
    source: str
    logical_cores: int

    def has(self, *features: str) -> bool:
        return set(features) <= self.features

    @property
    def isa_level(self) -> str:
        """A short tag for build caches: the widest vector ISA usable here."""
        for level, needs in (
            ("amx", ("amx_bf16", "amx_tile", "avx512_bf16")),
            ("avx512bf16", ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")),
            ("avx512", ("avx512f", "avx512bw", "avx512vl")),
            ("avx2", ("avx2", "fma")),
        ):
            if self.has(*needs):
                return level
        return "baseline"


def _parse_list(text: str) -> set[str]:
    return {f.strip().lower() for f in text.replace(" ", ",").split(",") if f.strip()}


def _read_cpuinfo() -> tuple[set[str], str]:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name":
                    model = value.strip()
    except OSError:
        pass
    return flags, model


def _torch_vector_level() -> str:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - very old torch
        return "DEFAULT"


@functools.cache
def detect_cpu() -> CpuInfo:
    """Probe the CPU once per process, then apply the environment overrides."""
    flags, model = _read_cpuinfo()
    features = {f for f in flags if f in KNOWN_FEATURES}
    source = "/proc/cpuinfo"
    if _torch_vector_level() not in ("AVX512", "ZVECTOR") and features & {"avx512f"}:
        # The OS may not save AVX-512 state although the CPU has it: trust torch's probe.
        features = {f for f in features if not f.startswith(("avx512", "amx"))}
        source += " (AVX-512 disabled: OS support missing)"
    override = os.environ.get("PACE_CPU_FEATURES")
    if override is not None:
        features = set() if override.strip().lower() == "none" else _parse_list(override)
        source = "PACE_CPU_FEATURES"
    disabled = _parse_list(os.environ.get("PACE_CPU_FEATURES_DISABLE", ""))
    if disabled:
        features -= disabled
        source += " minus PACE_CPU_FEATURES_DISABLE"
    return CpuInfo(frozenset(features), model, source, os.cpu_count() or 1)
