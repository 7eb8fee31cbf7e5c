"""JIT build of the C++ kernels (``csrc/``), cached per ISA target, torch version and sources.

The extension is compiled by ``torch.utils.cpp_extension.load`` (ninja + the system C++
compiler) into ``$PACE_CACHE_DIR/kernels/avx512-<target>-torch<ver>-<hash>/`` (cache root
``~/.cache/pace`` by default). ``<target>`` names the exact ISA flags used, never
``-march=native``, so a cached binary is only ever loaded on a CPU that has those features;
``<hash>`` covers the sources and flags, so an edited source never meets a stale binary.

Once built, later processes import the cached ``.so`` directly (milliseconds, no ninja run).
A failed build leaves ``build-failed.txt`` with the compiler output in the build directory:
later processes then register no kernels and say why, until :func:`prebuild` succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import sysconfig
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("pace.avx512")

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("bindings.cpp", "stack.cpp", "linear.cpp", "norm.cpp", "rope.cpp", "attention.cpp",
           "stream.cpp")  # fmt: skip
HEADERS = ("kernels.h", "simd.h", "tensor_ops.h")
BASE_FEATURES = ("avx512f", "avx512bw", "avx512vl", "fma")
BASE_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c")
# Build targets, best first: tag -> (CPU features required, ISA flags).
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512bf16": (
        (*BASE_FEATURES, "avx512_bf16"),
        (*BASE_FLAGS, "-mavx512bf16", "-DPACE_HAS_BF16"),
    ),
    "avx512": (BASE_FEATURES, BASE_FLAGS),
}
COMMON_FLAGS = ("-O3", "-fopenmp")  # -fopenmp goes to the linker too (else one thread)
FAILURE_FILE = "build-failed.txt"

_module: ModuleType | None = None
_lock = threading.Lock()


class BuildError(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why."""


def cache_root() -> Path:
    """``$PACE_CACHE_DIR`` or ``~/.cache/pace`` (same rule as the model zoo)."""
    env = os.environ.get("PACE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pace"


def target() -> str | None:
    """The best build target this CPU (as ``pace_core.cpu.detect_cpu`` reports it) can run."""
    from pace_core.cpu import detect_cpu

    cpu = detect_cpu()
    return next((tag for tag, (needs, _) in TARGETS.items() if cpu.has(*needs)), None)


def source_hash(tag: str) -> str:
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    digest.update(" ".join((*COMMON_FLAGS, *TARGETS[tag][1])).encode())
    return digest.hexdigest()[:12]


def module_name(tag: str) -> str:
    return f"pace_avx512_{tag}"


def build_dir(tag: str) -> Path:
    return cache_root() / "kernels" / f"avx512-{tag}-torch{torch.__version__}-{source_hash(tag)}"


def cached_library(tag: str) -> Path | None:
    """The built extension for ``tag`` if this exact build exists."""
    path = build_dir(tag) / f"{module_name(tag)}.so"
    return path if path.is_file() else None


def previous_failure(tag: str) -> str | None:
    """The error of an earlier failed build of this exact build, if any."""
    path = build_dir(tag) / FAILURE_FILE
    return path.read_text(errors="replace") if path.is_file() else None


def toolchain_problem() -> str | None:
    """Why a build cannot even start here (cheap checks: no compiling), or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH (install g++ or set CXX)"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        return f"Python headers missing ({include}); install the python3-dev package"
    if _ninja_dir() is None:
        return "ninja is missing (pip install ninja)"
    return None


def _ninja_dir() -> str | None:
    found = shutil.which("ninja")
    if found:
        return str(Path(found).parent)
    try:
        import ninja  # the PyPI package ships the binary

        return str(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        return None


@contextlib.contextmanager
def _ninja_on_path():
    """torch runs ``ninja`` from PATH; an unactivated venv may not have it there."""
    old = os.environ.get("PATH", "")
    directory = _ninja_dir()
    if directory and directory not in old.split(os.pathsep):
        os.environ["PATH"] = directory + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot import the kernel library {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(tag: str, verbose: bool) -> ModuleType:
    from torch.utils.cpp_extension import load

    directory = build_dir(tag)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / FAILURE_FILE).unlink(missing_ok=True)
    flags = [*COMMON_FLAGS, *TARGETS[tag][1]]
    log.warning("pace-avx512: compiling the %s kernels (one time, about a minute)...", tag)
    start = time.perf_counter()
    kwargs = dict(
        name=module_name(tag),
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
        verbose=verbose,
    )
    try:
        with _ninja_on_path():
            try:
                module = load(**kwargs)
            except ImportError:
                # Another process held the build lock and stopped before linking: build here.
                module = load(**kwargs)
    except Exception as exc:
        message = f"pace-avx512: building the {tag} kernels in {directory} failed:\n{exc}"
        (directory / FAILURE_FILE).write_text(message)  # later processes: register nothing
        raise BuildError(message) from exc
    log.warning(
        "pace-avx512: built the %s kernels in %.1f s (cached in %s)",
        tag, time.perf_counter() - start, directory,
    )  # fmt: skip
    return module


def loaded() -> bool:
    """Whether this process has the kernel module already."""
    return _module is not None


def load_extension(verbose: bool = False) -> ModuleType:
    """The kernel module: imported from the cache, or compiled first (once per process)."""
    if _module is not None:
        return _module
    with _lock:
        return _load(verbose)


def _load(verbose: bool) -> ModuleType:
    global _module
    if _module is not None:
        return _module
    tag = target()
    if tag is None:
        raise BuildError(
            "pace-avx512: this CPU lacks " + ", ".join(BASE_FEATURES) + " (see `pace ops`)"
        )
    cached = cached_library(tag)
    if cached is not None:
        try:
            _module = _import(module_name(tag), cached)
        except (ImportError, OSError) as exc:
            raise BuildError(
                f"pace-avx512: cannot load the cached kernels {cached}: {exc} "
                f"(delete {cached.parent} to rebuild)"
            ) from exc
        return _module
    failure = previous_failure(tag)
    if failure is not None:
        raise BuildError(failure + "\n(run `pace build-kernels avx512` to retry)")
    problem = toolchain_problem()
    if problem is not None:
        raise BuildError(f"pace-avx512: cannot build the kernels: {problem}")
    _module = _compile(tag, verbose)
    return _module


def available() -> bool | str:
    """True once the kernels are loaded (building them if needed), else the reason (for
    ``supports`` predicates, so the resolver falls back instead of picking a broken kernel)."""
    try:
        load_extension()
    except BuildError as exc:
        first = str(exc).strip().splitlines()[0]
        return f"kernels unavailable: {first}"
    return True


def prebuild(verbose: bool = False) -> Path:
    """Build now (retrying a failed build) and print the build time: ``pace build-kernels``."""
    tag = target()
    if tag is None:
        raise BuildError("pace-avx512: this CPU cannot run any AVX-512 target")
    (build_dir(tag) / FAILURE_FILE).unlink(missing_ok=True)
    start = time.perf_counter()
    load_extension(verbose)
    seconds = time.perf_counter() - start
    print(f"pace-avx512: {tag} kernels ready in {seconds:.1f} s: {build_dir(tag)}")
    return build_dir(tag)
