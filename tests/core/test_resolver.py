"""The op resolver and OperatorConfig, on a hand-filled kernel registry and simulated CPUs."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from pace_core.cpu import CpuInfo, detect_cpu
from pace_core.errors import ConfigError, OpResolutionError
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.ops import OP_GROUPS, OPS
from pace_core.registry import KernelSpec, OpContext, Registrations, Registry, kernel_registry

AVX2 = CpuInfo(frozenset({"avx", "avx2", "fma"}), "simulated AVX2", "test", 2)
AVX512_NO_BF16 = CpuInfo(
    AVX2.features | {"avx512f", "avx512bw", "avx512vl"}, "simulated AVX-512", "test", 2
)
SAPPHIRE = CpuInfo(
    AVX512_NO_BF16.features | {"avx512_bf16", "amx_tile", "amx_bf16"}, "simulated AMX", "test", 2
)


class Linear:
    """Real linear kernels (prepare + fn) that record each call in a shared counter."""

    def __init__(self, name: str, calls: Counter) -> None:
        self.name, self.calls = name, calls

    def prepare(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        return weight.contiguous(), bias

    def fn(self, x: torch.Tensor, w) -> torch.Tensor:
        self.calls[self.name] += 1
        return F.linear(x, *w)


def rms_norm(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight, x


KernelRegistry = Registry[tuple[str, str], KernelSpec]


def fill(registry: KernelRegistry, plugin: str, *kernels: dict) -> None:
    """Register ``kernels`` as the plugin host does: into a plugin's Registrations, merged."""
    regs = Registrations(plugin)
    for kw in kernels:
        regs.add_kernel(**kw)
    registry.merge(regs.kernels)


def layer_norm(x, weight, bias, eps, residual=None):
    if residual is not None:
        x = x + residual
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps), x


@pytest.fixture
def calls() -> Counter:
    return Counter()


@pytest.fixture
def registry(calls: Counter) -> KernelRegistry:
    """native (priority 0), fast (10), amx (20, needs avx512_bf16+amx, bf16 only, K % 64)."""
    reg = kernel_registry()
    kernels = {name: Linear(name, calls) for name in ("native", "fast", "amx")}
    fill(reg, "pace-native", {"op": "linear", "backend": "native", "fn": kernels["native"].fn,
                              "prepare": kernels["native"].prepare},
         {"op": "rms_norm", "backend": "native", "fn": rms_norm},
         {"op": "layer_norm", "backend": "native", "fn": layer_norm})  # fmt: skip
    fill(reg, "pace-fast", {"op": "linear", "backend": "fast", "fn": kernels["fast"].fn,
                            "prepare": kernels["fast"].prepare, "priority": 10,
                            "dtypes": [torch.float32, torch.bfloat16]})  # fmt: skip
    fill(reg, "pace-amx", {
        "op": "linear", "backend": "amx", "fn": kernels["amx"].fn,
        "prepare": kernels["amx"].prepare, "priority": 20, "dtypes": [torch.bfloat16],
        "cpu_features": ["avx512_bf16", "amx_bf16"],
        "supports": lambda ctx: (
            ctx.in_features % 64 == 0 or f"K={ctx.in_features} not a multiple of 64"
        ),
    })  # fmt: skip
    return reg


def linear_ctx(dtype: torch.dtype = torch.bfloat16, k: int = 128, n: int = 64) -> OpContext:
    return OpContext("linear", dtype, {"in_features": k, "out_features": n})


def run(resolution, calls: Counter) -> str:
    """Really run the resolved kernel once and return the name that recorded the call."""
    before = Counter(calls)
    x, w = torch.randn(2, 128), torch.randn(64, 128)
    out = resolution.kernel.fn(x, resolution.kernel.prepare(w))
    torch.testing.assert_close(out, x @ w.T)
    (name,) = (calls - before).keys()
    return name


# -- choosing kernels --------------------------------------------------------------------------
def test_auto_picks_highest_priority_available_kernel(registry, calls):
    res = OpResolver(registry, OperatorConfig(), SAPPHIRE).resolve(linear_ctx())
    assert (res.requested, res.backend, res.fallback_reason) == ("auto", "amx", "")
    assert run(res, calls) == "amx"
    # On a CPU without AMX the next best runs, and the skipped candidate is recorded.
    res = OpResolver(registry, OperatorConfig(), AVX2).resolve(linear_ctx())
    assert res.backend == "fast" and res.fallback_reason == ""
    assert dict(res.rejected)["amx"].startswith("missing CPU features: ")
    assert run(res, calls) == "fast"


