"""Triton kernel of RMS norm and fused residual-add + RMS norm (only ``@triton.jit`` code).

One program normalizes ``BLOCK_M`` whole rows.  The sum of squares of a row is accumulated in
a ``[BLOCK_M, BLOCK_N]`` fp32 tile over ``cdiv(n_cols, BLOCK_N)`` column chunks (chunk 0
first), then reduced along the columns by one ``tl.sum``.  Every constexpr that shapes that
order (``BLOCK_N``, ``SINGLE_TILE``, ``ROW_ALIGN`` and the launch's ``num_warps``) comes from
the launcher's config table, keyed on (arch, dtype, hidden size) only, so the order is a
function of the row length alone.  Row-validity masks never touch the column reduction.

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
def _store_out(out_rows, weight_ptr, c, mask, hf, rstd, n_cols, DTYPE: tl.constexpr):
    """out = round((h * rstd) * w) for one chunk: two fp32 products, one rounding to DTYPE."""
    w = tl.load(weight_ptr + c, mask=c < n_cols, other=0.0)
    if DTYPE == tl.bfloat16:
        wf = (w.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        wf = w.to(tl.float32)
    y = (hf * rstd[:, None]) * wf[None, :]
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = tl.where(y != y, 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
        tl.store(out_rows + c[None, :], bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(out_rows + c[None, :], y.to(DTYPE), mask=mask)


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
):
    """out = x * w / sqrt(mean(x^2) + eps) per row; with HAS_RESIDUAL, x := round(x + residual)
    is also written to residual_out.  SINGLE_TILE means BLOCK_N >= n_cols: the row stays in
    registers between the reduction and the scaling pass."""
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

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SINGLE_TILE:
        mask = row_mask[:, None] & (cols[None, :] < n_cols)
        hf = _h_chunk(x_rows, res_rows, res_out_rows, cols, mask, DTYPE, HAS_RESIDUAL, True)
        acc += hf * hf
    else:
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            hf = _h_chunk(x_rows, res_rows, res_out_rows, c, mask, DTYPE, HAS_RESIDUAL, True)
            acc += hf * hf
    sum_sq = tl.sum(acc, axis=1)
    # Correctly rounded division and square root: the same bits on every arch and in the
    # interpreter (Triton's plain fp32 `/` is an approximate division on NVIDIA GPUs).
    mean_sq = tl.math.div_rn(sum_sq, tl.full([BLOCK_M], n_cols, tl.float32))
    rstd = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.sqrt_rn(mean_sq + eps))

    if SINGLE_TILE:
        _store_out(out_rows, weight_ptr, cols, mask, hf, rstd, n_cols, DTYPE)
    else:
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < n_cols)
            # h again from the inputs (bitwise the value summed above); reading residual_out
            # back would race with other threads' stores of this program.
            hf = _h_chunk(x_rows, res_rows, res_out_rows, c, mask, DTYPE, HAS_RESIDUAL, False)
            _store_out(out_rows, weight_ptr, c, mask, hf, rstd, n_cols, DTYPE)
