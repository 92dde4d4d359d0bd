"""Registry entry ``decode_partition_plan`` (seed 003): the decode plan of a split-KV attention
kernel -- which partition (``num_sm_parts``) serves each request, and how each request's KV is
split and merged.

A request-level component whose unit is a request: ``rows = {"seq_lens": [b] int32}`` (tokens
of KV per request) and ``shared`` = the configuration (``num_sm_parts``, ``block_size``,
``blocks_per_split``, ``max_splits``).  Outputs, per request: ``partition [b]``, ``num_splits
[b]``, ``split_bounds [b, max_splits + 1]`` (int32; see :mod:`batchinv.reference.decode_partition_plan`).

What is compared:

* agreement (exact): all three outputs, so the partition spans are the formula's on every case;
* co_batch, slot, placement and partition compare the request's *partition-local work*,
  ``(num_splits, split_bounds)`` (``RequestModel.local``): its split of the KV and, through the
  split order, its merge order.  ``partition`` is left out there: where the launch puts a request
  moves with b and P by design; the contract is that the work it does there does not;
* repeat: all three outputs.

The negative control is the token-balanced planner (:mod:`batchinv.fast.baselines.decode_partition_plan`),
which cuts a long request where a partition's block budget runs out: co_batch sees it on the
first case (a long request alone is cut into ~P pieces, beside others elsewhere).  The covering
property (every request exactly once, contiguous, in order) is a hypothesis test over b in
1..2P+1 and P in {1, 2, 4, 132, 133} (tests/components/test_decode_partition_plan.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast import decode_partition_plan as fast_plan
from batchinv.fast.baselines import decode_partition_plan as baselines
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Baseline, Batch, Case, Component, ErrorCase, Exact, RequestModel
from batchinv.reference import decode_partition_plan as ref_plan
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "decode_partition_plan"

#: Length kinds of a case (drawn from the seed): ``edges``: 0, 1, block and split boundaries
#: +-1, the longest context; ``mixed``: uniform in [0, longest]; ``equal``: every request at one
#: length; ``one_huge``: one request at ``longest``, the others within one split; ``short``:
#: within one split; ``long``: in [longest / 2, longest].
LENGTH_KINDS: tuple[str, ...] = ("edges", "mixed", "equal", "one_huge", "short", "long")
#: The co_batch / slot neighbour mixes (other requests beside a target).
MIXES: tuple[str, ...] = ("long", "short", "equal", "one_huge")
#: Other requests per neighbour case (co_batch cycles through them up to its sizes).
NEIGHBOUR_REQUESTS = {False: 8, True: 64}


def _case(b: int, parts: int, lengths: str, *, block: int, per_split: int, splits: int, seed: int) -> Case:
    axes = {
        "b": b,
        "P": parts,
        "lengths": lengths,
        "block_size": block,
        "blocks_per_split": per_split,
        "max_splits": splits,
        "longest": block * per_split * splits,  # the plan's capacity: the longest context
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> list[Case]:
    """Plans are cheap integer work, so every lane runs the issue's partition counts: P in
    {1, 2, 4, 132, 133} (the H200's 132 partitions and one more), b from 1 to 2P + 1, and the
    length kinds of :data:`LENGTH_KINDS`.  ``max_splits`` is at least P wherever the
    token-balanced baseline may cut a request P ways (its pieces must fit the output)."""
    small = {"block": 16, "per_split": 4, "splits": 16}  # 64-token splits, 1024-token capacity
    wide = {"block": 16, "per_split": 2, "splits": 160}  # room for 133 pieces
    out = [
        _case(3, 4, "mixed", **small, seed=1),  # first: the negative control's detection
        _case(1, 1, "edges", **small, seed=2),
        _case(1, 4, "one_huge", **small, seed=3),
        _case(2, 2, "long", **small, seed=4),
        _case(9, 4, "edges", **small, seed=5),
        _case(7, 2, "mixed", **small, seed=6),
        _case(5, 4, "equal", **small, seed=7),
        _case(17, 4, "short", **small, seed=8),
        _case(8, 1, "mixed", **small, seed=9),
        _case(4, 4, "edges", block=1, per_split=1, splits=64, seed=10),  # 1-token blocks and splits
        _case(6, 3, "mixed", block=64, per_split=1, splits=16, seed=11),  # one block per split
        _case(2, 133, "mixed", **wide, seed=12),
        _case(132, 132, "edges", **wide, seed=13),
        _case(133, 132, "mixed", **wide, seed=14),
        _case(265, 132, "one_huge", **wide, seed=15),
        _case(267, 133, "edges", **wide, seed=16),
        _case(131, 133, "equal", **wide, seed=17),
    ]
    if lane.is_gpu:  # FlashMLA's 64-token blocks; room for the GPU partition axis (2 * SMs + 1)
        gpu = {"block": 64, "per_split": 2, "splits": 512}
        out += [
            _case(b, parts, kind, **gpu, seed=100 + i)
            for i, (b, parts, kind) in enumerate(
                (
                    (1, 132, "one_huge"),
                    (64, 132, "mixed"),
                    (265, 132, "edges"),
                    (1024, 148, "mixed"),
                    (4096, 133, "short"),
                )
            )
        ]
    return out


def _edge_lengths(axes: dict[str, Any]) -> list[int]:
    block, split, longest = (
        int(axes["block_size"]),
        int(axes["block_size"]) * int(axes["blocks_per_split"]),
        int(axes["longest"]),
    )
    values = {0, 1, 2, longest - 1, longest}
    for step in (block, split):
        for k in (1, 2, 3):
            values |= {k * step - 1, k * step, k * step + 1}
    return sorted(v for v in values if 0 <= v <= longest)


def lengths_of(kind: str, count: int, axes: dict[str, Any], gen: torch.Generator) -> list[int]:
    """``count`` request lengths of ``kind`` (:data:`LENGTH_KINDS`) for the case's configuration."""
    longest = int(axes["longest"])
    split = int(axes["block_size"]) * int(axes["blocks_per_split"])

    def draw(low: int, high: int, n: int) -> list[int]:
        return torch.randint(low, high + 1, (n,), generator=gen).tolist()

    if kind == "edges":
        edges = _edge_lengths(axes)
        offset = int(torch.randint(len(edges), (1,), generator=gen))
        return [edges[(offset + i) % len(edges)] for i in range(count)]
    if kind == "mixed":
        return draw(0, longest, count)
    if kind == "equal":
        return [int(torch.randint(1, longest + 1, (1,), generator=gen))] * count
    if kind == "one_huge":
        out = draw(0, min(split, longest), count)
        if count:
            out[int(torch.randint(count, (1,), generator=gen))] = longest
        return out
    if kind == "short":
        return draw(0, min(split, longest), count)
    if kind == "long":
        return draw(longest // 2, longest, count)
    raise ValueError(f"lengths: expected one of {LENGTH_KINDS}, got {kind!r}")


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``{"seq_lens": [b] int32}`` drawn from the seed; shared: the configuration."""
    a = dict(case.axes)
    gen = torch.Generator().manual_seed(case.seed)
    lengths = lengths_of(str(a["lengths"]), int(a["b"]), a, gen)
    shared = {
        "num_sm_parts": int(a["P"]),
        "block_size": int(a["block_size"]),
        "blocks_per_split": int(a["blocks_per_split"]),
        "max_splits": int(a["max_splits"]),
    }
    return Batch({"seq_lens": torch.tensor(lengths, dtype=torch.int32, device=device)}, shared)


# --- the request model ---------------------------------------------------------------------------


def take(batch: Batch, requests: Sequence[int]) -> Batch:
    """Those requests, in that order (a copy)."""
    return batch.take(list(requests))


def concat(parts: Sequence[Batch]) -> Batch:
    """The requests of every part in one launch (the parts share one configuration)."""
    return Batch.concat(parts)


#: What lies between and around a relocated batch's lengths: no plan may read it.
_GAP = -(2**31)


def relocate(batch: Batch, generator: torch.Generator) -> Batch:
    """The same lengths in other memory: a strided view (stride 1-3) at an offset (0-4) inside
    a buffer of ``INT32_MIN`` (a read outside the view shows as a negative length)."""
    lens = batch.rows["seq_lens"]
    stride = 1 + int(torch.randint(3, (1,), generator=generator))
    offset = int(torch.randint(5, (1,), generator=generator))
    n = lens.shape[0]
    buf = torch.full((offset + stride * n + 3,), _GAP, dtype=lens.dtype, device=lens.device)
    view = buf[offset : offset + stride * n : stride]
    view.copy_(lens)
    return Batch({"seq_lens": view}, batch.shared)


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """Other requests for co_batch and slot, one case per mix of :data:`MIXES`, with the case's
    configuration (so that ``concat`` joins them)."""
    out = {}
    for i, mix in enumerate(MIXES):
        axes = {**case.axes, "b": NEIGHBOUR_REQUESTS[lane.is_gpu], "lengths": mix}
        out[mix] = Case(NAME, axes, seed=case.seed + 7919 * (i + 1))
    return out


# --- error inputs ----------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    lens = torch.tensor([3, 0, 64, 1024], dtype=torch.int32, device=device)
    ok = {"seq_lens": lens, "num_sm_parts": 4, "block_size": 16, "blocks_per_split": 4, "max_splits": 16}

    def bad(**changes: Any) -> dict[str, Any]:
        return {**ok, **changes}

    def lengths(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return [
        ErrorCase("lens_int64", bad(seq_lens=lens.long()), DTypeError, r"'seq_lens'.*int32.*int64"),
        ErrorCase("lens_float", bad(seq_lens=lens.float()), DTypeError, r"'seq_lens'.*int32.*float32"),
        ErrorCase("lens_not_tensor", bad(seq_lens=[3, 4]), DTypeError, r"'seq_lens'.*torch\.Tensor"),
        ErrorCase("lens_2d", bad(seq_lens=lens[None]), ArgumentError, r"'seq_lens'.*1-D.*2-D"),
        ErrorCase("lens_negative", bad(seq_lens=lengths(3, -1)), ArgumentError, r"'seq_lens'.*>= 0.*-1"),
        ErrorCase(
            "lens_past_capacity",
            bad(seq_lens=lengths(3, 1025)),
            ArgumentError,
            r"'seq_lens'.*<= max_splits \* blocks_per_split \* block_size = 1024.*1025",
        ),
        ErrorCase("lens_on_meta", bad(seq_lens=lens.to("meta")), DeviceError, r"'seq_lens'.*meta"),
        ErrorCase("parts_zero", bad(num_sm_parts=0), ArgumentError, r"'num_sm_parts'.*>= 1.*0"),
        ErrorCase("parts_bool", bad(num_sm_parts=True), DTypeError, r"'num_sm_parts'.*int.*bool"),
        ErrorCase("parts_float", bad(num_sm_parts=4.0), DTypeError, r"'num_sm_parts'.*int.*float"),
        ErrorCase("block_size_zero", bad(block_size=0), ArgumentError, r"'block_size'.*>= 1.*0"),
        ErrorCase(
            "blocks_per_split_zero", bad(blocks_per_split=0), ArgumentError, r"'blocks_per_split'.*>= 1.*0"
        ),
        ErrorCase("max_splits_zero", bad(max_splits=0), ArgumentError, r"'max_splits'.*>= 1.*0"),
    ]


COMPONENT = Component(
    name=NAME,
    summary="decode partition plan: whole requests per partition, each request split by its own length",
    reference=ref_plan.decode_partition_plan,
    fast=fast_plan.decode_partition_plan,
    baselines=(
        Baseline(
            "token_balanced",
            baselines.token_balanced,
            "the throughput planner: one block budget per partition from the whole batch's blocks, "
            "a request cut where a budget runs out, so its splits move with the other requests, "
            "its slot and num_sm_parts",
            accepts_partition=True,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("integer planning: spans from floor divisions, split bounds from integer multiples"),
    dtypes=(torch.int32,),
    error_cases=error_cases,
    partition_arg="num_sm_parts",
    requests=RequestModel(
        take=take, concat=concat, relocate=relocate, neighbours=neighbours, local=ref_plan.request_work
    ),
)
