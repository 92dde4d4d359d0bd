"""Triton kernel for the mean over the last dim (only ``@triton.jit`` code).

A program owns a tile of ``BLOCK_M`` rows and walks them in fixed chunks of ``BLOCK_N``
columns; each lane (row, column slot) keeps an fp64 running sum of the row's elements (each
first rounded to the output dtype, then widened exactly), and a row's ``BLOCK_N`` lanes are
combined by :func:`~batchinv.fast.kernels.primitives.fixed_point_lane_sum_f64` (integer adds
on a fixed-point grid: the same bits in any order, so Triton's register layout does not enter).  The sum is divided by the row
length in fp64 (correctly rounded on GPUs and in the interpreter alike, unlike fp32 ``/``,
which a GPU computes with the approximate ``div.full.f32``) and rounded once to the output
dtype.  The order of a row's additions depends on ``BLOCK_N`` and the row length alone; rows
never meet, so the bits of a row do not depend on the number of rows, its slot or its
neighbours.  The launcher (``fast/mean.py``) takes the tile from a table keyed on (arch, dtype,
row length).
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import fixed_point_lane_sum_f64, round_from_f64, round_to, widen_f32


@triton.jit
def _add_chunk(acc, p, mask, OUT_DTYPE: tl.constexpr):
    """``acc`` plus one chunk's elements (each lane its own), each rounded to ``OUT_DTYPE`` and
    widened exactly.  Through fp32 first: bf16 -> fp32 is exact, so the one rounding to the
    output dtype is the direct conversion's (and Triton's interpreter has no direct bf16 -> fp16
    path); the widening to the accumulator's dtype is exact."""
    x = tl.load(p, mask=mask, other=0.0)
    return acc + widen_f32(round_to(widen_f32(x), OUT_DTYPE)).to(acc.dtype)


# num_rows is never specialized: Triton would otherwise compile a variant for num_rows == 1 and
# for num_rows % 16 == 0, i.e. pick code by the batch size.
@triton.jit(do_not_specialize=["num_rows"])
def mean_kernel(
    x_ptr,
    y_ptr,
    num_rows,
    n_cols,
    stride_x_row,
    stride_x_col,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FIXED_POINT: tl.constexpr = True,
    STAGES: tl.constexpr = 1,
):
    """y[r] = sum_n x[r, n].to(y.dtype).to(fp64) / n_cols, rounded once to y's dtype.

    Each element is first rounded to the output dtype (``torch.mean(..., dtype=)`` casts its
    input before reducing), then accumulated in fp64 from +0 (exact widening; a lane of fp32
    values cannot overflow fp64), the lanes combined order-free, divided in fp64 and rounded
    once by :func:`~batchinv.fast.kernels.primitives.round_from_f64`.

    ``STAGES > 1`` pipelines the chunk loop (Triton's ``tl.range(num_stages=...)``: the loads of
    the next ``STAGES - 1`` chunks issued before a chunk is added); every lane adds its chunks in
    the same order, so the bits are the same at any ``STAGES``.

    ``FIXED_POINT=False`` is the unpinned production-style path, for the baseline only: fp32
    lanes (as ``torch.mean`` accumulates), a float ``tl.sum`` over them whose order follows the
    register layout, an fp32 division, and rounding fp32 -> output dtype.
    """
    # int64 row offsets: row * stride passes 2**31 for long rows times many rows.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = (rows < num_rows)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_x_row + cols.to(tl.int64) * stride_x_col
    # Advance pointers by an int64 step: start * stride_x_col can pass 2**31 for a column-strided view.
    col_step = tl.full([1, BLOCK_N], BLOCK_N, tl.int64) * stride_x_col
    if FIXED_POINT:
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    p = x_ptrs
    if STAGES > 1:
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            acc = _add_chunk(acc, p, row_ok & (cols < n_cols - start), y_ptr.dtype.element_ty)
            p += col_step
    else:
        for start in range(0, n_cols, BLOCK_N):
            acc = _add_chunk(acc, p, row_ok & (cols < n_cols - start), y_ptr.dtype.element_ty)
            p += col_step
    if FIXED_POINT:
        # n_cols (int32) -> fp64 is exact; fp64 division is correctly rounded on every lane.
        out = round_from_f64(fixed_point_lane_sum_f64(acc) / n_cols, y_ptr.dtype.element_ty)
    else:
        out = round_to(tl.sum(acc, axis=1) / n_cols, y_ptr.dtype.element_ty)
    tl.store(y_ptr + rows, out, mask=rows < num_rows)
