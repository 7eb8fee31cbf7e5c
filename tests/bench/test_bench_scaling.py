"""``pace bench scaling``: the bandwidth fit, the model's arithmetic, node binding on a recorded
two-node tree, and one tiny end-to-end run (plumbing, not speed)."""

from __future__ import annotations

import argparse
import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from pace_bench import scaling
from pace_bench.scaling import Fit, Shape, default_threads, fit_bandwidth, parse_machine

from pace_core.cli import main
from pace_core.platform import read_topology

TREES = Path(__file__).resolve().parents[1] / "platform" / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def test_fit_recovers_a_saturating_curve():
    c, b = 30.0, 200.0
    points = [(t, 1 / (1 / (c * t) + 1 / b)) for t in (1, 2, 4, 8, 16)]
    got_c, got_b = fit_bandwidth(points)
    assert got_c == pytest.approx(c) and got_b == pytest.approx(b)
    assert Fit(got_c, got_b, 1.0, 1.0).bandwidth(64) == pytest.approx(1 / (1 / 1920 + 1 / 200))


def test_fit_without_saturation_and_with_a_fixed_ceiling():
    assert fit_bandwidth([(1, 25.0), (2, 50.0)]) == (pytest.approx(25.0), math.inf)
    c, b = fit_bandwidth([(1, 25.0), (2, 30.0)])  # two points: exact
    assert 1 / (1 / c + 1 / b) == pytest.approx(25.0)
    assert 1 / (1 / (2 * c) + 1 / b) == pytest.approx(30.0)
    assert fit_bandwidth([(2, 50.0)]) == (pytest.approx(25.0), math.inf)  # one point
    c, b = fit_bandwidth([(1, 20.0)], node_gbs=300.0)
    assert b == 300.0 and 1 / (1 / c + 1 / b) == pytest.approx(20.0)
    c, b = fit_bandwidth([(1, 30.0), (2, 20.0)])  # slower with more: flat at the best
    assert Fit(c, b, 1.0, 1.0).bandwidth(1) == Fit(c, b, 1.0, 1.0).bandwidth(64) == 30.0


def test_decode_is_bandwidth_bound_until_the_batch_makes_it_compute_bound():
    shape = Shape(body_params=10**9, head_params=0, layers=1, kv_width=0, q_width=0)
    fit = Fit(core_gbs=10.0, node_gbs=math.inf, core_gflops=100.0, prefill_eff=0.5)
    tok, bound = fit.decode(shape, "bfloat16", threads=4, batch=1, context=0)
    assert bound == "bandwidth" and tok == pytest.approx(40e9 / 2e9)  # 40 GB/s / 2 GB
    tok, bound = fit.decode(shape, "bfloat16", threads=4, batch=1000, context=0)
    assert bound == "compute" and tok == pytest.approx(4 * 50e9 / 2e9)
    assert fit.prefill(shape, 8, 2) == pytest.approx(8 * 50e9 / 2e9)
    headed = Shape(body_params=10**9, head_params=10**8, layers=2, kv_width=8, q_width=16)
    assert headed.prefill_flops_per_token(100) == pytest.approx(2e9 + 2e8 / 100 + 4 * 2 * 16 * 50)
    assert shape.weight_bytes("q4_0") == pytest.approx(0.5625e9)


def test_shapes_from_configs_only():
    shape = scaling.shape_of(scaling.config_of("random:llama-3.2-1b"))
    assert shape.body_params + shape.head_params == 1_235_814_400  # Llama-3.2-1B, tied
    assert shape.layers == 16 and shape.kv_width == 2 * 8 * 64
    eight = scaling.shape_of(scaling.config_of("random:llama-3.1-8b"))
    assert eight.body_params + eight.head_params == 8_030_261_248 - 128256 * 4096  # untied


def test_arguments():
    assert default_threads(1) == [1] and default_threads(2) == [1, 2]
    assert default_threads(96) == [1, 2, 4, 8, 16, 32, 64, 96]
    assert parse_machine("128:2:360") == (128, 2, 360.0)
    for bad in ("64", "1:2:3", "64:1:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_machine(bad)


def test_two_node_machine_sweeps_inside_node_one(monkeypatch):
    from pace_core.platform import binding

    topo = read_topology(TREES / "xeon-2s-snc")
    applied = []
    monkeypatch.setattr("pace_core.platform.current_topology", lambda: topo)
    monkeypatch.setattr(binding, "apply_plan", lambda plan, name: applied.append(plan))
    args = argparse.Namespace(node=1, quiet=True, machine={"cores": {"usable": 128}})
    assert scaling.bind_to_node(args) == (4, 16)
    assert applied[0].cores == tuple(range(16, 32)) and applied[0].numa_node == 1
    assert args.machine["cores"]["usable"] == 16


def test_tiny_run_writes_every_section_and_a_plot(tiny_llama_dir, tmp_path):
    out = tmp_path / "scaling"
    argv = ["bench", "scaling", "--models", str(tiny_llama_dir), "--threads", "1",
            "--batches", "1", "2", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1",
            "--read-mib", "8", "--gemm-m", "8", "--predict", "64:1:360",
            "--predict-models", "random:llama-3.1-8b", "--predict-formats", "bfloat16", "int4",
            "--fit", "75:217:0.89",
            "--out", str(out)]  # fmt: skip
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(argv) == 0
    rows = json.loads((out / "scaling.json").read_text())["results"]
    sections = {r["section"] for r in rows}
    assert {"read", "gemm", "fit", "model", "prediction"} <= sections
    model = [r for r in rows if r["section"] == "model"]
    assert {r["what"] for r in model} == {"decode b1", "decode b2", "prefill 8"}
    assert all(r["tok_s"] > 0 and r["best"] >= r["tok_s"] * 0.999 and r["pred"] > 0
               for r in model)  # fmt: skip
    eight = [r for r in rows if r["section"] == "prediction" and "8b" in r["model"]]
    assert {(r["format"], r["what"]) for r in eight} >= {("int4", "decode b1"),
                                                       ("bfloat16", "prefill 8")}  # fmt: skip
    given = [r for r in rows if r["section"] == "fit" and r["node_gbs"] == "per machine"]
    assert given and given[0]["core_gbs"] == 75.0
    tok = next(r["pred"] for r in eight if (r["format"], r["what"]) == ("bfloat16", "decode b1"))
    shape = scaling.shape_of(scaling.config_of("random:llama-3.1-8b"))
    expected = Fit(75.0, 360.0, 217.0, 0.89).decode(shape, "bfloat16", 64, 1, 8 + 4 // 2)[0]
    assert tok == pytest.approx(expected)
    assert (out / "scaling.png").read_bytes()[:8] == PNG
    assert "[prediction]" in buf.getvalue()
