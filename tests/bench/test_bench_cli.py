"""``pace bench``: results folders, plots, --quiet, errors, and the llama.cpp peer helpers.

Everything runs with tiny shapes and one repeat: these check the plumbing, not speed.
"""

from __future__ import annotations

import io
import json
import tarfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from pace_bench import peers
from pace_bench.cli import BENCHMARKS

from pace_core import plugins
from pace_core.cli import main
from pace_core.cpu import detect_cpu
from pace_core.errors import ModelLoadError
from pace_core.registry import OpContext

PNG = b"\x89PNG\r\n\x1a\n"
K, N = 64, 128
TINY_KERNELS = [
    "bench", "kernels", "--shapes", f"{K}x{N}", "--dtypes", "float32", "--threads", "1",
    "--repeats", "1", "--gemv-m", "1", "--gemm-m", "4", "--cold-mib", "1",
    "--sections", "gemv", "gemm",
]  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch):
    for name in ("PACE_OPCONFIG", "PACE_DISABLE_PLUGINS", "PACE_CPU_FEATURES_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    plugins.reset_host()
    yield
    plugins.reset_host()


def usable_linear_backends(dtype: torch.dtype) -> set[str]:
    """What the resolver could pick for ``linear`` here, by the registry's own check."""
    ctx = OpContext("linear", dtype, {"in_features": K, "out_features": N})
    features = detect_cpu().features
    specs = plugins.get_host().ops.where(op="linear")
    return {s.backend for s in specs if s.check(ctx, features) is None}


@pytest.fixture(scope="module")
def kernels_run(tmp_path_factory) -> tuple[Path, str]:
    """One tiny ``pace bench kernels`` run: its folder and what it printed."""
    out = tmp_path_factory.mktemp("bench") / "kernels"
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main([*TINY_KERNELS, "--out", str(out)]) == 0
    return out, buf.getvalue()


def test_kernels_writes_machine_json_results_and_plots(kernels_run):
    out, printed = kernels_run
    machine = json.loads((out / "machine.json").read_text())
    assert machine["features"] and machine["cores"]["logical"] >= 1
    assert {"torch", "transformers", "pace"} <= set(machine["versions"])
    assert machine["plugins"]["native"]["status"] == "ok"
    payload = json.loads((out / "kernels.json").read_text())
    assert payload["benchmark"] == "kernels" and payload["machine"] == machine
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == PNG for p in pngs)
    assert "gemv" in printed and "backend" in printed  # the table went to stdout


def test_kernels_rows_cover_every_usable_linear_backend(kernels_run):
    rows = json.loads((kernels_run[0] / "kernels.json").read_text())["results"]
    expected = usable_linear_backends(torch.float32) | {"torch"}
    assert "native" in expected
    for section in ("gemv", "gemm"):
        found = {r["backend"] for r in rows if r["section"] == section}
        assert expected <= found, f"{section}: missing {expected - found}"
        assert all(r["value"] > 0 for r in rows if r["section"] == section)


def test_backends_filter(tmp_path):
    argv = [*TINY_KERNELS, "--sections", "gemv", "--backends", "native", "torch"]
    assert main([*argv, "--out", str(tmp_path), "--quiet", "--no-plots"]) == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["results"]
    assert {r["backend"] for r in rows if r["section"] == "gemv"} == {"native", "torch"}


def test_qgemv_rows_per_format_and_backend_that_takes_it(tmp_path):
    """Every quantized format, every backend whose linear takes it, with its share of the
    streaming read timed in the same rounds (or of the dram-read rows without pace-avx512)."""
    from pace_bench.kernels_quant import FORMATS, REFERENCE

    k = 256  # a k-quant super-block
    argv = [*TINY_KERNELS[:-3], "--sections", "qgemv", "--shapes", f"{k}x{N}", f"{K}x{N}",
            "--out", str(tmp_path), "--no-plots"]  # fmt: skip
    assert main([*argv, "--quiet"]) == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["results"]
    dram = max(r["value"] for r in rows if r["section"] == "dram-read")
    qgemv = [r for r in rows if r["section"] == "qgemv"]
    assert not [r for r in qgemv if r["shape"].startswith(f"{K}x") and "_k" in r["shape"]]
    for fmt in FORMATS:
        got = {r["backend"]: r for r in qgemv if r["shape"] == f"{k}x{N} {fmt}"}
        ctx = OpContext("linear", torch.float32, {"in_features": k, "out_features": N,
                                                  "weight_format": fmt})  # fmt: skip
        specs = plugins.get_host().ops.where(op="linear")
        usable = {s.backend for s in specs if s.check(ctx, detect_cpu().features) is None}
        assert set(got) - {REFERENCE} == usable and "native" in usable, fmt
        assert (REFERENCE in got) == ("avx512" in usable_linear_backends(torch.bfloat16))
        reference = got[REFERENCE]["value"] if REFERENCE in got else dram
        for row in got.values():
            assert row["unit"] == "GB/s" and row["value"] > 0
            assert row["of_dram"] == pytest.approx(row["value"] / reference)


