"""The op contract is checked by code: every installed kernel against its OpSpec, declared
context attributes, and the contract version a plugin states."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re

import pytest
import torch

from pace_core import CONTRACT_VERSION, hookimpl
from pace_core.errors import ContractError
from pace_core.opconfig import OperatorConfig
from pace_core.ops import OPS
from pace_core.plugins import ENTRY_POINT_GROUP, PluginHost
from pace_core.registry import OpContext, Registrations

# A plausible value for every context attribute the catalogue declares.
SAMPLE_CONTEXT = {
    "vocab": 1000, "in_features": 576, "out_features": 1536, "activation": "silu",
    "hidden": 576, "intermediate": 1536, "experts": 4, "top_k": 2, "head_dim": 64, "gqa": 3,
    "window": None, "sinks": False, "cache_layout": "contiguous", "blocks": frozenset(),
    "layer_backends": frozenset({"native"}), "profiling": False, "weight_format": "dense",
    "biases": False, "rank": 512, "rope_dim": 64, "heads": 16, "rows": 1000, "dim": 128,
    "layers": 3, "kv_dtype": "auto",
}  # fmt: skip


@pytest.fixture
def every_installed_plugin(monkeypatch):
    """A host that loads every installed plugin, not just the hermetic test set."""
    monkeypatch.setattr("pace_core.plugins.metadata.entry_points", metadata.entry_points)
    return PluginHost()


def test_every_declared_context_attribute_has_a_sample():
    declared = {name for spec in OPS.values() for name in spec.context}
    assert declared == set(SAMPLE_CONTEXT)


def test_every_installed_kernel_matches_its_op_spec(every_installed_plugin):
    host = every_installed_plugin
    loaded = [n for n, info in host.plugins.items() if info.status == "ok"]
    assert "native" in loaded
    kernels = host.ops.values()
    assert {s.op for s in kernels if s.backend == "native"} == set(OPS)
    for spec in kernels:
        op = OPS[spec.op]
        assert op.call_problem(spec.fn, spec.prepare if op.prepared else None) == "", spec
        assert op.prepared == (spec.prepare is not None) or not op.prepared, spec
        if spec.supports is None:
            continue
        attrs = {name: SAMPLE_CONTEXT[name] for name in op.context}
        for dtype in spec.dtypes:
            verdict = spec.supports(OpContext(spec.op, dtype, attrs))  # never a ContractError
            assert verdict is True or verdict is False or isinstance(verdict, str), spec


def test_every_plugin_distribution_depends_on_pace_core():
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist is None:
            continue
        requires = [r.split(";")[0].strip() for r in ep.dist.requires or []]
        names = {re.split(r"[=<>!~\[ ]", r)[0] for r in requires}
        assert "pace-core" in names, f"{ep.dist.name} does not declare pace-core"


def test_context_typo_raises_instead_of_reading_none():
    ctx = OpContext("gated_mlp", torch.float32, {"activation": "silu"})
    assert ctx.activation == "silu"
    assert ctx.hidden is None  # declared, not set by this call site
    with pytest.raises(ContractError, match=r"no context attribute 'activaton'.*activation"):
        getattr(ctx, "activaton", None)  # a default does not hide the typo
    with pytest.raises(ContractError, match=r"declares no context attribute\(s\) \['width'\]"):
        OpContext("linear", torch.float32, {"width": 3})
    with pytest.raises(ContractError, match="unknown op 'lineer'"):
        OpContext("lineer", torch.float32)


def test_kernel_with_the_wrong_arity_is_refused_at_registration():
    regs = Registrations("p")
    with pytest.raises(ContractError, match=r"cannot take the 5 positional arguments of op"):
        regs.add_kernel("layer_norm", "p", lambda x, weight, eps, residual=None: (x, x))
    with pytest.raises(ContractError, match=r"prepare step .* cannot take the 2 positional"):
        regs.add_kernel("linear", "p", lambda x, w: x, prepare=lambda weight: weight)
    assert regs.kernels == []


class Versioned:
    def __init__(self, version):
        if version is not None:
            self.PACE_CONTRACT_VERSION = version

    @hookimpl
    def pace_register_ops(self, registry):
        registry.add_kernel("rms_norm", "versioned", lambda x, w, eps, r=None: (x, x))


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (None, "does not state the contract version it was written for: set "
               f"PACE_CONTRACT_VERSION = {CONTRACT_VERSION}"),
        (CONTRACT_VERSION + 1, f"was written for pace contract version {CONTRACT_VERSION + 1}, "
                               f"but this pace-core implements version {CONTRACT_VERSION}"),
    ],
)  # fmt: skip
def test_contract_version_is_checked_with_a_clear_error(version, message):
    host = PluginHost(autoload=False)
    info = host.register(Versioned(version), "versioned")
    assert info.status == "failed"
    assert info.error.startswith("ContractError: plugin 'versioned' ")
    assert message in info.error
    assert ("rms_norm", "versioned") not in host.ops
    assert host.register(Versioned(CONTRACT_VERSION), "versioned2").status == "ok"


def test_pinning_a_plugin_that_failed_to_load_states_its_real_reason(caplog):
    host = PluginHost(autoload=False)
    host.register(importlib.import_module("pace_native.plugin"), "native")
    info = host.register(Versioned(None), "tpp")  # as if pace-tpp failed to load
    assert info.status == "failed"
    resolver = host.resolver(OperatorConfig(rms_norm="tpp"))
    res = resolver.resolve(OpContext("rms_norm", torch.float32))
    assert res.backend == "native"
    assert res.fallback_reason.startswith("plugin 'tpp' is installed but failed to load: ")
    assert "PACE_CONTRACT_VERSION" in res.fallback_reason
    assert "not installed" not in res.fallback_reason
