"""Loading the pace-onednn glue leaves the process's CPU affinity and environment alone.

The same check as tests/tpp/test_tpp_affinity.py, where libxsmm's init set OMP_PROC_BIND=TRUE
and a later OpenMP runtime (sentencepiece's vendored libgomp) then pinned the process to one CPU.
oneDNN does not do this; the test guards against a future wheel that does. It runs in a fresh
process because the environment and the affinity mask are process-wide.
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
import ctypes, io, json, os

import torch

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p


def state():
    bind = libc.getenv(b"OMP_PROC_BIND")  # the C environment, which a library can change
    return {"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "omp_proc_bind": None if bind is None else bind.decode()}


before = state()
from pace_onednn import build, kernels

build.extension()
x, w = torch.randn(3, 64), torch.randn(80, 64)
assert torch.allclose(kernels.linear(x, kernels.prepare_linear(w)), x @ w.T, atol=1e-4)
loaded = state()

import sentencepiece as spm  # starts its own vendored libgomp, which reads OMP_PROC_BIND

model = io.BytesIO()
lines = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(50)]
spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                               vocab_size=40, num_threads=1, minloglevel=2)
tok = spm.SentencePieceProcessor(model_proto=model.getvalue())
assert tok.decode(tok.encode("the lazy fox")) == "the lazy fox"
print(json.dumps({"before": before, "loaded": loaded, "after": state()}))
"""


def test_glue_then_sentencepiece_keeps_affinity_threads_and_environment():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs in the affinity mask to see a shrink")
    env = {k: v for k, v in os.environ.items() if k not in AFFINITY_VARS}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["before"]["affinity"]) >= 2 and out["before"]["omp_proc_bind"] is None
    assert out["loaded"] == out["before"], "loading the glue changed affinity, threads or env"
    assert out["after"] == out["before"], "sentencepiece's OpenMP pinned the process"
