"""Triton kernels of the indexer top-k (launchers: ``batchinv.fast.topk`` and
``batchinv.fast.baselines.topk``).

One program per row; the row is register-resident.  A 32-step bitwise binary search over the
int32 key space finds the k-th largest key ``T`` of the row's candidates, then one ascending
scan emits every candidate with key > T plus the first ``k - count(key > T)`` candidates with
key == T in column order (an exclusive cumsum), at their rank among the emitted lanes: the
output is ascending without a sort.

Two executions of that selection, bit-identical by construction (the selection is exact) and
proven so by the registry check ``config_equivalence``:

* :func:`topk_kernel` (``"compare"``): candidates by mask, counts by compare, ``K`` constexpr.
* :func:`topk_sign_count_kernel` (``"sign"``): fewer instructions per lane and, on rows of
  distinct scores, fewer search steps; for many rows.
"""

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import monotone_key

# Bit patterns of the key map, as constexpr globals (plain globals do not compile in a kernel);
# the map itself and its masks are :func:`~batchinv.fast.kernels.primitives.monotone_key`'s.
KEY_MIN = tl.constexpr(-2147483648)  # the smallest int32 key (0xffffffff's key)
NEG_INF_KEY = tl.constexpr(-2139095041)  # key of -inf: 0xff800000 ^ 0x7fffffff


@triton.jit
def _kth_key(key, candidate, num_wanted):
    """The largest int32 ``t`` with ``count(candidate & key >= t) >= num_wanted``, found bit by
    bit from the most significant (32 steps).  Needs ``num_wanted <= count(candidate)``.

    A loop, not unrolled: 32 unrolled copies of the block-wide count made this kernel ~3.3 s
    to compile, and a GPU sweep compiles it per (k, BLOCK_N, specialization): 457 s of a cold
    sweep's 1047 s of compiling (H200 run 61).  The steps are the same either way."""
    thresh = tl.full((), KEY_MIN, tl.int64)
    bit = tl.full((), 31, tl.int64)  # a tensor on the GPU and in the interpreter alike
    for _ in range(32):
        trial = thresh + (tl.full((), 1, tl.int64) << bit)  # <= 2**31 - 1: fits int32
        above = candidate & (key >= trial.to(tl.int32))
        count = tl.sum(above.to(tl.int32), axis=0)
        thresh = tl.where(count >= num_wanted, trial, thresh)
        bit -= 1
    return thresh.to(tl.int32)


@triton.jit
def _select(key, candidate, num_wanted):
    """Mask of the ``num_wanted`` best candidates: key descending, exact ties by ascending lane."""
    kth = _kth_key(key, candidate, num_wanted)
    above = candidate & (key > kth)
    tied = candidate & (key == kth)
    budget = num_wanted - tl.sum(above.to(tl.int32), axis=0)
    tie_rank = tl.cumsum(tied.to(tl.int32), axis=0)  # inclusive: 1 for the first tie
    return above | (tied & (tie_rank <= budget))


@triton.jit
def _emit(out_row_ptr, emit, local_col, K: tl.constexpr):
    """Store the emitted lanes' ``local_col`` ascending at the row's front, -1 after them."""
    num_emitted = tl.sum(emit.to(tl.int32), axis=0)
    slot = tl.cumsum(emit.to(tl.int32), axis=0) - 1  # exclusive rank among emitted lanes
    tl.store(out_row_ptr + slot, local_col, mask=emit)
    offs_k = tl.arange(0, K)
    tl.store(out_row_ptr + offs_k, tl.full((K,), -1, tl.int32), mask=offs_k >= num_emitted)


@triton.jit
def _load_window(row_starts_ptr, row_ends_ptr, row, num_cols, stride_starts, stride_ends):
    """The row's window clamped to ``[0, num_cols]`` (int64 bounds clamp before narrowing)."""
    start = tl.load(row_starts_ptr + row * stride_starts).to(tl.int64)
    end = tl.load(row_ends_ptr + row * stride_ends).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), num_cols)
    end = tl.minimum(tl.maximum(end, start), num_cols)
    return start.to(tl.int32), end.to(tl.int32)


# Sizes and strides other than the column stride are not specialized: each distinct value class
# would compile another kernel (the row_start sweep alone walks several), and the selection is
# integer logic whose bits cannot depend on how the loads were vectorized.
# The row stride stays specialized: its divisibility by 16 lets the loads of a row vectorize
# (leaving it out cost 34% on the H200, 20.6 -> 27.6 us at 1 x 8192).
_NOT_SPECIALIZED = ["num_cols", "stride_starts", "stride_ends", "stride_out_row"]
# Nor the alignment of the pointers whose accesses are one scalar per program (the row bounds)
# or a scatter (the output): the row_start sweep shifts every one of them, and each aligned /
# unaligned combination was another compile (137 of topk_kernel in a cold GPU sweep, run 61).
# The scores keep theirs (it vectorizes the row's loads).
_NOT_ALIGNED = ["row_starts_ptr", "row_ends_ptr", "out_ptr"]


