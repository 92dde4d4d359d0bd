"""``moe_router``'s weight envelope admits the reference rounded once and no weight a full fp32
ULP away from it, at the top of a binade (where half an ULP of ``v`` is a full ULP below it) as
anywhere else (docs/MOE.md, review item 3)."""

from __future__ import annotations

import math

import pytest
import torch

from batchinv.harness.compare import compare_exact, compare_tolerance
from batchinv.harness.components import moe_router as component
from batchinv.harness.registry import Batch
from batchinv.reference.exact import round_once


def _admitted(batch: Batch, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per element: whether fast weight ``w`` passes agreement against reference ``v``."""
    ids = torch.zeros(v.shape, dtype=torch.int32)
    bound = component.weights_bound(batch, (v, ids))[0]
    mask = component.weights_exact(batch, (v, ids))[0]
    out = torch.empty(v.shape, dtype=torch.bool)
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            b = torch.where(mask[i : i + 1, j : j + 1], math.inf, bound[i : i + 1, j : j + 1])
            within = compare_tolerance(v[i : i + 1, j : j + 1], w[i : i + 1, j : j + 1], b).within
            m, r = mask[i : i + 1, j : j + 1], round_once(v[i : i + 1, j : j + 1], torch.float32)
            out[i, j] = within and compare_exact(r, w[i : i + 1, j : j + 1], m).equal
    return out


@pytest.mark.cpu
def test_no_weight_one_ulp_off_is_admitted() -> None:
    tops = torch.tensor([1.0, 0.5, 2.0**-20, 0.75], dtype=torch.float32)
    r = torch.nextafter(tops, torch.zeros_like(tops))  # the largest fp32 below: a binade's top
    r = torch.cat([r, torch.tensor([0.5, 0.75, 0.6180339887], dtype=torch.float32)])  # and others
    below = torch.nextafter(r, torch.zeros_like(r)).double()
    above = torch.nextafter(r, 2 * torch.ones_like(r)).double()
    # v at fractions of the way to either neighbour (never within 2^-10 ULP of a midpoint).
    fractions = torch.tensor([-0.49, -0.3, -0.1, 0.0, 0.1, 0.3, 0.49], dtype=torch.float64)
    r64 = r.double()[:, None]
    v = torch.where(
        fractions >= 0,
        r64 + fractions * (above[:, None] - r64),
        r64 + fractions.abs() * (below[:, None] - r64),
    )  # [7, 7]
    batch = Batch({"logits": torch.zeros(v.shape[0], 64)}, {"top_k": v.shape[1], "renormalize": False})
    rounded = round_once(v, torch.float32)
    assert bool((rounded == r[:, None]).all())
    assert bool(_admitted(batch, v, rounded).all()), "the correctly rounded weight fails"
    for name, off in (
        ("one ULP up", torch.nextafter(rounded, 2 * torch.ones_like(rounded))),
        ("one ULP down", torch.nextafter(rounded, torch.zeros_like(rounded))),
    ):
        passed = _admitted(batch, v, off)
        assert not bool(passed.any()), f"{name} admitted at v = {v[passed].tolist()}"


@pytest.mark.cpu
def test_a_midpoint_admits_both_neighbours() -> None:
    r = torch.tensor([0.99999994, 0.5, 0.75], dtype=torch.float32)
    above = torch.nextafter(r, 2 * torch.ones_like(r))
    v = ((r.double() + above.double()) / 2)[:, None]  # exact midpoints: either rounding is possible
    batch = Batch({"logits": torch.zeros(3, 8)}, {"top_k": 1, "renormalize": False})
    assert bool(_admitted(batch, v, r[:, None]).all())
    assert bool(_admitted(batch, v, above[:, None]).all())
    assert not bool(_admitted(batch, v, torch.nextafter(above, 2 * torch.ones_like(above))[:, None]).any())
