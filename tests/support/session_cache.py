"""The test session's own pace cache over the user's (tests/conftest.py sets it as
``PACE_CACHE_DIR``), so a run leaves the user's cache as it found it."""

from __future__ import annotations

from pathlib import Path

# The user's pace cache as the suite uses it in place: the kernels and zoo models pace's own
# first run builds (made there if missing, as `make run` would), and the benchmarks' peers and
# random-weight models where `make bench-*` made them.
PRODUCT_CACHE = ("kernels", "models")
BENCH_CACHE = ("peers", "random", "compressed-tensors")
# What is derived from a model file once (pace_core.paths.derived_entry): the entries made
# before are read through links, the ones the suite makes (every temporary GGUF's) stay in it.
DERIVED_CACHE = ("gguf-meta", "tokenizers")


def session_cache(user_root: Path, root: Path) -> Path:
    """A pace cache at ``root`` over the user's (``user_root``): the shared parts linked, the
    derived entries linked one by one, so what the suite derives from its temporary files
    leaves the user's cache as it found it."""
    root.mkdir(parents=True)
    for name in PRODUCT_CACHE:
        (user_root / name).mkdir(parents=True, exist_ok=True)
    for name in PRODUCT_CACHE + BENCH_CACHE:
        if (user_root / name).is_dir():
            (root / name).symlink_to(user_root / name, target_is_directory=True)
    for name in DERIVED_CACHE:
        (root / name).mkdir()
        if (user_root / name).is_dir():
            for entry in (user_root / name).iterdir():
                (root / name / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return root
