"""``pace bench dlrm`` on small settings: a throughput row per engine and batch, skipped peers
with their reason, quality rows against fp32, and the results folder."""

from __future__ import annotations

import json

import pytest

from pace_core.cli import main


def test_dlrm_bench_rows_and_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("pace_bench.dlrm.amd_pace_venv", lambda: tmp_path / "no-venv")
    out = tmp_path / "out"
    argv = ["bench", "dlrm", "--max-rows", "500", "--batches", "1", "8", "--repeats", "1",
            "--engines", "pace-fp32", "pace-int8", "pace-int8-static", "torch-eager", "amd-pace",
            "--eval-samples", "512", "--calibration-samples", "256", "--no-plots", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((out / "dlrm.json").read_text())["results"]
    speed = [r for r in rows if r["section"] == "throughput" and "batch" in r]
    assert {(r["engine"], r["batch"]) for r in speed} == {
        (e, b)
        for e in ("pace-fp32", "pace-int8", "pace-int8-static", "torch-eager")
        for b in (1, 8)
    }
    assert all(r["samples_s"] > 0 for r in speed)
    assert all(r["vs_eager"] == 1.0 for r in speed if r["engine"] == "torch-eager")
    skipped = next(r for r in rows if r["engine"] == "amd-pace")
    assert skipped["note"].startswith("skipped: AMD PACE peer venv absent")
    quality = {r["engine"]: r for r in rows if r["section"] == "quality"}
    assert quality["torch-eager"]["d_logloss"] == 0.0
    assert abs(quality["pace-fp32"]["d_logloss"]) < 1e-5
    assert 0 < quality["pace-int8"]["max_dprob"] < 0.2
    assert 0 < quality["pace-int8-static"]["max_dprob"] < 0.2


def _fake_peer(venv, stdout: str, exit_code: int = 0):
    """A peer venv whose bin/python records its arguments and prints ``stdout``."""
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$@" > "{venv}/argv"\ncat <<\'EOF\'\n{stdout}\nEOF\n'
                      f"exit {exit_code}\n")  # fmt: skip
    python.chmod(0o755)
    return venv


def test_amd_pace_engine_states_why_it_does_not_run(tmp_path, monkeypatch):
    from pace_bench import dlrm

    venv = _fake_peer(tmp_path / "amd-pace-venv", json.dumps({
        "version": "1.3.0", "torch": "2.13.0+cpu",
        "missing": ["pace.graph.optimize_qdq", "torch.ops.pace.qmerged_embedding_bag_nbit_cat"],
    }))  # fmt: skip
    monkeypatch.setattr(dlrm, "amd_pace_venv", lambda: venv)
    with pytest.raises(dlrm.PeerUnavailable, match="1.3.0 .* has no DLRMv2 path: missing pace.gr"):
        dlrm._amd_pace(None, None, {})
    probe = (venv / "argv").read_text().split()
    assert probe == ["-I", str(dlrm.Path(dlrm.__file__).with_name("amd_pace_dlrm_probe.py"))]

    (venv / "bin" / "python").unlink()
    _fake_peer(tmp_path / "broken", "", exit_code=1)
    monkeypatch.setattr(dlrm, "amd_pace_venv", lambda: tmp_path / "broken")
    with pytest.raises(dlrm.PeerUnavailable, match="probe in .* failed \\(exit 1\\)"):
        dlrm._amd_pace(None, None, {})
    assert "import pace fails: ModuleNotFoundError" in dlrm.amd_pace_reason(
        {"version": "1.3.0", "import_error": "ModuleNotFoundError: No module named 'pace'"}, venv
    )
    with pytest.raises(dlrm.PeerUnavailable, match="has no bin/python"):
        dlrm.probe_amd_pace(venv)


def test_amd_pace_probe_without_amd_pace():
    """The probe itself, in pace's own venv (no ``pace`` import name there)."""
    from pace_bench.amd_pace_dlrm_probe import probe

    found = probe()
    assert found["version"] is None
    assert found["import_error"].startswith("ModuleNotFoundError")


