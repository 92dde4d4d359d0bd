"""Reference of ``moe_align`` (docs/MOE.md section 2): (token, slot) pairs grouped by expert.

Dimension legend:
    T: tokens, k: top_k (slots per token), N = T * k flat indices (``t * k + j``)
    E: experts, L = N + E * (block_m - 1) (the static length of ``sorted_ids``)

The reference is a stable sort on the integer key ``(expert id, flat index)`` (packed as
``expert * N + flat``, all keys distinct): obviously correct, no arithmetic to round.
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import MAX_SIZE, ArgumentError, check_int, check_tensor

#: The smallest block_m (a power of two) the contract accepts.
MIN_BLOCK_M = 16


def check_moe_align_args(
    topk_ids: Any, num_experts: Any, block_m: Any, *, check_values: bool = True
) -> tuple[int, int, int, int]:
    """Validate the arguments; returns ``(T, k, E, block_m)``.

    ``check_values`` reads the ids (a host synchronisation) to refuse ids outside ``[0, E)``;
    the fast path skips it while a CUDA graph is being captured (see ``fast/moe_align.py``).

    Raises:
        DTypeError: ``topk_ids`` not an int32 tensor; ``num_experts`` or ``block_m`` not a host
            integer (:func:`~batchinv.reference.errors.check_int`).
        ArgumentError: ``topk_ids`` not 2-D or with k = 0; ``num_experts`` < 1; ``block_m`` not a
            power of two >= 16, or so large that the output length ``T*k + E*(block_m-1)``
            passes :data:`~batchinv.reference.errors.MAX_SIZE`; top_k > num_experts; an id
            outside ``[0, num_experts)``.
    """
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32,), ndim=2)
    num_experts = check_int("num_experts", num_experts, 1)
    block_m = check_int("block_m", block_m, MIN_BLOCK_M)
    if block_m & (block_m - 1):
        raise ArgumentError("block_m", f"a power of two >= {MIN_BLOCK_M}", block_m)
    num_tokens, top_k = topk_ids.shape
    if top_k < 1:
        raise ArgumentError("topk_ids", "top_k = topk_ids.shape[1] >= 1", top_k)
    if top_k > num_experts:
        raise ArgumentError("topk_ids", f"top_k = topk_ids.shape[1] <= num_experts = {num_experts}", top_k)
    if check_values and topk_ids.numel():
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if low < 0 or high >= num_experts:
            bad = low if low < 0 else high
            raise ArgumentError("topk_ids", f"expert ids in [0, num_experts = {num_experts})", bad)
    length, _ = output_lengths(num_tokens, top_k, num_experts, block_m)
    if length > MAX_SIZE:
        # sorted_ids is indexed in int32 (and the kernels' padded counts are int32)
        raise ArgumentError(
            "block_m",
            f"T*k + E*(block_m - 1) <= {MAX_SIZE} (the int32 length of sorted_ids; T*k = "
            f"{num_tokens * top_k}, E = {num_experts})",
            block_m,
        )
    return num_tokens, top_k, num_experts, block_m


def output_lengths(num_tokens: int, top_k: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """Static lengths ``(len(sorted_ids), len(block_expert))``: T*k + E*(block_m-1) and its
    number of blocks (a function of the shapes alone, so a call can be graph-captured)."""
    length = num_tokens * top_k + num_experts * (block_m - 1)
    return length, -(-length // block_m)


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, slot) pairs grouped by expert, each group padded to a multiple of ``block_m``.

    Returns ``(sorted_ids [L] int32, block_expert [ceil(L / block_m)] int32, num_padded [1]
    int32)`` on the device of ``topk_ids``: ``sorted_ids`` holds the flat indices ``t * k + j``
    grouped by increasing expert id, increasing inside a group (stable), each group followed by
    the sentinel ``T * k`` up to a multiple of ``block_m``; positions from ``num_padded`` on hold
    the sentinel too.  ``block_expert[b]`` is the expert of block b, -1 from block
    ``num_padded / block_m`` on.

    Raises:
        DTypeError, ArgumentError: see :func:`check_moe_align_args`.
    """
    num_tokens, top_k, num_experts, block_m = check_moe_align_args(topk_ids, num_experts, block_m)
    n = num_tokens * top_k
    device = topk_ids.device
    length, num_blocks = output_lengths(num_tokens, top_k, num_experts, block_m)
    expert = topk_ids.reshape(-1).to(torch.int64).cpu()  # [N]
    flat = torch.arange(n, dtype=torch.int64)
    key = expert * max(n, 1) + flat  # (expert id, flat index), all distinct
    order = torch.sort(key, stable=True).indices  # [N] flat indices grouped by expert
    counts = torch.bincount(expert, minlength=num_experts)  # [E] M of each expert
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    group_start = torch.cumsum(padded, 0) - padded  # [E] first position of each group
    sorted_expert = expert[order]  # [N]
    rank = torch.arange(n) - (torch.cumsum(counts, 0) - counts)[sorted_expert]  # rank in group
    sorted_ids = torch.full((length,), n, dtype=torch.int64)
    sorted_ids[group_start[sorted_expert] + rank] = order
    num_padded = int(padded.sum())
    block_expert = torch.full((num_blocks,), -1, dtype=torch.int64)
    used = torch.repeat_interleave(torch.arange(num_experts), padded // block_m)
    block_expert[: used.numel()] = used
    return (
        sorted_ids.to(torch.int32).to(device),
        block_expert.to(torch.int32).to(device),
        torch.tensor([num_padded], dtype=torch.int32).to(device),
    )