def test_qgemm_rows_per_format_against_the_dense_weight(tmp_path):
    """``--qgemm-formats``: each backend's dense weight and every listed format its linear
    takes, each with ``vs_dense`` over that backend's dense rate; a K that is not a whole
    number of the format's blocks is skipped."""
    k = 256  # a k-quant super-block
    argv = [*TINY_KERNELS[:-3], "--sections", "qgemm", "--shapes", f"{k}x{N}", f"{K}x{N}",
            "--qgemm-formats", "w8a8", "q8_0", "q4_k", "--out", str(tmp_path)]  # fmt: skip
    assert main([*argv, "--no-plots", "--quiet"]) == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["results"]
    for shape, formats in ((f"{k}x{N}", {"w8a8", "q8_0", "q4_k"}), (f"{K}x{N}", {"w8a8", "q8_0"})):
        got = {r["backend"]: r for r in rows if r["section"] == "qgemm" and r["shape"] == shape}
        assert {name.split(" ")[1] for name in got} == {"dense", *formats}, shape
        for name, row in got.items():
            backend, fmt = name.split(" ")
            assert row["unit"] == "GFLOP/s" and row["value"] > 0
            if fmt != "dense":
                dense = got[f"{backend} dense"]["value"]
                assert row["vs_dense"] == pytest.approx(row["value"] / dense)


def test_qgemm_paths_force_each_avx512_path(tmp_path):
    """``--qgemm-paths``: pace-avx512's bf16-row paths of each quantized format forced side by
    side (panel, planes, and words where the build has them), each with ``vs_dense``; the
    kernels' tuning knobs are as they were after."""
    from support.isa import avx512_unavailable

    if avx512_unavailable(int8=True):
        pytest.skip(avx512_unavailable(int8=True))
    from pace_avx512 import build

    ext = build.load_extension()
    knobs = ext.qpanel_rows(), ext.qword_tiles(), ext.qpanel_every_kind()
    argv = ["bench", "kernels", "--shapes", f"{K}x{N}", "--dtypes", "bfloat16", "--threads", "1",
            "--repeats", "1", "--gemm-m", "8", "--sections", "qgemm", "--qgemm-paths",
            "--backends", "avx512", "--qgemm-formats", "q8_0", "--out", str(tmp_path)]  # fmt: skip
    assert main([*argv, "--no-plots", "--quiet"]) == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["results"]
    got = {r["backend"]: r for r in rows if r["section"] == "qgemm"}
    paths = {"panel", "planes", *(["words"] if ext.has_word_tiles else [])}
    assert set(got) == {"avx512 dense", "avx512 q8_0", *(f"avx512 q8_0 {p}" for p in paths)}
    dense = got["avx512 dense"]["value"]
    for name, row in got.items():
        assert row["value"] > 0
        if name != "avx512 dense":
            assert row["vs_dense"] == pytest.approx(row["value"] / dense)
    assert (ext.qpanel_rows(), ext.qword_tiles(), ext.qpanel_every_kind()) == knobs


def test_plot_redraws_from_json(kernels_run, tmp_path):
    out, _ = kernels_run
    assert main(["bench", "plot", str(out), "--out", str(tmp_path), "--quiet"]) == 0
    redrawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert redrawn == sorted(p.name for p in out.glob("*.png"))
    assert all((tmp_path / name).read_bytes()[:8] == PNG for name in redrawn)


def test_plot_of_a_folder_without_results(tmp_path, capsys):
    assert main(["bench", "plot", str(tmp_path)]) == 2
    assert "no benchmark JSON" in capsys.readouterr().err


def test_quiet_prints_nothing_to_stdout(tmp_path, capfd):
    assert main([*TINY_KERNELS, "--sections", "gemv", "--out", str(tmp_path), "--quiet"]) == 0
    assert capfd.readouterr().out == ""
    assert (tmp_path / "kernels.json").is_file()


