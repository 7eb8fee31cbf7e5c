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
        dlrm._amd_pace()
    probe = (venv / "argv").read_text().split()
    assert probe == ["-I", str(dlrm.Path(dlrm.__file__).with_name("amd_pace_dlrm_probe.py"))]

    (venv / "bin" / "python").unlink()
    _fake_peer(tmp_path / "broken", "", exit_code=1)
    monkeypatch.setattr(dlrm, "amd_pace_venv", lambda: tmp_path / "broken")
    with pytest.raises(dlrm.PeerUnavailable, match="probe in .* failed \\(exit 1\\)"):
        dlrm._amd_pace()
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
