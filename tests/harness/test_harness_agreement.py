"""Toleranced agreement's two refinements, on a toy component: the exact envelope (bitwise
against the reference rounded once: a 1-ULP regression fails however loose the bound) and the
tight bound (judged; the rigorous one stays a hard limit), and the reported error / bound."""

from __future__ import annotations

import json
import math

import torch

from batchinv.harness.checks import run_check
from batchinv.harness.compare import compare_exact
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, Case, Component, Toleranced

CASE = Case("toy", {"rows": 6, "cols": 8}, 0)


def _build(case: Case, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(case.seed)
    x = torch.randn(case.axes["rows"], case.axes["cols"], generator=g)
    x[0, 0] = math.nan
    return Batch({"x": x.to(device)})


def _reference(x: torch.Tensor) -> torch.Tensor:
    return x.double() / 3.0  # fp64; the fast result is this rounded once to fp32


def _fast(x: torch.Tensor) -> torch.Tensor:
    return (x.double() / 3.0).float()


def _one_ulp_off(x: torch.Tensor) -> torch.Tensor:
    out = _fast(x)
    out.view(torch.int32)[3, 4] += 1
    return out


def _toy(fast, *, exact_rows=None, hard=1.0, tight=None) -> Component:
    def exact(batch, ref):
        mask = torch.zeros(ref[0].shape, dtype=torch.bool)
        if exact_rows is not None:
            mask[list(exact_rows)] = True
        return (mask,)

    return Component(
        name="toy",
        summary="x / 3",
        reference=_reference,
        fast=fast,
        baselines=(),
        cases=lambda lane: [CASE],
        build=_build,
        agreement=Toleranced(
            bound=lambda batch, ref: (torch.full((), hard, dtype=torch.float64),),
            justification="toy",
            out_dtypes=lambda batch: (torch.float32,),
            tight_bound=None
            if tight is None
            else (lambda batch, ref: (torch.full((), tight, dtype=torch.float64),)),
            exact=None if exact_rows is None else exact,
        ),
    )


def test_a_one_ulp_regression_fails_inside_the_envelope_only():
    assert run_check(_toy(_fast, exact_rows=range(6)), "fast", "agreement", CASE, Lane.CPU).status == "pass"
    inside = run_check(_toy(_one_ulp_off, exact_rows=range(6)), "fast", "agreement", CASE, Lane.CPU)
    assert inside.status == "fail" and "1 ULP" in inside.detail and "(row 3, col 4)" in inside.detail
    outside = run_check(_toy(_one_ulp_off, exact_rows=[0, 1]), "fast", "agreement", CASE, Lane.CPU)
    assert outside.status == "pass" and "exact (one rounding of the exact value) on 16/48" in outside.detail


def test_the_tight_bound_is_judged_and_the_rigorous_one_reported():
    def off(x):  # 1e-3 off everywhere: inside the rigorous bound 1, outside the tight 1e-4
        return _fast(x) + 1e-3

    r = run_check(_toy(off, hard=1.0, tight=1e-4), "fast", "agreement", CASE, Lane.CPU)
    assert r.status == "fail" and "tight bound" in r.detail and "rigorous bound" in r.detail
    assert "(exceeded)" not in r.detail and r.bound_ratio is not None and r.bound_ratio > 5
    ok = run_check(_toy(off, hard=1.0, tight=1e-2), "fast", "agreement", CASE, Lane.CPU)
    assert ok.status == "pass" and 0.05 < ok.bound_ratio < 0.2
    # a tight bound above the rigorous one never loosens it
    loose = run_check(_toy(off, hard=1e-4, tight=1.0), "fast", "agreement", CASE, Lane.CPU)
    assert loose.status == "fail" and "(exceeded)" in loose.detail


def test_bound_ratio_is_none_when_not_finite_and_the_row_stays_valid_json():
    def off(x):
        return _fast(x) + 1e-3

    r = run_check(_toy(off, hard=0.0), "fast", "agreement", CASE, Lane.CPU)
    assert r.status == "fail" and r.bound_ratio is None
    json.loads(r.to_json(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_compare_exact_matches_nan_by_class_and_zeros_by_sign():
    expected = torch.tensor([[math.nan, 0.0, 1.0]])
    other_nan = torch.tensor([[1.0, 0.0, 1.0]]).view(torch.int32)
    other_nan[0, 0] = -4194305  # 0xffbfffff: a negative NaN with another payload
    assert compare_exact(expected, other_nan.view(torch.float32), torch.ones(1, 3, dtype=torch.bool)).equal
    minus_zero = torch.tensor([[math.nan, -0.0, 1.0]])
    assert not compare_exact(expected, minus_zero, torch.ones(1, 3, dtype=torch.bool)).equal
    assert compare_exact(expected, minus_zero, torch.tensor([[True, False, True]])).equal
    assert not compare_exact(
        expected, torch.tensor([[1.0, 0.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool)
    ).equal


def test_a_wrong_shape_fails_without_crashing():
    r = run_check(_toy(lambda x: _fast(x)[:, :4], exact_rows=range(6)), "fast", "agreement", CASE, Lane.CPU)
    assert r.status == "fail" and "shape" in r.detail
