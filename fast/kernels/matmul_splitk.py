"""Split-K matmul kernel (the unpinned baseline): each program sums one K slice of one tile.

Only ``@triton.jit`` code; the launcher is :mod:`batchinv.fast.baselines.matmul`.  The K axis is
cut into ``SPLIT_K`` slices whose fp32 partial sums are written to a workspace and added
afterwards, so the association of each output's sum depends on ``SPLIT_K``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import exact_fp32


@triton.jit
def splitk_partial_kernel(
    a_ptr,
    b_ptr,
    ws_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_ws_s,
    stride_ws_m,
    stride_ws_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``ws[s, M, N] = a[:, ks] @ b[ks, :]`` for the K slice ``ks`` of split ``s`` (fp32).

    Grid: (tiles of M x N, SPLIT_K).  ``k_per_split`` is a multiple of BLOCK_K.  The K-tile
    reduction is the fast kernel's (also under the interpreter), so the only difference from it
    is the split of K.
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + offs_k
        k64 = ks.to(tl.int64)
        a = tl.load(
            a_ptr + (rows[:, None] * stride_am + k64[None, :] * stride_ak),
            mask=ks[None, :] < k_end,
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k64[:, None] * stride_bk + cols[None, :] * stride_bn),
            mask=ks[:, None] < k_end,
            other=0.0,
        )
        if INTERPRETED:  # the same K-tile reduction as the fast kernel's interpreter path
            acc = acc + tl.sum(exact_fp32(a)[:, :, None] * exact_fp32(b)[None, :, :], axis=1)
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    ws_ptrs = ws_ptr + (
        split.to(tl.int64) * stride_ws_s
        + offs_m.to(tl.int64)[:, None] * stride_ws_m
        + offs_n.to(tl.int64)[None, :] * stride_ws_n
    )
    tl.store(ws_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
