"""Find oneDNN and describe the C++ glue that :mod:`pace_core.jit` builds and loads.

oneDNN 3.2 comes from the PyPI wheels ``onednn-cpu-gomp`` (``lib/libdnnl.so.3``, OpenMP
runtime shared with torch's libgomp) and ``onednn-devel-cpu-gomp`` (headers), both installed
under the environment prefix. ``check()`` is cheap (file look-ups only) and runs at plugin
registration; the glue is compiled when the first kernel is resolved (~30 s), into
``$PACE_CACHE_DIR/kernels/onednn-<isa>-torch<ver>-<hash>``, and later processes load the
cached ``.so`` directly. A failed build is recorded there, so later processes fail
registration with that reason (shown by ``pace plugins``) instead of rebuilding on every model
load; in the process where the build fails, the kernels decline with the reason, so models
fall back to another backend (or fail under strict). ``python -m pace_onednn.build`` (or
``pace build-kernels onednn``) builds ahead of time.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
from dataclasses import dataclass
from pathlib import Path

from pace_core import jit
from pace_core.cpu import CpuInfo, detect_cpu

LIB_DIST, DEV_DIST = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"
ONEDNN_VERSION = "2023.2.0"
MODULE = "pace_onednn_ext"
SOURCE = Path(__file__).with_name("csrc") / "onednn_ops.cpp"
CFLAGS = ["-O2"]


class OneDNNUnavailable(jit.BuildFailed):
    """oneDNN, its headers, a compiler or the glue build is missing."""


@dataclass(frozen=True)
class Toolchain:
    lib_dir: Path
    include_dir: Path


def _dist_file(dist: str, suffix: str) -> Path:
    hint = f"pip install {dist}=={ONEDNN_VERSION}"
    try:
        files = metadata.files(dist) or []
    except metadata.PackageNotFoundError:
        raise OneDNNUnavailable(f"{dist} is not installed ({hint})") from None
    for f in files:
        if str(f).endswith(suffix) and Path(f.locate()).is_file():
            return Path(f.locate()).resolve()
    raise OneDNNUnavailable(f"{dist} has no {suffix} on disk ({hint})")


@functools.cache
def toolchain() -> Toolchain:
    """Where libdnnl.so.3 and the oneapi/dnnl headers are."""
    lib = _dist_file(LIB_DIST, "libdnnl.so.3")
    header = _dist_file(DEV_DIST, "oneapi/dnnl/dnnl.hpp")
    return Toolchain(lib.parent, header.parents[2])


def onednn_isa(cpu: CpuInfo) -> str:
    """The oneDNN ISA cap matching pace's view of the CPU (no cap unless it is overridden)."""
    f = cpu.features
    if cpu.source == "/proc/cpuinfo":
        return "all"
    core = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= f
    for isa, ok in (
        ("avx512_core_bf16", core and {"avx512_vnni", "avx512_bf16"} <= f),
        ("avx512_core_vnni", core and "avx512_vnni" in f),
        ("avx512_core", core),
        ("avx2", {"avx2", "fma"} <= f),
        ("avx", "avx" in f),
    ):
        if ok:
            return isa
    return "sse41"


def glue() -> jit.Extension:
    """The build for this CPU (raises OneDNNUnavailable without oneDNN)."""
    tc = toolchain()
    return jit.Extension(
        MODULE, (SOURCE,), prefix="onednn", what="the oneDNN glue", backend="onednn",
        extra_cflags=CFLAGS, include_dirs=(tc.include_dir,), library_dirs=(tc.lib_dir,),
        libraries=(":libdnnl.so.3",),
    )  # fmt: skip


GLUE = jit.LazyExtension(glue, after_load=lambda m: m.set_max_isa(onednn_isa(detect_cpu())))
extension = GLUE.get  # the compiled glue, built on first call if no cached build exists
check = GLUE.check  # raise unless the glue is built or can be built here (compiles nothing)
unavailable = GLUE.unavailable
prebuild = GLUE.prebuild


if __name__ == "__main__":
    ext = extension()
    print(f"oneDNN {ext.version()} glue ready in {GLUE.directory()}")
