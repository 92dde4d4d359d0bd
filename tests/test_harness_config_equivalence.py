"""The ``config_equivalence`` check has teeth: a planted config with another BLOCK_K is named.

The shipped matmul's declared configs (other BLOCK_M / BLOCK_N / warps / stages, the same
BLOCK_K) agree bitwise on the cpu lane; a config with half the BLOCK_K slipped into the
declared set changes the association of every fp32 sum and the check fails naming it.  The
driver itself is checked on planted functions, and the check applies only to components that
declare configs.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from batchinv.fast import matmul as fast_matmul
from batchinv.harness import invariance
from batchinv.harness.checks import FAST, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, components, get

pytestmark = pytest.mark.cpu


def _with_planted_block_k(component):
    declared = component.configs

    def configs(batch, lane):
        out = dict(declared(batch, lane))
        x, w = batch.rows["x"], batch.shared["weight"]
        cfg = fast_matmul.plan(x.shape[0], w.shape[0], x.shape[1], x.dtype, x.device).config
        planted = replace(cfg, block_k=cfg.block_k // 2)
        out[f"planted_block_k_{planted.block_k}"] = functools.partial(fast_matmul.matmul, config=planted)
        return out

    return replace(component, configs=configs)


def test_a_planted_config_with_another_block_k_is_detected_and_named():
    comp = get("matmul")
    case = comp.cases(Lane.CPU)[0]  # K = 160: two K tiles of 128, or three of 64
    shipped = run_check(comp, FAST, "config_equivalence", case, Lane.CPU)
    assert shipped.status == "pass", shipped.detail
    planted = run_check(_with_planted_block_k(comp), FAST, "config_equivalence", case, Lane.CPU)
    assert planted.status == "fail"
    assert planted.where == ["config planted_block_k_64"], planted.where
    assert planted.rows_differing > 0 and "config planted_block_k_64" in planted.first_difference


def test_driver_names_the_differing_config_and_passes_equal_ones():
    batch = Batch({"x": torch.arange(12.0).reshape(4, 3)})

    def shipped(b):
        return (b.rows["x"] * 3.0,)

    def same(b):
        return (b.rows["x"] * 2.0 + b.rows["x"],)

    def other(b):
        return (b.rows["x"] * 3.0 + 1e-3,)

    ok = invariance.config_equivalence(shipped, batch, {"same": same})
    assert ok.passed and ok.comparisons == 1
    bad = invariance.config_equivalence(shipped, batch, {"same": same, "other": other})
    assert not bad.passed and bad.where == ["config other"]
    empty = invariance.config_equivalence(shipped, batch, {})
    assert empty.passed and empty.comparisons == 0  # reported skip by the check, never pass


def test_the_check_applies_only_to_components_declaring_configs():
    for comp in components():
        assert ("config_equivalence" in comp.applicable_checks()) == (comp.configs is not None), comp.name
    assert "config_equivalence" in get("matmul").applicable_checks()


def test_only_config_control_baselines_are_compared_with_the_configs():
    """A baseline that is another library or formula differs from the pinned kernel's configs by
    construction: config_equivalence skips it (else that would be reported as its variance and
    stop its negative control before the check that finds the real one); a config control (the
    kernel under a config with another summation) is compared and fails, named."""
    comp = get("log_softmax")
    case = comp.cases(Lane.CPU)[0]
    assert not comp.baseline("torch_sum").config_control
    other = run_check(comp, "torch_sum", "config_equivalence", case, Lane.CPU)
    assert other.status == "skip" and "config_control" in other.detail
    control = run_check(comp, "split_float_partials", "config_equivalence", case, Lane.CPU)
    assert control.status == "fail" and control.where and all(w.startswith("config ") for w in control.where)
    assert {b.name for b in get("matmul").baselines if b.config_control} == {"other_block_k", "two_k_slices"}
