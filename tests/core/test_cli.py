"""The ``pace plugins`` and ``pace ops`` commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pace_core.cli import main
from pace_core.ops import OPS
from pace_core.plugins import BUILTIN_PLUGINS

BROKEN_ERROR = "RuntimeError: pace-broken is broken on purpose (simulated missing native library)"


def rows(out: str) -> dict[str, list[str]]:
    """Table rows of ``pace plugins`` by plugin name (first column)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("plugin "))
    return {line.split()[0]: line.split(None, 4) for line in lines[start + 2 :] if line.strip()}


def test_plugins_lists_everything(capsys):
    assert main(["plugins"]) == 0
    table = rows(capsys.readouterr().out)
    assert table["native"][1:4] == ["pace-native", "0.1.0", "ok"]
    assert table["native"][4] == f"{len(OPS)} kernels"
    assert table["example"][1:] == ["pace-example", "0.1.0", "ok", "1 kernels"]
    assert table["broken"][1:] == ["pace-broken", "0.1.0", "failed", BROKEN_ERROR]
    for name, _ in BUILTIN_PLUGINS:
        assert table[name][1:4] == ["builtin", "-", "ok"]


def test_plugins_console_script():
    script = Path(sys.executable).with_name("pace")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "pace_core.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACE_")}
    env["PACE_DISABLE_PLUGINS"] = "example"
    proc = subprocess.run([*cmd, "plugins"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    table = rows(proc.stdout)
    assert table["native"][3] == "ok"
    assert table["example"][3] == "disabled"
    assert table["broken"][3:] == ["failed", BROKEN_ERROR]
    assert "WARNING pace.plugins: plugin 'broken' skipped: RuntimeError" in proc.stderr


def op_rows(out: str) -> list[list[str]]:
    """Rows of the ``pace ops`` table (it ends at the first blank line; notes follow)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("op "))
    table = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        table.append(line.split(None, 4))
    return table


def op_notes(out: str) -> list[str]:
    lines = out.splitlines()
    return lines[lines.index("") + 1 :] if "" in lines else []


def test_ops_marks_the_chosen_backend_of_every_op(capsys):
    assert main(["ops", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "dtype: float32; config: {'default': 'auto', 'strict': False}; * = chosen" in out
    assert out.startswith("CPU: ")
    table = op_rows(out)
    chosen = [r[0] for r in table if r[1].endswith("*")]
    assert sorted(chosen) == sorted(OPS)  # exactly one chosen backend per op
    assert ["rms_norm", "example", "example", "-10", "yes"] in table
    assert {r[0] for r in table} == set(OPS)
    assert op_notes(out) == []


def test_ops_with_opconfig_marks_the_pinned_backend(capsys):
    assert main(["ops", "--dtype", "fp32", "--opconfig", "norm=example"]) == 0
    table = op_rows(capsys.readouterr().out)
    assert ["rms_norm", "example*", "example", "-10", "yes"] in table
    assert ["rms_norm", "native", "native", "0", "yes"] in table
    assert ["layer_norm", "native*", "native", "0", "yes"] in table


def test_ops_shows_fallback_reasons(capsys):
    assert main(["ops", "--dtype", "fp32", "--opconfig", "linear=avx512,norm=example"]) == 0
    out = capsys.readouterr().out
    assert ["linear", "native*", "native", "0", "yes"] in op_rows(out)
    assert op_notes(out) == [
        "linear: 'avx512' unavailable (plugin pace-avx512 is not installed); using 'native'",
        "layer_norm: 'example' unavailable (no installed plugin provides backend 'example' for "
        "this op); using 'native'",
    ]


def test_ops_strict_failure_is_shown_not_raised(capsys):
    assert main(["ops", "--dtype", "fp32", "--opconfig", "linear=avx512,strict=1"]) == 0
    out = capsys.readouterr().out
    table = op_rows(out)
    assert ["linear", "native", "native", "0", "yes"] in table  # nothing chosen
    assert ["rms_norm", "native*", "native", "0", "yes"] in table
    (note,) = op_notes(out)
    assert note.startswith("linear: error: op 'linear': pinned backend 'avx512' unavailable "
                           "(plugin pace-avx512 is not installed); available: native.")  # fmt: skip


@pytest.mark.parametrize(("opconfig", "message"), [
    ("linear", "pace: error: bad OperatorConfig item 'linear' in 'linear'; write op=backend pairs"),
    ("lnear=native", "pace: error: unknown op 'lnear' in OperatorConfig (did you mean 'linear'?)"),
    ("linear=natve",
     "pace: error: unknown backend 'natve' for op 'linear' (did you mean 'native'?)"),
    ('{"linear": ', "pace: error: OperatorConfig JSON is malformed"),
])  # fmt: skip
def test_ops_bad_opconfig_exits_2(opconfig, message, capsys):
    assert main(["ops", "--opconfig", opconfig]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message)


def test_ops_reads_pace_opconfig(monkeypatch, capsys):
    monkeypatch.setenv("PACE_OPCONFIG", "rms_norm=example")
    assert main(["ops", "--dtype", "fp32"]) == 0
    assert ["rms_norm", "example*", "example", "-10", "yes"] in op_rows(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["generate", "Hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "Hi", "--threads", "-2"], "--threads"),
        (["generate", "Hi", "--temperature", "nan"], "--temperature"),
        (["generate", "Hi", "--seed", "-5"], "--seed"),
        (["check", "--new-tokens", "0"], "--new-tokens"),
    ],
)
def test_out_of_range_flags_exit_2_before_loading(argv, flag, capsys):
    """A one-line argparse error (exit 2) naming the flag, before any model loads."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


def test_check_of_a_folder_that_is_no_model_exits_2(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_check_refuses_what_it_would_ignore_before_loading(tmp_path, capsys):
    """--new-tokens has no effect on --quantization's logit comparison; a bad plan is named
    before the transformers reference loads (the folder is no model: it is never read)."""
    assert main(["check", str(tmp_path), "--quantization", "int8", "--new-tokens", "4"]) == 2
    assert "with --quantization pace check compares logits" in capsys.readouterr().err
    assert main(["check", str(tmp_path), "--plans", "native", "linear=fastest"]) == 2
    assert "unknown backend 'fastest' for op 'linear'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["models", "list", "--quantization", "int8"], "--quantization (only quantize)"),
        (["models", "pull", "--dtype", "float32"], "--dtype (only quantize)"),
        (["models", "list", "smollm2"], "model names (only pull and quantize)"),
        (
            ["models", "quantize", "a", "b", "--force", "--quantization", "int8"],
            "--force (only pull)",
        ),
    ],
)
def test_models_refuses_options_its_action_ignores(argv, named, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"pace models {argv[1]} does not take" in err and named in err


def test_check_plans_take_backends_or_operator_configs():
    from pace_core.check import check_plans

    assert check_plans(["native", "linear=native,default=auto"]) == {
        "native": "default=native",
        "linear=native,default=auto": "linear=native,default=auto",
    }


def test_generate_ends_the_echoed_prompt_before_an_error(smollm2_dir, tiny_llama_dir, capsys):
    """The prompt is echoed as it generates; an error ends that line first (was
    "Hipace: error: ..."). A model folder without a tokenizer is named, not a traceback."""
    prompt = "hi " * 9000  # past SmolLM2's 8192-token window
    assert main(["generate", prompt, "--model", str(smollm2_dir), "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == prompt + "\n" and "context window" in err
    # its own line: after a slow load, the weights' progress bar (cleared by "\r") leads stderr
    assert re.search(r"(\A|[\r\n])pace: error: prompt 0", err)
    assert main(["generate", "Hi", "--model", str(tiny_llama_dir)]) == 2
    assert "cannot load a tokenizer from" in capsys.readouterr().err
