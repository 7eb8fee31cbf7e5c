"""Plugin discovery, selection and failure isolation with real installed plugin packages.

``tests/plugins/pace_example`` (distribution ``pace-example``) registers an RMSNorm kernel
under the backend ``example``; ``tests/plugins/pace_broken`` fails on import. Both are
pip-installed by the session fixture in ``conftest.py``.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import logging
import re

import pytest
import torch

import pace_core
from pace_core import LLMModel, hookimpl
from pace_core.caches.contiguous import DynamicCache
from pace_core.errors import ConfigError, OpResolutionError
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.ops import CONTRACT_VERSION, OPS
from pace_core.plugins import BUILTIN_PLUGINS, get_host, reset_host
from pace_core.registry import OpContext, backends

FP32 = OpContext("rms_norm", torch.float32)


def rms_norm(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight, x


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama saved as a HF checkpoint, its transformers logits and the input."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(path)
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        reference = hf(ids).logits.float()
    return path, ids, reference


def load(path, **kwargs):
    return pace_core.LLMModel(path, dtype=torch.float32, load_tokenizer=False, **kwargs)


def rms_norm_sites(model) -> int:
    return sum(n for (op, _, _), n in model.op_plan.sites.items() if op == "rms_norm")


# -- discovery and selection -------------------------------------------------------------------
def test_example_plugin_is_discovered():
    host = get_host()
    info = host.plugins["example"]
    assert (info.status, info.error, info.origin) == ("ok", "", "entry point")
    assert info.module == "pace_example.plugin"
    assert info.distribution == "pace-example"
    assert info.version == metadata.version("pace-example") == "0.1.0"
    assert info.provides == {"kernels": 1, "caches": 0, "models": 0, "processors": 0}
    spec = next(s for s in host.ops.where(op="rms_norm") if s.backend == "example")
    assert (spec.plugin, spec.priority) == ("example", -10)
    assert backends(host.ops, "linear") == ["native"]
    # native and the built-in plugins load alongside it
    assert host.plugins["native"].status == "ok"
    assert host.plugins["native"].provides["kernels"] == len(OPS)
    for name, _ in BUILTIN_PLUGINS:
        assert host.plugins[name].origin == "builtin" and host.plugins[name].status == "ok"


def test_example_is_selectable_per_op():
    host = get_host()
    resolve = lambda config, ctx=FP32: OpResolver(host.ops, config).resolve(ctx)  # noqa: E731
    assert resolve(OperatorConfig(rms_norm="example")).backend == "example"
    assert resolve(OperatorConfig(norm="example")).backend == "example"
    # negative priority: auto keeps native
    assert resolve(OperatorConfig()).backend == "native"
    # example has no layer_norm: that op falls back, with the reason
    res = resolve(OperatorConfig(norm="example"), OpContext("layer_norm", torch.float32))
    assert res.backend == "native"
    assert res.fallback_reason == "no installed plugin provides backend 'example' for this op"


def test_example_kernel_is_called_in_a_real_forward(tiny_llama):
    example = importlib.import_module("pace_example.plugin")
    path, ids, reference = tiny_llama
    native = load(path)
    assert native.op_plan.backends()["rms_norm"] == {"native"}
    native_logits = native.logits(ids)

    model = load(path, opconfig={"rms_norm": "example"})
    assert model.op_plan.backends()["rms_norm"] == {"example"}
    assert model.op_plan.backends()["linear"] == {"native"}
    assert re.search(r"rms_norm +example", str(model.op_plan))
    before = example.calls
    logits = model.logits(ids)
    assert example.calls - before == rms_norm_sites(model) == 5  # 2 per layer + final norm
    torch.testing.assert_close(logits, native_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)

    before = example.calls
    native.logits(ids)
    assert example.calls == before  # the native model never touches it


def test_opconfig_from_env_selects_the_plugin(tiny_llama, monkeypatch):
    monkeypatch.setenv("PACE_OPCONFIG", "norm=example,strict=1")
    model = load(tiny_llama[0])
    assert model.op_plan.backends()["rms_norm"] == {"example"}


def test_broken_plugin_is_reported_and_engine_still_works(tiny_llama, caplog):
    path, ids, reference = tiny_llama
    with caplog.at_level(logging.WARNING, logger="pace.plugins"):
        host = get_host()
    info = host.plugins["broken"]
    assert (info.status, info.distribution) == ("failed", "pace-broken")
    assert info.module == "pace_broken.plugin"
    assert info.error == (
        "RuntimeError: pace-broken is broken on purpose (simulated missing native library)"
    )
    assert info.provides == {}
    assert any("plugin 'broken' skipped: RuntimeError" in r.getMessage() for r in caplog.records)
    assert host.plugins["example"].status == "ok"
    torch.testing.assert_close(load(path).logits(ids), reference, atol=1e-5, rtol=0)


# -- environment switches ----------------------------------------------------------------------
def test_disable_plugins(monkeypatch, tiny_llama):
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "example, broken")
    host = get_host()
    assert host.plugins["example"].status == "disabled"
    assert host.plugins["broken"].status == "disabled"  # never imported: no error
    assert host.plugins["broken"].error == ""
    assert "example" not in backends(host.ops)
    # A disabled third-party backend is unknown (not a first-party name): pinning it errors,
    # whether or not strict is set.
    for strict in (False, True):
        with pytest.raises(ConfigError, match="unknown backend 'example' for op 'rms_norm'"):
            OpResolver(host.ops, OperatorConfig(rms_norm="example", strict=strict))
    with pytest.raises(ConfigError, match="unknown backend 'example'"):
        load(tiny_llama[0], opconfig={"rms_norm": "example"})


def test_disable_builtin_plugin(monkeypatch):
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "pace.caches")
    host = get_host()
    assert host.plugins["pace.caches"].status == "disabled"
    assert len(host.caches) == 0
    assert host.plugins["pace.models"].status == "ok"


def test_no_autoload_then_pace_plugins(monkeypatch, tiny_llama):
    path, ids, reference = tiny_llama
    monkeypatch.setenv("PACE_DISABLE_PLUGIN_AUTOLOAD", "1")
    host = get_host()
    assert set(host.plugins) == {name for name, _ in BUILTIN_PLUGINS}
    assert backends(host.ops) == []
    with pytest.raises(OpResolutionError, match="pace-native plugin installed"):
        load(path)

    monkeypatch.setenv("PACE_PLUGINS", "pace_native.plugin,pace_example.plugin")
    reset_host()
    host = get_host()
    for module in ("pace_native.plugin", "pace_example.plugin"):
        assert (host.plugins[module].origin, host.plugins[module].status) == ("PACE_PLUGINS", "ok")
    assert "native" not in host.plugins and "broken" not in host.plugins
    model = load(path, opconfig="rms_norm=example")
    assert model.op_plan.backends()["rms_norm"] == {"example"}
    torch.testing.assert_close(model.logits(ids), reference, atol=1e-5, rtol=0)


def test_pace_plugins_with_a_missing_module_is_reported(monkeypatch):
    monkeypatch.setenv("PACE_PLUGINS", "pace_no_such_plugin")
    info = get_host().plugins["pace_no_such_plugin"]
    assert info.status == "failed"
    assert info.error.startswith("ModuleNotFoundError: No module named 'pace_no_such_plugin'")


# -- failure isolation -------------------------------------------------------------------------
class HalfWay:
    """Registers a kernel, then a cache, then raises: nothing of it may remain."""
    PACE_CONTRACT_VERSION = CONTRACT_VERSION


    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel("rms_norm", "halfway", rms_norm)

    @hookimpl
    def pace_register_kv_caches(self, registry):
        registry.add_cache("halfway", DynamicCache, layout="contiguous")
        raise RuntimeError("boom half-way")


class RaisesInOps:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel("rms_norm", "halfway", rms_norm)
        raise RuntimeError("boom")


@pytest.mark.parametrize("plugin", [RaisesInOps(), HalfWay()], ids=["one-hook", "two-hooks"])
def test_plugin_failing_half_way_leaves_nothing(plugin, caplog):
    host = get_host()
    with caplog.at_level(logging.WARNING, logger="pace.plugins"):
        info = host.register(plugin, "halfway")
    assert info.status == "failed" and info.error.startswith("RuntimeError: boom")
    assert host.plugins["halfway"] is info
    assert "halfway" not in backends(host.ops)
    assert "halfway" not in host.caches
    assert host.pm.get_plugin("halfway") is None
    assert any("plugin 'halfway' skipped" in r.getMessage() for r in caplog.records)
    # the name is free again, and the rest keeps working
    assert OpResolver(host.ops, OperatorConfig()).resolve(FP32).backend == "native"


class Good:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel("rms_norm", "halfway", rms_norm)


def test_failed_plugin_name_can_be_registered_again():
    host = get_host()
    assert host.register(RaisesInOps(), "halfway").status == "failed"
    assert host.register(Good(), "halfway").status == "ok"
    assert "halfway" in backends(host.ops, "rms_norm")


class KeysAndValuesOnly:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_kv_caches(self, registry):
        registry.add_cache("keys_and_values", DynamicCache, layout="contiguous")


class HalfABlockCache(DynamicCache):
    """Claims the paged layout but has no block pool: no ``free_sequence``, no prefixes."""

    layout = "paged"


class ClaimsBlocks:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_kv_caches(self, registry):
        registry.add_cache("half_a_block", HalfABlockCache, layout="paged")


def test_a_cache_must_implement_its_layouts_protocol():
    """A cache class that declares a block layout is checked against ``BlockKVCache`` when
    it registers (as kernels are against their ``OpSpec``): the plugin fails, naming what the
    class lacks, and nothing of it is kept."""
    info = get_host().register(ClaimsBlocks(), "claims_blocks")
    assert info.status == "failed" and info.error.startswith("ContractError")
    assert "'half_a_block' declares layout 'paged'" in info.error
    assert "adopt_prefix" in info.error and "free_sequence" in info.error
    assert "BlockKVCache" in info.error and "half_a_block" not in get_host().caches


def test_a_latent_model_refuses_a_cache_that_ignores_value_dims(tmp_path):
    """DeepSeek's MLA caches keys only (value_dims 0): a plugin cache that does not declare
    value_dims would allocate values of the key width and fail at the first step."""
    from support.tiny import FACTORIES

    assert get_host().register(KeysAndValuesOnly(), "kvonly").status == "ok"
    path = FACTORIES["deepseek-v3"](tmp_path)
    with pytest.raises(ConfigError, match=r"kv_cache_type 'keys_and_values' does not take "
                                          r"value_dims.*deepseek_v3"):  # fmt: skip
        LLMModel(path, dtype=torch.float32, load_tokenizer=False,
                 kv_cache_type="keys_and_values")  # fmt: skip


def _plugin(**kernels):
    """A plugin object whose pace_register_ops calls add_kernel with each kwargs dict."""

    class Plugin:
        PACE_CONTRACT_VERSION = CONTRACT_VERSION

        @hookimpl
        def pace_register_ops(self, registry):
            for kw in kernels.values():
                registry.add_kernel(**kw)

    return Plugin()


@pytest.mark.parametrize(("kernel", "message"), [
    ({"op": "softmax", "backend": "x", "fn": rms_norm},
     "PluginError: unknown op 'softmax'; the op catalogue has: " + ", ".join(OPS)),
    ({"op": "linear", "backend": "x", "fn": rms_norm},
     "PluginError: op 'linear' needs a prepare step (backend 'x' gave none)"),
    ({"op": "rms_norm", "backend": "my-backend", "fn": rms_norm},
     "PluginError: backend name must be lower case letters, digits and underscores, starting "
     "with a letter (got 'my-backend')"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "packs_ragged": True},
     "PluginError: packs_ragged applies to decoder_stack kernels only, not to 'rms_norm'"),
    # each of these registered and then broke every load, or was silently never usable
    ({"op": "rms_norm", "backend": "MyBack", "fn": rms_norm},
     "PluginError: backend name must be lower case letters, digits and underscores, starting "
     "with a letter (got 'MyBack')"),
    ({"op": "rms_norm", "backend": "auto", "fn": rms_norm},
     "PluginError: backend name 'auto' is reserved by OperatorConfig"),
    ({"op": "rms_norm", "backend": "x", "fn": None},
     "ContractError: backend 'x' for op 'rms_norm': fn must be a callable, not None"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "supports": True},
     "ContractError: backend 'x' for op 'rms_norm': supports must be a callable or None, "
     "not True"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "priority": "10"},
     "ContractError: backend 'x' for op 'rms_norm': priority must be an int, not '10'"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "cpu_features": "avx2"},
     "ContractError: backend 'x' for op 'rms_norm': cpu_features must be a collection of str, "
     "not 'avx2'"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "cpu_features": ("avx-512f",)},
     "ContractError: backend 'x' for op 'rms_norm': cpu_features: unknown ['avx-512f']; known: "
     "sse4_2, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512cd, "
     "avx512_vnni, avx512_bf16, avx512_fp16, avx512vbmi, amx_tile, amx_bf16, amx_int8"),
    ({"op": "rms_norm", "backend": "x", "fn": rms_norm, "dtypes": ("float32",)},
     "ContractError: backend 'x' for op 'rms_norm': dtypes must hold dtype items, not 'float32'"),
])  # fmt: skip
def test_invalid_registration_is_reported(kernel, message):
    host = get_host()
    info = host.register(_plugin(k=kernel), "bad")
    assert info.status == "failed"
    assert info.error == message
    assert "x" not in backends(host.ops) and "my_backend" not in backends(host.ops)


def test_duplicate_op_backend_second_plugin_fails_and_stores_nothing():
    host = get_host()
    first = host.register(_plugin(a={"op": "rms_norm", "backend": "dup", "fn": rms_norm}), "first")
    assert first.status == "ok"
    second = host.register(_plugin(
        a={"op": "rms_norm", "backend": "extra", "fn": rms_norm},  # staged before the clash
        b={"op": "rms_norm", "backend": "dup", "fn": rms_norm},
    ), "second")  # fmt: skip
    assert second.status == "failed"
    assert second.error == (
        "PluginError: backend 'dup' for op 'rms_norm' is registered twice "
        "(plugins 'first' and 'second')"
    )
    assert "extra" not in backends(host.ops)  # a failed commit stores nothing
    assert host.ops.where(op="rms_norm")[0].plugin in ("native", "first")
    assert {s.plugin for s in host.ops.where(op="rms_norm") if s.backend == "dup"} == {"first"}
    assert host.pm.get_plugin("second") is None


def test_duplicate_against_native_and_within_one_plugin():
    host = get_host()
    clash = host.register(_plugin(a={"op": "rms_norm", "backend": "native", "fn": rms_norm}), "c")
    assert clash.status == "failed" and "(plugins 'native' and 'c')" in clash.error
    twice = host.register(_plugin(
        a={"op": "rms_norm", "backend": "twice", "fn": rms_norm},
        b={"op": "rms_norm", "backend": "twice", "fn": rms_norm},
    ), "twice")  # fmt: skip
    assert twice.status == "failed" and "(plugins 'twice' and 'twice')" in twice.error
    assert "twice" not in backends(host.ops)
    native = next(s for s in host.ops.where(op="rms_norm") if s.backend == "native")
    assert native.plugin == "native"


def test_duplicate_in_one_registry_rolls_back_the_others():
    """A cache-name clash must also drop the plugin's kernel (all-or-nothing across registries)."""

    class KernelAndClash:
        PACE_CONTRACT_VERSION = CONTRACT_VERSION

        @hookimpl
        def pace_register_ops(self, registry):
            registry.add_kernel("rms_norm", "clash", rms_norm)  # ops are committed first

        @hookimpl
        def pace_register_kv_caches(self, registry):
            registry.add_cache("dynamic", DynamicCache, layout="contiguous")  # pace.caches has it

    host = get_host()
    info = host.register(KernelAndClash(), "clash")
    assert info.status == "failed"
    assert info.error == (
        "PluginError: KV cache 'dynamic' is registered twice (plugins 'pace.caches' and 'clash')"
    )
    assert "clash" not in backends(host.ops)
    assert host.caches["dynamic"].plugin == "pace.caches"
    assert host.pm.get_plugin("clash") is None