def test_offline_sweeps_and_plots(tiny_llama_dir, tmp_path, capfd):
    argv = ["bench", "offline", "--models", str(tiny_llama_dir), "--engines", "pace",
            "transformers", "--threads", "1", "--batches", "1", "2", "--prompt-lens", "4", "8",
            "--new-tokens", "2", "--repeats", "1", "--out", str(tmp_path), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert capfd.readouterr().out == ""
    rows = json.loads((tmp_path / "offline.json").read_text())["results"]
    points = {(r["engine"], r["batch"], r["prompt_len"]) for r in rows}
    assert points == {(e, b, p) for e in ("pace", "transformers")
                      for b, p in ((1, 4), (2, 4), (1, 8))}  # fmt: skip
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 for r in rows)
    png = tmp_path / f"offline-{Path(str(tiny_llama_dir)).name}.png"
    assert png.read_bytes()[:8] == PNG


def test_offline_compares_kv_cache_types_side_by_side(tiny_llama_dir, tmp_path):
    argv = ["bench", "offline", "--models", str(tiny_llama_dir), "--engines", "pace",
            "--kv-cache-types", "dynamic", "paged", "slab_pool", "--threads", "1",
            "--batches", "2", "--prompt-lens", "6", "--new-tokens", "3", "--repeats", "1",
            "--out", str(tmp_path), "--quiet", "--no-plots"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "offline.json").read_text())["results"]
    assert [(r["engine"], r["kv_cache"]) for r in rows] == [
        ("pace[dynamic]", "dynamic"), ("pace[paged]", "paged"), ("pace[slab_pool]", "slab_pool")
    ]  # fmt: skip
    assert rows[0]["decode_vs_first_cache"] == rows[0]["prefill_vs_first_cache"] == 1.0
    assert all(r["decode_vs_first_cache"] > 0 and r["prefill_vs_first_cache"] > 0 for r in rows)


def test_decode_vs_peers_measures_pace_against_transformers(tiny_llama_dir, tmp_path):
    argv = ["bench", "decode_vs_peers", "--models", str(tiny_llama_dir), "--engines", "pace",
            "transformers", "--threads", "1", "--prompt-lens", "5", "--new-tokens", "3",
            "--repeats", "1", "--out", str(tmp_path), "--quiet", "--no-plots"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "decode_vs_peers.json").read_text())["results"]
    assert sorted(r["engine"] for r in rows) == ["pace", "transformers"]
    pace = next(r for r in rows if r["engine"] == "pace")
    assert pace["decode_tok_s"] > 0 and pace["decode_vs_hf"] > 0 and "kv_cache" not in pace


def test_unknown_benchmark_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err
    for name in (*BENCHMARKS, "all", "plot"):
        assert name in err


def test_quick_defaults_yield_to_explicit_options():
    from pace_bench.cli import parse

    args = parse(["bench", "kernels", "--quick", "--repeats", "9"])
    assert args.repeats == 9 and args.shapes == ["576x1536"] and args.threads == [1]
    assert parse(["bench", "kernels"]).repeats == 7


# -- peers -------------------------------------------------------------------------------------
def test_gguf_lookup_without_converter_says_make_bench_peers(tmp_path, monkeypatch):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert peers.find_converter() is None
    with pytest.raises(peers.PeerUnavailable, match="make bench-peers"):
        peers.gguf_for(model)


def test_the_newest_tree_serves_when_llama_cpp_python_is_absent(tmp_path, monkeypatch):
    """`make bench-llama-cpp` alone: its tree's converter, and llama-quantize for the quants."""
    from pace_bench import llama_cpp_tools

    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(peers, "find_llama_cpp", lambda: None)
    script = llama_cpp_tools.tree() / "llama.cpp" / "convert_hf_to_gguf.py"
    (script.parent / "gguf-py").mkdir(parents=True)
    script.write_text("print('convert')\n")
    assert peers.find_converter() == script
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bf16 = peers.gguf_path(model.resolve(), "bf16")
    bf16.write_bytes(b"GGUF")
    made = []
    monkeypatch.setattr(llama_cpp_tools, "find_tool", lambda name: Path("/bin/true"))

    def quantize(src, out, ftype, requantize):
        made.append((src, out, ftype, requantize))
        out.write_bytes(b"GGUF q")

    monkeypatch.setattr(llama_cpp_tools, "quantize", quantize)
    out = peers.quantized_gguf(model, "q4_0")
    assert made == [(bf16, out, "q4_0", False)] and out.read_bytes() == b"GGUF q"
    monkeypatch.setattr(llama_cpp_tools, "find_tool", lambda name: None)
    with pytest.raises(peers.PeerUnavailable, match="make bench-llama-cpp"):
        peers.quantized_gguf(model, "q8_0")


