"""Find libxsmm (headers + library) without building anything.

Search order: ``$LIBXSMM_ROOT`` (exclusively, when set), ``$CONDA_PREFIX``, ``/usr/local``,
``/usr``, ``/opt/libxsmm``. pace-tpp needs the 1.x API (``libxsmm_bsmmdispatch_reducebatch_strd``),
as shipped by Debian/Ubuntu ``libxsmm-dev`` 1.17.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pace_core.jit import BuildFailed

LIB_SUBDIRS = ("lib", "lib64", "lib/x86_64-linux-gnu")
DEFAULT_PREFIXES = ("/usr/local", "/usr", "/opt/libxsmm")
REQUIRED_SYMBOL = "libxsmm_bsmmdispatch_reducebatch_strd"
INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install libxsmm-dev; see plugins/tpp/README.md)"


class TppUnavailable(BuildFailed):
    """pace-tpp cannot run here; the message says why and how to fix it."""


@dataclass(frozen=True)
class Libxsmm:
    """A usable libxsmm install: where its headers and libraries are, and its version."""

    include_dir: Path
    lib_dir: Path
    libs: tuple[str, ...]  # e.g. ("xsmm", "xsmmnoblas")
    shared: bool
    version: str

    def ldflags(self) -> list[str]:
        flags = [f"-L{self.lib_dir}", *(f"-l{lib}" for lib in self.libs)]
        if self.shared:
            flags.append(f"-Wl,-rpath,{self.lib_dir}")
        return [*flags, "-lpthread", "-ldl", "-lm"]


def _prefixes() -> list[Path]:
    root = os.environ.get("LIBXSMM_ROOT")
    if root:
        return [Path(root).expanduser()]
    conda = os.environ.get("CONDA_PREFIX")
    return [Path(p) for p in ([conda] if conda else []) + list(DEFAULT_PREFIXES)]


def _find_lib(prefix: Path, name: str) -> tuple[Path, bool] | None:
    """The directory holding ``lib<name>`` under ``prefix`` and whether it is shared."""
    for sub in LIB_SUBDIRS:
        d = prefix / sub
        for suffix, shared in ((".so", True), (".a", False)):
            if (d / f"lib{name}{suffix}").exists():
                return d, shared
    return None


def _version(include_dir: Path) -> str:
    try:
        text = (include_dir / "libxsmm_version.h").read_text(errors="replace")
    except OSError:
        return "unknown"
    found = re.search(r'LIBXSMM_CONFIG_VERSION\s+"([^"]+)"', text)
    return found.group(1) if found else "unknown"


def find_libxsmm() -> Libxsmm:
    """The first complete libxsmm install on the search path, else raise TppUnavailable."""
    tried = []
    for prefix in _prefixes():
        header = prefix / "include" / "libxsmm.h"
        lib = _find_lib(prefix, "xsmm")
        if not header.exists() or lib is None:
            tried.append(str(prefix))
            continue
        if REQUIRED_SYMBOL not in header.read_text(errors="replace"):
            raise TppUnavailable(
                f"libxsmm {_version(header.parent)} at {prefix} lacks the 1.x API "
                f"({REQUIRED_SYMBOL}); pace-tpp needs libxsmm 1.16/1.17"
            )
        lib_dir, shared = lib
        noblas = _find_lib(prefix, "xsmmnoblas")
        libs = ("xsmm", "xsmmnoblas") if noblas and noblas[0] == lib_dir else ("xsmm",)
        return Libxsmm(header.parent, lib_dir, libs, shared, _version(header.parent))
    where = "LIBXSMM_ROOT=" if os.environ.get("LIBXSMM_ROOT") else "searched "
    raise TppUnavailable(
        f"libxsmm not found (libxsmm.h + libxsmm.a/.so; {where}{', '.join(tried)}): {INSTALL_HINT}"
    )
