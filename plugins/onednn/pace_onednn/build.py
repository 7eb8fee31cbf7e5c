"""Find oneDNN, JIT-build the C++ glue once per (ISA, torch, source) and load it.

oneDNN 3.2 comes from the PyPI wheels ``onednn-cpu-gomp`` (``lib/libdnnl.so.3``, OpenMP
runtime shared with torch's libgomp) and ``onednn-devel-cpu-gomp`` (headers), both installed
under the environment prefix. ``check()`` is cheap (file look-ups only) and runs at plugin
registration; the glue is compiled when the first kernel is resolved (~30 s), into
``$PACE_CACHE_DIR/kernels/onednn-<isa>-torch<ver>-<hash>``, and later processes load the
cached ``.so`` directly. A failed build leaves ``build-failed.txt`` there, so later
processes fail registration with that reason (shown by ``pace plugins``) instead of
rebuilding on every model load; in the process where the build fails, the kernels decline
with the reason, so models fall back to another backend (or fail under strict).
``python -m pace_onednn.build`` builds ahead of time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from pace_core.cpu import CpuInfo, detect_cpu
from pace_core.zoo import cache_root

log = logging.getLogger("pace.onednn")

LIB_DIST, DEV_DIST = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"
ONEDNN_VERSION = "2023.2.0"
MODULE = "pace_onednn_ext"
SOURCE = Path(__file__).with_name("csrc") / "onednn_ops.cpp"
FAILED = "build-failed.txt"
CFLAGS = ["-O2", "-fopenmp"]
STALE_LOCK_S = 600


class OneDNNUnavailable(RuntimeError):
    """oneDNN, its headers, a compiler or the glue build is missing."""


@dataclass(frozen=True)
class Toolchain:
    lib_dir: Path
    include_dir: Path

    def ldflags(self) -> list[str]:
        return ["-fopenmp", f"-L{self.lib_dir}", "-l:libdnnl.so.3", f"-Wl,-rpath,{self.lib_dir}"]


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


def build_dir(cpu: CpuInfo | None = None) -> Path:
    """``<cache>/kernels/onednn-<isa>-torch<ver>-<hash of source, flags and library paths>``."""
    tc = toolchain()
    key = [SOURCE.read_text(), *CFLAGS, *tc.ldflags(), str(tc.include_dir)]
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:12]
    isa = (cpu or detect_cpu()).isa_level
    torch_ver = torch.__version__.replace("+", "_")
    return cache_root() / "kernels" / f"onednn-{isa}-torch{torch_ver}-{digest}"


def check() -> None:
    """Raise OneDNNUnavailable unless the glue is built or can be built here."""
    out = build_dir()
    if (out / f"{MODULE}.so").is_file():
        return
    if (out / FAILED).is_file():
        raise OneDNNUnavailable(
            f"the oneDNN glue failed to build earlier ({out / FAILED}; delete it to retry): "
            + _first_error((out / FAILED).read_text(errors="replace"))
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise OneDNNUnavailable(f"no C++ compiler {compiler!r} on PATH to build the oneDNN glue")
    if importlib.util.find_spec("ninja") is None and shutil.which("ninja") is None:
        raise OneDNNUnavailable("ninja is not installed (pip install ninja)")


def _first_error(log_text: str) -> str:
    lines = log_text.splitlines()
    return next((ln for ln in lines if "error:" in ln), lines[0] if lines else "?").strip()[:300]


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


def _compile(out: Path) -> ModuleType:
    from torch.utils import cpp_extension

    tc = toolchain()
    out.mkdir(parents=True, exist_ok=True)
    lock = out / "lock"  # torch's build baton: a killed build leaves it behind forever
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        lock.unlink(missing_ok=True)
    log.warning("pace-onednn: building the oneDNN glue once (~30 s) into %s", out)
    path = os.environ.get("PATH", "")
    try:
        import ninja  # the venv's bin may not be on PATH

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path])
    except ImportError:
        pass
    try:
        return cpp_extension.load(
            MODULE, [str(SOURCE)], build_directory=str(out), extra_cflags=CFLAGS,
            extra_include_paths=[str(tc.include_dir)], extra_ldflags=tc.ldflags(),
        )  # fmt: skip
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}\n"
        (out / FAILED).write_text(text)
        raise OneDNNUnavailable(
            f"building the oneDNN glue failed ({out / FAILED}): {_first_error(text)}"
        ) from exc
    finally:
        os.environ["PATH"] = path


def _load() -> ModuleType:
    check()
    so = build_dir() / f"{MODULE}.so"
    if so.is_file():
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(so))
        spec = importlib.util.spec_from_file_location(MODULE, so, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        try:
            loader.exec_module(module)
        except ImportError as exc:  # e.g. libdnnl.so.3 moved since the build
            raise OneDNNUnavailable(f"cannot load the oneDNN glue {so}: {exc}") from exc
    else:
        module = _compile(so.parent)
    module.set_max_isa(onednn_isa(detect_cpu()))
    return module


_module: ModuleType | None = None
_error: str | None = None  # why the glue cannot load in this process (tried once)


def extension() -> ModuleType:
    """The compiled glue module, built on first call if no cached build exists."""
    global _module, _error
    if _module is None:
        if _error is not None:
            raise OneDNNUnavailable(_error)
        try:
            _module = _load()
        except OneDNNUnavailable as exc:
            _error = str(exc)
            raise
    return _module


def prebuild() -> str:
    """Build now (retrying after a failure) for ``pace build-kernels``; return the build dir."""
    global _error
    _error = None
    extension()  # raises OneDNNUnavailable with the reason
    return str(build_dir())


def unavailable() -> str | None:
    """None once the glue is loaded (building it if needed), else the reason it cannot be."""
    try:
        extension()
    except OneDNNUnavailable as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    ext = extension()
    print(f"oneDNN {ext.version()} glue ready in {build_dir()}")
