"""Tests of the MoE grouped GEMM (``grouped_gemm``): the align (moe_align) layout, the config
table, sentinel rows never read nor written, the request model's rebuild of the align tensors,
per-token invariance in an expert's M, the per-slot input, and the block_m check.

Expected values come from hand-written layouts or the fp64 reference; the registry-driven
checks (agreement, co_batch, slot, placement, repeat, negative controls) live in
``tests/components/test_components.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch

from batchinv.fast import grouped_gemm as fast_module
from batchinv.fast.grouped_gemm import (
    BLOCK_K_RULES,
    DEFAULT_BLOCK_M,
    SCHEDULE,
    TILES,
    block_m,
    checked,
    grouped_gemm,
    launch,
    select_config,
)
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
def test_block_k_never_keyed_on_tokens_expert_m_or_block_m():
    # select_config's BLOCK_K comes from (arch, dtype, N, K): the rules have no other field, and
    # every block_m the tile table holds gets the same BLOCK_K for a shape
    params = list(inspect.signature(select_config).parameters)
    assert params == ["arch_key", "dtype", "block_m", "n", "k"]
    assert {"m", "t", "num_tokens"}.isdisjoint(params)
    assert {f.name for f in dataclasses.fields(BLOCK_K_RULES[0])} == {
        "arch",
        "max_n",
        "max_k",
        "block_k",
        "why",
    }
    for arch_key, tiles in TILES.items():
        for n, k in ((1536, 2048), (2048, 768), (4096, 7168), (28672, 4096), (4096, 14336), (64, 100)):
            block_ks = {select_config(arch_key, torch.bfloat16, bm, n, k).block_k for bm in tiles}
            assert len(block_ks) == 1, (arch_key, n, k, block_ks)
    assert block_m(torch.device("cpu")) == DEFAULT_BLOCK_M["interp"]


@pytest.mark.cpu
def test_schedule_gives_block_ms_the_tile_table_holds():
    for arch_key, schedule in SCHEDULE.items():
        assert {bm for _, bm in schedule} <= set(TILES[arch_key]), arch_key
        assert DEFAULT_BLOCK_M[arch_key] in TILES[arch_key]
        limits = [limit for limit, _ in schedule]
        assert limits == sorted(limits) and limits[-1] == math.inf, arch_key
    cpu = torch.device("cpu")
    assert block_m(cpu, num_rows=0, num_experts=4) == 16
    assert block_m(cpu, num_rows=10**6, num_experts=4) == 16
    with pytest.raises(ArgumentError, match="'num_experts'"):
        block_m(cpu, num_rows=8)
    with pytest.raises(ArgumentError, match="'num_rows'"):
        block_m(cpu, num_rows=-1, num_experts=4)


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
def test_block_m_must_be_one_the_tile_table_holds():
    batch = component.build(case_of(T=3), DEVICE)
    routing = component._routing(batch)
    want = grouped_gemm(**batch.kwargs())
    for bm in sorted(TILES["interp"]):  # every block_m of the table: accepted, the same bits
        ids, be, npad = component._align(routing, 4, bm)
        kw = {**batch.kwargs(), "sorted_ids": ids, "block_expert": be, "num_padded": npad}
        assert torch.equal(grouped_gemm(**kw), want), bm
    ids, be, npad = component._align(routing, 4, 2 * max(TILES["interp"]))
    kw = {**batch.kwargs(), "sorted_ids": ids, "block_expert": be, "num_padded": npad}
    with pytest.raises(ArgumentError, match="block_m one of"):
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
