"""Triton kernels for softmax and log_softmax over the last dim (only ``@triton.jit`` code).

A program owns a tile of ``BLOCK_M`` rows (1 for vocabulary-sized rows on GPUs) and walks
them in fixed chunks of ``BLOCK_N`` columns, twice:

1. an online pass keeps, per lane (row, column slot), a running maximum ``m`` and a running
   sum ``s`` of ``exp(x - m)``; the ``BLOCK_N`` lanes of a row are then combined (``tl.max``,
   exact; :func:`fixed_point_lane_sum`, order-free);
2. a write pass reads the row again and stores ``exp(x - M) / S`` (or ``x - M - log S``).

The lanes' sums are combined by :func:`fixed_point_lane_sum` (integer adds on a fixed-point
grid), whose result does not depend on the order Triton's register layout implies -- and that
layout changes with pointer alignment, strides and ``num_warps``; the maximum is exact in any
order.

Every floating-point operation of a row happens in an order set by ``BLOCK_N`` and the row
length; rows never meet (all reductions run along axis 1), so the bits of a row do
not depend on how many rows share the launch, on its slot in the tile, or on its neighbours.
The launcher (``fast/softmax.py``) takes the tile from a table keyed on (arch, dtype, row length).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Constants used inside kernels must be tl.constexpr globals to compile on a real GPU.
NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
POS_INF: tl.constexpr = tl.constexpr(float("inf"))
# No NaN constexpr global: Triton re-checks globals after compiling and NaN != NaN, so a NaN
# global fails every launch on a GPU ("Global variable NAN has changed").  Build it from bits.
QUIET_NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
#: log2 of the widest lane vector a kernel may combine (BLOCK_N <= 2**16).
MAX_LOG2_LANES: tl.constexpr = tl.constexpr(16)


@triton.jit
def _quiet_nan():
    """The fp32 quiet NaN 0x7fc00000 (the default NaN of the GPU's arithmetic)."""
    return tl.full((), QUIET_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _split_nonfinite(v):
    """(is_nan, pos_inf, neg_inf, finite) of ``v``: ``finite`` has 0 where ``v`` is not finite."""
    is_nan = v != v
    pos_inf = v == POS_INF
    neg_inf = v == NEG_INF
    finite = tl.where(is_nan | pos_inf | neg_inf, 0.0, v)
    return is_nan, pos_inf, neg_inf, finite


@triton.jit
def _grid_sum(finite, exponent):
    """Sum each row of ``finite`` (fp32 or fp64, [BLOCK_M, BLOCK_N]) on the fixed-point grid
    ``2**-shift``, ``shift = 61 - MAX_LOG2_LANES - exponent`` (at most 1023), where every
    |lane| < ``2**(exponent + 1)``: each lane is scaled exactly in fp64, truncated to int64
    (it is < 2**46 there) and the ints added -- associative, so any order gives the same total,
    < 2**62.  Returns the total in fp64 ([BLOCK_M], one rounding: int64 -> fp64)."""
    # clamp: 2**shift must be an fp64 normal; a row whose largest |lane| < 2**-978 (zeros
    # included) is then summed on the grid 2**-1023, losing under 2**-1023 per lane.
    # The tensor stays the left operand: Triton 3.7/3.8's interpreter turns ``constexpr - tensor``
    # into a constexpr wrapping the tensor, which no op accepts ("cannot convert ... to tensor").
    # Same int32 arithmetic (exact), same bits.
    shift = tl.minimum(-exponent + (61 - MAX_LOG2_LANES), 1023)
    scale = ((shift + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2**shift, exact
    fixed = (finite.to(tl.float64) * scale[:, None]).to(tl.int64)  # exact scaling, truncation
    return tl.sum(fixed, axis=1).to(tl.float64) / scale


@triton.jit
def _merge_nonfinite(total, is_nan, pos_inf, neg_inf):
    """``total`` where the row's lanes are finite; NaN for a NaN or +inf with -inf; else the inf."""
    any_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    any_pos = tl.max(pos_inf.to(tl.int32), axis=1) > 0
    any_neg = tl.max(neg_inf.to(tl.int32), axis=1) > 0
    total = tl.where(any_pos, POS_INF, total)
    total = tl.where(any_neg, NEG_INF, total)
    return tl.where(any_nan | (any_pos & any_neg), _quiet_nan().to(total.dtype), total)


@triton.jit
def fixed_point_lane_sum(v):
    """Sum each row of ``v`` ([BLOCK_M, BLOCK_N] fp32) with a result independent of the order.

    ``tl.sum`` over floats adds in an order that follows the register layout, and Triton picks
    the layout from the vector width it derives from pointer alignment, strides and
    ``num_warps``: a strided view of a row could get other bits than the contiguous row.  Here
    the finite lanes of a row are put on one fixed-point grid -- ``2**-q`` with ``q`` from the
    exponent ``e`` of the row's largest |lane|, so that the int64 total cannot overflow -- by an
    exact scaling in fp64 and a truncation, and summed with integer adds, which are
    associative: every order gives the same total.  Each lane loses less than
    ``2**(e - 45)`` to the truncation: in all, under ``2**-29`` of the largest lane.  The total returns
    to fp32 through fp64 (two roundings, fixed).

    Non-finite lanes: a NaN, or +inf together with -inf, gives NaN; otherwise an inf gives
    itself.  A row of zeros gives +0.  Returns [BLOCK_M] fp32.
    """
    is_nan, pos_inf, neg_inf, finite = _split_nonfinite(v)
    largest = tl.max(tl.abs(finite), axis=1)  # exact in any order
    biased = (largest.to(tl.int32, bitcast=True) >> 23) & 0xFF  # 0 for a subnormal or zero
    exponent = tl.maximum(biased, 1) - 127  # largest < 2**(exponent + 1)
    # sum of BLOCK_N lanes < 2**(MAX_LOG2_LANES + exponent + 1); scaled by 2**shift: < 2**62
    total = _grid_sum(finite, exponent).to(tl.float32)
    return _merge_nonfinite(total, is_nan, pos_inf, neg_inf)


@triton.jit
def fixed_point_lane_sum_f64(v):
    """Sum each row of ``v`` ([BLOCK_M, BLOCK_N] fp64) with a result independent of the order.

    The fp64 twin of :func:`fixed_point_lane_sum` (same grid rule, same non-finite classes):
    the exponent ``e`` of the row's largest |lane| comes from the fp64 bits, the lanes are
    truncated to the grid ``2**(e - 45)`` and summed as int64, so each lane loses less than
    ``2**(e - 45)``: in all, under ``2**-29`` of the largest lane.  The grid's scale
    ``2**(45 - e)`` is an fp64 normal for every ``e`` in [-978, 1023] -- all lanes of a sum of
    fp32 values (nonzero |lane| >= 2**-149, |lane| < 2**(128 + log2 N)); below that the grid
    is clamped to ``2**-1023`` (an absolute loss under ``2**-1023`` per lane).  The int64 total
    (< 2**62) returns to fp64 with one rounding.

    Non-finite lanes: a NaN, or +inf together with -inf, gives NaN; otherwise an inf gives
    itself.  A row of zeros gives +0.  Returns [BLOCK_M] fp64.
    """
    is_nan, pos_inf, neg_inf, finite = _split_nonfinite(v)
    largest = tl.max(tl.abs(finite), axis=1)  # exact in any order
    biased = (largest.to(tl.int64, bitcast=True) >> 52) & 0x7FF  # 0 for a subnormal or zero
    exponent = (tl.maximum(biased, 1) - 1023).to(tl.int32)  # largest < 2**(exponent + 1)
    total = _grid_sum(finite, exponent)
    return _merge_nonfinite(total, is_nan, pos_inf, neg_inf)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """``x`` (fp32) rounded to ``dtype`` to nearest, ties to even, on every lane.

    For bf16 the rounding is written out in integer ops: Triton 3.6's interpreter converts fp32
    to bf16 by truncation (and turns some NaNs into infinities), while a GPU rounds to nearest;
    written out, both lanes compute the same bits as the GPU's ``cvt.rn.bf16.f32`` up to NaN
    payloads (a NaN stays a NaN).  Overflow rounds to +-inf.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = tl.where(x != x, bits | 0x400000, rounded)
        return (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


# num_rows is never specialized: Triton would otherwise compile a variant for num_rows == 1 and
# for num_rows % 16 == 0, i.e. pick code by the batch size.
@triton.jit(do_not_specialize=["num_rows"])
def softmax_kernel(
    x_ptr,
    y_ptr,
    num_rows,
    n_cols,
    stride_x_row,
    stride_x_col,
    stride_y_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOG: tl.constexpr,
    FIXED_POINT: tl.constexpr = True,
):
    """y[r, :] = softmax(x[r, :]) (``LOG=False``) or log_softmax (``LOG=True``), fp32 math.

    ``FIXED_POINT=False`` replaces the order-free lane combine by a float ``tl.sum`` (whose
    order follows the register layout): only the unpinned baseline uses it.

    Non-finite rows follow aten: a NaN or a +inf anywhere in the row, or a row of all -inf,
    makes the whole output row NaN; -inf entries of an otherwise finite row give 0 (or -inf).
    """
    # int64 row offsets: row * stride passes 2**31 at vocab 151936 beyond ~14k rows.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = (rows < num_rows)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_x_row + cols.to(tl.int64) * stride_x_col
    y_ptrs = y_ptr + rows[:, None] * stride_y_row + cols
    # Advance pointers by an int64 step: start * stride_x_col can pass 2**31 for a column-strided view.
    col_step = tl.full([1, BLOCK_N], BLOCK_N, tl.int64) * stride_x_col

    # Pass 1: per-lane online max and sum, one exp per element.  A NaN makes its lane's sum
    # NaN for good (grows is False, e is NaN), which poisons the row's sum below.
    m = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
    s = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    p = x_ptrs
    for start in range(0, n_cols, BLOCK_N):
        mask = row_ok & (cols < n_cols - start)
        x = tl.load(p, mask=mask, other=NEG_INF).to(tl.float32)
        p += col_step
        d = x - m
        # exp(-|d|) is the rescale factor of the old sum when x is a new lane maximum (d > 0)
        # and the new term otherwise; an x of -inf adds nothing (also when m is still -inf).
        e = tl.where(x == NEG_INF, 0.0, tl.exp(-tl.abs(d)))
        grows = d > 0
        s = tl.where(grows, s * e + 1.0, s + e)
        m = tl.where(grows, x, m)

    # Combine each row's lanes: the maximum is exact in any order, the sum order-free.
    row_max = tl.max(m, axis=1)
    scale = tl.where(m == NEG_INF, 0.0, tl.exp(m - row_max[:, None]))
    if FIXED_POINT:
        row_sum = fixed_point_lane_sum(s * scale)
    else:
        row_sum = tl.sum(s * scale, axis=1)
    # +inf in the row, or nothing but -inf: the row is NaN (a NaN input already made it so).
    row_sum = tl.where((row_max == POS_INF) | (row_max == NEG_INF), _quiet_nan(), row_sum)
    row_max = row_max[:, None]
    row_sum = row_sum[:, None]
    log_sum = tl.log(row_sum)

    # Pass 2: write.
    p = x_ptrs
    for start in range(0, n_cols, BLOCK_N):
        mask = row_ok & (cols < n_cols - start)
        x = tl.load(p, mask=mask, other=0.0).to(tl.float32)
        p += col_step
        if LOG:
            y = (x - row_max) - log_sum
        else:
            y = tl.exp(x - row_max) / row_sum
        tl.store(y_ptrs + start, round_to(y, y_ptr.dtype.element_ty), mask=mask)
