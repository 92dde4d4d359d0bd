"""Unpinned baseline of ``decode_partition_plan``: the token-balanced planner (negative control).

What a throughput planner does (FlashMLA's ``get_mla_metadata``, the shipped planner of seed
003): every partition gets the same budget of KV blocks, ``payload = ceil(total / P) + overhead``
with ``total = sum(blocks_r + overhead)`` over the batch, and the requests are walked in order,
each partition taking blocks until its budget runs out -- in the middle of a request if need be,
which splits that request across partitions.  A request's splits (where its KV is cut, how many
partials the combine merges) therefore depend on the other requests' lengths, on its position
and on ``P``: the co_batch, slot and partition checks must see it.
"""

from __future__ import annotations

import torch

from batchinv.reference.decode_partition_plan import PLAN_DTYPE, check_plan_args
from batchinv.reference.errors import ArgumentError

#: Blocks of budget a partition spends per request piece it starts (FlashMLA's
#: ``fixed_overhead_num_blocks``).
FIXED_OVERHEAD_BLOCKS = 5


def token_balanced_schedule(
    lengths: list[int], num_sm_parts: int, block_size: int
) -> tuple[list[tuple[int, int]], list[int], list[list[int]]]:
    """The token-balanced walk over ``lengths`` (tokens per request).

    Returns ``(spans, owner, cuts)``: per partition, the half-open span of requests it touches
    (a request split across partitions appears in two spans); per request, the partition of its
    first piece; per request, the block indices where a partition boundary cuts it.
    """
    b = len(lengths)
    n_blocks = [-(-n // block_size) for n in lengths]
    total = sum(n + FIXED_OVERHEAD_BLOCKS for n in n_blocks)
    payload = -(-total // num_sm_parts) + FIXED_OVERHEAD_BLOCKS
    spans: list[tuple[int, int]] = []
    owner = [-1] * b
    cuts: list[list[int]] = [[] for _ in range(b)]
    now, block = 0, 0
    for p in range(num_sm_parts):
        begin = now
        remain = payload
        while now < b:
            left = n_blocks[now] - block
            if remain >= left + FIXED_OVERHEAD_BLOCKS:  # the rest of the request fits
                remain -= left + FIXED_OVERHEAD_BLOCKS
                owner[now] = p if owner[now] < 0 else owner[now]
                now, block = now + 1, 0
                continue
            if remain > FIXED_OVERHEAD_BLOCKS:  # take what the budget allows: a cut
                block += remain - FIXED_OVERHEAD_BLOCKS
                cuts[now].append(block)
                owner[now] = p if owner[now] < 0 else owner[now]
            break
        end = now + 1 if block > 0 else now
        spans.append((begin, max(begin, end)))
    return spans, owner, cuts


def token_balanced(
    seq_lens: torch.Tensor, num_sm_parts: int, block_size: int, blocks_per_split: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token-balanced plan in the pinned plan's output format: ``partition`` is the
    partition of a request's first piece, its splits are the pieces the partition budgets cut
    (an empty request gets one empty piece, as in FlashMLA), ``blocks_per_split`` is ignored.

    Raises:
        as the reference, and ArgumentError (``max_splits``) when a request is cut into more
        pieces than ``max_splits`` (at most ``min(P, its blocks)``).
    """
    b, parts, _, _ = check_plan_args(seq_lens, num_sm_parts, block_size, blocks_per_split, max_splits)
    lengths = [int(n) for n in seq_lens.tolist()]
    _, owner, cuts = token_balanced_schedule(lengths, parts, block_size)
    counts, rows = [], []
    for r, length in enumerate(lengths):
        bounds = [0, *(c * block_size for c in cuts[r]), length]
        if len(bounds) - 1 > max_splits:
            raise ArgumentError(
                "max_splits",
                f">= the {len(bounds) - 1} pieces the token-balanced plan cuts request {r} into",
                max_splits,
            )
        counts.append(len(bounds) - 1)
        rows.append(bounds + [-1] * (max_splits + 1 - len(bounds)))
    device = seq_lens.device
    return (
        torch.tensor(owner, dtype=PLAN_DTYPE, device=device),
        torch.tensor(counts, dtype=PLAN_DTYPE, device=device),
        torch.tensor(rows, dtype=PLAN_DTYPE, device=device).reshape(b, max_splits + 1),
    )
