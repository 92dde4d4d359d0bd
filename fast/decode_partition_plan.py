"""Fast ``decode_partition_plan`` (seed 003): the pinned decode plan, vectorized torch ops on the
device of ``seq_lens``, CUDA-graph capturable (no host synchronisation while capturing, output
shapes a function of ``b`` and the configuration alone).

The contract is :mod:`batchinv.reference.decode_partition_plan`'s: partition ``p`` owns requests
``[floor(p b / P), floor((p + 1) b / P))`` (:func:`partition_spans`, the tile-scheduler metadata
the kernel reads), and each request's KV is cut at the multiples of its configured split size,
independently of the batch.  The planner builds the per-partition spans first, as the kernel's
metadata, and derives each request's partition from them by a search; the reference runs the
formula per partition in Python integers, so agreement compares two constructions.
"""

from __future__ import annotations

import torch

from batchinv.reference.decode_partition_plan import PLAN_DTYPE, check_plan_args
from batchinv.reference.errors import MAX_WIDTH, check_int


def _capturing(t: object) -> bool:
    return (
        isinstance(t, torch.Tensor) and t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    )


def partition_spans(num_requests: int, num_sm_parts: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The partitions' request spans, ``[P, 2]`` int32 ``(begin, end)``: partition ``p`` owns
    requests ``[floor(p b / P), floor((p + 1) b / P))`` (half-open; ``begin == end``: idle).

    Contiguous, disjoint and in order, covering ``[0, b)`` for any ``b >= 0`` and ``P >= 1``:
    below P each span is 0 or 1 requests wide, above P a span holds several whole requests.

    Raises:
        DTypeError: either count not a host integer (:func:`~batchinv.reference.errors.check_int`:
            a bool, a float, a tensor).
        ArgumentError: ``num_requests`` outside ``[0, MAX_SIZE]`` or ``num_sm_parts`` outside
            ``[1, MAX_WIDTH]`` (:mod:`batchinv.reference.errors`).
    """
    num_requests = check_int("num_requests", num_requests, 0)
    num_sm_parts = check_int("num_sm_parts", num_sm_parts, 1, MAX_WIDTH)
    starts = torch.arange(num_sm_parts + 1, device=device, dtype=torch.int64) * num_requests // num_sm_parts
    return torch.stack([starts[:-1], starts[1:]], dim=1).to(PLAN_DTYPE)


def decode_partition_plan(
    seq_lens: torch.Tensor, num_sm_parts: int, block_size: int, blocks_per_split: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pinned decode plan: ``(partition [b], num_splits [b], split_bounds [b, max_splits +
    1])``, int32, on the device of ``seq_lens`` (see
    :func:`batchinv.reference.decode_partition_plan.decode_partition_plan` for the contract).

    ``(num_splits, split_bounds)`` -- the request's partition-local work -- is bitwise invariant
    along b, the other requests, the request's slot and ``num_sm_parts``; ``partition`` is a
    function of (r, b, P).  Every value is computed in int64 and narrowed once (a boundary is at
    most the request's own int32 length).

    Raises:
        DTypeError, ArgumentError, DeviceError: as the reference; the length checks (negative,
        past the capacity) are skipped while a CUDA graph is being captured.
    """
    b, parts, split_tokens, _ = check_plan_args(
        seq_lens,
        num_sm_parts,
        block_size,
        blocks_per_split,
        max_splits,
        check_values=not _capturing(seq_lens),
    )
    device = seq_lens.device
    partition = request_partitions(partition_spans(b, parts, device), b)
    num_splits, bounds = request_splits(seq_lens.to(torch.int64), split_tokens, int(max_splits))
    return partition, num_splits, bounds


def request_partitions(spans: torch.Tensor, num_requests: int) -> torch.Tensor:
    """Each request's partition, ``[b]`` int32, from the spans ``[P, 2]`` of
    :func:`partition_spans` over ``b = num_requests`` requests: the owner of request r is the
    first partition whose span ends past r -- the number of spans ending at or before r, a
    search over the non-decreasing ends (no host synchronisation: b comes from the shape)."""
    ends = spans[:, 1].to(torch.int64).contiguous()
    requests = torch.arange(num_requests, device=spans.device, dtype=torch.int64)
    return torch.searchsorted(ends, requests, right=True).to(PLAN_DTYPE)


def request_splits(
    lengths: torch.Tensor, split_tokens: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's splits from its own length alone: ``(num_splits [b], split_bounds [b,
    max_splits + 1])`` int32 from ``lengths [b]`` int64 -- cuts at the multiples of
    ``split_tokens``, ``ceil(length / split_tokens)`` splits (0 for an empty request), -1 past
    the last bound."""
    num_splits = (lengths + (split_tokens - 1)) // split_tokens
    k = torch.arange(max_splits + 1, device=lengths.device, dtype=torch.int64)
    cuts = torch.minimum(k[None, :] * split_tokens, lengths[:, None])
    bounds = torch.where(k[None, :] <= num_splits[:, None], cuts, torch.full_like(cuts, -1))
    return num_splits.to(PLAN_DTYPE), bounds.to(PLAN_DTYPE)
