"""Persistent matmul kernel: ``c = a @ b (+ bias)``, one fixed reduction order per (N, K) config.

Only ``@triton.jit`` code lives here; the launcher is :mod:`batchinv.fast.matmul`.

Reduction order: every output tile is computed by exactly one program, which walks the whole
K axis in increasing ``k`` with a single fp32 accumulator (no split-K, no atomics).  Which
program computes a tile (the persistent walk, the launched grid, the planned SM count) changes
nothing in a tile's arithmetic, so the bits are independent of M, of a row's position and of
the partition count.  The arithmetic depends only on the BLOCK sizes and the input precision,
which the launcher takes from a table keyed on (arch, dtype, N, K).

Index math is written inline rather than in ``@triton.jit`` helpers: under the interpreter
(the cpu lane) every helper call costs milliseconds.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp32_to_bf16_rne(x):
    """Round fp32 to bf16 to nearest-even with integer ops; NaN becomes the canonical 0x7fff.

    Used only under the interpreter, whose fp32 -> bf16 cast truncates; on a GPU the cast
    instruction rounds to nearest-even itself.
    """
    bits = x.to(tl.uint32, bitcast=True)
    lsb = (bits >> 16) & 1
    high = (bits + 0x7FFF + lsb) >> 16
    high = tl.where(x != x, 0x7FFF, high)
    return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def exact_fp32(x):
    """``x`` converted exactly to fp32; bf16 by moving its bits into the high half of a word.

    Used only under the interpreter, whose bf16 -> fp32 cast loops over mantissa bits in Python
    for zeros and subnormals (slow); the shift is the same exact conversion.
    """
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


# M is not specialized: a batch size divisible by 16 must not select a different compiled kernel.
@triton.jit(do_not_specialize=["M"])
def persistent_matmul_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_bias,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``c[M, N] = a[M, K] @ b[K, N] (+ bias[N])``, fp32 accumulation, one rounding at the store.

    The grid is the planned number of programs; program ``p`` computes tiles ``p``,
    ``p + grid``, ... in grouped order (GROUP_M row-tiles share B in L2; only the visiting
    order depends on it).  ``b`` is addressed through its strides, so ``F.linear``'s weight
    ``w[N, K]`` row-major is ``b = w.T`` (``stride_bk = 1``, ``stride_bn = K``); ``bias`` is
    addressed through ``stride_bias`` too (a strided view, or 0 for an expanded scalar).  Row
    and column offsets are formed in int64: a row index times a row stride passes 2**31 for
    large operands (Triton tutorial 03).

    ``INTERPRETED`` is set by the launcher only under the Triton interpreter (the cpu lane): the
    K tile is reduced as a product-and-sum instead of numpy's position-dependent matmul, and
    bf16 output is rounded with integer RNE (the interpreter's fp32 -> bf16 cast truncates).
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_group = GROUP_M * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    # The K step is advanced on the (64-bit) pointers, from an int64 stride product.
    a_step = tl.full((), BLOCK_K, tl.int64) * stride_ak
    b_step = tl.full((), BLOCK_K, tl.int64) * stride_bk

    for tile_id in range(pid, num_tiles, num_programs):
        first_pid_m = (tile_id // tiles_per_group) * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % tiles_per_group) % group_size_m
        pid_n = (tile_id % tiles_per_group) // group_size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Rows / columns past the edge read row / column 0 instead of masking every load; they
        # are never stored, and the rows of a tile do not mix in a dot.
        rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
        a_ptrs = a_ptr + (rows[:, None] * stride_am + offs_k[None, :].to(tl.int64) * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None].to(tl.int64) * stride_bk + cols[None, :] * stride_bn)

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_tiles):
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if INTERPRETED:
                # numpy's matmul (the interpreter's tl.dot) sums rows at different positions of
                # a block in different orders (BLAS micro-kernels) and multiplies raw bf16 bits
                # (triton-lang/triton#11584): reduce fp32 products along k instead, one fixed
                # order for every element.  Compiled, tl.dot forms every element of the tile
                # with the same MMA / FMA sequence whatever its row.
                prod = exact_fp32(a)[:, :, None] * exact_fp32(b)[None, :, :]
                acc = acc + tl.sum(prod, axis=1)
            else:
                acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            a_ptrs += a_step
            b_ptrs += b_step

        if HAS_BIAS:
            bias = tl.load(bias_ptr + cols * stride_bias).to(tl.float32)
            acc = acc + bias[None, :]
        c_ptrs = c_ptr + (offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn)
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if INTERPRETED and c_ptr.dtype.element_ty == tl.bfloat16:
            tl.store(c_ptrs, fp32_to_bf16_rne(acc), mask=c_mask)
        else:
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
