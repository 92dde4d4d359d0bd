"""The shared ``@triton.jit`` numerics of the kernels (only ``@triton.jit`` code and constexpr
globals).

Every kernel file imports ``triton``, ``triton.language`` and this module, never another
component's kernel file: a helper two components use lives here, once, so that a change to one
component's kernel cannot change another's bits.  Each helper here is moved unchanged from the
kernel file that first defined it (the same operations in the same order), so the kernels that
call it compute the same bits as before.

What is here:

* constants: :data:`NEG_INF`, :data:`POS_INF` (fp32 infinities), :data:`QUIET_NAN_BITS` (the
  fp32 quiet NaN's bits), :data:`MAX_LOG2_LANES`, and the bit masks of the monotone key map
  (:data:`NEG_ZERO_BITS`, :data:`MAGNITUDE_MASK`);
* canonical NaNs: :func:`quiet_nan` (one fp32 scalar) and :func:`canonical_nan_block` (a block of
  the canonical quiet NaN of fp32, bf16 or fp16) -- the same fp32 bits, distinct shapes and dtypes;
* widening to fp32: :func:`exact_fp32` (bf16, fp16, fp32 and float8_e4m3fn), :func:`widen_f32`
  (bf16, fp16, fp32), :func:`e4m3_to_fp32`;
* rounding: :func:`round_to` (fp32 -> dtype, bf16 NaN keeps its payload, quieted),
  :func:`fp32_to_bf16_rne` (fp32 -> bf16, every NaN becomes 0x7fff), :func:`round_from_f64`
  (fp64 -> dtype, once, through fp32 rounded to odd);
* order-free sums: :func:`fixed_point_lane_sum` (fp32 lanes) and
  :func:`fixed_point_lane_sum_f64` (fp64 lanes), integer adds on a fixed-point grid;
* keys: :func:`monotone_key`, int32 keys whose signed order is the fp32 order.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Constants used inside kernels must be tl.constexpr globals to compile on a real GPU.
#: -inf (a Python float: fp32 -inf in fp32 expressions, fp64 -inf in fp64 ones).
NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
#: +inf (a Python float, as :data:`NEG_INF`).
POS_INF: tl.constexpr = tl.constexpr(float("inf"))
# No NaN constexpr global: Triton re-checks globals after compiling and NaN != NaN, so a NaN
# global fails every launch on a GPU ("Global variable NAN has changed").  Build it from bits.
#: The bits of the fp32 quiet NaN 0x7fc00000 (positive, payload 0: the GPU's default NaN).
QUIET_NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
#: log2 of the widest lane vector a kernel may combine (BLOCK_N <= 2**16).
MAX_LOG2_LANES: tl.constexpr = tl.constexpr(16)
#: The int32 bits of fp32 -0.0 (0x80000000), which :func:`monotone_key` maps to +0.0's key.
NEG_ZERO_BITS: tl.constexpr = tl.constexpr(-2147483648)
#: The magnitude bits of an fp32 (0x7fffffff): xor-ed into the bits of a negative value by
#: :func:`monotone_key` (and by a key's inverse) to reverse their order.
MAGNITUDE_MASK: tl.constexpr = tl.constexpr(0x7FFFFFFF)


# --- canonical NaNs ----------------------------------------------------------------------------


@triton.jit
def quiet_nan():
    """The fp32 quiet NaN 0x7fc00000 (the default NaN of the GPU's arithmetic), a scalar.

    Built from :data:`QUIET_NAN_BITS` by an int32 -> fp32 bitcast (never a NaN global).  A kernel
    needing another float dtype converts it (``.to(dtype)``: a NaN of that dtype).
    """
    return tl.full((), QUIET_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def canonical_nan_block(dtype: tl.constexpr, BLOCK: tl.constexpr):
    """A ``[BLOCK]`` tensor of ``dtype``'s canonical quiet NaN (positive, payload 0): bf16 0x7fc0,
    fp16 0x7e00, fp32 0x7fc00000 (:data:`QUIET_NAN_BITS`; any other ``dtype`` gets the fp32 NaN),
    built from the bits by a bitcast.  These are ``float('nan')``'s bits in each dtype, as torch
    writes them; :func:`quiet_nan` is the fp32 one as a scalar."""
    if dtype == tl.bfloat16:
        return tl.full([BLOCK], 0x7FC0, tl.int16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float16:
        return tl.full([BLOCK], 0x7E00, tl.int16).to(tl.float16, bitcast=True)
    else:
        return tl.full([BLOCK], QUIET_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)


# --- widening to fp32 --------------------------------------------------------------------------


@triton.jit
def widen_f32(x):
    """``x`` (fp32, bf16 or fp16) converted exactly to fp32; bf16 by moving its 16 bits into the
    high half of a word, which is the conversion a GPU performs.  Triton 3.6's interpreter
    converts bf16 subnormals wrongly (2**-133 becomes 0, 3 * 2**-133 becomes 2**-127), so the
    cast is written out on every lane.  Every bit pattern is kept (a NaN keeps its sign and
    payload); any other dtype goes through a plain ``.to(tl.float32)`` (see :func:`exact_fp32`
    for float8_e4m3fn)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def exact_fp32(x):
    """``x`` converted exactly to fp32; bf16 by moving its bits into the high half of a word.

    Used only under the interpreter, whose bf16 -> fp32 cast loops over mantissa bits in Python
    for zeros and subnormals (slow); the shift is the same exact conversion.  bf16 keeps every bit
    pattern (NaN payloads included); float8_e4m3fn goes through :func:`e4m3_to_fp32`; fp16 and
    fp32 through a plain ``.to(tl.float32)`` (exact).  For bf16, fp16 and fp32 these are
    :func:`widen_f32`'s operations.
    """
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif x.dtype == tl.float8e4nv:
        return e4m3_to_fp32(x)
    else:
        return x.to(tl.float32)


@triton.jit
def e4m3_to_fp32(x):
    """``float8_e4m3fn`` to fp32 exactly, with integer ops: the interpreter's own conversion
    reads the NaN code (S.1111.111) as 480 and is a Python loop for subnormals.

    e4m3fn: exponent bias 7, no infinity; exponent 0 is ``m * 2**-9`` (subnormal), S.1111.111 NaN
    (either sign becomes the fp32 ``float("nan")`` of the backend, its sign not kept).
    """
    bits = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    exponent = (bits >> 3) & 0xF
    mantissa = bits & 0x7
    negative = bits >= 128
    normal = (((bits >> 7) << 31) | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125  # 2**-9, exact
    subnormal = tl.where(negative, -subnormal, subnormal)
    value = tl.where(exponent == 0, subnormal, normal)
    return tl.where((exponent == 15) & (mantissa == 7), float("nan"), value)


# --- rounding ----------------------------------------------------------------------------------


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """``x`` (fp32) rounded to ``dtype`` to nearest, ties to even, on every lane.

    For bf16 the rounding is written out in integer ops: Triton 3.6's interpreter converts fp32
    to bf16 by truncation (and turns some NaNs into infinities), while a GPU rounds to nearest;
    written out, both lanes compute the same bits as the GPU's ``cvt.rn.bf16.f32`` up to NaN
    payloads (a NaN stays a NaN: its top 16 bits with the quiet bit set, sign kept).  Overflow
    rounds to +-inf.  Other dtypes: a plain ``.to(dtype)``.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = tl.where(x != x, bits | 0x400000, rounded)
        return (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def fp32_to_bf16_rne(x):
    """Round fp32 to bf16 to nearest-even with integer ops; NaN becomes the canonical 0x7fff.

    Used only under the interpreter, whose fp32 -> bf16 cast truncates; on a GPU the cast
    instruction rounds to nearest-even itself.  Overflow rounds to +-inf.  Unlike
    :func:`round_to`, every NaN (either sign, any payload) becomes the one bf16 NaN 0x7fff.
    """
    bits = x.to(tl.uint32, bitcast=True)
    lsb = (bits >> 16) & 1
    high = (bits + 0x7FFF + lsb) >> 16
    high = tl.where(x != x, 0x7FFF, high)
    return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_from_f64(x, dtype: tl.constexpr):
    """``x`` (fp64) rounded once to ``dtype`` (fp32, bf16 or fp16), to nearest, ties to even.

    fp32: the direct conversion.  bf16 and fp16: ``x`` is first rounded to fp32 *to odd*
    (truncate, then set the last bit when inexact) and then to ``dtype`` to nearest; fp32 has at
    least two more bits than either at every magnitude (subnormals included), so this equals a
    direct rounding of ``x`` (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums:
    proved algorithms using rounding to odd", IEEE TC 2008).  Rounding fp64 -> fp32 -> 16 bit
    to nearest twice would not: a value just above a 16-bit tie becomes the tie, then goes to
    even.  Beyond fp32's range, rounding to odd gives +-max_normal, which rounds to +-inf.
    A NaN stays a NaN (its payload is not canonicalized: see :func:`canonical_nan_block`);
    the final step is :func:`round_to`.
    """
    if dtype == tl.float32:
        return x.to(tl.float32)
    else:
        near = x.to(tl.float32)  # to nearest: one of the two fp32 neighbours of x
        bits = near.to(tl.int32, bitcast=True)
        back = near.to(tl.float64)
        # inexact and even: the odd neighbour is one step (in magnitude) towards x
        step = tl.where(tl.abs(back) > tl.abs(x), -1, 1)
        fix = (back != x) & (x == x) & ((bits & 1) == 0)
        odd = tl.where(fix, bits + step, bits).to(tl.float32, bitcast=True)
        return round_to(odd, dtype)


# --- order-free lane sums ----------------------------------------------------------------------


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
    """``total`` where the row's lanes are finite; NaN for a NaN or +inf with -inf; else the inf.

    The NaN is :func:`quiet_nan` converted to ``total``'s dtype (fp32: 0x7fc00000), whatever the
    input NaNs' payloads."""
    any_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    any_pos = tl.max(pos_inf.to(tl.int32), axis=1) > 0
    any_neg = tl.max(neg_inf.to(tl.int32), axis=1) > 0
    total = tl.where(any_pos, POS_INF, total)
    total = tl.where(any_neg, NEG_INF, total)
    return tl.where(any_nan | (any_pos & any_neg), quiet_nan().to(total.dtype), total)


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

    Non-finite lanes: a NaN, or +inf together with -inf, gives NaN (the quiet NaN 0x7fc00000);
    otherwise an inf gives itself.  A row of zeros gives +0.  Returns [BLOCK_M] fp32.
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

    Non-finite lanes: a NaN, or +inf together with -inf, gives NaN (:func:`quiet_nan` converted
    to fp64); otherwise an inf gives itself.  A row of zeros gives +0.  Returns [BLOCK_M] fp64.
    """
    is_nan, pos_inf, neg_inf, finite = _split_nonfinite(v)
    largest = tl.max(tl.abs(finite), axis=1)  # exact in any order
    biased = (largest.to(tl.int64, bitcast=True) >> 52) & 0x7FF  # 0 for a subnormal or zero
    exponent = (tl.maximum(biased, 1) - 1023).to(tl.int32)  # largest < 2**(exponent + 1)
    total = _grid_sum(finite, exponent)
    return _merge_nonfinite(total, is_nan, pos_inf, neg_inf)


# --- keys --------------------------------------------------------------------------------------


@triton.jit
def monotone_key(scores):
    """int32 keys whose signed order is the fp32 value order (-0.0 canonicalized to +0.0).

    ``scores`` fp32 (any shape).  The bits of -0.0 (:data:`NEG_ZERO_BITS`) become +0.0's; a
    non-negative value keeps its bits; a negative one has its magnitude bits flipped
    (xor :data:`MAGNITUDE_MASK`), so more negative is smaller.  -inf is -2139095041, +inf
    0x7f800000; NaNs sort by their bits (positive NaNs above +inf, negative below -inf).  The
    kernel twin of :func:`batchinv.reference.topk.monotone_key`.
    """
    bits = scores.to(tl.int32, bitcast=True)
    bits = tl.where(bits == NEG_ZERO_BITS, 0, bits)
    return tl.where(bits < 0, bits ^ MAGNITUDE_MASK, bits)
