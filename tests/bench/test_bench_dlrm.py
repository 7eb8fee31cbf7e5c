"""``pace bench dlrm`` on small settings: a throughput row per engine and batch, skipped peers
with their reason, quality rows against fp32, and the results folder."""

from __future__ import annotations

import json

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