# -- docs --------------------------------------------------------------------------------------
def test_plugin_docs_show_the_tested_example_and_the_catalogue(test_plugins):
    docs = (test_plugins["pace-example"][0].parents[2] / "docs" / "plugins.md").read_text()
    source = test_plugins["pace-example"][0]
    for file in ("pyproject.toml", "pace_example/__init__.py", "pace_example/plugin.py"):
        assert (source / file).read_text().rstrip() + "\n```" in docs, f"{file} differs"
    for spec in OPS.values():
        signature = spec.signature.replace("|", "\\|")
        prepared = "yes" if spec.prepared else "no"
        context = ", ".join(spec.context) or "-"
        row = f"| `{spec.name}` | `{signature}` | {prepared} | {context} | {spec.summary} |"
        assert row in docs, f"op catalogue row of {spec.name!r} is missing or stale"


def test_a_supports_predicate_that_raises_rules_out_its_kernel_only():
    """A plugin's predicate reading an undeclared attribute (any exception) makes its kernel
    unusable with the reason; resolving the op still works (it made every load fail)."""

    def misspelt(ctx):
        return ctx.hidden_size > 0  # rms_norm declares no such attribute

    host = get_host()
    kernel = {"op": "rms_norm", "backend": "buggy", "fn": rms_norm, "supports": misspelt,
              "priority": 100}  # fmt: skip
    assert host.register(_plugin(k=kernel), "buggy").status == "ok"
    spec = host.ops[("rms_norm", "buggy")]
    reason = spec.check(OpContext("rms_norm", torch.float32), frozenset())
    assert reason.startswith("its supports predicate raised ContractError: op 'rms_norm' has no")
    assert reason.endswith("(a bug in plugin 'buggy')")
    chosen = host.resolver(OperatorConfig()).resolve(OpContext("rms_norm", torch.float32))
    assert chosen.backend != "buggy"


