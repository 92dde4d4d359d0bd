"""Matmul kernels: ``c = a @ b (+ bias)`` as one fixed reduction tree, walked or split.

Only ``@triton.jit`` code lives here; the launcher is :mod:`batchinv.fast.matmul`.

The reduction tree (:class:`batchinv.fast.matmul_config.ReductionTree`, keyed on arch, dtype,
N, K only): K is cut into chunks of ``chunk_tiles`` K tiles; each chunk is summed from a zero
accumulator in increasing k; the chunk sums are added, in increasing chunk order, to a total
that starts at zero; the bias is added; one rounding.  Two executions compute it:

* :func:`chunked_matmul_kernel` (persistent): one program walks every chunk of a tile.
* :func:`chunked_matmul_kernel` with ``SPLIT_K`` + :func:`chunk_sum_kernel` (split-K across the grid): each
  program sums one chunk of one tile into an fp32 workspace ``[chunks, M, N]`` (exact: the
  partial is the fp32 accumulator itself); the second kernel adds the chunk sums in order.

The same sequence of fp32 operations reaches every output in both, whatever the tile shape,
program or grid, so the bits do not depend on M, on a row's position, on the partition count or
on the execution the launcher picks; ``config_equivalence`` checks that on every lane.

Index math is written inline rather than in ``@triton.jit`` helpers: under the interpreter
(the cpu lane) every helper call costs milliseconds.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import exact_fp32, fp32_to_bf16_rne


@triton.jit
def _k_step(
    acc,
    a_ptrs,
    b_ptrs,
    a_desc,
    b_desc,
    start_m,
    start_n,
    kt,
    K,
    offs_k,
    BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_IS_NK: tl.constexpr,
    PROMOTE_K: tl.constexpr,
):
    """``acc`` plus the products of K tile ``kt`` of the tile at (``start_m``, ``start_n``).

    ``PROMOTE_K`` (FP8 operands; 0 otherwise): the tensor core sums ``PROMOTE_K`` products in its
    reduced-precision accumulator, from zero, and each such sum is added to ``acc`` in fp32
    (Triton's ``max_num_imprecise_acc``, implemented for wgmma on sm90).

    The operands come through ``a_ptrs`` / ``b_ptrs`` (addressing K tile ``kt``; masked past K)
    or, with ``USE_TMA``, through tensor descriptors (TMA on Hopper; zero-filled past every
    edge): the same values either way, so the same bits.  ``B_IS_NK``: ``b_desc`` describes the
    weight as ``[N, K]`` (``F.linear``), else as ``[K, N]``.

    ``INTERPRETED`` (the cpu lane only): numpy's matmul (the interpreter's ``tl.dot``) sums rows
    at different positions of a block in different orders (BLAS micro-kernels) and multiplies
    raw bf16 bits (triton-lang/triton#11584), so the tile's fp32 products are reduced along k
    instead, one fixed order for every element.  Compiled, ``tl.dot`` forms every element of the
    tile with the same MMA / FMA sequence whatever its row."""
    if USE_TMA:
        a = a_desc.load([start_m, kt * BLOCK_K])
        if B_IS_NK:
            b = b_desc.load([start_n, kt * BLOCK_K]).T
            if INTERPRETED:
                # numpy keeps the transpose's column-major layout through the products below,
                # and np.sum then adds a K step's products pairwise (k contiguous) instead of
                # in increasing k as for the row-major pointer loads: other bits.  The reshape
                # round trip copies to row-major.
                b = tl.reshape(tl.reshape(b, [b.shape[0] * b.shape[1]]), [b.shape[0], b.shape[1]])
        else:
            b = b_desc.load([kt * BLOCK_K, start_n])
    else:
        k_left = K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    if INTERPRETED:
        prod = exact_fp32(a)[:, :, None] * exact_fp32(b)[None, :, :]
        return acc + tl.sum(prod, axis=1)
    elif PROMOTE_K > 0:
        return tl.dot(a, b, acc, max_num_imprecise_acc=PROMOTE_K)
    else:
        return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


@triton.jit
def _chunk_sum(
    a_ptrs,
    b_ptrs,
    a_desc,
    b_desc,
    start_m,
    start_n,
    a_step,
    b_step,
    kt_start,
    kt_end,
    K,
    offs_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_IS_NK: tl.constexpr,
    PROMOTE_K: tl.constexpr,
):
    """The fp32 sum of K tiles ``[kt_start, kt_end)`` of one output tile, from zero, in
    increasing k.  ``a_ptrs`` / ``b_ptrs`` address K tile 0."""
    a_ptrs += kt_start * a_step
    b_ptrs += kt_start * b_step
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        acc = _k_step(
            acc, a_ptrs, b_ptrs, a_desc, b_desc, start_m, start_n, kt, K, offs_k,
            BLOCK_K, INPUT_PRECISION, INTERPRETED, USE_TMA, B_IS_NK, PROMOTE_K,
        )  # fmt: skip
        a_ptrs += a_step
        b_ptrs += b_step
    return acc


@triton.jit
def _store_total(
    c_ptr,
    total,
    bias_ptr,
    stride_bias,
    offs_m,
    offs_n,
    cols,
    M,
    N,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``c[offs_m, offs_n] = round(total + bias)``: the bias in fp32, one rounding to c's dtype
    (integer round-to-nearest-even for bf16 under the interpreter, whose cast truncates)."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols * stride_bias).to(tl.float32)
        total = total + bias[None, :]
    c_ptrs = c_ptr + (offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if INTERPRETED and c_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(c_ptrs, fp32_to_bf16_rne(total), mask=c_mask)
    else:
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _tile_coords(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(start_m, start_n)``, the first row and column of tile ``tile_id`` in grouped order (GROUP_M row tiles share the
    weight in L2; only the visiting order depends on it)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // tiles_per_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % tiles_per_group) % group_size_m
    pid_n = (tile_id % tiles_per_group) // group_size_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


# M is not specialized: a batch size divisible by 16 must not select a different compiled kernel.
@triton.jit(do_not_specialize=["M", "num_chunks"])
def chunked_matmul_kernel(
    a_ptr,
    b_ptr,
    a_desc,
    b_desc,
    bias_ptr,
    c_ptr,
    ws_ptr,
    M,
    N,
    K,
    chunk_tiles,
    num_chunks,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_bias,
    stride_ws_s,
    stride_ws_m,
    xs_ptr,
    ws_scale_ptr,
    stride_xs_m,
    stride_xs_k,
    stride_wss_n,
    stride_wss_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_IS_NK: tl.constexpr,
    PROMOTE_K: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
):
    """``c[M, N] = a[M, K] @ b[K, N] (+ bias[N])`` as the module's reduction tree.

    ``USE_TMA``: the operands are read through ``a_desc`` (``a`` as ``[M, K]``) and ``b_desc``
    (the weight as ``[N, K]`` when ``B_IS_NK``, else ``[K, N]``), tensor descriptors the launcher
    builds when the operands' layout allows TMA; else through the pointers and strides.

    Work items: tiles (``SPLIT_K`` False: a program walks all ``num_chunks`` chunks of a tile and
    stores ``round(total + bias)`` to ``c``) or (tile, chunk) pairs (``SPLIT_K`` True: the chunk's
    fp32 sum goes to ``ws[chunk, M, N]``, row-major per chunk; :func:`chunk_sum_kernel` finishes).
    The grid is the planned number of programs; program ``p`` takes items ``p``, ``p + grid``, ...
    ``b`` is addressed through its strides, so ``F.linear``'s weight ``w[N, K]`` row-major is
    ``b = w.T``; ``bias`` through ``stride_bias`` (0 for an expanded scalar).

    FP8 scales (``SCALES``; the walk only): 0 none; 1 per tensor (``xs_ptr``, ``ws_scale_ptr``
    one element each); 2 per token x per channel (``xs[m]``, ``ws[n]``); 3 blocks (``xs[m, c]``
    for the 1 x ``SCALE_BLOCK`` group, ``ws[n // SCALE_BLOCK, c]``, the chunks being the
    ``SCALE_BLOCK``-wide K blocks).  The fixed formula, fp32, launched without FMA contraction:
    ``total = fl(total + fl(chunk * fl(xs * ws)))`` per chunk (3) or ``fl(total * fl(xs * ws))``
    once after the walk (1, 2); then the bias and one rounding as above.  Offsets are formed
    in int64 (a row index times a row stride passes 2**31 for large operands: Triton tutorial
    03).  Rows / columns past the edge read row / column 0 instead of masking every load; they
    are never stored, and the rows of a tile do not mix in a dot.
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    # The K step is advanced on the (64-bit) pointers, from an int64 stride product.
    a_step = tl.full((), BLOCK_K, tl.int64) * stride_ak
    b_step = tl.full((), BLOCK_K, tl.int64) * stride_bk
    items = num_tiles * num_chunks if SPLIT_K else num_tiles

    for item in range(pid, items, num_programs):
        tile_id = item // num_chunks if SPLIT_K else item
        start_m, start_n = _tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
        a_ptrs = a_ptr + (rows[:, None] * stride_am + offs_k[None, :].to(tl.int64) * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None].to(tl.int64) * stride_bk + cols[None, :] * stride_bn)
        if SPLIT_K:
            chunk = item % num_chunks
            kt_start = chunk * chunk_tiles
            kt_end = tl.minimum(kt_start + chunk_tiles, k_tiles)
            acc = _chunk_sum(
                a_ptrs,
                b_ptrs,
                a_desc,
                b_desc,
                start_m,
                start_n,
                a_step,
                b_step,
                kt_start,
                kt_end,
                K,
                offs_k,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                INPUT_PRECISION,
                INTERPRETED,
                USE_TMA,
                B_IS_NK,
                PROMOTE_K,
            )
            ws_ptrs = ws_ptr + (
                chunk * (tl.full((), 1, tl.int64) * stride_ws_s)
                + offs_m.to(tl.int64)[:, None] * stride_ws_m
                + offs_n.to(tl.int64)[None, :]
            )
            tl.store(ws_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
        else:
            # One loop over K tiles (the pipeliner sees one loop; no restart per chunk): at a
            # chunk's last tile its sum joins the total and the accumulator restarts from zero.
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_tiles):
                acc = _k_step(
                    acc, a_ptrs, b_ptrs, a_desc, b_desc, start_m, start_n, kt, K, offs_k,
                    BLOCK_K, INPUT_PRECISION, INTERPRETED, USE_TMA, B_IS_NK, PROMOTE_K,
                )  # fmt: skip
                a_ptrs += a_step
                b_ptrs += b_step
                if ((kt + 1) % chunk_tiles == 0) | (kt + 1 == k_tiles):
                    if SCALES == 3:
                        c = kt // chunk_tiles
                        x_s = tl.load(xs_ptr + rows * stride_xs_m + c * stride_xs_k)
                        w_s = tl.load(ws_scale_ptr + (cols // SCALE_BLOCK) * stride_wss_n + c * stride_wss_k)
                        total += acc * (x_s[:, None] * w_s[None, :])
                    else:
                        total += acc
                    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if SCALES == 1:
                total = total * (tl.load(xs_ptr) * tl.load(ws_scale_ptr))
            elif SCALES == 2:
                x_s = tl.load(xs_ptr + rows * stride_xs_m)
                w_s = tl.load(ws_scale_ptr + cols * stride_wss_n)
                total = total * (x_s[:, None] * w_s[None, :])
            _store_total(
                c_ptr,
                total,
                bias_ptr,
                stride_bias,
                offs_m,
                offs_n,
                cols,
                M,
                N,
                stride_cm,
                stride_cn,
                HAS_BIAS,
                INTERPRETED,
            )


@triton.jit(do_not_specialize=["M", "num_chunks"])
def chunk_sum_kernel(
    ws_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    num_chunks,
    stride_ws_s,
    stride_ws_m,
    stride_cm,
    stride_cn,
    stride_bias,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """``c = round(((0 + ws[0]) + ws[1]) + ... + bias)``: the split execution's chunk sums added
    in increasing chunk order, as :func:`chunked_matmul_kernel`'s walk adds them.  One program
    per ``BLOCK_M`` x ``BLOCK_N`` tile of ``c``."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_ptrs = ws_ptr + (offs_m.to(tl.int64)[:, None] * stride_ws_m + offs_n.to(tl.int64)[None, :])
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, num_chunks):
        total += tl.load(ws_ptrs, mask=mask, other=0.0)
        ws_ptrs += stride_ws_s
    _store_total(
        c_ptr,
        total,
        bias_ptr,
        stride_bias,
        offs_m,
        offs_n,
        cols,
        M,
        N,
        stride_cm,
        stride_cn,
        HAS_BIAS,
        INTERPRETED,
    )
