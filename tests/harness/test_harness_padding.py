"""The ``padding`` check (``harness.invariance.padding``): its place among the checks, and its
teeth on the cpu lane.

The sweep's cpu cases are bf16 / fp16: there an fp32 regrouping of a row's keys rarely moves a
rounded output bit, so the teeth are shown here in fp32 (the SDPA path takes fp32; the
interpreter's fp32 sums regroup visibly): the same entry with its q, k and v in fp32, the
shipped kernel passes, the kernel with its splits counted from key 0 of the padded row and
Hugging Face's eager attention with pinned matmuls fail, naming the side and the amount.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from batchinv.fast.baselines import sdpa_attention as baselines
from batchinv.harness.checks import FAST, run_check
from batchinv.harness.components import sdpa_attention as entry
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import CHECKS, INVARIANCE_CHECKS, PADDING_CHECKS, Batch, Case, get

pytestmark = pytest.mark.cpu


def test_padding_follows_phase_and_applies_to_components_with_a_padding_model():
    assert PADDING_CHECKS == ("padding",) and "padding" in INVARIANCE_CHECKS
    assert CHECKS.index("padding") == CHECKS.index("phase") + 1
    assert "padding" in get("sdpa_attention").applicable_checks()
    assert all(
        "padding" not in get(n).applicable_checks()
        for n in ("decode_attention", "prefill_attention", "matmul")
    )
    no_model = dataclasses.replace(get("sdpa_attention"), padding=None)
    assert "padding" not in no_model.applicable_checks()


def _fp32(batch: Batch) -> Batch:
    rows = {k: (v.float() if v.is_floating_point() else v) for k, v in batch.rows.items()}
    return Batch(rows, dict(batch.shared))


def _fp32_entry(fast, sides=None):
    """The entry in fp32 with ``fast``; ``sides``: the padding sides the check runs (default:
    the entry's, left and right)."""
    component = get("sdpa_attention")
    assert component.padding is not None
    padding = component.padding if sides is None else dataclasses.replace(component.padding, sides=sides)
    return dataclasses.replace(
        component,
        fast=fast,
        build=lambda case, device: _fp32(component.build(case, device)),
        dtypes=(torch.float32,),
        padding=padding,
    )


CASE = Case(
    "sdpa_attention",
    dict(R=1, Hq=2, Hkv=1, D=16, dtype="bfloat16", mix="prefill", longest=20, mask="bool", side="left"),
)


def test_the_shipped_kernel_passes_in_fp32():
    result = run_check(
        _fp32_entry(entry.padded(entry.fast_attention.sdpa_attention)), FAST, "padding", CASE, Lane.CPU
    )
    assert result.status == "pass", result.detail


@pytest.mark.parametrize(
    "control",
    [baselines.absolute_splits, baselines.eager_pinned_matmul],
    ids=["absolute_splits", "eager_pinned_matmul"],
)
def test_the_check_catches_splits_from_the_padded_key_0_and_eager_attention(control):
    # Left padding only: it is what moves a row's keys from key 0 (what both controls are
    # caught by); the right side's launches (half the check) cannot be where they fail.
    result = run_check(_fp32_entry(entry.padded(control), sides=("left",)), FAST, "padding", CASE, Lane.CPU)
    assert result.status == "fail", f"{control.__name__}: {result.status} {result.detail}"
    assert "left-padded by" in result.detail or "left-padded by" in " ".join(result.where), result
