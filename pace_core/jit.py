"""JIT builds of C++ kernel extensions: one cache, one lock, one failure vocabulary.

A plugin names its sources and flags; :func:`build_extension` (or an :class:`Extension` it
keeps) compiles them with ``torch.utils.cpp_extension.load`` (ninja and the system C++
compiler) into ``$PACE_CACHE_DIR/kernels/<prefix>-<isa tag>-torch<version>-<hash>/`` and
imports the result. Later processes import the cached ``.so`` directly (milliseconds).

- ``<isa tag>`` names the CPU target the flags are for (default: ``detect_cpu().isa_level``),
  so a cached binary is never served to a CPU that cannot run it; ``<hash>`` covers the
  sources, headers, flags, library paths, compiler, Python ABI and ``hash_extra``, so an
  edited source never meets a stale binary.
- ``-fopenmp`` goes to the compiler and the linker (without it at link time ``at::parallel_for``
  runs on one thread), ``-O3`` unless the flags choose a level.
- A file lock (``flock``, released when a process dies) makes a second process wait for the
  first one's build and then import it.
- A failed build raises :class:`BuildFailed` with the first compiler error and the tail of the
  compiler output, and leaves ``build-failed.txt`` (the whole output) in the build directory:
  later processes then fail fast with that reason instead of rebuilding on every model load,
  until the record is deleted or the build is retried (``retry=True``, ``pace build-kernels``).
- A new build retires the older builds of the same extension, target and torch (all but the
  few most recently used, :mod:`pace_core.jit_cache`), so the cache does not grow per edit.

Plugins whose build inputs are only known at run time (the CPU target, where a library is
installed) keep a :class:`LazyExtension`: it loads the extension at most once per process,
remembers why it could not, and gives registration hooks, ``supports`` predicates and build
steps the cheap check, the reason and the retry they need.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType

import torch

from pace_core import jit_cache
from pace_core.paths import cache_root
from pace_core.registry import BuildNotApplicable

__all__ = [
    "FAILURE_FILE",
    "BuildFailed",
    "BuildNotApplicable",
    "Extension",
    "LazyExtension",
    "build_extension",
    "cache_root",
    "kernels_dir",
    "toolchain_problem",
]

log = logging.getLogger("pace.jit")

FAILURE_FILE = "build-failed.txt"  # the compiler output of a failed build
BUILT_FILE = "built.txt"  # written last: the file name of the built library
LOCK_FILE = "pace-build.lock"
TAIL_LINES = 30  # of the compiler output, in the exception


class BuildFailed(RuntimeError):
    """The extension cannot be built or loaded here: no toolchain, a missing library, a compiler
    error, or an earlier failed build. The first line says why; ``log`` is the compiler's
    output tail (empty when nothing was compiled), ``directory`` the build directory."""

    def __init__(self, message: str, *, log: str = "", directory: Path | None = None) -> None:
        super().__init__(message)
        self.log = log
        self.directory = directory


def kernels_dir() -> Path:
    """Where JIT builds live: ``<cache root>/kernels``."""
    return cache_root() / "kernels"


def _ninja_dir() -> str | None:
    found = shutil.which("ninja")
    if found:
        return str(Path(found).parent)
    try:
        import ninja  # the PyPI package ships the binary
    except ImportError:
        return None
    return getattr(ninja, "BIN_DIR", None)


def toolchain_problem() -> str | None:
    """Why no build can even start here (cheap checks, nothing compiled), or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH (install g++ or set CXX)"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        return f"Python headers missing ({include}); install the python3-dev package"
    if _ninja_dir() is None:
        return "ninja is missing (pip install ninja)"
    return None


