"""Registry entry ``prefill_chunk_plan`` (seed write-up 003): how a prefill is chunked.

A request-level plan: the unit is a request, its input its prompt length (``rows``:
``prompt_lens [R]`` int64), its output its chunk geometry (``num_chunks [R]``, ``chunks [R, W,
4]``: offset, length, chunk rows, row start per chunk; W = ``max_chunks``, a shared operand, so
a request's outputs have one shape alone and in any co-batch).  ``shared``: ``token_budget``
and ``max_chunks``.

Checks: exact agreement with the plain-Python reference; co_batch (each request's geometry is
its solo plan beside 1 to 255 other requests of four length mixes: short, long, budget edges,
one huge), slot, placement (the lengths read through a strided view into junk) and repeat.
The baseline ``greedy_packing`` (the production default) packs several requests per chunk: a
request's chunk boundaries and chunk rows shift with its neighbours, which co_batch sees on
every lane.

Length kinds of a case (drawn from its seed): ``short`` (1 to B - 1), ``long`` (B to the
longest), ``one_huge`` (short, one at the longest), ``budget_edges`` (0, 1 and multiples of B
+-1 up to the longest), ``equal`` (all one length), ``mixed`` (0 to the longest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast.baselines.prefill_chunk_plan import GREEDY_SLACK, greedy_packing
from batchinv.fast.prefill_chunk_plan import prefill_chunk_plan as fast_plan
from batchinv.harness.lanes import Lane
from batchinv.harness.plan_requests import plan_model
from batchinv.harness.registry import CO_BATCH_SIZES, Baseline, Batch, Case, Component, ErrorCase, Exact
from batchinv.reference.errors import ArgumentError, DTypeError
from batchinv.reference.prefill_chunk_plan import prefill_chunk_plan as reference_plan

NAME = "prefill_chunk_plan"
LENGTH_KINDS: tuple[str, ...] = ("short", "long", "one_huge", "budget_edges", "equal", "mixed")
#: The co_batch check's neighbour mixes (:func:`neighbours`), 5 requests each.
NEIGHBOUR_MIXES: tuple[str, ...] = ("short", "long", "budget_edges", "one_huge")


def max_chunks_for(longest: int, token_budget: int) -> int:
    """The width of a case's geometry: the longest prompt's solo chunks plus the one more piece
    greedy packing may cut it into (so the baseline reports its plan instead of raising)."""
    return -(-longest // token_budget) + GREEDY_SLACK


def budget_edges(token_budget: int, longest: int) -> list[int]:
    """0, 1, and k B - 1, k B, k B + 1 for the first four and the last multiple, up to ``longest``."""
    count = longest // token_budget
    ks = sorted({*range(1, min(count, 4) + 1), count} - {0})
    values = {0, 1, longest}
    for k in ks:
        values |= {k * token_budget - 1, k * token_budget, k * token_budget + 1}
    return sorted(v for v in values if 0 <= v <= longest)


def draw_lengths(kind: str, count: int, token_budget: int, longest: int, gen: torch.Generator) -> list[int]:
    """``count`` prompt lengths of ``kind`` (:data:`LENGTH_KINDS`), at most ``longest``."""

    def uniform(low: int, high: int) -> int:
        return int(torch.randint(low, max(low, high) + 1, (1,), generator=gen))

    short_high = max(1, min(longest, token_budget - 1))
    if kind == "short":
        return [uniform(1, short_high) for _ in range(count)]
    if kind == "long":
        return [uniform(min(token_budget, longest), longest) for _ in range(count)]
    if kind == "one_huge":
        out = [uniform(1, short_high) for _ in range(count)]
        out[uniform(0, count - 1)] = longest
        return out
    if kind == "budget_edges":
        edges = budget_edges(token_budget, longest)
        start = uniform(0, len(edges) - 1)
        return [edges[(start + i) % len(edges)] for i in range(count)]
    if kind == "equal":
        return [uniform(1, longest)] * count
    if kind == "mixed":
        return [uniform(0, longest) for _ in range(count)]
    raise ValueError(f"lengths: expected one of {LENGTH_KINDS}, got {kind!r}")


def make_case(r: int, token_budget: int, lengths: str, longest: int, seed: int = 0) -> Case:
    axes = {
        "R": r,
        "token_budget": token_budget,
        "lengths": lengths,
        "longest": longest,
        "max_chunks": max_chunks_for(longest, token_budget),
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> Sequence[Case]:
    """Budgets 1 to 8192, lengths of every kind (0-token prompts, budget multiples +-1, a
    request of 16 chunks), production budgets and prompt lengths (cheap: no kernel)."""
    c = make_case
    return [
        c(1, 16, "budget_edges", 64, seed=1),
        c(9, 16, "budget_edges", 97, seed=2),
        c(7, 16, "short", 64, seed=3),
        c(5, 16, "long", 100, seed=4),
        c(6, 8, "one_huge", 200, seed=5),
        c(4, 1, "mixed", 9, seed=6),
        c(8, 32, "equal", 96, seed=7),
        c(3, 64, "mixed", 64, seed=8),
        c(16, 2048, "budget_edges", 32768, seed=9),
        c(8, 8192, "one_huge", 131072, seed=10),
        c(33, 512, "mixed", 4096, seed=11),
    ]


def build(case: Case, device: torch.device) -> Batch:
    """``rows``: ``prompt_lens [R]`` int64 drawn from the case's seed; ``shared``: the budget
    and ``max_chunks``."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    budget, longest = int(a["token_budget"]), int(a["longest"])
    lengths = draw_lengths(str(a["lengths"]), int(a["R"]), budget, longest, gen)
    prompt_lens = torch.tensor(lengths, dtype=torch.int64, device=device)
    return Batch({"prompt_lens": prompt_lens}, {"token_budget": budget, "max_chunks": int(a["max_chunks"])})


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """The other requests of co_batch and slot: five requests of each :data:`NEIGHBOUR_MIXES`
    mix, with the case's budget, longest prompt and width."""
    a = case.axes
    budget, longest = int(a["token_budget"]), int(a["longest"])
    return {
        mix: make_case(5, budget, mix, longest, seed=case.seed * 31 + 101 + i)
        for i, mix in enumerate(NEIGHBOUR_MIXES)
    }


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    lens = torch.tensor([3, 0, 17], dtype=torch.int64, device=device)
    ok = {"prompt_lens": lens, "token_budget": 8, "max_chunks": 3}
    return [
        ErrorCase(
            "lens_float", {**ok, "prompt_lens": lens.float()}, DTypeError, r"'prompt_lens'.*int.*float32"
        ),
        ErrorCase(
            "lens_not_tensor", {**ok, "prompt_lens": [3, 0]}, DTypeError, r"'prompt_lens'.*torch\.Tensor"
        ),
        ErrorCase("lens_2d", {**ok, "prompt_lens": lens[None]}, ArgumentError, r"'prompt_lens'.*1-D.*2-D"),
        ErrorCase(
            "lens_negative",
            {**ok, "prompt_lens": torch.tensor([3, -1], device=device)},
            ArgumentError,
            r"'prompt_lens'.*>= 0.*-1 at request 1",
        ),
        ErrorCase("budget_zero", {**ok, "token_budget": 0}, ArgumentError, r"'token_budget'.*>= 1.*0"),
        ErrorCase("budget_bool", {**ok, "token_budget": True}, DTypeError, r"'token_budget'.*int.*bool"),
        ErrorCase("max_chunks_zero", {**ok, "max_chunks": 0}, ArgumentError, r"'max_chunks'.*>= 1.*0"),
        ErrorCase(
            "prompt_past_max_chunks",
            {**ok, "max_chunks": 2},
            ArgumentError,
            r"'prompt_lens'.*max_chunks = 2.*never truncates.*17 tokens at request 2.*3 chunks",
        ),
    ]


