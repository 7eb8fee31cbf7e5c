"""Loading the pace-onednn glue leaves the process's CPU affinity and environment alone.

The same check as tests/tpp/test_tpp_affinity.py, where libxsmm's init set OMP_PROC_BIND=TRUE
and a later OpenMP runtime (sentencepiece's vendored libgomp) then pinned the process to one CPU.
oneDNN does not do this; the test guards against a future wheel that does. It runs in a fresh
process because the environment and the affinity mask are process-wide.
"""

from __future__ import annotations

import os

import pytest
from support.affinity_probe import probe

pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")

LOAD = "from pace_onednn import build, kernels\nbuild.extension()"


def test_glue_then_sentencepiece_keeps_affinity_threads_and_environment():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs in the affinity mask to see a shrink")
    out = probe(LOAD)
    assert len(out["before"]["affinity"]) >= 2 and out["before"]["omp_proc_bind"] is None
    assert out["loaded"] == out["before"], "loading the glue changed affinity, threads or env"
    assert out["after"] == out["before"], "sentencepiece's OpenMP pinned the process"
    assert out["child"] == "None"