def test_pinned_backend_is_honoured_even_at_lower_priority(registry, calls):
    res = OpResolver(registry, OperatorConfig(linear="native"), SAPPHIRE).resolve(linear_ctx())
    assert (res.requested, res.backend, res.fallback_reason) == ("native", "native", "")
    assert run(res, calls) == "native"


def test_pinned_first_party_backend_not_installed_falls_back(registry, calls, caplog):
    resolver = OpResolver(registry, OperatorConfig(linear="avx512"), AVX512_NO_BF16)
    with caplog.at_level(logging.WARNING, logger="pace.ops"):
        res = resolver.resolve(linear_ctx())
        resolver.resolve(linear_ctx(k=256))  # another call site, same reason: no second line
        resolver.resolve(linear_ctx())
    assert (res.requested, res.backend) == ("avx512", "fast")
    assert res.fallback_reason == "plugin pace-avx512 is not installed"
    lines = [r.getMessage() for r in caplog.records if r.name == "pace.ops"]
    assert len(lines) == 1, lines
    assert "'avx512' unavailable (plugin pace-avx512 is not installed)" in lines[0]
    assert "falling back to 'fast'" in lines[0]
    assert run(res, calls) == "fast"


def test_installed_first_party_backend_without_this_op_is_not_called_missing(registry):
    """avx512 is installed (for linear only): pinning it for norms must not say 'not installed'."""
    fill(registry, "pace-avx512", {"op": "linear", "backend": "avx512", "fn": F.linear,
                                   "prepare": lambda w, b=None: (w, b)})  # fmt: skip
    res = OpResolver(registry, OperatorConfig(norm="avx512"), AVX2).resolve(
        OpContext("rms_norm", torch.float32)
    )
    assert res.backend == "native"
    assert res.fallback_reason == "no installed plugin provides backend 'avx512' for this op"


def test_kernel_needing_missing_cpu_feature_is_skipped_and_never_called(registry, calls):
    res = OpResolver(registry, OperatorConfig(linear="amx"), AVX512_NO_BF16).resolve(linear_ctx())
    assert res.backend == "fast"
    assert "missing CPU features" in res.fallback_reason
    assert "avx512_bf16" in res.fallback_reason and "amx_bf16" in res.fallback_reason
    assert run(res, calls) == "fast"
    assert calls["amx"] == 0


def test_unsupported_dtype_is_reported(registry):
    res = OpResolver(registry, OperatorConfig(linear="amx"), SAPPHIRE).resolve(
        linear_ctx(torch.float32)
    )
    assert res.backend == "fast"
    assert res.fallback_reason == "dtype float32 unsupported (supports bfloat16)"


def test_support_predicate_reason_is_reported(registry, calls):
    res = OpResolver(registry, OperatorConfig(linear="amx"), SAPPHIRE).resolve(linear_ctx(k=100))
    assert res.backend == "fast"
    assert res.fallback_reason == "K=100 not a multiple of 64"
    assert dict(res.rejected) == {"amx": "K=100 not a multiple of 64"}
    assert calls["amx"] == 0


def test_support_predicate_returning_false_gets_a_generic_reason():
    reg = kernel_registry()
    fill(reg, "p", {"op": "rms_norm", "backend": "native", "fn": rms_norm},
         {"op": "rms_norm", "backend": "picky", "fn": rms_norm,
          "supports": lambda ctx: False})  # fmt: skip
    res = OpResolver(reg, OperatorConfig(rms_norm="picky"), AVX2).resolve(
        OpContext("rms_norm", torch.float32)
    )
    assert res.fallback_reason == "unsupported shape"


def test_strict_raises_naming_op_backend_and_choices(registry):
    config = OperatorConfig(linear="amx", strict=True)
    with pytest.raises(OpResolutionError) as err:
        OpResolver(registry, config, AVX2).resolve(linear_ctx())
    msg = str(err.value)
    assert "op 'linear'" in msg and "pinned backend 'amx'" in msg
    assert "missing CPU features" in msg
    assert "available: fast, native" in msg
    # strict only matters when the pin cannot be honoured
    res = OpResolver(registry, config, SAPPHIRE).resolve(linear_ctx())
    assert res.backend == "amx"


def test_strict_not_installed_first_party_backend(registry):
    with pytest.raises(OpResolutionError, match="plugin pace-tpp is not installed"):
        OpResolver(registry, OperatorConfig(linear="tpp", strict=True), AVX2).resolve(linear_ctx())


