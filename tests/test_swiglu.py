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
