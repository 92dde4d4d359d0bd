"""Grouped GEMM kernel of a fused MoE layer: one program per (block of ``sorted_ids``, N tile).

Only ``@triton.jit`` code lives here; the launcher is :mod:`batchinv.fast.grouped_gemm`.

Structure (vLLM's ``fused_moe_kernel``): program (b, n) reads the ``BLOCK_M`` ids of block b of
``sorted_ids``, its expert ``block_expert[b]``, gathers the rows ``a[id // TOP_K]`` (``a[id]``
when ``A_PER_SLOT``), multiplies them by ``w[expert]`` and scatters the tile to ``c[id]``.
Sentinel ids (``>= num_valid``) are masked: never read, never written; blocks at or past
``num_padded`` and blocks whose expert is negative exit at once.

Reduction order: one fp32 accumulator per output walks ``k`` from ``k_lo`` to ``k_hi`` in
increasing ``BLOCK_K`` tiles.  The fast launcher always passes the whole K (no split-K) and a
``BLOCK_K`` from its (arch, dtype, N, K) table, so a row's arithmetic is fixed whatever the
expert's M or the other tokens.  ``SPLIT_OUT`` (baselines only) writes the fp32 partial of a
K slice to a workspace instead of the rounded result.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_gemm_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_padded_ptr,
    N,
    num_valid,
    k_per_split,
    K,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cs,
    stride_cm,
    stride_cn,
    TOP_K: tl.constexpr,
    A_PER_SLOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_OUT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``c[id] = a[row(id)] @ w[e].T`` for the ids of block ``program_id(0)``, columns of tile
    ``program_id(1)``, K slice ``program_id(2)`` (``[k_lo, k_hi)``; the whole K on the fast path).

    Pointers: ``a [rows, K]``, ``w [E, N, K]``, ``c [T * k, N]`` (or ``[S, T * k, N]`` fp32 with
    ``SPLIT_OUT``), ``sorted_ids [L]``, ``block_expert [B]``, ``num_padded [1]`` (int32).
    """
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    num_padded = tl.load(num_padded_ptr)
    if pid_b * BLOCK_M >= num_padded:
        return
    expert = tl.load(block_expert_ptr + pid_b)
    if expert < 0:
        return
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_ids_ptr + offs_m)
    row_ok = ids < num_valid
    if A_PER_SLOT:
        a_rows = tl.where(row_ok, ids, 0).to(tl.int64)
    else:
        a_rows = tl.where(row_ok, ids // TOP_K, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    a_ptrs = a_ptr + (a_rows[:, None] * stride_am + (k_lo + offs_k[None, :]).to(tl.int64) * stride_ak)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    b_ptrs = w_base + ((k_lo + offs_k[:, None]).to(tl.int64) * stride_wk + cols[None, :] * stride_wn)
    k_tiles = tl.cdiv(k_hi - k_lo, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, k_tiles):
        k_left = k_hi - k_lo - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if INTERPRETED:
            # numpy's matmul (the interpreter's tl.dot) sums rows in different orders and
            # multiplies raw bf16 bits: reduce exact fp32 products along k instead (as the
            # matmul kernel does), one fixed order for every element.
            # (bf16 -> fp32 exactly by moving the bits up: a jit helper call costs ms here)
            a32 = (a.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            b32 = (b.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            prod = a32[:, :, None] * b32[None, :, :]
            acc = acc + tl.sum(prod, axis=1)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_wk
    c_ptrs = (
        c_ptr
        + pid_s.to(tl.int64) * stride_cs
        + tl.where(row_ok, ids, 0).to(tl.int64)[:, None] * stride_cm
        + cols[None, :] * stride_cn
    )
    c_mask = row_ok[:, None] & (offs_n[None, :] < N)
    if SPLIT_OUT:
        tl.store(c_ptrs, acc, mask=c_mask)
    elif INTERPRETED:
        # the interpreter's fp32 -> bf16 cast truncates: round to nearest-even with integer ops
        # (fast.kernels.primitives.fp32_to_bf16_rne, inline); NaN becomes the canonical 0x7fff
        bits = acc.to(tl.uint32, bitcast=True)
        high = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        high = tl.where(acc != acc, 0x7FFF, high)
        tl.store(c_ptrs, high.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=c_mask)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