class Processors:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    def __init__(self, **kw):
        self.kw = kw

    @hookimpl
    def pace_register_samplers(self, registry):
        registry.add_processor(**self.kw)


@pytest.mark.parametrize(("kw", "message"), [
    ({"name": "p", "factory": lambda configs: None, "order": "500"},
     "ContractError: processor 'p': order must be an int, not '500'"),
    ({"name": "p", "factory": "nope", "order": 5},
     "ContractError: processor 'p': factory must be a callable, not 'nope'"),
])  # fmt: skip
def test_invalid_processors_are_refused(kw, message):
    host = get_host()
    assert host.register(Processors(**kw), "procs").error == message
    assert [s.order for s in host.samplers.values()]  # still sortable


def test_a_name_in_use_leaves_the_loaded_plugin_alone():
    host = get_host()
    info = host.register(Good(), "native")
    assert info.status == "failed" and "a plugin named 'native' is already loaded" in info.error
    assert host.plugins["native"].status == "ok"


class Misspelt:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl
    def pace_register_op(self, registry):  # sic
        registry.add_kernel("rms_norm", "never", rms_norm)


class Wrapper:
    PACE_CONTRACT_VERSION = CONTRACT_VERSION

    @hookimpl(hookwrapper=True)
    def pace_register_ops(self, registry):
        registry.add_kernel("rms_norm", "never", rms_norm)
        yield