@triton.jit(do_not_specialize=_NOT_SPECIALIZED, do_not_specialize_on_alignment=_NOT_ALIGNED)
def topk_kernel(
    scores_ptr,
    row_starts_ptr,
    row_ends_ptr,
    out_ptr,
    num_cols,
    stride_scores_row,
    stride_scores_col,
    stride_starts,
    stride_ends,
    stride_out_row,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Row ``program_id(0)``: the ``min(K, window)`` best in-window lanes, ascending, row-local."""
    row = tl.program_id(0).to(tl.int64)
    start, end = _load_window(row_starts_ptr, row_ends_ptr, row, num_cols, stride_starts, stride_ends)
    cols = tl.arange(0, BLOCK_N)
    in_window = (cols >= start) & (cols < end)
    offsets = row * stride_scores_row + cols.to(tl.int64) * stride_scores_col
    scores = tl.load(scores_ptr + offsets, mask=in_window, other=0.0)
    key = monotone_key(scores)
    num_wanted = tl.minimum(end - start, K)
    take = _select(key, in_window, num_wanted)
    _emit(out_ptr + row * stride_out_row, take, cols - start, K)


@triton.jit(do_not_specialize=_NOT_SPECIALIZED, do_not_specialize_on_alignment=_NOT_ALIGNED)
def topk_masked_lanes_compete_kernel(
    scores_ptr,
    row_starts_ptr,
    row_ends_ptr,
    out_ptr,
    num_cols,
    stride_scores_row,
    stride_scores_col,
    stride_starts,
    stride_ends,
    stride_out_row,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The fused production shortcut (negative control): out-of-window lanes are masked to
    -inf and stay candidates, so they share the key of an in-window -inf and, being tie-broken by
    column, the masked lanes before ``row_start`` spend the tie budget; they are dropped only at
    emission, and the row emits fewer indices the further right the packer placed it."""
    row = tl.program_id(0).to(tl.int64)
    start, end = _load_window(row_starts_ptr, row_ends_ptr, row, num_cols, stride_starts, stride_ends)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < num_cols
    in_window = (cols >= start) & (cols < end)
    offsets = row * stride_scores_row + cols.to(tl.int64) * stride_scores_col
    scores = tl.load(scores_ptr + offsets, mask=in_window, other=0.0)
    key = tl.where(in_window, monotone_key(scores), NEG_INF_KEY)
    take = _select(key, in_row, tl.minimum(num_cols, K))
    _emit(out_ptr + row * stride_out_row, take & in_window, cols - start, K)


@triton.jit
def _kth_key_by_sign(key, num_wanted, half_shift, BLOCK_N: tl.constexpr):
    """A threshold ``t`` whose selection equals :func:`_kth_key`'s, for ``key`` ``[BLOCK_N]``
    whose non-candidate lanes hold ``KEY_MIN``: the candidates with key > t, then the first
    ``num_wanted - count(key > t)`` of those with key == t, are the ``num_wanted`` best.

    The search is :func:`_kth_key`'s, bit by bit from the most significant, with three
    changes, none of which can change the selection:

    * Every trial lies above ``KEY_MIN``, so a lane keyed ``KEY_MIN`` is never counted and no
      candidate mask is needed (an in-window ``KEY_MIN``, 0xffffffff, is never counted either,
      rightly).
    * In the offset order ``u = key + 2**31`` the trials of key bits 31..1 are even, so
      ``u >= trial_u`` iff ``u >> 1 >= trial_u >> 1``: two values below 2**31, so the top bit
      of their uint32 difference is set exactly when the lane lies below the trial -- one
      subtraction and one shift-add per lane (a step is ~99 instructions per thread at 8
      warps and 8192 columns, against 153 for :func:`_kth_key`'s mask, compare and select;
      ptxas, sm_90).  Key bit 0 compares.
    * A trial with exactly ``num_wanted`` lanes at or above it ends the search: those lanes are
      the selection, and ``t = trial`` selects them all (the tie budget at ``t`` is the number
      of lanes equal to it).  On rows of distinct scores this comes ~12 steps early at 8192
      columns (the gap between the k-th and (k+1)-th best keys spans ~2**12 keys); a row whose
      cutoff lies on a tie plateau searches every bit, to :func:`_kth_key`'s threshold.

    ``half_shift`` is 1, passed at run time: with a constant shift LLVM bounds the halves,
    proves the difference cannot overflow and turns it back into the compare and select.
    """
    half = (key ^ KEY_MIN).to(tl.uint32, bitcast=True) >> half_shift.to(tl.uint32)  # [BLOCK_N] < 2**31
    max_below = BLOCK_N - num_wanted  # a trial is kept while at most this many lanes lie below it
    thresh_half = tl.full((), 0, tl.uint32)  # (thresh - KEY_MIN) >> 1, thresh starting at KEY_MIN
    bit = tl.full((), 30, tl.int32)  # the trial of key bit b + 1 is thresh + 2**(b + 1)
    below = tl.full((), -1, tl.int32)
    while (bit >= 0) & (below != max_below):
        trial_half = thresh_half + (tl.full((), 1, tl.uint32) << bit.to(tl.uint32))  # in [1, 2**31)
        below = tl.sum(((half - trial_half) >> 31).to(tl.int32), axis=0)  # wraps iff half < trial_half
        thresh_half = tl.where(below <= max_below, trial_half, thresh_half)
        bit -= 1
    thresh = (thresh_half.to(tl.int64) << 1) + KEY_MIN
    if below != max_below:  # key bit 0, by a compare
        count = tl.sum((key >= (thresh + 1).to(tl.int32)).to(tl.int32), axis=0)
        thresh += (count >= num_wanted).to(tl.int64)
    return thresh.to(tl.int32)


# k is not specialized either: one compile serves every k of a num_cols bucket.
_SIGN_NOT_SPECIALIZED = [*_NOT_SPECIALIZED, "k", "half_shift"]


@triton.jit(do_not_specialize=_SIGN_NOT_SPECIALIZED, do_not_specialize_on_alignment=_NOT_ALIGNED)
def topk_sign_count_kernel(
    scores_ptr,
    row_starts_ptr,
    row_ends_ptr,
    out_ptr,
    num_cols,
    k,
    half_shift,
    stride_scores_row,
    stride_scores_col,
    stride_starts,
    stride_ends,
    stride_out_row,
    BLOCK_N: tl.constexpr,
):
    """:func:`topk_kernel`'s selection with fewer instructions per lane (the bits are the same).

    Out-of-window lanes are keyed ``KEY_MIN`` and the threshold is found by
    :func:`_kth_key_by_sign`; one scan of the above-count (bits 0..15) and tie-count
    (bits 16..) packed in an int32 gives both the tie budget's cut and each emitted lane's
    slot: ``slot = above_through + min(ties_through, budget) - 1`` (counts inclusive of the
    lane; every count is at most BLOCK_N <= 8192, so neither field overflows).  ``k`` is a
    run-time value (the -1 tail is stored in BLOCK_N-wide chunks); ``half_shift`` is 1.
    """
    row = tl.program_id(0).to(tl.int64)
    start, end = _load_window(row_starts_ptr, row_ends_ptr, row, num_cols, stride_starts, stride_ends)
    cols = tl.arange(0, BLOCK_N)
    in_window = (cols >= start) & (cols < end)
    offsets = row * stride_scores_row + cols.to(tl.int64) * stride_scores_col
    scores = tl.load(scores_ptr + offsets, mask=in_window, other=0.0)
    key = tl.where(in_window, monotone_key(scores), KEY_MIN)
    num_wanted = tl.minimum(end - start, k)
    kth = _kth_key_by_sign(key, num_wanted, half_shift, BLOCK_N)
    above = key > kth  # never an out-of-window lane: kth >= KEY_MIN
    tied = in_window & (key == kth)
    packed = tl.cumsum(above.to(tl.int32) + (tied.to(tl.int32) << 16), axis=0)  # inclusive
    budget = num_wanted - tl.sum(above.to(tl.int32), axis=0)
    ties_through = packed >> 16
    take = above | (tied & (ties_through <= budget))
    slot = (packed & 0xFFFF) + tl.minimum(ties_through, budget) - 1
    out_row_ptr = out_ptr + row * stride_out_row
    tl.store(out_row_ptr + slot, cols - start, mask=take)
    for first in range(0, k, BLOCK_N):  # num_wanted lanes were emitted; -1 after them
        offs = first + cols
        tl.store(
            out_row_ptr + offs, tl.full((BLOCK_N,), -1, tl.int32), mask=(offs >= num_wanted) & (offs < k)
        )
