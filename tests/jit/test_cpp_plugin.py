"""A third-party C++ kernel plugin needs its sources, one ``pace_core.jit`` call, one entry point.

``tests/plugins/pace_cpp_example`` (distribution ``pace-cpp-example``) is pip-installed for this
module only (``support/plugins.py``). Its ``rms_norm.cpp`` is compiled by ``pace_core.jit`` at
the first resolution (20-40 s on 2 cores the first time; later sessions import the cached build
from ``$PACE_CACHE_DIR/kernels``), and a real forward runs it.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
from pathlib import Path
from types import ModuleType

import pytest
import torch
from support.plugins import PLUGIN_DIR, installed_for_session

import pace_core
from pace_core import jit, plugins
from pace_core.cpu import detect_cpu
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.registry import OpContext

PACE_ENV = ("PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
            "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG")  # fmt: skip
SOURCE_DIR = PLUGIN_DIR / "pace_cpp_example"


@pytest.fixture(scope="module")
def cpp_example(tmp_path_factory):
    """The plugin module, installed for this module only."""
    with installed_for_session([SOURCE_DIR], tmp_path_factory.mktemp("cpp-plugin")):
        plugins.reset_host()
        yield importlib.import_module("pace_cpp_example.plugin")
    plugins.reset_host()


@pytest.fixture
def host(cpp_example, monkeypatch: pytest.MonkeyPatch):
    """A fresh plugin host with only native and the C++ example, whatever else is installed."""
    for name in PACE_ENV:
        monkeypatch.delenv(name, raising=False)
    real_entry_points = metadata.entry_points

    def entry_points(**kw):
        found = real_entry_points(**kw)
        if kw.get("group") == plugins.ENTRY_POINT_GROUP:
            return [ep for ep in found if ep.name in ("native", "cppexample")]
        return found

    monkeypatch.setattr(plugins.metadata, "entry_points", entry_points)
    plugins.reset_host()
    yield plugins.get_host()
    plugins.reset_host()


def load(path: Path, **kwargs) -> pace_core.LLMModel:
    return pace_core.LLMModel(path, dtype=torch.float32, load_tokenizer=False, **kwargs)


def test_discovered_by_its_entry_point_and_built_at_resolution(host, cpp_example):
    info = host.plugins["cppexample"]
    assert (info.status, info.distribution, info.module) == (
        "ok", "pace-cpp-example", "pace_cpp_example.plugin",
    )  # fmt: skip
    res = OpResolver(host.ops, OperatorConfig(rms_norm="cppexample")).resolve(
        OpContext("rms_norm", torch.float32)
    )
    assert (res.backend, res.fallback_reason) == ("cppexample", "")
    ext: ModuleType = cpp_example.extension()
    built = Path(ext.__file__)
    assert built.parent.parent == jit.kernels_dir()  # one cache, ISA-tagged
    assert built.parent.name.startswith(f"pace_cpp_example-{detect_cpu().isa_level}-torch")
    assert (built.parent / jit.BUILT_FILE).is_file()


def test_runs_in_a_real_forward_and_matches_native(host, cpp_example, tiny_llama_dir):
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    native = load(tiny_llama_dir, opconfig={"default": "native"})
    model = load(tiny_llama_dir, opconfig={"rms_norm": "cppexample", "default": "native"})
    assert model.op_plan.backends()["rms_norm"] == {"cppexample"}
    assert native.op_plan.backends()["rms_norm"] == {"native"}
    ext = cpp_example.extension()
    before = ext.calls()
    logits = model.logits(ids)
    sites = sum(n for (op, _, _), n in model.op_plan.sites.items() if op == "rms_norm")
    assert ext.calls() - before == sites == 5  # 2 per layer + the final norm
    torch.testing.assert_close(logits, native.logits(ids), atol=1e-4, rtol=1e-4)
    before = ext.calls()
    native.logits(ids)
    assert ext.calls() == before  # the native model never touches it


def test_build_failure_declines_with_the_compiler_error(host, tmp_path, monkeypatch):
    """A source that does not compile: BuildFailed with the error, recorded for later."""
    broken = tmp_path / "broken.cpp"
    broken.write_text("int f() { return undeclared_name; }\n")
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(jit.BuildFailed) as failed:
        jit.build_extension("pace_broken_example", [broken], backend="cppexample")
    summary = str(failed.value).splitlines()[0]
    assert "JIT build of the pace_broken_example extension failed" in summary
    assert "undeclared_name" in summary and "error:" in summary
    assert "undeclared_name" in failed.value.log
    record = failed.value.directory / jit.FAILURE_FILE
    assert record.is_file() and summary.endswith(f"(log: {record})")
    # A later attempt does not recompile: it fails fast with the recorded reason.
    with pytest.raises(jit.BuildFailed, match="failed earlier: .*undeclared_name"):
        jit.build_extension("pace_broken_example", [broken], backend="cppexample")


def test_plugin_docs_show_the_cpp_example_verbatim():
    docs = (SOURCE_DIR.parents[2] / "docs" / "plugins.md").read_text()
    assert "## A C++ kernel plugin" in docs
    for file in ("pace_cpp_example/plugin.py", "pace_cpp_example/rms_norm.cpp"):
        assert (SOURCE_DIR / file).read_text().rstrip() + "\n```" in docs, f"{file} differs"
    package_data = '[tool.setuptools.package-data]\npace_cpp_example = ["*.cpp"]'
    assert package_data in (SOURCE_DIR / "pyproject.toml").read_text() and package_data in docs
