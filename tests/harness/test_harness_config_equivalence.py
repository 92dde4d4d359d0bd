"""The ``config_equivalence`` check has teeth: a planted config with another tree is named.

The shipped matmul's declared configs (every execution of the table: split-K across the grid or
a walk, other tiles, warps, stages; the same reduction tree) agree bitwise on the cpu lane; a
config with half the BLOCK_K or twice the chunk size slipped into the declared set changes the
association of the fp32 sums and the check fails naming it.  The
driver itself is checked on planted functions, and the check applies only to components that
declare configs.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from batchinv.fast import matmul as fast_matmul
from batchinv.fast.matmul_config import ReductionTree
from batchinv.harness import invariance
from batchinv.harness.checks import FAST, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, components, get

pytestmark = pytest.mark.cpu


def _with_planted(component, change, label):
    """``component`` whose declared configs also hold the table's execution with the tree
    ``change(tree)``, named ``planted_<label>``."""
    declared = component.configs

    def configs(batch, lane):
        out = dict(declared(batch, lane))
        x, w = batch.rows["x"], batch.shared["weight"]
        cfg = fast_matmul.plan(x.shape[0], w.shape[0], x.shape[1], x.dtype, x.device).config
        planted = replace(cfg, tree=change(cfg.tree))
        out[f"planted_{label}"] = functools.partial(fast_matmul.matmul, config=planted)
        return out

    return replace(component, configs=configs)


@pytest.mark.parametrize(
    ("label", "change"),
    [
        # K = 160 in 32-wide steps: 16-wide steps associate each step's sum otherwise
        ("half_block_k", lambda tree: ReductionTree(tree.block_k // 2, tree.chunk_k)),
        # chunks of 64 + 64 + 32, or 128 + 32: another association of the chunk sums
        ("twice_chunk_k", lambda tree: ReductionTree(tree.block_k, 2 * tree.chunk_k)),
    ],
)
def test_a_planted_config_with_another_tree_is_detected_and_named(label, change):
    comp = get("matmul")
    case = comp.cases(Lane.CPU)[0]
    shipped = run_check(comp, FAST, "config_equivalence", case, Lane.CPU)
    assert shipped.status == "pass", shipped.detail
    planted = run_check(_with_planted(comp, change, label), FAST, "config_equivalence", case, Lane.CPU)
    assert planted.status == "fail", planted.detail
    assert planted.where == [f"config planted_{label}"], planted.where
    assert planted.rows_differing > 0 and f"config planted_{label}" in planted.first_difference


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
    assert {b.name for b in get("matmul").baselines if b.config_control} == {
        "other_block_k",
        "other_chunk_k",
        "two_k_slices",
    }
