"""Issue 25 section 3: one rule for the launchers' and plans' arguments, in both trees.

* Integer (size, count) arguments: :func:`batchinv.reference.errors.check_int` -- a Python int or
  a NumPy integer; a bool, a float or a tensor is a DTypeError; a value outside its range
  (bounded so the int64 arithmetic and the allocations it sizes hold) an ArgumentError naming it.
* An operand that requires grad under grad mode: an ArgumentError naming it
  (:func:`batchinv.fast.device.check_no_grad`), never an output silently without a gradient.
* ``decode_attention`` sizes its grid and workspace from the lengths, not the table capacity,
  and refuses a grid past CUDA's limits; an all -inf score row gives (o = 0, lse = -inf) in
  the fast and the reference trees alike.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from batchinv.fast import cuda_graph_buckets as fast_buckets
from batchinv.fast import decode_attention as fast_decode_module
from batchinv.fast import decode_partition_plan as fast_plan
from batchinv.fast import prefill_chunk_plan as fast_chunks
from batchinv.fast.decode_partition_plan_lifecycle import PlanConfig
from batchinv.reference import cuda_graph_buckets as ref_buckets
from batchinv.reference import decode_partition_plan as ref_plan
from batchinv.reference import prefill_chunk_plan as ref_chunks
from batchinv.reference.decode_attention import decode_attention as ref_decode
from batchinv.reference.errors import ArgumentError, DTypeError, check_int

pytestmark = pytest.mark.cpu

LENS = torch.tensor([5, 9], dtype=torch.int32)
BIG = 2**63 - 1


# --- the shared integer rule --------------------------------------------------------------------


def test_check_int_accepts_python_and_numpy_integers_and_refuses_the_rest():
    assert check_int("n", 7, 1) == 7 and type(check_int("n", np.int64(7), 1)) is int
    assert check_int("n", np.uint8(3), 0) == 3
    for bad in (True, np.True_, 1.5, 2.0, torch.tensor(3), torch.tensor(True), "3", None):
        with pytest.raises(DTypeError, match="'n'"):
            check_int("n", bad, 0)
    with pytest.raises(ArgumentError, match=r"'n'.*>= 1"):
        check_int("n", -1, 1)
    with pytest.raises(ArgumentError, match=r"'n'.*2147483647"):
        check_int("n", 2**31, 1)


@pytest.mark.parametrize("plan", [fast_plan.decode_partition_plan, ref_plan.decode_partition_plan])
def test_decode_partition_plan_refuses_sizes_past_int64_and_memory(plan):
    # block_size = 2**63 - 1 gave num_splits [-1, -1] (the int64 sum wrapped)
    with pytest.raises(ArgumentError, match="'block_size'"):
        plan(LENS, 2, BIG, 1, 4)
    # block * blocks_per_split past an int32 length: the split products would wrap
    with pytest.raises(ArgumentError, match="'blocks_per_split'"):
        plan(LENS, 2, 2**20, 2**20, 4)
    # the reference looped 2**40 partitions (a hang), the fast plan asked for 8 TB
    with pytest.raises(ArgumentError, match="'num_sm_parts'"):
        plan(LENS, 2**40, 16, 1, 4)
    with pytest.raises(ArgumentError, match="'max_splits'"):
        plan(LENS, 2, 16, 1, 2**40)
    with pytest.raises(DTypeError, match="'num_sm_parts'"):
        plan(LENS, True, 16, 1, 4)
    # a NumPy integer is a host integer: the same plan as the Python int
    for a, b in zip(
        plan(LENS, np.int64(2), np.int32(16), 1, np.int64(4)), plan(LENS, 2, 16, 1, 4), strict=True
    ):
        assert torch.equal(a, b)


def test_plan_helpers_take_the_same_rule():
    with pytest.raises(DTypeError, match="'num_requests'"):
        fast_plan.partition_spans(1.5, 2)
    with pytest.raises(DTypeError, match="'num_sm_parts'"):
        fast_plan.partition_spans(3, True)
    with pytest.raises(ArgumentError, match="'max_splits'"):
        PlanConfig(max_splits=-1)
    with pytest.raises(DTypeError, match="'block_size'"):
        PlanConfig(block_size=16.0)
    assert type(PlanConfig(max_requests=np.int64(8)).max_requests) is int


@pytest.mark.parametrize("plan", [fast_chunks.prefill_chunk_plan, ref_chunks.prefill_chunk_plan])
def test_prefill_chunk_plan_refuses_a_budget_past_int32(plan):
    # token_budget = 2**63 - 1 gave num_chunks [0, -1, -1]
    with pytest.raises(ArgumentError, match="'token_budget'"):
        plan(torch.tensor([0, 5, 9]), BIG, 4)
    with pytest.raises(ArgumentError, match="'max_chunks'"):
        plan(torch.tensor([0, 5, 9]), 4, 2**40)
    expected = plan(torch.tensor([0, 5, 9]), 4, 3)
    for a, b in zip(plan(torch.tensor([0, 5, 9]), np.int64(4), np.int16(3)), expected, strict=True):
        assert torch.equal(a, b)


def test_capture_buckets_refuse_sizes_past_int32_and_agree_at_the_bounds():
    # max_seq_len = 2**62: prefill * max_seq_len wrapped in the fast table, which dropped buckets
    for check in (fast_buckets.capture_buckets, ref_buckets.check_config):
        with pytest.raises(ArgumentError, match="'max_seq_len'"):
            check(8, 2**20, 2**62)
        with pytest.raises(ArgumentError, match="'num_speculative_tokens'"):
            check(1, 2**20, 2**20, 2**40)
    top = 2**31 - 1
    for cfg in [(2**20, top, top, 0), (1, top, top, top - 1), (top, top, top, 0)]:
        fast = fast_buckets.capture_buckets(*cfg)
        ref = ref_buckets.capture_buckets(ref_buckets.check_config(*cfg))
        assert fast.tolist() == [[d.tokens, d.prefill, d.decode] for d in ref], cfg


def test_moe_align_refuses_a_block_m_whose_output_length_wraps():
    from batchinv.fast.moe_align import moe_align as fast_align
    from batchinv.reference.moe_align import moe_align as ref_align

    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    for fn in (fast_align, ref_align):
        with pytest.raises(ArgumentError, match="'block_m'"):
            fn(ids, 2, 2**40)
        with pytest.raises(ArgumentError, match="'block_m'"):
            fn(ids, 4, 2**30)  # T*k + E*(block_m - 1) past int32


def test_grouped_gemm_helpers_take_numpy_integers():
    from batchinv.fast import grouped_gemm as fast_gemm

    cpu = torch.device("cpu")
    assert fast_gemm.block_m(cpu, num_rows=np.int64(8), num_experts=np.int32(4)) == fast_gemm.block_m(
        cpu, num_rows=8, num_experts=4
    )
    assert fast_gemm.layer_block_m(cpu, np.int64(4), np.int64(2), 4) == fast_gemm.layer_block_m(cpu, 4, 2, 4)


# --- empty reductions -----------------------------------------------------------------------------


def _aligned(t: int, e: int):
    from batchinv.reference.moe_align import moe_align as ref_align

    ids = (torch.arange(t * 2, dtype=torch.int32) % e).reshape(t, 2)
    return ids, ref_align(ids, e, 16)


def test_grouped_gemm_with_k_zero_is_a_typed_error_in_both_trees():
    from batchinv.fast.grouped_gemm import grouped_gemm as fast_gemm
    from batchinv.reference.grouped_gemm import grouped_gemm as ref_gemm

    _, (sorted_ids, block_expert, num_padded) = _aligned(3, 2)
    a = torch.zeros(3, 0, dtype=torch.bfloat16)
    w = torch.zeros(2, 8, 0, dtype=torch.bfloat16)
    for fn in (fast_gemm, ref_gemm):
        with pytest.raises(ArgumentError, match=r"'a'.*K"):
            fn(a, w, sorted_ids, block_expert, num_padded, 2)
        with pytest.raises(DTypeError, match="'top_k'"):
            fn(a, w, sorted_ids, block_expert, num_padded, 2.0)


def test_fused_moe_with_h_zero_is_a_typed_error_in_both_trees():
    from batchinv.fast.fused_moe import fused_moe as fast_moe
    from batchinv.reference.fused_moe import fused_moe as ref_moe

    e, i = 4, 8
    args = (
        torch.zeros(3, 0, dtype=torch.bfloat16),
        torch.zeros(e, 0, dtype=torch.bfloat16),
        torch.zeros(e, 2 * i, 0, dtype=torch.bfloat16),
        torch.zeros(e, 0, i, dtype=torch.bfloat16),
        2,
    )
    for fn in (fast_moe, ref_moe):
        with pytest.raises(ArgumentError, match=r"'hidden'.*H >= 1"):
            fn(*args)


# --- requires_grad: one rule for every public fast function -----------------------------------------


def _grad_calls():
    from batchinv.fast.matmul import matmul
    from batchinv.fast.moe_router import moe_router
    from batchinv.fast.rms_norm import rms_norm
    from batchinv.fast.softmax import softmax
    from batchinv.fast.swiglu import swiglu

    g = torch.Generator().manual_seed(3)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    x, w, gu = r(4, 16), r(8, 16), r(4, 16, dtype=torch.bfloat16)
    return [
        ("matmul_x", "x", lambda t: matmul(t, w), x),
        ("matmul_weight", "weight", lambda t: matmul(x, t), w),
        ("softmax", "x", lambda t: softmax(t), x),
        ("rms_norm_weight", "weight", lambda t: rms_norm(x, t), r(16)),
        ("moe_router", "logits", lambda t: moe_router(t, 2), r(4, 8)),
        ("swiglu", "gate_up", lambda t: swiglu(t), gu),
        ("swiglu_scale", "scale", lambda t: swiglu(gu, t), r(4).abs()),
    ]


@pytest.mark.parametrize(
    ("name", "argument", "call", "operand"), _grad_calls(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_operand_that_requires_grad_is_refused_by_name(name, argument, call, operand):
    # before: the output came back with requires_grad=False, a gradient through it silently zero
    with pytest.raises(ArgumentError, match=rf"'{argument}'.*requires_grad"):
        call(operand.clone().requires_grad_())
    # under no_grad / inference_mode the same call runs, with the detached operand's bits
    expected = call(operand)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            out = call(operand.clone().requires_grad_())
        for a, b in zip(
            out if isinstance(out, tuple) else (out,),
            expected if isinstance(expected, tuple) else (expected,),
            strict=True,
        ):
            assert torch.equal(a, b)


def test_decode_attention_and_fused_moe_refuse_grad_operands():
    from batchinv.fast.fused_moe import fused_moe

    q, k, v, table, lens = _decode_inputs(torch.tensor([20, 5], dtype=torch.int32), pages=2)
    with pytest.raises(ArgumentError, match=r"'k_cache'.*requires_grad"):
        fast_decode_module.decode_attention(q, k.float().bfloat16().requires_grad_(), v, table, lens, 0.25)
    e, h, i = 4, 16, 8
    w2 = torch.zeros(e, h, i, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ArgumentError, match=r"'w2'.*requires_grad"):
        fused_moe(
            torch.zeros(3, h, dtype=torch.bfloat16),
            torch.zeros(e, h, dtype=torch.bfloat16),
            torch.zeros(e, 2 * i, h, dtype=torch.bfloat16),
            w2,
            2,
        )


def test_enable_aten_override_still_trains_through_mm():
    # below autograd (the aten::mm override of enable(strict=False)) autograd records the op
    # itself: no refusal there, and the gradient is torch's formula through the pinned kernel
    import batchinv

    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, 8)
    with batchinv.enable(strict=False):
        y = torch.mm(x, w)
    y.sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, w.sum(1).expand(4, 16), atol=1e-5)


# --- decode_attention: grid from the lengths, CUDA's grid limits, the all -inf row ---------------


def _decode_inputs(lens: torch.Tensor, pages: int, page_size: int = 16, d: int = 16):
    g = torch.Generator().manual_seed(11)
    r = lens.shape[0]
    q = torch.randn(r, 1, 2, d, generator=g).bfloat16()
    k = torch.randn(4, page_size, 1, d, generator=g).bfloat16()
    v = torch.randn(4, page_size, 1, d, generator=g).bfloat16()
    table = torch.zeros(r, pages, dtype=torch.int32)
    table[:, :2] = torch.tensor([[0, 1], [2, 3]][:r], dtype=torch.int32)
    return q, k, v, table, lens


class _GridSpy:
    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_decode_grid_and_workspace_follow_the_lengths_not_the_table(monkeypatch):
    # a 4096-slot table with lengths (20, 5): before, 128 splits per token (the capacity); the
    # issue's 128k-slot table took 48 s on the cpu lane for 1 split of work
    lens = torch.tensor([20, 5], dtype=torch.int32)
    small = fast_decode_module.decode_attention(*_decode_inputs(lens, pages=2), 0.25)
    spy = _GridSpy(fast_decode_module.decode_attention_split_kernel)
    monkeypatch.setattr(fast_decode_module, "decode_attention_split_kernel", spy)
    big = fast_decode_module.decode_attention(*_decode_inputs(lens, pages=256), 0.25)
    split = fast_decode_module.decode_attention_config("interp", 16, torch.bfloat16).split_tokens
    assert spy.grids[-1][1] == -(-20 // split)
    for a, b in zip(big, small, strict=True):  # the same bits: splits are absolute positions
        assert torch.equal(a, b)


def test_decode_grid_past_cudas_dim1_limit_is_refused():
    split = fast_decode_module.decode_attention_config("interp", 16, torch.bfloat16).split_tokens
    length = 65_535 * split + 1  # CUDA: grid dims y and z hold at most 65,535 blocks
    page = 2**16
    pages = -(-length // page)
    k = torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16).expand(1, page, 1, 16)  # no memory
    q = torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16)
    table = torch.zeros(1, pages, dtype=torch.int32)
    with pytest.raises(ArgumentError, match=r"'seq_lens'.*65535 splits"):
        fast_decode_module.decode_attention(q, k, k, table, torch.tensor([length], dtype=torch.int32), 0.25)


def _minus_inf_keys(n_inf: int, n: int):
    # q = 1 and a key with a -inf coordinate: the key's score is -inf (a masked key)
    q = torch.ones(1, 1, 1, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 1, 16, generator=torch.Generator().manual_seed(2)).bfloat16()
    k[0, :n_inf, 0, 0] = -math.inf
    v = torch.randn(1, 64, 1, 16, generator=torch.Generator().manual_seed(3)).bfloat16()
    return q, k, v, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([n], dtype=torch.int32)


def test_every_attended_score_minus_inf_gives_zero_and_minus_inf_in_both_trees():
    args = _minus_inf_keys(40, 40)
    o, lse = fast_decode_module.decode_attention(*args, 0.25)
    ref_o, ref_lse = ref_decode(*args, 0.25)
    # before: fast lse NaN (o NaN), reference o NaN (lse -inf)
    assert (lse == -math.inf).all() and (ref_lse == -math.inf).all()
    assert (o == 0).all() and (ref_o == 0).all() and not torch.signbit(o.float()).any()


def test_minus_inf_scores_in_a_leading_chunk_are_masked_keys():
    # the first 16 keys (the split's first chunk) -inf, the rest finite: before, the chunk's
    # exp(-inf - -inf) = NaN poisoned the whole split; the reference gives their weight 0
    args = _minus_inf_keys(16, 40)
    o, lse = fast_decode_module.decode_attention(*args, 0.25)
    ref_o, ref_lse = ref_decode(*args, 0.25)
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    assert torch.allclose(o.double(), ref_o, atol=2e-2) and torch.allclose(lse.double(), ref_lse, atol=1e-3)


def test_sdpa_row_with_every_score_minus_inf_matches_the_reference():
    from batchinv.fast.sdpa_attention import sdpa_attention as fast_sdpa
    from batchinv.reference.sdpa_attention import sdpa_attention as ref_sdpa

    query = torch.ones(1, 1, 2, 16, dtype=torch.bfloat16)
    key = torch.randn(1, 1, 8, 16, generator=torch.Generator().manual_seed(4)).bfloat16()
    key[..., 0] = -math.inf
    value = torch.randn(1, 1, 8, 16, generator=torch.Generator().manual_seed(5)).bfloat16()
    out = fast_sdpa(query, key, value)
    assert torch.equal(out.double(), ref_sdpa(query, key, value))  # both +0
    assert (out == 0).all()
