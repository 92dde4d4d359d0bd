"""Batch-invariant ``prefill_chunk_plan``: chunked prefill with one request per chunk.

Vectorized torch over the request axis: request ``r`` of ``L`` tokens gets ``ceil(L / B)``
chunks of ``B = token_budget`` tokens (the last one the remainder), each a chunk of its own
(``chunk_rows = length``, ``row_start = 0``).  Nothing about a request's plan reads another
request, so its geometry -- and the bits of any kernel that plans its splits from that
geometry -- is its solo plan in any co-batch.  No host synchronisation beyond the argument
check (which reads the lengths to refuse a prompt past ``max_chunks * token_budget``).

Source: the per-request prefill chunk plan of seed write-up 003 (sparse-MLA prefill under
batch invariance, "each request's (chunk_N, chunk_M) equals its solo plan").
"""

from __future__ import annotations

import torch

from batchinv.reference.prefill_chunk_plan import PAD, check_prefill_chunk_plan_arguments


def prefill_chunk_plan(
    prompt_lens: torch.Tensor, token_budget: int, max_chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's chunk geometry, one request per chunk.

    Parameters
    ----------
    prompt_lens : Tensor, (R,), int32 or int64, any stride: prompt tokens per request (0: none)
    token_budget : int >= 1: the most tokens a chunk holds
    max_chunks : int >= 1: the output width W (a request needing more chunks raises)

    Returns
    -------
    (num_chunks, chunks): ``num_chunks`` (R,) int64 = ``ceil(L / B)``; ``chunks`` (R, W, 4)
    int64, chunk ``k < num_chunks``: ``(k B, min(B, L - k B), min(B, L - k B), 0)`` as
    ``(offset, length, chunk_rows, row_start)``; -1 past ``num_chunks``.  On ``prompt_lens``'
    device.  Bitwise invariant along every batch axis (co-batch, slot, memory layout, calls).

    Raises
    ------
    DTypeError, ArgumentError
        As :func:`batchinv.reference.prefill_chunk_plan.check_prefill_chunk_plan_arguments`.
    """
    check_prefill_chunk_plan_arguments(prompt_lens, token_budget, max_chunks)
    token_budget, max_chunks = int(token_budget), int(max_chunks)
    lengths = prompt_lens.to(torch.int64)
    num_chunks = (lengths + (token_budget - 1)) // token_budget
    k = torch.arange(max_chunks, dtype=torch.int64, device=lengths.device)
    offset = (k * token_budget).expand(lengths.shape[0], max_chunks)
    length = torch.clamp(lengths[:, None] - offset, max=token_budget)
    geometry = torch.stack([offset, length, length, torch.zeros_like(length)], dim=-1)
    valid = (k[None, :] < num_chunks[:, None])[..., None]
    return num_chunks, torch.where(valid, geometry, torch.full_like(geometry, PAD))
