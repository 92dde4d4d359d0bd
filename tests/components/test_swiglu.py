"""swiglu beyond the generic registry tests: special values, the tight bound's teeth against
the unfused torch path, and the launcher's block choice never reading M."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from batchinv.fast import swiglu as fast
from batchinv.harness.checks import (
    CheckResult,
    _agreement,
)
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, get
from batchinv.reference import swiglu as reference
from batchinv.reference.exact import round_once

pytestmark = pytest.mark.cpu
COMP = get("swiglu")


def _judge(batch: Batch, out: torch.Tensor) -> CheckResult:
    result = CheckResult("swiglu", "probe", "agreement", "", {}, 0, "cpu", "error")
    _agreement(COMP, batch, (out,), result)
    return result


def _gate_up(gate: list[float], up: list[float], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.tensor([gate + up], dtype=torch.float64).to(dtype)


def test_special_gates_follow_ieee_and_the_documented_formula():
    inf, nan = math.inf, math.nan
    gate = [inf, -inf, nan, -0.0, 0.0, 100.0, -100.0, 1e4, -1e4]
    x = _gate_up(gate, [1.0] * len(gate))
    out = fast.swiglu(x).double()[0]
    ref = reference.swiglu(x)[0]
    assert out[0] == inf and math.isnan(out[1]) and math.isnan(out[2])
    assert out[3] == 0 and math.copysign(1, out[3]) < 0  # silu(-0) = -0
    assert out[4] == 0 and math.copysign(1, out[4]) > 0
    assert out[5] == 100.0 and out[7] == x[0, 7].double()
    assert out[6] == 0 and math.copysign(1, out[6]) < 0 and out[8] == 0  # exp(-|g|) underflows
    assert torch.equal(round_once(ref, torch.bfloat16).isnan(), out.isnan())


def test_a_flushed_silu_times_infinity_is_the_signed_infinity():
    """silu(g) of a finite nonzero g is nonzero (sign of g) even where fp32's exp(-|g|) (below
    g ~ -104, -87 with FTZ) or fp64's (below -745) underflows: times +-inf the exact limit is
    the signed infinity, in the kernel and the reference alike; silu(+-0) * inf and silu(-inf)
    stay NaN."""
    inf, nan = math.inf, math.nan
    gate = [-100.0, -104.0, -800.0, -1e4, -1e30, 1.5, 0.0, -0.0, -inf]
    up = [inf, -inf, inf, -inf, inf, -inf, inf, -inf, inf]
    expected = [-inf, inf, -inf, inf, -inf, -inf, nan, nan, nan]  # sign(g) sign(u) inf, or NaN
    x = _gate_up(gate, up)
    for got in (fast.swiglu(x).double()[0], reference.swiglu(x)[0]):
        for value, want in zip(got.tolist(), expected, strict=True):
            assert (math.isnan(value) and math.isnan(want)) or value == want, (got, expected)


def test_a_scale_infinite_or_underflowing_keeps_the_exact_limit():
    inf = math.inf
    # gates | ups.  Row 0: flushed silu times finite u times s = +inf: sign(g u) inf (g = 0: NaN);
    # row 1: silu(+inf) times a subnormal u * s (0 in fp32, not in fp64): sign(u) inf (u = 0: NaN)
    x = torch.tensor(
        [[-104.0, -800.0, 0.0, 2.0, 3.0, -3.0, 1.0, 1.0], [inf, inf, inf, 1.0, 1e-40, -1e-40, 0.0, 1.0]],
        dtype=torch.float64,
    ).to(torch.bfloat16)
    s = torch.tensor([inf, 1e-40])
    out = fast.swiglu(x, s).double()
    ref = reference.swiglu(x, s)
    for got in (out, ref):
        assert got[0, 0] == -inf and got[0, 1] == inf and math.isnan(got[0, 2]) and got[0, 3] == inf
        assert got[1, 0] == inf and got[1, 1] == -inf and math.isnan(got[1, 2])
    assert _judge(Batch({"gate_up": x, "scale": s}), fast.swiglu(x, s)).status == "pass"


@pytest.mark.parametrize("scale", [2.5, 0.5])
def test_a_huge_up_times_a_scale_above_or_below_one_stays_finite(scale):
    """u = 0.9 bf16 max: u * 2.5 overflows fp32 and so does silu(2) * u, but the exact products
    silu(g) u s here are finite: the kernel orders the product by |s| (review item 2)."""
    top = torch.finfo(torch.bfloat16).max * 0.9
    gate = [-4.0, -1.0, 0.1, 0.4, 2.0, -100.0]
    x = _gate_up(gate, [top, -top, top, -top, top, -top])
    s = torch.tensor([scale])
    ref = reference.swiglu(x, s)
    out = fast.swiglu(x, s)
    finite = ref.abs() < torch.finfo(torch.bfloat16).max
    assert int(finite.sum()) == (6 if scale == 0.5 else 5)  # silu(2) u 2.5 is past the range
    assert bool(out.double()[finite].isfinite().all())
    assert _judge(Batch({"gate_up": x, "scale": s}), out).status == "pass"


def test_scale_zero_and_nan():
    x = torch.randn(3, 8).to(torch.bfloat16)
    out = fast.swiglu(x, torch.tensor([0.0, math.nan, 1.0]))
    assert bool((out[0] == 0).all()) and bool(out[1].isnan().all())
    assert torch.equal(out[2].view(torch.int16), fast.swiglu(x[2:]).view(torch.int16)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_is_the_correct_rounding_on_normal_values(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(16, 192, generator=g) * 2).to(dtype)
    s = torch.rand(16, generator=g)
    out = fast.swiglu(x, s)
    assert torch.equal(out.view(torch.int16), round_once(reference.swiglu(x, s), dtype).view(torch.int16))
    assert _judge(Batch({"gate_up": x, "scale": s}), out).status == "pass"


def test_the_unfused_torch_path_exceeds_the_tight_bound():
    """``F.silu(gate) * up`` rounds silu to bf16 first: a precision difference (not a batch
    dependence) that the tight bound must reject."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(16, 192, generator=g) * 2).to(torch.bfloat16)
    gate, up = x[:, :96], x[:, 96:]
    unfused = F.silu(gate) * up
    result = _judge(Batch({"gate_up": x}), unfused)
    assert result.status == "fail", result.detail
    assert "tight bound" in result.detail


def test_the_block_choice_never_reads_m():
    assert list(inspect.signature(fast.blocks_for).parameters) == ["i"]
    assert fast.blocks_for(96) == fast.blocks_for(96)
    assert fast.blocks_for(14336)[1] == fast.MAX_BLOCK


def test_gpu_lane_cases_have_the_issue_shapes():
    inters = {c.axes["inter"] for c in COMP.cases(Lane.SM90)}
    assert {768, 2048, 14336} <= inters


def test_property_agreement_and_row_locality():
    from hypothesis import HealthCheck, given, settings

    from batchinv.harness.compare import compare_bitwise

    @settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(COMP.strategy(Lane.CPU, torch.device("cpu")))
    def prop(batch: Batch) -> None:
        out = COMP.fast(**batch.kwargs())
        result = _judge(batch, out)
        assert result.status == "pass", result.detail
        i = batch.num_rows // 2
        alone = COMP.fast(**batch.take([i]).kwargs())
        assert compare_bitwise(out[i : i + 1], alone).equal

    prop()