def first_error(output: str) -> str:
    """The line of compiler output that says what went wrong (first ``error:``, else the last
    line that is not ninja's own), at most 300 characters."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    found = next((ln for ln in lines if "error:" in ln or "undefined reference" in ln), None)
    if found is None:
        found = next((ln for ln in reversed(lines) if not ln.startswith("ninja:")), "?")
    return found[:300]


def _tail(output: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])


def _strs(values: Sequence[str | Path] | str | Path) -> tuple[str, ...]:
    if isinstance(values, (str, Path)):
        values = [values]
    return tuple(str(v) for v in values)


@dataclass(frozen=True)
class Extension:
    """What to build: sources, flags and where the libraries are; the build directory, cached
    library and earlier failure follow from them. Creating one compiles nothing."""

    name: str  # the Python module name (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``)
    sources: tuple[str, ...]
    isa_tag: str = ""  # the CPU target the flags compile for; default: detect_cpu().isa_level
    prefix: str = ""  # build directory prefix; default: name
    what: str = ""  # for messages, e.g. "the libxsmm glue"; default: "the <name> extension"
    backend: str = ""  # for the retry hint `pace build-kernels <backend>`
    headers: tuple[str, ...] = ()  # hashed (an edit rebuilds), not compiled
    extra_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    library_dirs: tuple[str, ...] = ()  # -L and an rpath
    libraries: tuple[str, ...] = ()  # -l<lib>; ":libfoo.so.3" names one file
    hash_extra: tuple[str, ...] = field(default=(), repr=False)  # more inputs of the build

    def __post_init__(self) -> None:
        for name in ("sources", "headers", "extra_cflags", "extra_ldflags", "include_dirs",
                     "library_dirs", "libraries", "hash_extra"):  # fmt: skip
            object.__setattr__(self, name, _strs(getattr(self, name)))
        if not self.isa_tag:
            from pace_core.cpu import detect_cpu

            object.__setattr__(self, "isa_tag", detect_cpu().isa_level)
        object.__setattr__(self, "prefix", self.prefix or self.name)
        object.__setattr__(self, "what", self.what or f"the {self.name} extension")

    # -- what is passed to the compiler ----------------------------------------------------------
    @property
    def cflags(self) -> list[str]:
        level = [] if any(f.startswith("-O") for f in self.extra_cflags) else ["-O3"]
        openmp = [] if "-fopenmp" in self.extra_cflags else ["-fopenmp"]
        return [*level, *openmp, *self.extra_cflags]

    @property
    def ldflags(self) -> list[str]:
        flags = [] if "-fopenmp" in self.extra_ldflags else ["-fopenmp"]
        for d in self.library_dirs:
            flags += [f"-L{d}", f"-Wl,-rpath,{d}"]
        return [*flags, *(f"-l{lib}" for lib in self.libraries), *self.extra_ldflags]

    # -- the cache -------------------------------------------------------------------------------
    @cached_property
    def directory(self) -> Path:
        """``<kernels>/<prefix>-<isa tag>-torch<version>-<hash of every build input>``."""
        digest = hashlib.sha256()
        for path in (*self.sources, *self.headers):
            digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
        inputs = (self.cflags, self.ldflags, self.include_dirs, self.hash_extra,
                  os.environ.get("CXX", "c++"), sysconfig.get_config_var("SOABI"))  # fmt: skip
        digest.update(repr(inputs).encode())
        tag = f"{self.prefix}-{self.isa_tag}-torch{torch.__version__}-{digest.hexdigest()[:12]}"
        return kernels_dir() / tag

    @property
    def library(self) -> Path | None:
        """The built library if this exact build completed, else None."""
        try:
            built = (self.directory / BUILT_FILE).read_text().split("\n", 1)[0].strip()
        except OSError:
            return None
        path = self.directory / built
        return path if built and path.is_file() else None

    @property
    def failure_record(self) -> Path:
        return self.directory / FAILURE_FILE

    def failure(self) -> str | None:
        """Why an earlier build of this exact build failed (and how to retry), or None."""
        try:
            text = self.failure_record.read_text(errors="replace")
        except OSError:
            return None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]  # line 1: the summary
        reason = next((ln for ln in lines if "error:" in ln), lines[0] if lines else "?")
        retry = f"run `pace build-kernels {self.backend}` or " if self.backend else ""
        return (
            f"JIT build of {self.what} failed earlier: {reason[:300]} "
            f"(log: {self.failure_record}; {retry}delete it to retry)"
        )

    def check(self) -> None:
        """Raise BuildFailed unless this build is cached or can be attempted here (an earlier
        failure, or no toolchain). Cheap: compiles nothing."""
        if self.library is not None:
            return
        failure = self.failure()
        if failure is not None:
            raise BuildFailed(failure, directory=self.directory)
        problem = toolchain_problem()
        if problem is not None:
            raise BuildFailed(f"cannot build {self.what}: {problem}", directory=self.directory)

    # -- building and loading --------------------------------------------------------------------
    def load(self, *, retry: bool = False, verbose: bool = False) -> ModuleType:
        """The extension module: this process's, the cached build's, or compiled now.

        ``retry`` forgets an earlier failure. Raises :class:`BuildFailed`."""
        key = (self, str(kernels_dir()), os.environ.get("CXX", ""))
        with _process_lock:
            module = _loaded.get(key)
            if module is not None:
                return module
            if retry:
                self.failure_record.unlink(missing_ok=True)
            module = self._import_cached()
            if module is None:
                self.check()
                with self._build_lock():  # another process may have built it meanwhile
                    module = self._import_cached()
                    if module is None:
                        self.check()
                        module = self._compile(verbose)
            _loaded[key] = module
            return module

    def _import_cached(self) -> ModuleType | None:
        path = self.library
        if path is None:
            return None
        # torch names a rebuild within one process <name>_v<n>: import by the file's name
        spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
        try:
            if spec is None or spec.loader is None:
                raise ImportError("not an importable extension module")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (ImportError, OSError) as exc:  # e.g. a linked library moved since the build
            raise BuildFailed(
                f"cannot load {self.what} from {path}: {exc} (delete {self.directory} to rebuild)",
                directory=self.directory,
            ) from exc
        jit_cache.mark_used(self.directory, BUILT_FILE)
        return module

    @contextlib.contextmanager
    def _build_lock(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK_FILE, "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("pace: waiting for another process building %s in %s", self.what,
                            self.directory)  # fmt: skip
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                # Holding the lock, nobody else builds here: torch's own baton is stale.
                (self.directory / "lock").unlink(missing_ok=True)
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _compile(self, verbose: bool) -> ModuleType:
        from torch.utils.cpp_extension import load

        log.warning("pace: compiling %s (one time) into %s", self.what, self.directory)
        start = time.perf_counter()
        try:
            with _ninja_on_path():
                module = load(
                    name=self.name,
                    sources=list(self.sources),
                    extra_cflags=self.cflags,
                    extra_ldflags=self.ldflags,
                    extra_include_paths=list(self.include_dirs),
                    build_directory=str(self.directory),
                    verbose=verbose,
                )
        except Exception as exc:  # compiler, linker or import error: record and report
            output = str(exc).strip() or type(exc).__name__
            summary = first_error(output)
            with contextlib.suppress(OSError):
                self.failure_record.write_text(f"{summary}\n\n{output}\n")
            raise BuildFailed(
                f"JIT build of {self.what} failed: {summary} (log: {self.failure_record})\n"
                + _tail(output),
                log=_tail(output),
                directory=self.directory,
            ) from exc
        library = Path(module.__file__ or f"{self.name}.so").name
        (self.directory / BUILT_FILE).write_text(f"{library}\n{' '.join(self.cflags)}\n")
        log.warning("pace: built %s in %.1f s", self.what, time.perf_counter() - start)
        try:
            jit_cache.prune_older_builds(self.directory, BUILT_FILE, LOCK_FILE)
        except OSError:  # a cache that cannot be tidied still serves this build
            log.debug("pace: could not prune older builds of %s", self.what, exc_info=True)
        return module


_process_lock = threading.RLock()
_loaded: dict[tuple[Extension, str, str], ModuleType] = {}  # by cache root and CXX too


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs ``ninja`` from PATH; an unactivated venv may not have it there."""
    old = os.environ.get("PATH", "")
    directory = _ninja_dir()
    if directory and directory not in old.split(os.pathsep):
        os.environ["PATH"] = directory + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


