"""The JIT kernel cache stays small: a new build retires the older builds of its extension.

Every edit of a kernel source gives a new build directory (its name ends in a hash of every
build input, :mod:`pace_core.jit`), so without pruning ``<cache>/kernels`` grows by a build per
change (~3 MB each for pace-avx512). After a build succeeds, :func:`prune_older_builds` removes
the builds of the same *family* (same prefix, ISA target and torch version: only the hash
differs) except the :data:`KEEP_BUILDS` most recently used, this one included. Loading a cached
build marks it used (:func:`mark_used`), so two installations sharing one cache (two venvs,
say) keep each other's current build. A build another process is making (its lock held) is
never removed; removal holds that lock too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger("pace.jit")

KEEP_BUILDS = 3
"""Builds kept per family: the newest one and the two used before it."""

_HASH = re.compile(r"[0-9a-f]{12}")


def family(directory: Path) -> str:
    """``<prefix>-<isa tag>-torch<version>``: a build directory's name without its hash."""
    return directory.name.rsplit("-", 1)[0]


def last_used(directory: Path, built_file: str) -> float:
    """When a build was last loaded or made (its record's mtime, else the directory's)."""
    for path in (directory / built_file, directory):
        with contextlib.suppress(OSError):
            return path.stat().st_mtime
    return 0.0


def mark_used(directory: Path, built_file: str) -> None:
    """Record that a cached build was just loaded (the cache may be read-only: then nothing)."""
    with contextlib.suppress(OSError):
        os.utime(directory / built_file)


def prune_older_builds(
    directory: Path, built_file: str, lock_file: str, keep: int = KEEP_BUILDS
) -> list[Path]:
    """Remove the builds of ``directory``'s family but the ``keep`` most recently used
    (``directory`` always stays); returns what was removed."""
    name = family(directory)
    siblings = [
        d
        for d in directory.parent.iterdir()
        if d != directory and d.is_dir() and family(d) == name
        and _HASH.fullmatch(d.name.rsplit("-", 1)[-1])
    ]  # fmt: skip
    siblings.sort(key=lambda d: last_used(d, built_file), reverse=True)
    removed = [d for d in siblings[max(keep - 1, 0):] if _remove_unless_locked(d, lock_file)]
    if removed:
        log.info("pace: removed %d older build(s) of %s from %s", len(removed), name,
                 directory.parent)  # fmt: skip
    return removed


def _remove_unless_locked(directory: Path, lock_file: str) -> bool:
    """Delete a build directory while holding its build lock; False if another process holds
    it (a build in progress) or the directory could not be removed."""
    try:
        with open(directory / lock_file, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            shutil.rmtree(directory, ignore_errors=True)
    except OSError:
        return False
    return not directory.exists()