@pytest.mark.parametrize(("plugin", "message"), [
    (Misspelt(), "unknown hook 'pace_register_op'"),
    (Wrapper(), "pace_register_ops is a hook wrapper; pace calls each plugin's hooks directly"),
])  # fmt: skip
def test_hooks_pace_would_never_call_fail_the_plugin(plugin, message):
    """(They left the plugin "ok" with nothing registered.)"""
    host = get_host()
    info = host.register(plugin, "hooks")
    assert info.status == "failed" and message in info.error and "\n" not in info.error
    assert host.pm.get_plugin("hooks") is None and "never" not in backends(host.ops)


def _linear_failing_on(rows: int):
    def prepare(weight, bias=None):
        if weight.shape[0] == rows:
            raise RuntimeError(f"cannot pack N={rows}")
        return weight, bias

    def linear(x, packed):
        return torch.nn.functional.linear(x, *packed)

    return {"op": "linear", "backend": "packer", "fn": linear, "prepare": prepare}


def test_a_prepare_that_fails_falls_back_or_names_itself_under_strict(tiny_llama_dir):
    host = get_host()
    assert host.register(_plugin(k=_linear_failing_on(128)), "packer").status == "ok"  # the head
    llm = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, quiet=True,
                   opconfig="linear=packer,default=native")  # fmt: skip
    notes = {r.backend: r.note for r in llm.op_plan.resolutions if r.op == "linear"}
    assert notes == {"native": "prepare failed: RuntimeError: cannot pack N=128"}
    message = (r"op 'linear': backend 'packer' failed to prepare its weights \(RuntimeError: "
               r"cannot pack N=128\); strict=True")  # fmt: skip
    with pytest.raises(OpResolutionError, match=message):
        LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, quiet=True,
                 opconfig="linear=packer,default=native,strict=1")  # fmt: skip