def build_extension(
    name: str,
    sources: Sequence[str | Path],
    *,
    retry: bool = False,
    verbose: bool = False,
    **options,
) -> ModuleType:
    """Build (once, cached on disk) and import a C++ extension; raise :class:`BuildFailed`.

    ``options`` are the :class:`Extension` fields: ``isa_tag``, ``prefix``, ``what``,
    ``backend``, ``headers``, ``extra_cflags``, ``extra_ldflags``, ``include_dirs``,
    ``library_dirs``, ``libraries``, ``hash_extra``. Calling it again in the same process
    returns the same module (a dictionary look-up)."""
    return Extension(name, _strs(sources), **options).load(retry=retry, verbose=verbose)


class LazyExtension:
    """A plugin's extension, loaded at most once per process.

    ``describe()`` returns the :class:`Extension` (the CPU target and library look-ups happen
    there; it may raise :class:`BuildFailed` when a library is missing, or
    :class:`BuildNotApplicable` when this CPU would never use the kernels); ``after_load``
    configures a freshly loaded module. A :class:`BuildFailed` is remembered for the process:
    ``supports`` predicates then decline with its reason without retrying."""

    def __init__(
        self,
        describe: Callable[[], Extension],
        *,
        after_load: Callable[[ModuleType], object] | None = None,
    ) -> None:
        self.describe = describe
        self.after_load = after_load
        self.module: ModuleType | None = None
        self.error: BuildFailed | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self.module is not None

    def get(self, verbose: bool = False) -> ModuleType:
        """The module, built if need be (raises BuildFailed or BuildNotApplicable)."""
        if self.module is not None:  # fast path: kernels call this on every call
            return self.module
        with self._lock:
            if self.module is None:
                if self.error is not None:
                    raise self.error.with_traceback(None)
                try:
                    self.module = self._load(self.describe(), retry=False, verbose=verbose)
                except BuildFailed as exc:
                    self.error = exc
                    raise
            return self.module

    def _load(self, extension: Extension, *, retry: bool, verbose: bool) -> ModuleType:
        module = extension.load(retry=retry, verbose=verbose)
        if self.after_load is not None:
            self.after_load(module)
        return module

    def unavailable(self) -> str | None:
        """None once the module is loaded (building it if needed), else why it cannot be."""
        try:
            self.get()
        except (BuildFailed, BuildNotApplicable) as exc:
            return str(exc)
        return None

    def check(self, *, load_cached: bool = False) -> None:
        """For a registration hook: raise BuildFailed when this CPU could use the kernels but
        they are neither cached nor buildable here. Compiles nothing; ``load_cached`` imports
        a cached build right away (a ``dlopen``)."""
        try:
            extension = self.describe()
        except BuildNotApplicable:
            return  # the resolver declines these kernels by their CPU features
        extension.check()
        if load_cached and extension.library is not None:
            self.get()

    def prebuild(self, verbose: bool = False) -> str:
        """A build step (``pace build-kernels``): build now, retrying an earlier failure;
        returns the build directory."""
        with self._lock:
            extension = self.describe()
            self.error = None
            if self.module is None:
                try:
                    self.module = self._load(extension, retry=True, verbose=verbose)
                except BuildFailed as exc:
                    self.error = exc
                    raise
        return str(extension.directory)

    def directory(self) -> Path:
        """Where the build for this machine is (or would be)."""
        return self.describe().directory
