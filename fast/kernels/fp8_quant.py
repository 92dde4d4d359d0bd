"""Triton kernel of dynamic FP8 (e4m3fn) quantization, per token or per 1 x G group (only
``@triton.jit`` code).

One program quantizes ``BLOCK_M`` rows of one *segment*: a whole row (per token) or one group
of ``seg_len`` elements.  Per segment: ``amax`` = the max of |x| over the finite elements (a
max is exact and order-free, so neither the chunking nor the grid can change it), then
``scale = fl32(max(amax, MIN_AMAX) / 448)`` and ``q = e4m3(fl32(x / scale))``, both divisions
correctly rounded fp32 quotients (:func:`div_rn`: in fp64, rounded once to fp32; Triton's plain
fp32 ``/`` is the approximate ``div.full.f32`` on GPUs).  A
segment that fits one ``BLOCK_K`` chunk (``SINGLE_CHUNK``) stays in registers between the two
passes; a longer one is read twice.

The e4m3 rounding (:func:`e4m3_rne_satfinite`) is done with integer operations on the fp32 bits
on every lane, GPU and interpreter alike: the interpreter's float -> fp8 cast truncates and does
not saturate (``_convert_float`` in ``triton/runtime/interpreter.py``), and one code path keeps
the lanes bitwise comparable.  (On sm89+ Triton lowers ``.to(tl.float8e4nv)`` to
``cvt.rn.satfinite.e4m3x2.f32``, which should give the same bits up to the sign of NaN; it is
not used.)  q is stored as its uint8 bits.  bf16 is widened by a 16-bit shift (exact on every
lane; the interpreter's bf16 cast is slow on subnormals), fp16 by a plain cast (exact).

Every element's bits are a function of its own value and its segment's amax: invariant along
M, the row's position, its neighbours, the grid and the config.  The launcher is
:mod:`batchinv.fast.fp8_quant`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import POS_INF, exact_fp32

# Constants used inside kernels must be tl.constexpr globals to compile on a real GPU.
#: The floor of amax (reference.fp8_quant.MIN_AMAX, 2^-64).
MIN_AMAX: tl.constexpr = tl.constexpr(5.421010862427522e-20)
#: The largest float8_e4m3fn value.
E4M3_MAX: tl.constexpr = tl.constexpr(448.0)


@triton.jit
def div_rn(a, b):
    """``fl32(a / b)`` correctly rounded, for fp32 ``a`` and ``b``: the quotient in fp64, rounded
    once to fp32 (53 >= 2 * 24 + 2 bits, so the double rounding is innocuous: Figueroa, "When is
    double rounding innocuous?", 1995).  ``tl.math.div_rn`` (``div.rn.f32``) is correctly rounded
    too; this replaced it while run 38's 1-ulp codes were being chased, and they turned out to be
    the reference's (CUDA's ``pow``, run 39).  Going back to it would save 12-37% (run 41) and
    needs a GPU re-check of the bits."""
    return (a.to(tl.float64) / b.to(tl.float64)).to(tl.float32)


@triton.jit
def e4m3_rne_satfinite(v, sign_of):
    """The float8_e4m3fn bits (uint8) of fp32 ``v``: round to nearest even, e4m3 subnormals
    kept, |v| >= 448 (+-inf included) saturated to 0x7E, NaN -> 0x7F, the sign bit of
    ``sign_of`` (the input x, whose quotient by a positive scale has its sign; a GPU division
    returns NaN without its sign) on every result (-0.0 -> 0x80, -NaN -> 0xFF).

    On the magnitude bits ``a`` (uint32): normal e4m3 (|v| >= 2^-6, a >= 121 << 23): drop 20
    mantissa bits to nearest even (add 0x7FFFF plus the kept LSB) and rebias the exponent
    (127 -> 7: minus 120 << 3); a carry into the exponent is the correct next binade.
    Subnormal e4m3 (|v| < 2^-6): k = round-even(significand / 2^shift) with the implicit bit,
    shift = 141 - exponent (the spacing 2^-9 in units of the fp32 ulp), capped at 31 (k = 0
    from shift 25 on); k = 8 is the code of 2^-6, the smallest normal.  Every intermediate is
    clamped so that no uint32 operation wraps and no shift reaches 32.
    """
    bits = v.to(tl.uint32, bitcast=True)
    sign = (sign_of.to(tl.uint32, bitcast=True) >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    an = tl.minimum(a, 0x43E00000)  # 448.0: the saturated values are replaced below
    normal = ((an + 0x7FFFF + ((an >> 20) & 1)) >> 20) - (120 << 3)
    e = tl.minimum(a >> 23, 120)
    shift = tl.minimum(141 - e, 31)  # 21 .. 31
    mant = (a & 0x7FFFFF) | 0x800000
    half_minus_one = 0xFFFFFFFF >> (33 - shift)  # 2^(shift - 1) - 1
    sub = (mant + half_minus_one + ((mant >> shift) & 1)) >> shift
    mag = tl.where(a >= (121 << 23), normal, sub)
    mag = tl.where(a >= 0x43E00000, 0x7E, mag)  # |v| >= 448, +-inf: satfinite
    mag = tl.where(a > 0x7F800000, 0x7F, mag)  # NaN
    return (sign | mag).to(tl.uint8)


@triton.jit
def _load_fp32(ptrs, mask):
    """x at ``ptrs`` widened exactly to fp32 (masked lanes 0)."""
    x = tl.load(ptrs, mask=mask, other=0.0)
    return exact_fp32(x)


@triton.jit
def _finite_abs(xf):
    """|x| where finite, 0 for NaN and +-inf (NaN < inf is False)."""
    ax = tl.abs(xf)
    return tl.where(ax < POS_INF, ax, 0.0)


# M and the strides are never specialized: Triton would otherwise compile another variant for
# M == 1 or a stride divisible by 16 (no bit could change here, but the rule of the kernels holds).
@triton.jit(do_not_specialize=["n_rows", "n_segs", "stride_xm", "stride_xk", "stride_qm", "stride_sm"])
def fp8_quant_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n_rows,
    n_cols,
    seg_len,
    n_segs,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_sm,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SINGLE_CHUNK: tl.constexpr,
):
    """q[m, k] = e4m3(x[m, k] / scale[m, s]), scale[m, s] = max(amax, 2^-64) / 448, for the
    segment s = k // seg_len (seg_len = K per token, G per group; n_segs segments per row).

    ``q_ptr`` points at q's bytes (uint8), ``scale_ptr`` at fp32 [M, NG].  ``SINGLE_CHUNK``:
    seg_len <= BLOCK_K, the segment is loaded once.
    """
    # One flat grid axis (CUDA's axis 1 stops at 65535): program = row block * n_segs + segment.
    pid = tl.program_id(0)
    pid_m = pid // n_segs
    seg = pid % n_segs
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    seg_start = seg * seg_len
    seg_end = tl.minimum(seg_start + seg_len, n_cols)
    x_rows = x_ptr + rows64[:, None] * stride_xm
    q_rows = q_ptr + rows64[:, None] * stride_qm
    cols = tl.arange(0, BLOCK_K)

    if SINGLE_CHUNK:
        c = seg_start + cols
        mask = row_mask[:, None] & (c[None, :] < seg_end)
        xf = _load_fp32(x_rows + c[None, :].to(tl.int64) * stride_xk, mask)
        amax = tl.max(_finite_abs(xf), axis=1)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, seg_len, BLOCK_K):
            c = seg_start + start + cols
            mask = row_mask[:, None] & (c[None, :] < seg_end)
            xf = _load_fp32(x_rows + c[None, :].to(tl.int64) * stride_xk, mask)
            amax = tl.maximum(amax, tl.max(_finite_abs(xf), axis=1))
    scale = div_rn(tl.maximum(amax, MIN_AMAX), tl.full([BLOCK_M], E4M3_MAX, tl.float32))
    tl.store(scale_ptr + rows64 * stride_sm + seg, scale, mask=row_mask)

    if SINGLE_CHUNK:
        q = e4m3_rne_satfinite(div_rn(xf, scale[:, None]), xf)
        tl.store(q_rows + c[None, :].to(tl.int64), q, mask=mask)
    else:
        for start in range(0, seg_len, BLOCK_K):
            c = seg_start + start + cols
            mask = row_mask[:, None] & (c[None, :] < seg_end)
            xf = _load_fp32(x_rows + c[None, :].to(tl.int64) * stride_xk, mask)
            q = e4m3_rne_satfinite(div_rn(xf, scale[:, None]), xf)
            tl.store(q_rows + c[None, :].to(tl.int64), q, mask=mask)
