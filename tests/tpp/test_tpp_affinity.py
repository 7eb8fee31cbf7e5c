"""Loading the pace-tpp glue leaves the process's CPU affinity and environment alone.

libxsmm 1.x's init putenv()s ``OMP_PROC_BIND=TRUE`` when no affinity variable is set. torch's
OpenMP runtime is already initialized and does not notice. An OpenMP runtime started later does:
the libgomp vendored in the sentencepiece wheel then bound the main thread, and with it the whole
process, to CPU 0. Each case runs in a fresh process, because the environment and the affinity
mask are process-wide and libxsmm initializes only once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")

AFFINITY_VARS = ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES")

SCRIPT = r"""
import ctypes, io, json, os, subprocess, sys

import torch

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p


def state():
    bind = libc.getenv(b"OMP_PROC_BIND")  # the C environment: libxsmm bypasses os.environ
    return {"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "omp_proc_bind": None if bind is None else bind.decode()}


before = state()
from pace_tpp import build, kernels

build.load()
x, w = torch.randn(3, 64), torch.randn(80, 64)  # a JIT dispatch too: libxsmm inits lazily as well
assert torch.allclose(kernels.linear(x, kernels.prepare_linear(w)), x @ w.T, atol=1e-4)
loaded = state()

import sentencepiece as spm  # starts its own vendored libgomp, which reads OMP_PROC_BIND

model = io.BytesIO()
lines = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(50)]
spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                               vocab_size=40, num_threads=1, minloglevel=2)
tok = spm.SentencePieceProcessor(model_proto=model.getvalue())
assert tok.decode(tok.encode("the lazy fox")) == "the lazy fox"
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_PROC_BIND'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"before": before, "loaded": loaded, "after": state(), "child": child}))
"""


def run_fresh(**env_vars: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in AFFINITY_VARS}
    env.update(env_vars)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def two_cpus():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs in the affinity mask to see a shrink")


def test_glue_then_sentencepiece_keeps_affinity_threads_and_environment():
    out = run_fresh()
    before = out["before"]
    assert len(before["affinity"]) >= 2 and before["omp_proc_bind"] is None
    assert out["loaded"] == before, "loading the glue changed affinity, threads or OMP_PROC_BIND"
    assert out["after"] == before, "a later OpenMP runtime (sentencepiece) pinned the process"
    assert out["child"] == "None", "child processes inherit OMP_PROC_BIND from libxsmm"


def test_user_setting_survives_libxsmm_init():
    # An empty value counts as unset for libxsmm, which would overwrite it with TRUE.
    out = run_fresh(OMP_PROC_BIND="")
    assert out["before"]["omp_proc_bind"] == ""
    assert out["loaded"] == out["before"] and out["after"] == out["before"]
