"""Tests of the MoE grouped GEMM (``grouped_gemm``): the align (moe_align) layout, the config
table, sentinel rows never read nor written, the request model's rebuild of the align tensors,
per-token invariance in an expert's M, the per-slot input, and the block_m check.

Expected values come from hand-written layouts or the fp64 reference; the registry-driven
checks (agreement, co_batch, slot, placement, repeat, negative controls) live in
``tests/test_components.py``.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from batchinv.fast import grouped_gemm as fast_module
from batchinv.fast.grouped_gemm import BLOCK_M, TABLE, block_m, checked, grouped_gemm, launch, select_config
from batchinv.harness.components import grouped_gemm as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Case
from batchinv.reference.errors import ArgumentError
from batchinv.reference.grouped_gemm import grouped_gemm as reference

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")


def any_lane(fn):
    """A test of kernel behaviour: the cpu lane (interpreter) and every GPU lane."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def case_of(**axes) -> Case:
    base = dict(E=4, top_k=2, N=32, K=100, T=6, home=4, a_per_slot=False, values="normal")
    base.update(axes)
    return Case(component.NAME, base)


@pytest.mark.cpu
def test_align_is_moe_align_with_the_devices_block_m():
    # T = 3, k = 2: flat indices 0..5; experts of (t, j): [[1, 0], [1, 2], [0, 1]]
    topk = torch.tensor([[1, 0], [1, 2], [0, 1]])
    bm = block_m(DEVICE)
    ids, be, npad = component._align(topk, num_experts=4, block_m=bm)
    s = 6  # the sentinel T * k
    assert ids.dtype == be.dtype == npad.dtype == torch.int32
    want = [1, 4] + [s] * (bm - 2) + [0, 2, 5] + [s] * (bm - 3) + [3] + [s] * (bm - 1)
    assert ids.tolist() == want + [s] * (6 + 4 * (bm - 1) - 3 * bm)
    assert be.tolist() == [0, 1, 2] + [-1] * (be.numel() - 3)
    assert npad.tolist() == [3 * bm]
    # the one align implementation: the moe_align component's (reference and fast agree bitwise)
    from batchinv.fast.moe_align import moe_align as fast_align
    from batchinv.reference.moe_align import moe_align as ref_align

    for got, ref in zip(fast_align(topk.to(torch.int32).to(DEVICE), 4, bm), (ids, be, npad), strict=True):
        assert torch.equal(got.cpu(), ref)
    assert torch.equal(ref_align(topk.to(torch.int32), 4, bm)[0], ids)
    batch = component._assemble(
        torch.zeros(3, 8, dtype=torch.bfloat16),
        topk,
        {"w": torch.zeros(4, 8, 8, dtype=torch.bfloat16), "top_k": 2, "a_per_slot": False},
    )
    assert component._routing(batch).tolist() == topk.tolist()
    assert batch.shared["sorted_ids"].numel() == 6 + 4 * (bm - 1)


@pytest.mark.cpu
def test_table_never_keyed_on_tokens_or_expert_m():
    params = list(inspect.signature(select_config).parameters)
    assert params == ["arch_key", "dtype", "n", "k"]
    assert {"m", "t", "num_tokens"}.isdisjoint(params)
    for rule in TABLE:
        assert rule.config.block_m == BLOCK_M[rule.arch], rule
    assert block_m(torch.device("cpu")) == BLOCK_M["interp"]


