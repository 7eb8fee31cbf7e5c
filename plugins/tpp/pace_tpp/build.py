"""The C++ glue (``csrc/tpp_glue.cpp``) against libxsmm: its flags and library, built by
:mod:`pace_core.jit` into ``$PACE_CACHE_DIR/kernels/tpp-<isa>-torch<ver>-<hash>`` (the hash
covers the source, the flags and the libxsmm install). A failed build is recorded there; later
processes then refuse to register the plugin until it is deleted or rebuilt with
``pace build-kernels tpp``. Run ``python -m pace_tpp.build`` to build ahead of time.
"""

from __future__ import annotations

from pathlib import Path

from pace_core import jit
from pace_core.cpu import detect_cpu
from pace_tpp.locate import find_libxsmm

NAME = "pace_tpp_glue"
SOURCE = Path(__file__).parent / "csrc" / "tpp_glue.cpp"
ISA_FLAGS = {
    "amx": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
    "avx512bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}


def cflags() -> list[str]:
    isa = detect_cpu().isa_level
    return ["-O3", "-fno-math-errno", *ISA_FLAGS.get(isa, []), "-DNDEBUG"]


def glue() -> jit.Extension:
    """The build for this CPU and libxsmm install (raises TppUnavailable without libxsmm)."""
    lib = find_libxsmm()
    return jit.Extension(
        NAME, (SOURCE,), prefix="tpp", what="the libxsmm glue", backend="tpp",
        extra_cflags=cflags(), extra_ldflags=lib.ldflags(), include_dirs=(lib.include_dir,),
        hash_extra=(repr(lib),),
    )  # fmt: skip


GLUE = jit.LazyExtension(glue)
load = GLUE.get  # the glue module, built on first use (raises jit.BuildFailed)
unavailable_reason = GLUE.unavailable
prebuild = GLUE.prebuild


if __name__ == "__main__":
    problem = unavailable_reason()
    if problem:
        raise SystemExit(f"pace-tpp: {problem}")
    print(f"pace-tpp glue ready in {GLUE.directory()} (libxsmm {load().libxsmm_version}, "
          f"target {load().target_arch()})")  # fmt: skip
