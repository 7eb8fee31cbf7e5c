"""The C++ kernels (``csrc/``): sources, per-target ISA flags, and their JIT build.

:mod:`pace_core.jit` builds them into ``$PACE_CACHE_DIR/kernels/avx512-<target>-torch<ver>-
<hash>/``. ``<target>`` names the exact ISA flags used, never ``-march=native``, so a cached
binary is only ever loaded on a CPU that has those features. A failed build is recorded there:
later processes then register no kernels and say why, until :func:`prebuild` succeeds.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from pace_core import jit

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("bindings.cpp", "stack.cpp", "stack_layers.cpp", "linear.cpp", "qlinear.cpp",
           "igemm.cpp", "qpanel.cpp", "norm.cpp", "rope.cpp", "attention.cpp", "activation.cpp",
           "stream.cpp", "dlrm.cpp", "dlrm_ops.cpp")  # fmt: skip
# Every header in csrc/, so that an edit to any of them rebuilds (a hand-kept list once missed
# two, and their edits loaded the stale cached binary).
HEADERS = tuple(sorted(p.name for p in CSRC.glob("*.h")))
BASE_FEATURES = ("avx512f", "avx512bw", "avx512vl", "fma")
AVX2_FEATURES = ("avx2", "fma", "f16c")  # the least a build target needs
BASE_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c")
# Build targets, best first: tag -> (CPU features required, ISA flags).
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512bf16": (
        (*BASE_FEATURES, "avx512_bf16"),
        (*BASE_FLAGS, "-mavx512bf16", "-DPACE_HAS_BF16"),
    ),
    "avx512": (BASE_FEATURES, BASE_FLAGS),
    # The same kernels on AVX2 CPUs: each 512-bit intrinsic on a pair of 256-bit registers
    # (csrc/avx512_on_avx2.h). Same numbers, roughly half the vector width.
    "avx2": (AVX2_FEATURES, ("-mavx2", "-mfma", "-mf16c")),
}
COMMON_FLAGS = ("-O3",)  # and -fopenmp, which pace_core.jit adds to compiler and linker


def target() -> str | None:
    """The best build target this CPU (as ``pace_core.cpu.detect_cpu`` reports it) can run."""
    from pace_core.cpu import detect_cpu

    cpu = detect_cpu()
    return next((tag for tag, (needs, _) in TARGETS.items() if cpu.has(*needs)), None)


def int8_dot_problem() -> str | None:
    """Why the quantized kernels (vpdpbusd) cannot run on this CPU's target, or None: the
    AVX-512 targets compile them for AVX512-VNNI; the avx2 target has exact AVX2 forms of it."""
    from pace_core.cpu import detect_cpu

    tag = target()
    if tag is None or tag == "avx2" or detect_cpu().has("avx512_vnni"):
        return None
    return "missing CPU features: avx512_vnni (quantized kernels use vpdpbusd)"


def extension(tag: str | None = None) -> jit.Extension:
    """The build of ``tag`` (default: this CPU's target)."""
    tag = tag or target()
    if tag is None:
        raise jit.BuildNotApplicable(
            "pace-avx512: this CPU lacks " + ", ".join(AVX2_FEATURES) + " (see `pace ops`)"
        )
    return jit.Extension(
        f"pace_avx512_{tag}", tuple(CSRC / s for s in SOURCES), isa_tag=tag, prefix="avx512",
        what=f"the {tag} kernels", backend="avx512", headers=tuple(CSRC / h for h in HEADERS),
        extra_cflags=(*COMMON_FLAGS, *TARGETS[tag][1]),
    )  # fmt: skip


def check_constants(module: ModuleType) -> None:
    """Constants shared by C++ and Python live in C++ only (``csrc/kernels.h``: the packed
    layout's ``BLOCK`` and ``GROUP``; ``csrc/simd.h``: the activation names by code) and are
    read from the extension. Its activation codes must be indices into the core's vocabulary,
    ``pace_core.ops.ACTIVATIONS``: a build where they are not is refused when first loaded
    (a remembered BuildFailed, so the resolver declines the kernels with this reason)."""
    from pace_core.ops import ACTIVATIONS

    names = tuple(module.ACTIVATIONS)
    if names != ACTIVATIONS:
        raise jit.BuildFailed(
            f"pace-avx512: the kernels' activation codes {names} (csrc/simd.h ACT_NAMES) are "
            f"not pace_core.ops.ACTIVATIONS {ACTIVATIONS} in order (index = code); "
            "make them agree and rebuild"
        )


EXT = jit.LazyExtension(extension, after_load=check_constants)


def load_extension(verbose: bool = False) -> ModuleType:
    """The kernel module: imported from the cache, or compiled first (once per process)."""
    return EXT.get(verbose)


def loaded() -> bool:
    """Whether this process has the kernel module already."""
    return EXT.loaded


def available() -> bool | str:
    """True once the kernels are loaded (building them if needed), else the reason (for
    ``supports`` predicates, so the resolver falls back instead of picking a broken kernel)."""
    reason = EXT.unavailable()
    return True if reason is None else f"kernels unavailable: {reason.strip().splitlines()[0]}"


def prebuild(verbose: bool = False) -> str:
    """Build now, retrying a failed build (``pace build-kernels``); returns the build dir."""
    return EXT.prebuild(verbose)