@any_lane
def test_sentinel_rows_never_read_nor_written():
    batch = component.build(case_of(T=5, values="normal"), DEVICE)
    kw = batch.kwargs()
    # a NaN row right after a (the sentinel's row): the build already places one; check it
    a = kw["a"]
    tail = a.as_strided((1, a.shape[1]), a.stride(), a.storage_offset() + a.shape[0] * a.stride(0))
    assert bool(tail.isnan().all())
    args, cfg = checked(**kw)
    guard = torch.full((args.t * args.k + 3, args.n), 7.0, dtype=torch.bfloat16, device=DEVICE)
    out = guard[: args.t * args.k]
    launch(kw["a"], kw["w"], kw["sorted_ids"], kw["block_expert"], kw["num_padded"], args, False, cfg, out)
    assert bool((guard[args.t * args.k :] == 7.0).all()), "a sentinel row was written"
    assert not bool(out.isnan().any()), "a sentinel (NaN) row leaked into the output"
    ref = reference(**kw)
    assert torch.equal(out.view_as(ref), grouped_gemm(**kw))


@any_lane
def test_token_bits_do_not_depend_on_its_experts_m():
    # the target alone (each of its experts M = 1), then flooded by up to 40 other tokens on
    # its experts (M up to 41, crossing several BLOCK_M blocks)
    target = component.build(case_of(T=1, home=2, values="cancel", seed=3), DEVICE)
    flood = component.build(case_of(T=40, home=2, values="cancel", seed=9), DEVICE)
    model = component.COMPONENT.requests
    want = grouped_gemm(**target.kwargs())[0]
    for count in (1, 15, 16, 17, 40):
        mixed = model.concat(
            [
                model.take(flood, list(range(count // 2))),
                target,
                model.take(flood, list(range(count // 2, count))),
            ]
        )
        got = grouped_gemm(**mixed.kwargs())[count // 2]
        assert torch.equal(got, want), count


@any_lane
def test_per_slot_input_2d_and_3d_agree():
    batch = component.build(case_of(a_per_slot=True, T=4), DEVICE)
    kw = batch.kwargs()
    three = grouped_gemm(**kw)
    two = grouped_gemm(**{**kw, "a": kw["a"].reshape(-1, kw["a"].shape[-1])})
    assert torch.equal(three, two)
    ref = reference(**kw)
    assert ref.shape == three.shape == (4, 2, 32)


@pytest.mark.cpu
def test_take_and_concat_rebuild_the_align():
    batch = component.build(case_of(T=6, seed=4), DEVICE)
    model = component.COMPONENT.requests
    routing = component._routing(batch)
    part = model.take(batch, [4, 1, 1])
    assert component._routing(part).tolist() == routing[[4, 1, 1]].tolist()
    assert part.shared["sorted_ids"].numel() == 3 * 2 + 4 * (block_m(DEVICE) - 1)
    joined = model.concat([part, model.take(batch, [0])])
    assert component._routing(joined).tolist() == routing[[4, 1, 1, 0]].tolist()
    moved = model.relocate(batch, torch.Generator().manual_seed(0))
    assert torch.equal(grouped_gemm(**moved.kwargs()), grouped_gemm(**batch.kwargs()))


@pytest.mark.cpu
def test_block_m_must_be_the_devices():
    batch = component.build(case_of(T=3), DEVICE)
    routing = component._routing(batch)
    ids, be, npad = component._align(routing, 4, 2 * block_m(DEVICE))
    kw = {**batch.kwargs(), "sorted_ids": ids, "block_expert": be, "num_padded": npad}
    with pytest.raises(ArgumentError, match="BLOCK_M"):
        grouped_gemm(**kw)
    assert reference(**kw).shape == (3, 2, 32)  # the reference takes any block_m


@pytest.mark.cpu
def test_dropped_partial_k_tile_exceeds_the_bound():
    batch = component.build(case_of(T=4, K=100), DEVICE)
    kw = batch.kwargs()
    ref = reference(**kw)
    bound = component.tight(batch, (ref,))[0]
    truncated = {**kw, "a": kw["a"][:, :64], "w": kw["w"][..., :64]}
    err = (grouped_gemm(**truncated).double() - ref).abs()
    assert bool((err > bound).any())
    assert math.isfinite(float(bound.max()))


@pytest.mark.cpu
def test_launcher_module_has_no_autotune():
    assert "autotune" not in inspect.getsource(fast_module)
