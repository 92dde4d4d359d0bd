"""Batch-invariant ``moe_align`` (docs/MOE.md section 2): the launcher of ``kernels/moe_align.py``.

The (token, slot) pairs grouped by expert, padded to ``block_m`` per expert with the sentinel
``T * k``; inside an expert the flat indices ``t * k + j`` increase (never arrival or atomic
order).  Output lengths are static (from T, k, E and block_m only) and the launches never
synchronise with the host, so a call can be captured in a CUDA graph -- except the check that
every id lies in ``[0, E)``, which reads the ids and is therefore skipped while a graph is being
captured (the kernels then leave out-of-range ids out; they are never written).

The chunk of flat indices a program owns comes from :data:`MOE_ALIGN_CHUNK`, keyed on the arch
only (never on T).  The chunk size does not enter the result anyway: the position of a pair is
its rank in the stable order, whichever program computes it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.moe_align import (
    moe_align_count_kernel,
    moe_align_scan_kernel,
    moe_align_scatter_kernel,
)
from batchinv.reference.errors import ArgumentError
from batchinv.reference.moe_align import check_moe_align_args, output_lengths

#: Flat indices per program (a power of two: the scatter's in-register sort), keyed on arch only.
#: The interpreter's chunk is small so that the cpu cases span several chunks.
MOE_ALIGN_CHUNK: Final = MappingProxyType({"interp": 32, "sm90": 1024, "sm100": 1024})
DEFAULT_CHUNK: Final = 1024
#: The widest expert axis the kernels hold in registers (E padded to a power of two).
MAX_EXPERTS: Final = 1024
#: Blocks of ``block_expert`` written per step of the scan program.
BLOCK_B: Final = 64


def chunk_size(device: torch.device) -> int:
    """The chunk of flat indices per program on ``device`` (from the arch alone)."""
    return MOE_ALIGN_CHUNK.get(arch(device), DEFAULT_CHUNK)


def _capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_fast_args(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[int, int, int, int]:
    """The contract's checks (id values skipped under graph capture) plus the fast path's own."""
    dims = check_moe_align_args(topk_ids, num_experts, block_m, check_values=False)
    check_launch_device("topk_ids", topk_ids)
    if dims[2] > MAX_EXPERTS:
        raise ArgumentError("num_experts", f"at most {MAX_EXPERTS} on the fast path", dims[2])
    if not _capturing(topk_ids):
        check_moe_align_args(topk_ids, num_experts, block_m, check_values=True)
    return dims


def counts_and_scan(
    ids: torch.Tensor, n: int, num_experts: int, block_m: int, length: int, num_blocks: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the count and scan kernels: ``(counts [C, E_PAD], base [C, E_PAD], block_expert,
    num_padded)``."""
    device = ids.device
    e_pad = max(16, triton.next_power_of_2(num_experts))
    num_chunks = triton.cdiv(n, chunk)
    counts = torch.empty((num_chunks, e_pad), dtype=torch.int32, device=device)
    base = torch.empty((num_chunks, e_pad), dtype=torch.int32, device=device)
    block_expert = torch.empty((num_blocks,), dtype=torch.int32, device=device)
    num_padded = torch.empty((1,), dtype=torch.int32, device=device)
    with interpreter_quiet():
        if num_chunks:
            moe_align_count_kernel[(num_chunks,)](ids, counts, n, num_experts, E_PAD=e_pad, CHUNK=chunk)
        moe_align_scan_kernel[(1,)](
            counts,
            base,
            block_expert,
            num_padded,
            num_chunks,
            num_experts,
            num_blocks,
            E_PAD=e_pad,
            BLOCK_M=block_m,
            BLOCK_B=BLOCK_B,
        )
    return counts, base, block_expert, num_padded


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, slot) pairs grouped by expert (Triton: histogram, prefix sum, stable scatter).

    Parameters
    ----------
    topk_ids : Tensor [T, k] int32, any strides (copied contiguous when needed); ids in [0, E).
    num_experts : int, E >= k (at most :data:`MAX_EXPERTS` here).
    block_m : int, a power of two >= 16: each expert's group is padded to a multiple of it.

    Returns
    -------
    ``(sorted_ids [T*k + E*(block_m-1)] int32, block_expert [ceil(len(sorted_ids) / block_m)]
    int32, num_padded [1] int32)``, as :func:`batchinv.reference.moe_align.moe_align` (bitwise).

    Raises
    ------
    DTypeError, ArgumentError
        As the reference (ids out of range are refused except under CUDA graph capture);
        ``num_experts`` above :data:`MAX_EXPERTS`.
    DeviceError
        ``topk_ids`` not a CUDA tensor (CPU tensors are accepted under ``TRITON_INTERPRET=1``).
    """
    num_tokens, top_k, num_experts, block_m = check_fast_args(topk_ids, num_experts, block_m)
    ids = kernel_operand(topk_ids).contiguous()
    n = num_tokens * top_k
    length, num_blocks = output_lengths(num_tokens, top_k, num_experts, block_m)
    chunk = chunk_size(ids.device)
    _, base, block_expert, num_padded = counts_and_scan(
        ids, n, num_experts, block_m, length, num_blocks, chunk
    )
    sorted_ids = torch.full((length,), n, dtype=torch.int32, device=ids.device)
    num_chunks = triton.cdiv(n, chunk)
    if num_chunks:
        with interpreter_quiet():
            moe_align_scatter_kernel[(num_chunks,)](
                ids, base, sorted_ids, n, num_experts, E_PAD=base.shape[1], CHUNK=chunk
            )
    return sorted_ids, block_expert, num_padded
