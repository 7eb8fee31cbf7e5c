"""The compiled extension, checked once against the core it serves.

Constants shared by C++ and Python live in C++ only (``csrc/kernels.h``: the packed layout's
``BLOCK`` and ``GROUP``; ``csrc/simd.h``: the activation names by code) and are exported by the
extension; Python reads them from there. The activation codes are indices into the core's one
activation vocabulary, ``pace_core.ops.ACTIVATIONS``: a build whose names differ from it
(say, after an edit on one side only) is refused when first loaded.
"""

from __future__ import annotations

from types import ModuleType

from pace_avx512 import build
from pace_core.ops import ACTIVATIONS

_checked: ModuleType | None = None  # the module object last checked


class ExtensionMismatch(RuntimeError):
    """The built extension disagrees with the core on a shared constant."""


def load() -> ModuleType:
    """The kernel module (``build.load_extension``), its shared constants checked."""
    global _checked
    ext = build.load_extension()
    if ext is not _checked:
        check(ext)
        _checked = ext
    return ext


def check(ext: ModuleType) -> None:
    names = tuple(ext.ACTIVATIONS)
    if names != ACTIVATIONS:
        raise ExtensionMismatch(
            f"pace-avx512: the kernels' activation codes {names} (csrc/simd.h ACT_NAMES) are "
            f"not pace_core.ops.ACTIVATIONS {ACTIVATIONS} in order (index = code); "
            "make them agree and rebuild"
        )
