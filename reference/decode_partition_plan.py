"""Reference of ``decode_partition_plan`` (seed 003): the decode plan of a split-KV attention
kernel -- which partition serves each request, and how each request's KV is split and merged.

Dimension legend:
    b: requests in the launch (``seq_lens [b]``, tokens of KV per request, int32)
    P: partitions (``num_sm_parts``): the persistent kernel's workers, each owning a contiguous
       span of requests
    S: ``max_splits``, the configured cap on one request's splits (``split_bounds [b, S + 1]``)
    block_size: tokens per KV block; blocks_per_split: blocks per split (configured);
    split_tokens = block_size * blocks_per_split

The plan (the contract the fast planner must reproduce bit for bit):

* partition ``p`` owns requests ``[floor(p b / P), floor((p + 1) b / P))``: every request exactly
  once, contiguous, in order, never split across partitions (a partition with no request is
  idle when b < P; above P a partition holds several whole requests);
* request ``r``'s KV ``[0, seq_lens[r])`` is cut at the multiples of ``split_tokens`` --
  ``num_splits[r] = ceil(seq_lens[r] / split_tokens)`` splits, 0 for an empty request (no partial
  is written, so no empty partial is ever merged) -- and the combine merges its partials left
  to right in split order.  A request's splits, and so its merge order, are a function of its
  own length and the configuration alone: never of ``b``, ``P`` or the other requests.

Outputs (dim 0 = request): ``partition [b]`` int32, ``num_splits [b]`` int32 and
``split_bounds [b, S + 1]`` int32 (entries ``0..num_splits`` are the split boundaries in tokens,
``0 = bound_0 < bound_1 < ... = seq_lens[r]``, the rest -1).  ``partition`` says where the
launch put the request and moves with ``b`` and ``P`` by design; ``(num_splits, split_bounds)``
is the request's partition-local work, which must not (:func:`request_work`).

The reference is the formula in plain Python integers, one loop per partition and per request.
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import MAX_SIZE, MAX_WIDTH, ArgumentError, check_int, check_tensor

PLAN_DTYPE = torch.int32


def check_plan_args(
    seq_lens: Any,
    num_sm_parts: Any,
    block_size: Any,
    blocks_per_split: Any,
    max_splits: Any,
    *,
    check_values: bool = True,
) -> tuple[int, int, int, int]:
    """Validate a plan's arguments; returns ``(b, P, split_tokens, capacity)`` where ``capacity =
    max_splits * split_tokens`` is the longest request the plan can hold.

    ``check_values`` reads the lengths (a host synchronisation) to refuse a negative length or
    one past the capacity; the fast planner skips it while a CUDA graph is being captured.

    Raises:
        DTypeError: ``seq_lens`` not an int32 tensor; a configuration value not a host integer
            (:func:`~batchinv.reference.errors.check_int`: a bool, a float, a tensor).
        ArgumentError: ``seq_lens`` not 1-D; ``num_sm_parts``, ``block_size``,
            ``blocks_per_split`` or ``max_splits`` below 1; ``num_sm_parts`` or ``max_splits``
            above :data:`~batchinv.reference.errors.MAX_WIDTH`, ``block_size`` or the split
            ``block_size * blocks_per_split`` above
            :data:`~batchinv.reference.errors.MAX_SIZE` (int64 arithmetic and allocations
            sized by them must hold); a length below 0 or above the capacity (a plan never
            truncates a request silently).
        DeviceError: ``seq_lens`` on the meta device.
    """
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), ndim=1)
    parts = check_int("num_sm_parts", num_sm_parts, 1, MAX_WIDTH)
    block = check_int("block_size", block_size, 1)
    per_split = check_int("blocks_per_split", blocks_per_split, 1)
    splits = check_int("max_splits", max_splits, 1, MAX_WIDTH)
    split_tokens = block * per_split
    if split_tokens > MAX_SIZE:
        # a split longer than any int32 length; the int64 products split_tokens * k stay sane
        raise ArgumentError(
            "blocks_per_split",
            f"block_size * blocks_per_split <= {MAX_SIZE} (a split is an int32 length)",
            f"{per_split} (block_size {block}: {split_tokens} tokens)",
        )
    capacity = splits * split_tokens
    if check_values and seq_lens.numel():
        low, high = int(seq_lens.min()), int(seq_lens.max())
        if low < 0:
            raise ArgumentError("seq_lens", "lengths >= 0", low)
        if high > capacity:
            raise ArgumentError(
                "seq_lens",
                f"lengths <= max_splits * blocks_per_split * block_size = {capacity} (the plan's capacity)",
                high,
            )
    return int(seq_lens.shape[0]), parts, split_tokens, capacity


def decode_partition_plan(
    seq_lens: torch.Tensor, num_sm_parts: int, block_size: int, blocks_per_split: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode plan of ``b`` requests over ``num_sm_parts`` partitions (module docstring).

    Args:
        seq_lens: ``[b]`` int32, tokens of KV per request (0 allowed: an empty request).
        num_sm_parts: P >= 1, the partitions of the persistent kernel.
        block_size: tokens per KV block (>= 1).
        blocks_per_split: KV blocks per split (>= 1); a split holds ``block_size *
            blocks_per_split`` tokens, the last one of a request fewer.
        max_splits: the configured cap on a request's splits (>= 1); the width of
            ``split_bounds`` is ``max_splits + 1``.

    Returns:
        ``(partition [b], num_splits [b], split_bounds [b, max_splits + 1])``, int32, on the
        device of ``seq_lens``.  Bitwise invariant in ``(num_splits, split_bounds)`` along the
        batch (b, the other requests, the slot) and along ``num_sm_parts``; ``partition`` is a
        function of (r, b, P) only.

    Raises:
        DTypeError, ArgumentError, DeviceError: see :func:`check_plan_args`.

    Source: seed 003 (the pinned sparse-MLA decode plan: whole requests per partition, each
    request split by its own length only).
    """
    b, parts, _, _ = check_plan_args(seq_lens, num_sm_parts, block_size, blocks_per_split, max_splits)
    block_size, blocks_per_split, max_splits = int(block_size), int(blocks_per_split), int(max_splits)
    lengths = [int(n) for n in seq_lens.tolist()]
    owner = [-1] * b
    for p in range(parts):
        for r in range(p * b // parts, (p + 1) * b // parts):
            owner[r] = p
    counts: list[int] = []
    rows: list[list[int]] = []
    for length in lengths:
        n_blocks = -(-length // block_size)
        starts = [first * block_size for first in range(0, n_blocks, blocks_per_split)]
        cuts = [*starts, length] if length else [0]
        counts.append(len(cuts) - 1)
        rows.append(cuts + [-1] * (max_splits + 1 - len(cuts)))
    device = seq_lens.device
    partition = torch.tensor(owner, dtype=PLAN_DTYPE, device=device)
    num_splits = torch.tensor(counts, dtype=PLAN_DTYPE, device=device)
    bounds = torch.tensor(rows, dtype=PLAN_DTYPE, device=device).reshape(b, max_splits + 1)
    return partition, num_splits, bounds


def request_work(outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A request's partition-local work in a plan's outputs: ``(num_splits, split_bounds)`` --
    its split of the KV and, through the order of the splits, its merge order.  The request
    checks compare this; ``partition`` (where the launch put the request) moves with b and P."""
    return tuple(outputs[1:])


def covering_violations(spans: list[tuple[int, int]], num_requests: int) -> list[str]:
    """What is wrong with partition spans ``[(begin, end), ...]`` (half-open request ranges, one
    per partition, in partition order) as a cover of ``num_requests`` requests; empty when every
    request is owned exactly once, the spans are contiguous and in order.

    Partition ``p``'s span must start where the previous non-idle span ended (the first at 0),
    and the last must end at ``num_requests``; an idle partition (``begin == end``) is allowed
    anywhere.  A request listed by two partitions (split across them) is reported by name."""
    problems: list[str] = []
    seen: dict[int, int] = {}
    cursor = 0
    for p, (begin, end) in enumerate(spans):
        if end < begin:
            problems.append(f"partition {p}: span [{begin}, {end}) runs backwards")
            continue
        if begin == end:
            continue
        if begin != cursor:
            problems.append(
                f"partition {p}: starts at request {begin}, expected {cursor} (contiguous, in order)"
            )
        for r in range(begin, end):
            if r in seen:
                problems.append(f"request {r}: in partitions {seen[r]} and {p} (split across partitions)")
            else:
                seen[r] = p
        cursor = max(cursor, end)
    missing = [r for r in range(num_requests) if r not in seen]
    if missing:
        problems.append(f"requests {missing[:8]} owned by no partition")
    extra = sorted(r for r in seen if not 0 <= r < num_requests)
    if extra:
        problems.append(f"requests {extra[:8]} outside [0, {num_requests})")
    return problems