def test_extract_converter_keeps_only_the_converter(tmp_path, monkeypatch):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    sdist = tmp_path / "llama_cpp_python-0.0.0.tar.gz"
    files = {
        "vendor/llama.cpp/convert_hf_to_gguf.py": "print('convert')\n",
        "vendor/llama.cpp/conversion/__init__.py": "",
        "vendor/llama.cpp/gguf-py/gguf/__init__.py": "",
        "vendor/llama.cpp/src/llama.cpp": "// not needed\n",
        "llama_cpp/llama.py": "",
    }
    with tarfile.open(sdist, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-0.0.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    script = peers.extract_converter(sdist)
    assert script == peers.converter_dir() / "convert_hf_to_gguf.py"
    assert peers.find_converter() == script
    kept = {str(p.relative_to(peers.converter_dir())) for p in peers.converter_dir().rglob("*")
            if p.is_file()}  # fmt: skip
    assert kept == {"convert_hf_to_gguf.py", "conversion/__init__.py", "gguf-py/gguf/__init__.py"}


@pytest.mark.skipif(peers.find_llama_cpp() is None, reason="llama-cpp-python not installed")
def test_llama_cpp_runner_decodes_the_converted_model(smollm2_dir):
    if peers.find_converter() is None:
        pytest.skip("llama.cpp converter not extracted (make bench-peers)")
    runner = peers.LlamaCppRunner(peers.gguf_for(smollm2_dir), n_threads=1, n_ctx=64)
    tokens = list(range(100, 116))
    assert len(runner.generate(tokens, 3)) == 3
    stats = runner.measure(tokens, 3, repeats=1)
    assert stats["prefill_tok_s"] > 0 and stats["decode_tok_s"] > 0


@pytest.mark.skipif(peers.find_llama_cpp() is None, reason="llama-cpp-python not installed")
def test_llama_cpp_batch_runner_decodes_each_sequence_as_alone(smollm2_dir):
    """Sequences of different lengths decoded together give what each gives alone (English
    prompts: clear argmaxes, so the batched kernels' rounding cannot flip a token)."""
    if peers.find_converter() is None:
        pytest.skip("llama.cpp converter not extracted (make bench-peers)")
    from transformers import AutoTokenizer

    gguf = peers.gguf_for(smollm2_dir)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    texts = ["The capital of France is", "One, two, three, four, five,",
             "Water boils at a temperature of one hundred degrees"]  # fmt: skip
    prompts = [tok(t)["input_ids"] for t in texts]
    alone = peers.LlamaCppRunner(gguf, n_threads=1, n_ctx=64)
    together = peers.LlamaCppBatchRunner(gguf, n_threads=1, n_seq=len(prompts), n_ctx=64)
    assert together.generate(prompts, 5) == [alone.generate(p, 5) for p in prompts]


def test_structured_compares_grammar_and_free_decoding(smollm2_dir, tmp_path):
    argv = ["bench", "structured", "--models", str(smollm2_dir), "--batches", "2",
            "--tokens", "6", "--repeats", "1", "--threads", "1", "--dtype", "float32",
            "--out", str(tmp_path), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads((tmp_path / "structured.json").read_text())
    (row,) = payload["results"]
    assert row["batch"] == 2 and row["tokens"] == 6 and row["valid_prefix"] is True
    assert row["free_tok_s"] > 0 and row["grammar_tok_s"] > 0
    assert payload["summary"][0]["target"] == "grammar / free decode >= 0.9"


def test_random_model_names_are_checked():
    from pace_bench.common import model_path

    with pytest.raises(ValueError, match="qwen3-30b-a3b-2l"):
        model_path("random:nope")


def test_unknown_model_names_are_refused_with_the_choices(tmp_path, monkeypatch):
    from pace_bench.common import model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub id is looked up in the local cache only
    with pytest.raises(ModelLoadError, match=r"model 'nope' is not a local .* zoo model \(smollm2"):
        model_path("nope")
    assert model_path(tmp_path) == tmp_path  # a path is taken as it is


def test_unknown_backend_names_are_refused_before_the_run(tmp_path, capsys):
    argv = [*TINY_KERNELS, "--backends", "native", "bogus", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--backends bogus: no such backend; known:" in err and "native" in err
    assert not (tmp_path / "kernels.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["one_user", "--pairs", "0"],
        ["serving", "--concurrency", "4", "-1"],
        ["serving", "--start-timeout", "0"],
        ["kernels", "--threads", "0"],
        ["quality", "--window", "1"],
    ],
)
def test_out_of_range_bench_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert f"argument {argv[1]}:" in capsys.readouterr().err
