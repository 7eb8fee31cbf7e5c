"""`pace check` passes on a correct plan and fails on a wrong kernel."""

from __future__ import annotations

import pytest
from pace_native import kernels

from pace_core import hookimpl
from pace_core.check import format_rows, run_check
from pace_core.ops import CONTRACT_VERSION
from pace_core.plugins import get_host, reset_host


class NoisyNorm:
    """A deliberately wrong rms_norm (scales the output), to prove the check can fail."""
    PACE_CONTRACT_VERSION = CONTRACT_VERSION


    @hookimpl
    def pace_register_ops(self, registry):
        def bad(x, weight, eps, residual=None):
            y, res = kernels.rms_norm(x, weight, eps, residual)
            return y * 1.5, res

        registry.add_kernel("rms_norm", "noisy", bad, priority=-1)


@pytest.mark.slow
def test_check_passes_native_and_fails_a_wrong_kernel(smollm2_dir):
    reset_host()
    try:
        get_host().register(NoisyNorm(), "noisy")
        rows = run_check(
            str(smollm2_dir),
            new_tokens=6,
            prompts=["The capital of France is"],
            plans=["native", "noisy"],
        )
    finally:
        reset_host()
    table = format_rows(rows)
    by_plan = {(r.plan, r.dtype): r for r in rows}
    assert by_plan[("native", "float32")].passed and by_plan[("native", "float32")].mismatches == 0
    assert by_plan[("native", "float32")].max_logit_diff < 1e-3
    assert by_plan[("native", "bfloat16")].passed
    assert not by_plan[("noisy", "float32")].passed
    assert by_plan[("noisy", "float32")].max_logit_diff > 0.1
    assert "FAIL" in table and "PASS" in table
    # what ran: "noisy" pins rms_norm alone (the rest is auto); native runs native only
    assert by_plan[("native", "float32")].ran_on == "native"
    assert "noisy" in by_plan[("noisy", "float32")].ran_on.split(", ")
