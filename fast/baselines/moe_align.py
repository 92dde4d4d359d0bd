"""Unpinned ``moe_align``: the negative control of the ``moe_align`` component.

* ``atomic_scatter``: the same counts and prefix sum, but each (token, slot) pair claims the
  next free slot of its expert with ``tl.atomic_add`` on a per-expert cursor (the common
  production scatter).  The order inside an expert is the order in which the atomics arrive:
  on a GPU, the schedule of warps and programs, which changes from run to run; the repeat check
  sees it.  The interpreter runs programs one after another, so there it is deterministic
  (``expected_to_vary_on = GPU_LANES``).

No cpu-detectable baseline: the only invariance check that applies to this global component is
``repeat``, and every CPU path we could offer (``torch.sort(stable=False)`` on the expert id,
for one) is a deterministic function of its input on the CPU -- it may order ties differently
from the stable order (an agreement failure, not a variance) but gives the same bits on every
call, so it would never be detected by an invariance check there.
"""

from __future__ import annotations

import torch
import triton

from batchinv.fast.device import interpreter_quiet, kernel_operand
from batchinv.fast.kernels.moe_align import moe_align_atomic_scatter_kernel
from batchinv.fast.moe_align import check_fast_args, chunk_size, counts_and_scan
from batchinv.reference.moe_align import output_lengths


def atomic_scatter_moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``moe_align`` with an atomic-order scatter (same signature and outputs as the fast path;
    the set of indices in each expert's group is right, their order is arrival order)."""
    num_tokens, top_k, num_experts, block_m = check_fast_args(topk_ids, num_experts, block_m)
    ids = kernel_operand(topk_ids).contiguous()
    n = num_tokens * top_k
    length, num_blocks = output_lengths(num_tokens, top_k, num_experts, block_m)
    chunk = chunk_size(ids.device)
    counts, _, block_expert, num_padded = counts_and_scan(
        ids, n, num_experts, block_m, length, num_blocks, chunk
    )
    total = counts.sum(0, dtype=torch.int32)
    padded = (total + block_m - 1) // block_m * block_m
    start = (torch.cumsum(padded, 0, dtype=torch.int32) - padded).contiguous()
    cursor = torch.zeros_like(start)
    sorted_ids = torch.full((length,), n, dtype=torch.int32, device=ids.device)
    num_chunks = triton.cdiv(n, chunk)
    if num_chunks:
        with interpreter_quiet():
            moe_align_atomic_scatter_kernel[(num_chunks,)](
                ids, start, cursor, sorted_ids, n, num_experts, CHUNK=chunk
            )
    return sorted_ids, block_expert, num_padded