def test_no_usable_kernel_names_pace_native():
    with pytest.raises(OpResolutionError, match=r"no usable kernel for op 'rope'.*pace-native"):
        resolver = OpResolver(kernel_registry(), OperatorConfig(), AVX2)
        resolver.resolve(OpContext("rope", torch.float32))


def test_resolution_is_memoised(registry):
    resolver = OpResolver(registry, OperatorConfig(), SAPPHIRE)
    first = resolver.resolve(linear_ctx())
    assert resolver.resolve(linear_ctx()) is first
    assert (
        resolver.resolve(
            OpContext("linear", torch.bfloat16, {"out_features": 64, "in_features": 128})
        )
        is first
    )
    other = resolver.resolve(linear_ctx(k=100))
    assert other is not first and other.backend == "fast"
    assert len(resolver.resolutions) == 2


# -- OperatorConfig ----------------------------------------------------------------------------
def test_unknown_op_lists_valid_ops_and_suggests():
    with pytest.raises(ConfigError) as err:
        OperatorConfig(lineer="native")
    msg = str(err.value)
    assert "unknown op 'lineer'" in msg and "did you mean 'linear'?" in msg
    for name in [*OPS, *OP_GROUPS]:
        assert name in msg


def test_unknown_backend_lists_valid_choices(registry):
    with pytest.raises(ConfigError) as err:
        OpResolver(registry, OperatorConfig(linear="fsat"), AVX2)
    msg = str(err.value)
    assert "unknown backend 'fsat' for op 'linear'" in msg and "did you mean 'fast'?" in msg
    assert "valid choices: amx, auto, avx512, fast, native, onednn, tpp" in msg
    with pytest.raises(ConfigError, match="unknown backend 'nope' for default;"):
        OpResolver(registry, OperatorConfig(default="nope"), AVX2)


def test_unknown_backend_names_the_plugins_that_did_not_load(registry):
    """A disabled plugin's name need not be its backend's: the error cannot know which plugin
    would provide the backend, so it names those that did not load."""
    why = "plugin 'fastk' (pace-fastk) is disabled (PACE_DISABLE_PLUGINS)"
    with pytest.raises(ConfigError) as err:
        OpResolver(registry, OperatorConfig(linear="fastkernels"), AVX2, unavailable={"fastk": why})
    assert "unknown backend 'fastkernels' for op 'linear'" in str(err.value)
    assert why in str(err.value)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: OperatorConfig(strict="false"), "strict must be True or False (got 'false')"),
    (lambda: OperatorConfig.from_dict({1: "native"}), "OperatorConfig keys are op names (got 1)"),
])  # fmt: skip
def test_config_values_of_the_wrong_type(make, message):
    """(``strict="false"`` read as True; a number as op name was a TypeError from difflib.)"""
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


def test_configs_hash_as_they_compare():
    a, b = OperatorConfig(linear="native", strict=True), OperatorConfig({"linear": "native"})
    assert hash(a) == hash(OperatorConfig(linear="native", strict=True)) and a != b
    assert len({a, b, OperatorConfig(linear="native", strict=True)}) == 2


def test_norm_group_expands():
    config = OperatorConfig(norm="native", linear="AVX512")
    assert OP_GROUPS["norm"] == ("rms_norm", "layer_norm")
    assert config.backend_for("rms_norm") == config.backend_for("layer_norm") == "native"
    assert config.backend_for("linear") == "avx512"  # names are case-insensitive
    assert config.backend_for("rope") == "auto"


@pytest.mark.parametrize("text", [
    '{"linear": "avx512", "norm": "native", "strict": true}',
    "linear=avx512,norm=native,strict=1",
    " linear = avx512 , norm=native , strict=TRUE ",
])  # fmt: skip
def test_parse_json_and_pairs(text):
    config = OperatorConfig.parse(text)
    assert config.to_dict() == {
        "linear": "avx512", "rms_norm": "native", "layer_norm": "native",
        "default": "auto", "strict": True,
    }  # fmt: skip


def test_parse_default_and_empty():
    assert OperatorConfig.parse("default=native,strict=0").to_dict() == {
        "default": "native", "strict": False,
    }  # fmt: skip
    assert OperatorConfig.parse("   ") == OperatorConfig()


