"""JIT build and load of the C++ glue (``csrc/tpp_glue.cpp``) against libxsmm.

The build lives in ``$PACE_CACHE_DIR/kernels/tpp-<isa>-torch<ver>-<hash>`` (cache root
``~/.cache/pace`` by default); the hash covers the source, the flags and the libxsmm install,
so a cached build is reused as is. A failed build leaves ``FAILED`` there with the compiler
output; later processes then refuse to register the plugin until it is deleted.
Run ``python -m pace_tpp.build`` to build ahead of time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import threading
from pathlib import Path
from types import ModuleType

import torch

from pace_core.cpu import detect_cpu
from pace_core.zoo import cache_root
from pace_tpp.locate import Libxsmm, TppUnavailable, check_toolchain, find_libxsmm, ninja_dir

log = logging.getLogger("pace.tpp")

NAME = "pace_tpp_glue"
SOURCE = Path(__file__).parent / "csrc" / "tpp_glue.cpp"
ISA_FLAGS = {
    "amx": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
    "avx512bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def cflags() -> list[str]:
    isa = detect_cpu().isa_level
    return ["-O3", "-fopenmp", "-fno-math-errno", *ISA_FLAGS.get(isa, []), "-DNDEBUG"]


def build_dir(lib: Libxsmm | None = None) -> Path:
    """Where the glue for this CPU, torch, source and libxsmm is (or will be) built."""
    lib = lib or find_libxsmm()
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(repr((cflags(), lib)).encode())
    torch_ver = re.sub(r"[^0-9A-Za-z.]", "_", torch.__version__)
    tag = f"tpp-{detect_cpu().isa_level}-torch{torch_ver}-{digest.hexdigest()[:12]}"
    return cache_root() / "kernels" / tag


def failure_note() -> str | None:
    """Why a previous build of this exact glue failed (its ``FAILED`` marker), or None."""
    try:
        marker = build_dir() / "FAILED"
        text = marker.read_text(errors="replace").strip()
    except (OSError, TppUnavailable):
        return None
    first = text.splitlines()[0] if text else "JIT build of the libxsmm glue failed"
    return f"{first} (log: {marker}; delete it to retry)"


def _import_built(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(lib: Libxsmm, out: Path) -> ModuleType:
    from torch.utils import cpp_extension

    tools = ninja_dir()
    if tools and tools not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = tools + os.pathsep + os.environ.get("PATH", "")
    log.warning("pace-tpp: building the libxsmm glue (one time, ~30 s) in %s", out)
    return cpp_extension.load(
        name=NAME,
        sources=[str(SOURCE)],
        extra_cflags=cflags(),
        extra_ldflags=["-fopenmp", *lib.ldflags()],
        extra_include_paths=[str(lib.include_dir)],
        build_directory=str(out),
        verbose=False,
    )


def load() -> ModuleType:
    """The glue module: imported from the cache, else built now (raises TppUnavailable)."""
    global _module, _error
    if _module is not None:  # fast path: every kernel call comes through here
        return _module
    with _lock:
        if _module is None and _error is None:
            try:
                _module = _load_or_build()
            except TppUnavailable as exc:
                _error = str(exc)
        if _module is None:
            raise TppUnavailable(_error)
        return _module


def _load_or_build() -> ModuleType:
    lib = find_libxsmm()
    check_toolchain()
    out = build_dir(lib)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if (out / "OK").exists():
            return _import_built(out / f"{NAME}.so")
        module = _compile(lib, out)
        (out / "OK").write_text(f"libxsmm {lib.version}: {lib}\n")
        (out / "FAILED").unlink(missing_ok=True)
        return module
    except Exception as exc:  # compiler/linker/import errors: remember and report
        text = str(exc).strip() or type(exc).__name__
        reason = f"JIT build of the libxsmm glue failed ({text.splitlines()[0][:200]})"
        with contextlib.suppress(OSError):
            (out / "FAILED").write_text(f"{reason}\n\n{text}\n")
            reason += f"; log in {out / 'FAILED'}"
        raise TppUnavailable(reason) from exc


def prebuild() -> str:
    """Build now (retrying a failed build) for ``pace build-kernels``; return the build dir."""
    global _module, _error
    with _lock:
        _error = None
        if _module is None:
            _module = _load_or_build()  # raises TppUnavailable with the reason
    return str(build_dir())


def unavailable_reason() -> str | None:
    """None when the glue loads (building it if needed), else why it cannot."""
    try:
        load()
    except TppUnavailable as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    problem = unavailable_reason()
    if problem:
        raise SystemExit(f"pace-tpp: {problem}")
    print(f"pace-tpp glue ready in {build_dir()} (libxsmm {load().libxsmm_version}, "
          f"target {load().target_arch()})")  # fmt: skip
