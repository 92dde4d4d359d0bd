"""Triton kernels for softmax and log_softmax over the last dim (only ``@triton.jit`` code).

A program owns a tile of ``BLOCK_M`` rows (1 for vocabulary-sized rows on GPUs) and walks
them in fixed chunks of ``BLOCK_N`` columns, twice:

1. an online pass keeps, per lane (row, column slot), a running maximum ``m`` and a running
   sum ``s`` of ``exp(x - m)``; the ``BLOCK_N`` lanes of a row are then combined (``tl.max``,
   exact; :func:`~batchinv.fast.kernels.primitives.fixed_point_lane_sum`, order-free);
2. a write pass reads the row again and stores ``exp(x - M) / S`` (or ``x - M - log S``).

The lanes' sums are combined by ``fixed_point_lane_sum`` (integer adds on a fixed-point
grid), whose result does not depend on the order Triton's register layout implies -- and that
layout changes with pointer alignment, strides and ``num_warps``; the maximum is exact in any
order.

Every floating-point operation of a row happens in an order set by ``BLOCK_N`` and the row
length; rows never meet (all reductions run along axis 1), so the bits of a row do
not depend on how many rows share the launch, on its slot in the tile, or on its neighbours.
The launcher (``fast/softmax.py``) takes the tile from a table keyed on (arch, dtype, row length).

The same computation also runs split over programs (``softmax_split_*_kernel``, "the split
execution" below): pass 1 cut by lanes over several programs, the lanes' (m, s) through an fp32
workspace, the combine and the write in other programs.  Each lane's operations and their order
are the same, the combine is order-free and the write elementwise, so a row gets the same bits
whichever execution runs it; the launcher may then choose the execution by the number of rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import NEG_INF, POS_INF, fixed_point_lane_sum, quiet_nan, round_to


@triton.jit
def _online_step(m, s, x):
    """One chunk of pass 1 on every lane: the running maximum ``m`` and sum ``s`` of
    ``exp(x - m)`` of each lane, updated with the lane's next element ``x`` (fp32).  A NaN makes
    its lane's sum NaN for good (grows is False, e is NaN), which poisons the row's sum; an x of
    -inf adds nothing (also when m is still -inf), so a masked lane (``other=-inf``) leaves
    ``(m, s)`` bitwise as they were."""
    d = x - m
    # exp(-|d|) is the rescale factor of the old sum when x is a new lane maximum (d > 0)
    # and the new term otherwise.
    e = tl.where(x == NEG_INF, 0.0, tl.exp(-tl.abs(d)))
    grows = d > 0
    s = tl.where(grows, s * e + 1.0, s + e)
    m = tl.where(grows, x, m)
    return m, s


@triton.jit
def _lane_group(m, s, p, col_step, cols, row_ok, n_left, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """``_online_step`` on ``GROUP`` consecutive chunks, in order, all loaded first (``p``: the
    lanes' pointers in the first, ``n_left``: the columns left in the row from it)."""
    chunks = ()
    for g in tl.static_range(GROUP):
        mask = row_ok & (cols < n_left - g * BLOCK_N)
        # Triton builds tuples by concatenation (no starred elements in kernels)
        chunks = chunks + (tl.load(p + col_step * g, mask=mask, other=NEG_INF),)  # noqa: RUF005
    for g in tl.static_range(GROUP):
        m, s = _online_step(m, s, chunks[g].to(tl.float32))
    return m, s


@triton.jit
def _lane_pass(
    m, s, p, col_step, cols, row_ok, n_cols, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, STAGES: tl.constexpr
):
    """Pass 1 over a row's chunks in order: ``(m, s)`` of every lane after ``_online_step`` on
    chunk 0, 1, 2, ... of ``BLOCK_N`` columns (lane = column % BLOCK_N; ``cols`` are the lanes'
    indices, ``p`` their pointers in chunk 0, ``col_step`` the step to the next chunk).

    Loads in flight, neither of which changes a lane's arithmetic: ``GROUP`` chunks are loaded
    before the first is used (chunks past the row's end are masked to -inf, which leaves a lane
    as it was), and ``STAGES > 1`` pipelines the loop (Triton's ``tl.range(num_stages=...)``:
    loads issued ``STAGES - 1`` iterations ahead).  The same bits at every GROUP and STAGES."""
    if STAGES > 1:
        for start in tl.range(0, n_cols, BLOCK_N * GROUP, num_stages=STAGES):
            m, s = _lane_group(m, s, p, col_step, cols, row_ok, n_cols - start, BLOCK_N, GROUP)
            p += col_step * GROUP
    else:
        for start in range(0, n_cols, BLOCK_N * GROUP):
            m, s = _lane_group(m, s, p, col_step, cols, row_ok, n_cols - start, BLOCK_N, GROUP)
            p += col_step * GROUP
    return m, s


@triton.jit
def _row_stats(m, s, FIXED_POINT: tl.constexpr, FLOAT_PARTS: tl.constexpr = 1):
    """Combine each row's lanes ([BLOCK_M, LANES] ``m``, ``s`` from pass 1): (row max, row sum,
    log of the sum), each [BLOCK_M, 1] fp32.  The maximum is exact in any order, the sum
    order-free (:func:`fixed_point_lane_sum`).  The unpinned baselines only: ``FIXED_POINT=False``
    adds the lanes with a float ``tl.sum`` instead, in an order that follows the register
    layout; with ``FLOAT_PARTS > 1`` as ``FLOAT_PARTS`` float partial sums of consecutive lanes
    (one per pass-1 program of a split), then the partials -- an association that follows the
    split.  +inf in the row, or nothing but -inf: the row is NaN (a NaN input already made it
    so)."""
    row_max = tl.max(m, axis=1)
    scale = tl.where(m == NEG_INF, 0.0, tl.exp(m - row_max[:, None]))
    if FIXED_POINT:
        row_sum = fixed_point_lane_sum(s * scale)
    elif FLOAT_PARTS > 1:
        terms = tl.reshape(s * scale, (m.shape[0], FLOAT_PARTS, m.shape[1] // FLOAT_PARTS))
        row_sum = tl.sum(tl.sum(terms, axis=2), axis=1)
    else:
        row_sum = tl.sum(s * scale, axis=1)
    row_sum = tl.where((row_max == POS_INF) | (row_max == NEG_INF), quiet_nan(), row_sum)
    row_sum = row_sum[:, None]
    return row_max[:, None], row_sum, tl.log(row_sum)


@triton.jit
def _output(x, row_max, row_sum, log_sum, LOG: tl.constexpr):
    """The output of an element ``x`` (fp32) of a row with these statistics: elementwise, so
    the bits do not depend on which program writes it nor on the chunk it sits in."""
    if LOG:
        y = (x - row_max) - log_sum
    else:
        y = tl.exp(x - row_max) / row_sum
    return y


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
    GROUP: tl.constexpr = 1,
    STAGES: tl.constexpr = 1,
):
    """y[r, :] = softmax(x[r, :]) (``LOG=False``) or log_softmax (``LOG=True``), fp32 math.

    ``FIXED_POINT=False`` replaces the order-free lane combine by a float ``tl.sum`` (whose
    order follows the register layout): only the unpinned baseline uses it.  ``GROUP`` and
    ``STAGES`` put more loads in flight (:func:`_lane_pass`; ``STAGES`` pipelines pass 2 as
    well): the same bits at every value.

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

    # Pass 1: per-lane online max and sum, one exp per element.
    m = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
    s = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    m, s = _lane_pass(m, s, x_ptrs, col_step, cols, row_ok, n_cols, BLOCK_N, GROUP, STAGES)

    # Combine each row's lanes: the maximum is exact in any order, the sum order-free.
    row_max, row_sum, log_sum = _row_stats(m, s, FIXED_POINT)

    # Pass 2: write (elementwise: any order, any pipelining).
    p = x_ptrs
    if STAGES > 1:
        for start in tl.range(0, n_cols, BLOCK_N, num_stages=STAGES):
            mask = row_ok & (cols < n_cols - start)
            x = tl.load(p, mask=mask, other=0.0).to(tl.float32)
            p += col_step
            y = _output(x, row_max, row_sum, log_sum, LOG)
            tl.store(y_ptrs + start, round_to(y, y_ptr.dtype.element_ty), mask=mask)
    else:
        for start in range(0, n_cols, BLOCK_N):
            mask = row_ok & (cols < n_cols - start)
            x = tl.load(p, mask=mask, other=0.0).to(tl.float32)
            p += col_step
            y = _output(x, row_max, row_sum, log_sum, LOG)
            tl.store(y_ptrs + start, round_to(y, y_ptr.dtype.element_ty), mask=mask)


# --- the split execution: a row's lanes over several programs ----------------------------------
#
# At few rows one program per row leaves most SMs idle and walks a vocabulary row chunk after
# chunk, one memory latency each.  The split execution computes the very same per-lane values
# in other programs: pass 1 of a row is cut by LANES (never by chunks: a lane's sum adds its
# chunks in sequence, which no other cut preserves), the lanes' (m, s) go through global memory
# (fp32, stored and loaded exactly), the combine is ``_row_stats`` on all BLOCK_N lanes of the
# row (order-free, so any program may do it), and the write is elementwise.  Hence the same bits
# as ``softmax_kernel`` with the same BLOCK_N, at every split -- which config_equivalence checks.


@triton.jit(do_not_specialize=["num_rows"])
def softmax_split_lanes_kernel(
    x_ptr,
    m_ptr,
    s_ptr,
    num_rows,
    n_cols,
    stride_x_row,
    stride_x_col,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LANES: tl.constexpr,
    GROUP: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Pass 1 of the split execution: program (i, j) runs :func:`_lane_pass` on lanes
    ``[j * LANES, (j + 1) * LANES)`` of the ``BLOCK_N`` lanes of rows ``[i * BLOCK_M, (i + 1) *
    BLOCK_M)`` and stores each lane's (m, s) at ``m_ptr[r * BLOCK_N + lane]`` / ``s_ptr[...]``
    (fp32 workspaces of shape (R, BLOCK_N)).  ``BLOCK_M`` only batches rows for the interpreter
    (rows never meet); GPUs run one row per program."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = (rows < num_rows)[:, None]
    lanes = tl.program_id(1) * LANES + tl.arange(0, LANES)[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_x_row + lanes.to(tl.int64) * stride_x_col
    col_step = tl.full([1, LANES], BLOCK_N, tl.int64) * stride_x_col
    m = tl.full([BLOCK_M, LANES], NEG_INF, tl.float32)
    s = tl.full([BLOCK_M, LANES], 0.0, tl.float32)
    m, s = _lane_pass(m, s, x_ptrs, col_step, lanes, row_ok, n_cols, BLOCK_N, GROUP, STAGES)
    slots = rows[:, None] * BLOCK_N + lanes
    tl.store(m_ptr + slots, m, mask=row_ok)
    tl.store(s_ptr + slots, s, mask=row_ok)


@triton.jit
def _load_lanes(m_ptr, s_ptr, rows, row_ok, BLOCK_N: tl.constexpr):
    """The (m, s) of every lane of ``rows`` from the workspaces ([BLOCK_M, BLOCK_N] each; rows
    past the end read as empty lanes, whose statistics are never stored)."""
    slots = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    m = tl.load(m_ptr + slots, mask=row_ok, other=NEG_INF)
    s = tl.load(s_ptr + slots, mask=row_ok, other=0.0)
    return m, s


@triton.jit(do_not_specialize=["num_rows"])
def softmax_split_combine_kernel(
    m_ptr,
    s_ptr,
    stats_ptr,
    num_rows,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FIXED_POINT: tl.constexpr = True,
    FLOAT_PARTS: tl.constexpr = 1,
):
    """The combine of the split execution, once per row: ``_row_stats`` of the row's BLOCK_N
    lanes, stored as (row max, row sum) at ``stats_ptr[2 r]``, ``stats_ptr[2 r + 1]`` (fp32)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = (rows < num_rows)[:, None]
    m, s = _load_lanes(m_ptr, s_ptr, rows, row_ok, BLOCK_N)
    row_max, row_sum, _ = _row_stats(m, s, FIXED_POINT, FLOAT_PARTS)
    tl.store(stats_ptr + rows[:, None] * 2, row_max, mask=row_ok)
    tl.store(stats_ptr + rows[:, None] * 2 + 1, row_sum, mask=row_ok)


@triton.jit(do_not_specialize=["num_rows"])
def softmax_split_write_kernel(
    x_ptr,
    y_ptr,
    m_ptr,
    s_ptr,
    stats_ptr,
    num_rows,
    n_cols,
    span,
    stride_x_row,
    stride_x_col,
    stride_y_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_N: tl.constexpr,
    LOG: tl.constexpr,
    HAS_STATS: tl.constexpr,
    STAGES: tl.constexpr,
    FIXED_POINT: tl.constexpr = True,
    FLOAT_PARTS: tl.constexpr = 1,
):
    """Pass 2 of the split execution: program (i, k) writes columns ``[k * span, (k + 1) *
    span)`` of its ``BLOCK_M`` rows (``span`` a multiple of ``WRITE_N``), ``WRITE_N`` at a time,
    the loop pipelined over ``STAGES`` (elementwise: the bits do not depend on who writes an
    element, nor when).  The rows' statistics come from ``stats_ptr`` (``HAS_STATS``: the combine
    kernel ran) or from ``_row_stats`` of the rows' lanes in ``m_ptr`` / ``s_ptr`` (every program
    of a row computes the same).  ``FIXED_POINT`` and ``FLOAT_PARTS``: as :func:`_row_stats`
    (anything but the defaults is an unpinned baseline)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = (rows < num_rows)[:, None]
    if HAS_STATS:
        row_max = tl.load(stats_ptr + rows[:, None] * 2, mask=row_ok, other=0.0)
        row_sum = tl.load(stats_ptr + rows[:, None] * 2 + 1, mask=row_ok, other=1.0)
        log_sum = tl.log(row_sum)
    else:
        m, s = _load_lanes(m_ptr, s_ptr, rows, row_ok, BLOCK_N)
        row_max, row_sum, log_sum = _row_stats(m, s, FIXED_POINT, FLOAT_PARTS)
    cols = tl.program_id(1) * span + tl.arange(0, WRITE_N)[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_x_row + cols.to(tl.int64) * stride_x_col
    y_ptrs = y_ptr + rows[:, None] * stride_y_row + cols
    col_step = tl.full([1, WRITE_N], WRITE_N, tl.int64) * stride_x_col
    for start in tl.range(0, span, WRITE_N, num_stages=STAGES):
        mask = row_ok & (cols < n_cols - start)
        x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        x_ptrs += col_step
        y = _output(x, row_max, row_sum, log_sum, LOG)
        tl.store(y_ptrs + start, round_to(y, y_ptr.dtype.element_ty), mask=mask)
