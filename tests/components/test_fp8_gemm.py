"""fp8_gemm (issue 12): the tables, the exact envelope, the e4m3 conversion, the bounds' teeth.

The registry checks (agreement, invariance, config_equivalence, negative controls) run through
tests/components/test_components.py; the planted mutants through tests/mutants/test_mutants.py.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from batchinv.fast import fp8_gemm as fast_fp8
from batchinv.fast.baselines import fp8_gemm as bl
from batchinv.fast.matmul_config import EXECUTION_TABLE, FP8, TREE_TABLE, reduction_tree
from batchinv.harness.components import fp8_gemm as component
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch
from batchinv.harness.subjects import Unsupported
from batchinv.reference import fp8_gemm as ref
from batchinv.reference.errors import ArgumentError
from batchinv.reference.exact import round_once

FP8_DTYPE = torch.float8_e4m3fn
CPU = torch.device("cpu")


def test_fp8_trees_have_no_m_and_promote_inside_a_k_step() -> None:
    assert "m" not in inspect.signature(reduction_tree).parameters
    for rule in TREE_TABLE:
        if rule.dtypes != FP8:
            continue
        tree = rule.tree
        assert rule.scales, rule
        if rule.scales == ("block",):
            assert tree.chunk_k == ref.SCALE_BLOCK, rule  # a chunk is a scale block
        else:
            assert tree.chunk_k >= 1 << 30, rule  # one accumulator over K
        if rule.arch != "interp":
            # Triton promotes only when max_num_imprecise_acc <= the dot's K: a promote_k above
            # BLOCK_K would let the whole K accumulate in the tensor core's 13 bits.
            assert tree.promote_k and tree.block_k % tree.promote_k == 0, rule
            assert tree.promote_k <= ref.MAX_TENSOR_CORE_GROUP, rule


def test_fp8_gpu_executions_are_wgmma_walks() -> None:
    """No split-K (issue 12) and 64-row tiles at least: Triton's fp32 promotion exists for
    wgmma only; a 16-row tile would lower to mma.sync, which has none."""
    rows = [r for r in EXECUTION_TABLE if r.dtypes == FP8 and r.arch != "interp"]
    assert rows
    for rule in rows:
        assert not rule.execution.split_k, rule
        assert rule.execution.block_m >= 64, rule


def test_promote_k_must_divide_block_k() -> None:
    tree = reduction_tree("sm90", FP8_DTYPE, 4096, 4096, "tensor")
    with pytest.raises(ArgumentError, match="promote_k"):
        replace(tree, promote_k=2 * tree.block_k)
    with pytest.raises(ArgumentError, match="promote_k"):
        replace(tree, promote_k=48)


@pytest.mark.cpu
@pytest.mark.gpu
def test_every_e4m3_code_converts_exactly_in_the_kernel(device: torch.device) -> None:
    """All 256 codes through the kernel (x [256, 1] times 1.0, fp32 out): the interpreter's
    integer-op conversion gives torch's values, subnormals included, NaN for 0x7f/0xff (-0 sums
    to +0 from the zero accumulator: the sign of an exact zero is not specified)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).reshape(256, 1).to(device)
    one = torch.ones(1, device=device)
    weight = torch.ones(1, 1).to(FP8_DTYPE).to(device)
    got = fast_fp8.fp8_gemm(codes, weight, one, one, out_dtype=torch.float32)[:, 0]
    want = codes[:, 0].to(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    nonzero = ~nan & (want != 0)
    assert torch.equal(got[nonzero].view(torch.int32), want[nonzero].view(torch.int32))
    assert bool((got[want == 0] == 0).all())


def _exact_cases(lane: Lane) -> list:
    return [c for c in component.cases(lane) if c.axes["values"] == "exact"]


@pytest.mark.parametrize("lane", [Lane.CPU, Lane.SM90])
@pytest.mark.parametrize("gpu_group", [False, True])
def test_exact_cases_are_exact_everywhere(
    lane: Lane, gpu_group: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``exact`` cases of both lanes (GPU shapes at 16 rows) satisfy the exact envelope
    for every element, under the interpreter's accumulation and under the H200's (128 products
    in the tensor core's 13 bits): the test that builds inputs whose every partial sum is
    exactly representable."""
    if gpu_group:
        monkeypatch.setattr(
            fast_fp8, "accumulation", lambda n, k, layout, device: (128, ref.TENSOR_CORE_FP8_EPS)
        )
    cases = _exact_cases(lane)
    assert cases
    for case in cases:
        small = replace(case, axes={**case.axes, "rows": 16})
        batch = component.build(small, CPU)
        reference = (ref.fp8_gemm(**component._operands(batch)),)
        (mask,) = component.exact(batch, reference)
        assert bool(mask.all()), (case.id, int((~mask).sum()))


def test_exact_envelope_rejects_a_non_power_of_two_scale() -> None:
    case = _exact_cases(Lane.CPU)[0]
    batch = component.build(case, CPU)
    shared = dict(batch.shared)
    shared["weight_scale"] = shared["weight_scale"] * 3.0
    batch = type(batch)(batch.rows, shared)
    (mask,) = component.exact(batch, (ref.fp8_gemm(**component._operands(batch)),))
    assert not bool(mask.any())


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", _exact_cases(Lane.CPU), ids=lambda c: c.id)
def test_fast_is_one_rounding_on_exact_cases(case, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    batch = component.build(case, device)
    ops = component._operands(batch)
    want = round_once(ref.fp8_gemm(**ops), ops["out_dtype"])
    got = fast_fp8.fp8_gemm(**ops)
    assert torch.equal(got, want)


@pytest.mark.cpu
def test_tight_bound_has_teeth() -> None:
    """A bf16 rounding of the fp32 result (a 16-bit intermediate) exceeds the judged bound on
    the fp32-output case, while the kernel's own output meets it (the interpreter's bound: on
    a GPU the tensor core's 13-bit sums loosen it; the exact cases hold the GPU bitwise)."""
    case = next(c for c in component.cases(Lane.CPU) if c.axes["out"] == "fp32")
    case = replace(case, axes={**case.axes, "values": "normal"})
    batch = component.build(case, CPU)
    ops = component._operands(batch)
    reference = ref.fp8_gemm(**ops)
    (tight,) = component.tight(batch, (reference,))
    (hard,) = component.bound(batch, (reference,))
    assert bool((tight <= hard).all())
    got = fast_fp8.fp8_gemm(**ops).double()
    assert bool(((got - reference).abs() <= tight).all())
    downgraded = fast_fp8.fp8_gemm(**ops).to(torch.bfloat16).double()
    assert bool(((downgraded - reference).abs() > tight).any())


def test_group_terms() -> None:
    assert ref.group_terms(32, 2.0**-23) == 34
    assert ref.group_terms(32, ref.TENSOR_CORE_FP8_EPS) == 34
    assert ref.group_terms(128, ref.TENSOR_CORE_FP8_EPS) == 136
    with pytest.raises(ArgumentError, match="group"):
        ref.tight_bound(
            torch.zeros(2, 4).to(FP8_DTYPE),
            torch.zeros(3, 4).to(FP8_DTYPE),
            torch.ones(1),
            torch.ones(1),
            group=0,
        )


def test_torch_scaled_mm_is_a_skip_without_cuda() -> None:
    x = torch.zeros(2, 32).to(FP8_DTYPE)
    w = torch.zeros(16, 32).to(FP8_DTYPE)
    with pytest.raises(Unsupported, match="CUDA"):
        bl.torch_scaled_mm(x, w, torch.ones(1), torch.ones(1))


@pytest.mark.cpu
def test_split_k_small_m_splits_at_a_block_boundary() -> None:
    """The split-K control adds two fp32 halves cut at a multiple of 128 (block scales split
    with them); it differs from the pinned kernel at small M on the block case."""
    case = next(
        c for c in component.cases(Lane.CPU) if c.axes["scales"] == "block" and c.axes["values"] != "exact"
    )
    case = replace(case, axes={**case.axes, "values": "normal", "out": "fp32"})
    batch = component.build(case, CPU)
    ops = component._operands(batch)
    small = {**ops, "x": ops["x"][:8], "x_scale": ops["x_scale"][:8]}
    pinned = fast_fp8.fp8_gemm(**small)
    split = bl.split_k_small_m(**small)
    assert split.shape == pinned.shape
    assert not torch.equal(split.view(torch.int32), pinned.view(torch.int32))


def _exact_mask(ops: dict) -> torch.Tensor:
    rows = {"x": ops["x"]}
    shared = {key: value for key, value in ops.items() if key != "x"}
    if ops["scale_layout"] != "tensor":
        rows["x_scale"] = shared.pop("x_scale")
    batch = Batch(rows, shared)
    (mask,) = component.exact(batch, (ref.fp8_gemm(**ops),))
    return mask


@pytest.mark.cpu
def test_exact_envelope_excludes_fp32_overflow_of_the_scaling() -> None:
    """Power-of-two scales whose fp32 product overflows (2**100 * 2**100), and block totals
    whose fp32 partial sum overflows (2**128 - 2**128): the reference's exact value is 0, the
    fixed formula's ``fl(A * inf)`` / ``inf - inf`` NaN.  The envelope must not claim those
    (it did: every condition holds in exponents, none bounds fp32's range)."""
    x = torch.tensor([[1.0, 1.0], [2.0, 0.5]]).to(FP8_DTYPE)
    w = torch.tensor([[1.0, -1.0], [1.0, 1.0]]).to(FP8_DTYPE)
    tensor_ops = {
        "x": x,
        "weight": w,
        "x_scale": torch.tensor([2.0**100]),
        "weight_scale": torch.tensor([2.0**100]),
        "bias": None,
        "scale_layout": "tensor",
        "out_dtype": torch.float32,
    }
    block_ops = {
        "x": torch.ones(1, 256).to(FP8_DTYPE),
        "weight": torch.tensor([[1.0] * 128 + [-1.0] * 128]).to(FP8_DTYPE),
        "x_scale": torch.full((1, 2), 2.0**60),
        "weight_scale": torch.full((1, 2), 2.0**61),
        "bias": None,
        "scale_layout": "block",
        "out_dtype": torch.float32,
    }
    for ops in (tensor_ops, block_ops):
        got = fast_fp8.fp8_gemm(**ops)
        want = round_once(ref.fp8_gemm(**ops), torch.float32)
        assert bool(torch.isnan(got[0, 0])) and float(want[0, 0]) == 0.0  # the fixed formula's NaN
        assert not bool(_exact_mask(ops)[0, 0])
    # the same shapes at scales whose products stay in range are exact, and the kernel agrees
    in_range = {**tensor_ops, "x_scale": torch.tensor([2.0**60]), "weight_scale": torch.tensor([2.0**60])}
    assert bool(_exact_mask(in_range).all())
    assert torch.equal(fast_fp8.fp8_gemm(**in_range), round_once(ref.fp8_gemm(**in_range), torch.float32))