def test_amd_pace_runner_model_is_the_reference():
    """The plain-torch DLRMv2 the AMD PACE worker quantizes: pace's weights by their torchrec
    names, the reference's probabilities exactly (the worker imports AMD PACE only to quantize)."""
    import torch
    from pace_bench.amd_pace_dlrm_runner import DLRMv2

    from pace_core.dlrm import DLRMConfig, ReferenceDLRM, SyntheticClicks, names
    from pace_core.dlrm.features import fixed_hotness
    from pace_core.dlrm.weights import random_state

    config = DLRMConfig.scaled(300)
    state = random_state(config, 0)
    spec = {"tables": names.tables(config), "bottom": names.bottom(config),
            "cross": [list(c) for c in names.cross(config)], "top": names.top(config)}  # fmt: skip
    dense, sparse = SyntheticClicks(config, seed=1).features(8, torch.Generator().manual_seed(1))
    indices, offsets = fixed_hotness(sparse)
    with torch.no_grad():
        ref = torch.sigmoid(ReferenceDLRM(config, state)(dense, indices, offsets))
        probs = DLRMv2(state, spec)(dense, indices, offsets).reshape(-1)
    assert torch.equal(ref, probs)


FAKE_WORKER = """
import json, sys
from pathlib import Path
import torch
if sys.argv[2].endswith("amd_pace_dlrm_probe.py"):
    print(json.dumps({"version": "1.2.0", "torch": "x", "missing": []}))
    sys.exit()
spec = torch.load(sys.argv[3])
log = Path(spec["buffer"]).parent.parent / "calls"
print("ready " + json.dumps({"version": "1.2.0", "torch": "x", "ops": {},
                             "tables": len(spec["names"]["tables"]), "threads": spec["threads"]}))
sys.stdout.flush()
n = 0
for line in sys.stdin:
    with log.open("a") as f:
        f.write(line.split(" ")[0].strip() + "\\n")
    if line.startswith("load"):
        n = torch.load(line.split(" ", 1)[1].strip())[0].shape[0]
        print("ok", flush=True)
    elif line.startswith("run"):
        torch.arange(n, dtype=torch.float32).numpy().tofile(spec["buffer"])
        print(f"ok {n} 0.25", flush=True)
    elif line.startswith("quit"):
        break
    else:
        print("error bad", flush=True)
"""


def _fake_worker_venv(tmp_path, monkeypatch):
    """A DLRM peer venv whose python runs FAKE_WORKER; temporary files under tmp_path/tmp."""
    import sys

    from pace_bench import dlrm

    venv = tmp_path / "amd-pace-dlrm-venv"
    (venv / "bin").mkdir(parents=True)
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    (venv / "bin" / "python").write_text(
        f'#!/bin/sh\nexec {sys.executable} {tmp_path}/worker.py "$@"\n'
    )
    (venv / "bin" / "python").chmod(0o755)
    monkeypatch.setattr(dlrm, "amd_pace_venv", lambda: venv)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return venv


def test_amd_pace_worker_protocol(tmp_path, monkeypatch):
    """The engine's plumbing with a stand-in worker: the spec it is started with, one load per
    new batch, logits read back from the buffer, errors raised, the worker stopped."""
    import argparse

    import torch
    from pace_bench import dlrm

    from pace_core.dlrm import DLRMConfig, SyntheticClicks
    from pace_core.dlrm.features import fixed_hotness
    from pace_core.dlrm.weights import random_state

    _fake_worker_venv(tmp_path, monkeypatch)
    config = DLRMConfig.scaled(200)
    args = argparse.Namespace(seed=0, calibration_samples=64, batches=[1, 8])
    engine = dlrm._amd_pace(args, config, random_state(config, 0))
    try:
        assert engine.info["tables"] == config.sparse_features
        assert engine.note == "amd-pace 1.2.0 int8, torch x"
        dense, sparse = SyntheticClicks(config, seed=1).features(5, torch.Generator())
        x = (dense, sparse, *fixed_hotness(sparse))
        assert torch.equal(engine(*x), torch.arange(5.0))
        assert torch.equal(engine(*x), torch.arange(5.0))
        assert (tmp_path / "tmp" / "calls").read_text().split() == ["load", "run", "run"]
        assert engine.times == [0.25, 0.25]
        with pytest.raises(RuntimeError, match="worker: error bad"):
            engine._ask("bogus")
    finally:
        engine.close()
    assert engine.proc.returncode == 0
    assert not engine.dir.exists()


def test_dlrm_bench_reports_the_worker_timing(tmp_path, monkeypatch):
    _fake_worker_venv(tmp_path, monkeypatch)
    out = tmp_path / "out"
    argv = ["bench", "dlrm", "--max-rows", "200", "--batches", "4", "--repeats", "2",
            "--engines", "torch-eager", "amd-pace", "--eval-samples", "0",
            "--calibration-samples", "64", "--no-plots", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((out / "dlrm.json").read_text())["results"]
    row = next(r for r in rows if r["engine"] == "amd-pace")
    assert row["ms"] == 250.0
    assert row["note"].startswith("amd-pace 1.2.0 int8, torch x; timed in its process")
