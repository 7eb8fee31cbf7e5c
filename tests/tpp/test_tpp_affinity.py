"""Loading the pace-tpp glue leaves the process's CPU affinity and environment alone.

libxsmm 1.x's init putenv()s ``OMP_PROC_BIND=TRUE`` when no affinity variable is set. torch's
OpenMP runtime is already initialized and does not notice. An OpenMP runtime started later does:
the libgomp vendored in the sentencepiece wheel then bound the main thread, and with it the whole
process, to CPU 0. Each case runs in a fresh process, because the environment and the affinity
mask are process-wide and libxsmm initializes only once.
"""

from __future__ import annotations

import os

import pytest
from support.affinity_probe import probe

pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")

LOAD = "from pace_tpp import build, kernels\nbuild.load()"


@pytest.fixture(autouse=True)
def two_cpus():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs in the affinity mask to see a shrink")


def test_glue_then_sentencepiece_keeps_affinity_threads_and_environment():
    out = probe(LOAD)
    before = out["before"]
    assert len(before["affinity"]) >= 2 and before["omp_proc_bind"] is None
    assert out["loaded"] == before, "loading the glue changed affinity, threads or OMP_PROC_BIND"
    assert out["after"] == before, "a later OpenMP runtime (sentencepiece) pinned the process"
    assert out["child"] == "None", "child processes inherit OMP_PROC_BIND from libxsmm"


def test_user_setting_survives_libxsmm_init():
    # An empty value counts as unset for libxsmm, which would overwrite it with TRUE.
    out = probe(LOAD, OMP_PROC_BIND="")
    assert out["before"]["omp_proc_bind"] == ""
    assert out["loaded"] == out["before"] and out["after"] == out["before"]
