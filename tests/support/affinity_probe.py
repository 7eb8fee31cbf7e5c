"""Run a kernel plugin's glue in a fresh process, then start another OpenMP runtime
(sentencepiece's vendored libgomp), and report CPU affinity, torch threads and the C-level
``OMP_PROC_BIND`` at each stage. Used by the tpp and onednn affinity tests. A fresh process
because affinity and environment are process-wide and libraries such as libxsmm initialize once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

AFFINITY_VARS = ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES")

TEMPLATE = r"""
import ctypes, io, json, os, subprocess, sys

import torch

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p


def state():
    bind = libc.getenv(b"OMP_PROC_BIND")  # the C environment, which a library can change
    return {"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "omp_proc_bind": None if bind is None else bind.decode()}


before = state()
LOAD_GLUE
x, w = torch.randn(3, 64), torch.randn(80, 64)  # one real kernel call (lazy library inits)
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


def probe(load_glue: str, **env_vars: str) -> dict:
    """``load_glue``: statements that import ``kernels`` and load the plugin's glue."""
    env = {k: v for k, v in os.environ.items() if k not in AFFINITY_VARS}
    env.update(env_vars)
    script = TEMPLATE.replace("LOAD_GLUE", load_glue)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
