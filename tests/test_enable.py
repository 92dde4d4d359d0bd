"""Tests of ``batchinv.fast.enable()``: a torch model's GEMMs routed through the pinned kernel,
rows bitwise invariant along M inside the block, the original kernels back on exit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import batchinv.fast
from batchinv.fast.aten_override import enable
from batchinv.harness.plugin import current_lane

DEVICE = torch.device("cuda" if current_lane().is_gpu else "cpu")


def any_lane(fn):
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40, bias=False)
    ).to(DEVICE)


def _x(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 48, generator=gen).to(DEVICE)


@any_lane
@torch.no_grad()
def test_model_rows_are_batch_invariant_inside_enable():
    model, x = _model(0), _x(37, 1)
    with batchinv.fast.enable() as stats:  # the public spelling
        full = model(x)
        singles = [model(x[i : i + 1]) for i in (0, 17, 36)]
        middle = model(x[5:21])
    assert stats.pinned["addmm"] >= 2 and stats.pinned["mm"] >= 2, stats
    assert not stats.fallback, stats
    for i, single in zip((0, 17, 36), singles, strict=True):
        assert torch.equal(single.view(torch.int32), full[i : i + 1].view(torch.int32)), f"row {i}"
    assert torch.equal(middle.view(torch.int32), full[5:21].view(torch.int32))


@any_lane
@torch.no_grad()
def test_enable_restores_the_original_kernels_on_exit():
    model, x = _model(2), _x(9, 3)
    before = model(x)
    with enable() as stats:
        model(x)
    count = sum(stats.pinned.values())
    after = model(x)
    assert sum(stats.pinned.values()) == count, "the override outlived the block"
    assert torch.equal(before.view(torch.int32), after.view(torch.int32))


@any_lane
def test_unsupported_calls_fall_back_and_are_counted():
    a = torch.randn(6, 5, dtype=torch.float64, device=DEVICE)
    b = torch.randn(5, 3, dtype=torch.float64, device=DEVICE)
    inp = torch.randn(6, 3, dtype=torch.float64, device=DEVICE)
    with enable() as stats:
        got_mm = torch.mm(a, b)
        got_addmm = torch.addmm(inp, a, b, beta=0.5, alpha=2.0)
    assert stats.fallback == {"mm": 1, "addmm": 1}
    expected = sum(a[:, j, None] * b[j] for j in range(5))  # elementwise fp64, written out
    assert torch.allclose(got_mm, expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got_addmm, 0.5 * inp + 2.0 * expected, rtol=1e-12, atol=1e-12)


@any_lane
def test_addmm_scalars_and_full_input_use_the_pinned_product():
    a, b = torch.randn(6, 32, device=DEVICE), torch.randn(32, 24, device=DEVICE)
    inp = torch.randn(6, 24, device=DEVICE)
    with enable() as stats:
        product = torch.mm(a, b)
        out = torch.addmm(inp, a, b, beta=0.5, alpha=2.0)
        out_beta0 = torch.addmm(torch.full_like(inp, float("nan")), a, b, beta=0)
        linear = F.linear(a, b.t().contiguous(), inp[0])
    assert stats.pinned["addmm"] == 3 and not stats.fallback
    assert torch.equal(out, 0.5 * inp + 2.0 * product)
    assert torch.equal(out_beta0, product)  # beta = 0 ignores the input's NaNs, as aten does
    ref = a.double() @ b.double() + inp[0].double()
    assert float((linear.double() - ref).abs().max()) < 1e-4


@any_lane
def test_nested_enable_shares_one_override():
    a, b = torch.randn(4, 16, device=DEVICE), torch.randn(16, 8, device=DEVICE)
    with enable() as outer:
        with enable() as inner:
            torch.mm(a, b)
        torch.mm(a, b)
    assert inner is outer and outer.pinned["mm"] == 2