def strategy(lane: Lane, device: torch.device) -> Any:
    """A hypothesis strategy of :class:`Batch`: budgets 1 to 4096 (powers of two and odd),
    lengths all short, all long, one huge, budget multiples +-1, or mixed (ragged)."""
    from hypothesis import strategies as st

    from batchinv.harness.requests import ragged_seq_lens

    @st.composite
    def batches(draw: Any) -> Batch:
        budget = draw(st.sampled_from((1, 2, 3, 7, 16, 64, 100, 512, 4096)))
        longest = draw(st.integers(1, 6 * budget + 1))
        count = draw(st.integers(1, 12))
        short = st.integers(1, max(1, min(longest, budget - 1)))
        long_ = st.integers(min(budget, longest), longest)
        edges = st.sampled_from(budget_edges(budget, longest))
        lengths = draw(
            st.one_of(
                st.lists(short, min_size=count, max_size=count),
                st.lists(long_, min_size=count, max_size=count),
                st.lists(short, min_size=count, max_size=count).map(lambda ls: [*ls[:-1], longest]),
                st.lists(edges, min_size=count, max_size=count),
                ragged_seq_lens(12, longest, budget, budget, min_len=0),
            )
        )
        prompt_lens = torch.tensor(lengths, dtype=torch.int64, device=device)
        return Batch(
            {"prompt_lens": prompt_lens},
            {"token_budget": budget, "max_chunks": max_chunks_for(max(lengths), budget)},
        )

    return batches()


COMPONENT = Component(
    name=NAME,
    summary="prefill chunk plan: one request per chunk, each request's chunk geometry its solo plan",
    reference=reference_plan,
    fast=fast_plan,
    baselines=(
        Baseline(
            name="greedy_packing",
            fn=greedy_packing,
            why=(
                "chunks filled greedily across requests up to the token budget (the production "
                "default): a request's chunk boundaries and chunk rows depend on the requests "
                "before it, on every lane"
            ),
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("integer plan: ceil-division and offsets, no arithmetic to round"),
    dtypes=(torch.int64,),
    error_cases=error_cases,
    strategy=strategy,
    requests=plan_model(neighbours=neighbours, co_batch_sizes=lambda lane: CO_BATCH_SIZES),
)
