"""Triton kernel of RMS norm and fused residual-add + RMS norm (only ``@triton.jit`` code).

One program normalizes ``BLOCK_M`` whole rows.  The squares of a row are accumulated in fp64
(``FP64_SUM``; the pinned configs always set it): an fp32 value squared is exact in fp64 and
the sum of N <= 2^20 of them cannot overflow (at most 2^20 * 2^256), so no finite row
overflows.  They are summed in a ``[BLOCK_M, BLOCK_N]`` tile over ``cdiv(n_cols, BLOCK_N)``
column chunks (chunk 0 first), then reduced along the columns by one ``tl.sum``.  Every
constexpr that shapes that order (``BLOCK_N``, ``SINGLE_TILE``, ``ROW_ALIGN``, ``FP64_SUM`` and
the launch's ``num_warps``) comes from the launcher's config table, keyed on (arch, dtype,
hidden size) only, so the order is a function of the row length alone.  Row-validity masks
never touch the column reduction.

Per row, ``rstd = 1 / sqrt(sum / N + eps)`` is computed in fp64 (correctly rounded: Triton
lowers fp64 ``/`` to ``div.rn.f64`` and fp64 ``sqrt`` to ``sqrt.rn.f64``; the interpreter uses
numpy's IEEE fp64) and handed to the fp32 scaling pass as ``s * r`` with ``s`` a power of two
(1, or 2^-64 when rstd < 2^-64, i.e. rms > 2^64) and ``r = fl32(rstd / s)``, so ``r`` is a
normal fp32 even for rows near the fp32 maximum (whose rstd, about 2^-128, is subnormal in fp32).
fp64 adds, divisions and products here never see an operand pair that FMA contraction could
fuse into different bits (the squares are exact), so the GPU and the interpreter agree up to the
order of the fp64 sum.

Cost (estimate; the device run measures it): per element one fp32 -> fp64 conversion, one
fp64 FMA and one fp32 multiply (by the power of two) on top of the fp32 kernel.  On an
H100/H200 (132 SMs, ~1.98 GHz) a bf16 norm moving 4 bytes per element at ~4.8 TB/s handles
~4.6 elements per SM-clock, against ~16 fp64 conversions and 64 fp64 FMAs per SM-clock: about
30% and 7% of those pipes, so memory-bound shapes should not slow down; small batches pay the
per-row fp64 division and square root (tens of cycles of latency, once per row).

Launchers, validation and the config table live in :mod:`batchinv.fast.rms_norm`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _h_chunk(
    x_rows,
    res_rows,
    res_out_rows,
    c,
    mask,
    DTYPE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    WRITE: tl.constexpr,
):
    """The normalized input h of one chunk, as fp32 (exact): x, or with HAS_RESIDUAL
    round(x + residual) (fp32 add, one rounding to DTYPE), stored to residual_out when WRITE.

    bf16 is widened and rounded on its integer bits: a 16-bit shift up, and round to nearest
    even (NaN -> 0x7fc0, as torch) down.  That is bitwise what the GPU's conversions give for
    every non-NaN, and what the interpreter's own bf16 casts get wrong (they mangle subnormals
    and truncate).  Other dtypes use plain casts (numpy rounds fp16 correctly).
    """
    h = tl.load(x_rows + c[None, :], mask=mask, other=0.0)
    if DTYPE == tl.bfloat16:
        hf = (h.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        hf = h.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_rows + c[None, :], mask=mask, other=0.0)
        if DTYPE == tl.bfloat16:
            s = hf + (r.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            bits = s.to(tl.uint32, bitcast=True)
            bits = tl.where(s != s, 0x7FC00000, (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000)
            hf = bits.to(tl.float32, bitcast=True)
            h = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            h = (hf + r.to(tl.float32)).to(DTYPE)
            hf = h.to(tl.float32)
        if WRITE:
            tl.store(res_out_rows + c[None, :], h, mask=mask)
    return hf


@triton.jit
def _store_out(out_rows, weight_ptr, c, mask, hf, scale, r, n_cols, DTYPE: tl.constexpr):
    """out = round(((h * scale) * r) * w) for one chunk, with rstd = scale * r split per row
    (scale a power of two, so h * scale is exact unless it underflows): fp32 products, one
    rounding to DTYPE."""
    w = tl.load(weight_ptr + c, mask=c < n_cols, other=0.0)
    if DTYPE == tl.bfloat16:
        wf = (w.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        wf = w.to(tl.float32)
    y = ((hf * scale[:, None]) * r[:, None]) * wf[None, :]
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = tl.where(y != y, 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
        tl.store(out_rows + c[None, :], bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out_rows + c[None, :], y.to(DTYPE), mask=mask)


@triton.jit
def _square(hf, FP64_SUM: tl.constexpr):
    """h^2 for the sum of squares: exact in fp64 (a 24-bit significand squared has 48 bits and
    2^-298 <= h^2 <= 2^256 for nonzero finite fp32 h); FP64_SUM=False (baselines only) squares
    in fp32, which overflows past |h| = 2^64 as production fp32 norms do."""
    if FP64_SUM:
        h64 = hf.to(tl.float64)
        return h64 * h64
    else:
        return hf * hf


@triton.jit
def _rstd_split(sum_sq, n_cols, eps, BLOCK_M: tl.constexpr):
    """rstd = 1 / sqrt(sum_sq / N + eps) in fp64, returned as fp32 ``(scale, r)`` with
    rstd ~= scale * r: scale = 1, or 2^-64 where rstd < 2^-64, so r = fl32(rstd / scale) is a
    normal fp32 (2^-64 <= r <= 2^75; rstd lies in [2^-128, 2^74.5] for finite rows and an
    eps >= 2^-149).  A NaN rstd (NaN in the row) stays NaN in r; an infinite row gives rstd = 0.
    eps arrives as fp32 (the launcher rounds it) and is widened exactly; sum_sq / N + eps cannot
    overflow fp64."""
    mean_sq = sum_sq / tl.full([BLOCK_M], n_cols, tl.float64)
    rstd = 1.0 / tl.sqrt(mean_sq + tl.full([BLOCK_M], eps, tl.float32).to(tl.float64))
    tiny = rstd < 5.421010862427522e-20  # 2^-64
    r = tl.where(tiny, rstd * 1.8446744073709552e19, rstd).to(tl.float32)  # * 2^64: exact
    scale = tl.where(tiny, 5.421010862427522e-20, 1.0).to(tl.float32)
    return scale, r


# n_rows and the strides are never specialized: Triton would otherwise compile a different
# variant for n_rows == 1 or for a row stride divisible by 16, which may change vectorization
# and with it the layout of the reduction.  Row alignment is pinned by ROW_ALIGN instead (the
# strides arrive in units of ROW_ALIGN elements).
@triton.jit(
    do_not_specialize=[
        "n_rows",
        "stride_x_row",
        "stride_res_row",
        "stride_out_row",
        "stride_res_out_row",
    ]
)
def rms_norm_rows_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    n_rows,
    n_cols,
    stride_x_row,
    stride_res_row,
    stride_out_row,
    stride_res_out_row,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    FP64_SUM: tl.constexpr,
):
    """out = x * w / sqrt(mean(x^2) + eps) per row; with HAS_RESIDUAL, x := round(x + residual)
    is also written to residual_out.  SINGLE_TILE means BLOCK_N >= n_cols: the row stays in
    registers between the reduction and the scaling pass.  FP64_SUM: squares summed in fp64
    (every pinned config); False only for the fp32-accumulating baselines.  ``eps`` is an fp32
    scalar (already rounded by the launcher)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    # int64: row * stride passes 2^31 for large batches of wide rows.
    rows64 = rows.to(tl.int64)
    x_rows = x_ptr + rows64[:, None] * stride_x_row * ROW_ALIGN
    out_rows = out_ptr + rows64[:, None] * stride_out_row * ROW_ALIGN
    # Without a residual these point at x and out and are never dereferenced.
    res_rows = residual_ptr + rows64[:, None] * stride_res_row * ROW_ALIGN
    res_out_rows = residual_out_ptr + rows64[:, None] * stride_res_out_row * ROW_ALIGN
    cols = tl.arange(0, BLOCK_N)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty

    if FP64_SUM:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SINGLE_TILE:
        mask = row_mask[:, None] & (cols[None, :] < n_cols)
        hf = _h_chunk(x_rows, res_rows, res_out_rows, cols, mask, DTYPE, HAS_RESIDUAL, True)
        acc += _square(hf, FP64_SUM)
    else:
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            hf = _h_chunk(x_rows, res_rows, res_out_rows, c, mask, DTYPE, HAS_RESIDUAL, True)
            acc += _square(hf, FP64_SUM)
    sum_sq = tl.sum(acc, axis=1).to(tl.float64)
    scale, r = _rstd_split(sum_sq, n_cols, eps, BLOCK_M)

    if SINGLE_TILE:
        _store_out(out_rows, weight_ptr, cols, mask, hf, scale, r, n_cols, DTYPE)
    else:
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            # h again from the inputs (bitwise the value summed above); reading residual_out
            # back would race with other threads' stores of this program.
            hf = _h_chunk(x_rows, res_rows, res_out_rows, c, mask, DTYPE, HAS_RESIDUAL, False)
            _store_out(out_rows, weight_ptr, c, mask, hf, scale, r, n_cols, DTYPE)