@pytest.mark.parametrize(("text", "message"), [
    ("linear", "bad OperatorConfig item 'linear'"),
    ("linear=avx512,", "bad OperatorConfig item ''"),
    ("=avx512", "write op=backend pairs"),
    ("linear=", "write op=backend pairs"),
    ("linear=native,strict=maybe", "strict takes"),
    ('{"linear": "avx512"', "OperatorConfig JSON is malformed"),
    ('{"linear": 3}', "must be a non-empty string"),
    ('{"strict": "yes"}', "'strict' must be true or false"),
    ("lnear=native", "did you mean 'linear'"),
])  # fmt: skip
def test_parse_rejects_malformed_text(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        OperatorConfig.parse(text)


def test_from_env_reads_pace_opconfig(monkeypatch):
    monkeypatch.setenv("PACE_OPCONFIG", "linear=native,strict=1")
    assert OperatorConfig.from_env() == OperatorConfig(linear="native", strict=True)
    assert OperatorConfig.coerce(None) == OperatorConfig(linear="native", strict=True)
    monkeypatch.setenv("PACE_OPCONFIG", "")
    assert OperatorConfig.from_env() == OperatorConfig()
    monkeypatch.setenv("PACE_OPCONFIG", "linear")
    with pytest.raises(ConfigError, match="bad OperatorConfig item"):
        OperatorConfig.from_env()


def test_coerce_accepts_every_form():
    config = OperatorConfig(linear="native")
    assert OperatorConfig.coerce(config) is config
    assert OperatorConfig.coerce({"linear": "native"}) == config
    assert OperatorConfig.coerce("linear=native") == config


# -- CPU probe ---------------------------------------------------------------------------------
@pytest.fixture
def fresh_cpu_probe():
    detect_cpu.cache_clear()
    yield
    detect_cpu.cache_clear()


def test_detect_cpu_override_and_disable(monkeypatch, fresh_cpu_probe):
    monkeypatch.setenv("PACE_CPU_FEATURES", "avx2 fma,avx512f,avx512bw,avx512vl,AVX512_BF16")
    cpu = detect_cpu()
    assert cpu.features == {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"}
    assert cpu.source == "PACE_CPU_FEATURES" and cpu.isa_level == "avx512bf16"
    assert detect_cpu() is cpu  # cached until cache_clear()

    detect_cpu.cache_clear()
    monkeypatch.setenv("PACE_CPU_FEATURES_DISABLE", "avx512_bf16,avx512f")
    cpu = detect_cpu()
    assert cpu.features == {"avx2", "fma", "avx512bw", "avx512vl"}
    assert cpu.source == "PACE_CPU_FEATURES minus PACE_CPU_FEATURES_DISABLE"
    assert cpu.isa_level == "avx2"

    detect_cpu.cache_clear()
    monkeypatch.setenv("PACE_CPU_FEATURES", "none")
    monkeypatch.delenv("PACE_CPU_FEATURES_DISABLE")
    cpu = detect_cpu()
    assert cpu.features == frozenset() and cpu.isa_level == "baseline"


def test_detect_cpu_disable_applies_to_the_probe(monkeypatch, fresh_cpu_probe):
    real = detect_cpu().features
    detect_cpu.cache_clear()
    monkeypatch.setenv("PACE_CPU_FEATURES_DISABLE", "avx2")
    cpu = detect_cpu()
    assert cpu.features == real - {"avx2"}
    assert cpu.source.endswith(" minus PACE_CPU_FEATURES_DISABLE")


def test_simulated_cpu_drives_the_resolver(registry, monkeypatch, fresh_cpu_probe):
    features = "avx2 fma avx512f avx512bw avx512vl avx512_bf16 amx_bf16"
    monkeypatch.setenv("PACE_CPU_FEATURES", features)
    assert OpResolver(registry, OperatorConfig()).resolve(linear_ctx()).backend == "amx"
    detect_cpu.cache_clear()
    monkeypatch.setenv("PACE_CPU_FEATURES_DISABLE", "amx_bf16")
    assert OpResolver(registry, OperatorConfig()).resolve(linear_ctx()).backend == "fast"


@pytest.mark.parametrize(("features", "level"), [
    ({"amx_bf16", "amx_tile", "avx512_bf16"}, "amx"),
    ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}, "avx512bf16"),
    ({"avx512f", "avx512bw", "avx512vl"}, "avx512"),
    ({"avx512f", "avx2", "fma"}, "avx2"),
    ({"avx2"}, "baseline"),
    (set(), "baseline"),
])  # fmt: skip
def test_isa_level(features, level):
    cpu = CpuInfo(frozenset(features), "simulated", "test", 1)
    assert cpu.isa_level == level
    assert cpu.has(*features) and not cpu.has("avx512_fp16")
