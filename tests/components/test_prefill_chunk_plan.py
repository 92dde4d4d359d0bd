"""Tests of ``prefill_chunk_plan``: hand-written plans, the seed's regression (a request's chunks
shifted by a co-scheduled prefill), the capacity error, and hypothesis properties over length
distributions (all short, all long, one huge, budget multiples +-1, ragged).

Expected plans are written out by hand or follow from the definition (a request's solo plan);
never from the code under test.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from batchinv.fast.baselines.prefill_chunk_plan import greedy_packing
from batchinv.fast.prefill_chunk_plan import prefill_chunk_plan as fast_plan
from batchinv.harness.components import prefill_chunk_plan as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plan_requests import strided_over_junk
from batchinv.reference.errors import ArgumentError
from batchinv.reference.prefill_chunk_plan import PAD
from batchinv.reference.prefill_chunk_plan import prefill_chunk_plan as reference_plan

CPU = torch.device("cpu")


def lens(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def pieces(chunks: torch.Tensor, count: torch.Tensor, r: int) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in chunks[r, k]) for k in range(int(count[r]))]


@pytest.mark.cpu
@pytest.mark.parametrize("plan", [fast_plan, reference_plan], ids=["fast", "reference"])
def test_a_request_is_cut_into_budget_chunks_and_a_remainder(plan):
    count, chunks = plan(lens(33, 0, 16, 1), token_budget=16, max_chunks=4)
    assert count.tolist() == [3, 0, 1, 1]
    assert pieces(chunks, count, 0) == [(0, 16, 16, 0), (16, 16, 16, 0), (32, 1, 1, 0)]
    assert pieces(chunks, count, 2) == [(0, 16, 16, 0)]
    assert pieces(chunks, count, 3) == [(0, 1, 1, 0)]
    assert (chunks[1] == PAD).all() and (chunks[0, 3] == PAD).all()
    assert count.dtype == chunks.dtype == torch.int64 and chunks.shape == (4, 4, 4)


@pytest.mark.cpu
def test_a_request_chunks_as_its_solo_plan_beside_another_prefill():
    """Seed 003's regression: a fixed 2-request composition gave the second request other chunk
    boundaries than alone.  Pinned: its chunks are its solo plan; greedy packing (the negative
    control, written out) starts it 5 rows into a shared chunk."""
    alone_count, alone = fast_plan(lens(10), token_budget=8, max_chunks=3)
    count, together = fast_plan(lens(5, 10), token_budget=8, max_chunks=3)
    assert pieces(together, count, 1) == pieces(alone, alone_count, 0) == [(0, 8, 8, 0), (8, 2, 2, 0)]
    assert torch.equal(together[1], alone[0])
    g_count, greedy = greedy_packing(lens(5, 10), token_budget=8, max_chunks=3)
    assert pieces(greedy, g_count, 0) == [(0, 5, 8, 0)]
    assert pieces(greedy, g_count, 1) == [(0, 3, 8, 5), (3, 7, 7, 0)]


@pytest.mark.cpu
def test_a_prompt_past_max_chunks_raises_instead_of_truncating():
    count, _ = fast_plan(lens(24), token_budget=8, max_chunks=3)  # exactly at capacity
    assert count.tolist() == [3]
    for plan in (fast_plan, reference_plan):
        with pytest.raises(
            ArgumentError, match=r"max_chunks = 3.*never truncates.*25 tokens at request 0.*4 chunks"
        ):
            plan(lens(25), token_budget=8, max_chunks=3)


@pytest.mark.cpu
def test_lengths_read_through_their_strides():
    base = lens(3, 17, 0, 40)
    want = reference_plan(base, token_budget=16, max_chunks=4)
    got = fast_plan(strided_over_junk(base), token_budget=16, max_chunks=4)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.cpu
def test_int32_lengths_give_the_int64_plan():
    a = fast_plan(lens(3, 17).int(), token_budget=16, max_chunks=2)
    b = reference_plan(lens(3, 17), token_budget=16, max_chunks=2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.cpu
def test_the_cases_cover_every_length_kind_and_the_neighbour_mixes_share_the_configuration():
    cases = component.cases(Lane.CPU)
    assert {c.axes["lengths"] for c in cases} == set(component.LENGTH_KINDS)
    assert any(c.axes["token_budget"] == 1 for c in cases)
    for case in cases:
        batch = component.build(case, CPU)
        assert int(batch.rows["prompt_lens"].max()) <= case.axes["longest"]
        for mix in component.neighbours(case, Lane.CPU).values():
            assert mix.axes["token_budget"] == case.axes["token_budget"]
            assert mix.axes["max_chunks"] == case.axes["max_chunks"]


# --- hypothesis -----------------------------------------------------------------------------

BATCHES = component.COMPONENT.strategy(Lane.CPU, CPU)


@pytest.mark.cpu
@given(BATCHES)
def test_fast_equals_the_reference_bitwise(batch):
    want = reference_plan(**batch.kwargs())
    got = fast_plan(**batch.kwargs())
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.cpu
@given(BATCHES, st.data())
def test_each_requests_geometry_is_its_solo_plan_in_any_co_batch(batch, data):
    """co_batch invariance, property form: any request's outputs inside the batch (and inside
    the batch reordered) equal its outputs alone."""
    kwargs = batch.kwargs()
    count, chunks = fast_plan(**kwargs)
    n = batch.num_rows
    order = data.draw(st.permutations(range(n)))
    p_count, p_chunks = fast_plan(**{**kwargs, "prompt_lens": batch.rows["prompt_lens"][list(order)]})
    for r in range(n):
        solo_count, solo = fast_plan(**{**kwargs, "prompt_lens": batch.rows["prompt_lens"][r : r + 1]})
        assert torch.equal(chunks[r], solo[0]) and int(count[r]) == int(solo_count[0])
        at = order.index(r)
        assert torch.equal(p_chunks[at], solo[0]) and int(p_count[at]) == int(solo_count[0])


@pytest.mark.cpu
@given(BATCHES)
@example(component.build(component.make_case(2, 8, "short", 8, seed=0), CPU))
def test_greedy_packing_is_a_packing_that_moves_requests_whose_chunk_is_shared(batch):
    """The negative control varies for the right reason: greedy packing is a real packing (no
    chunk past the budget, every request's tokens covered once, in order) and differs from the
    solo plan exactly when some chunk is shared by two requests."""
    kwargs = batch.kwargs()
    budget = kwargs["token_budget"]
    count, chunks = greedy_packing(**kwargs)
    pinned = fast_plan(**kwargs)
    shared = False
    for r, n in enumerate(batch.rows["prompt_lens"].tolist()):
        ps = pieces(chunks, count, r)
        assert sum(p[1] for p in ps) == n
        assert [p[0] for p in ps] == [sum(q[1] for q in ps[:i]) for i in range(len(ps))]
        assert all(p[3] + p[1] <= p[2] <= budget for p in ps)
        shared |= any(p[1] != p[2] for p in ps)
    same = all(torch.equal(a, b) for a, b in zip(pinned, (count, chunks), strict=True))
    assert same != shared
