"""Launchers of the batch-invariant RMS norm kernels (validation, config, allocation, grid).

Pinned: everything that shapes a row's reduction order comes from :data:`CONFIGS` (or
:func:`derive_config` for a hidden size outside the table), keyed on (arch, dtype, hidden size)
only.  The number of rows never selects anything: it only sets the grid.  Triton's own
specialization is pinned too: ``n_rows`` and the row strides are never specialized, and row
alignment is a config field (``row_align``) rather than a property of the pointers handed in;
an operand whose rows miss that alignment is staged into a fresh, aligned buffer first (a copy
production inputs never need), so every call with the same key runs the same compiled kernel.

The kernel itself is :func:`batchinv.fast.kernels.rms_norm.rms_norm_rows_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.execution import check_power_of_two
from batchinv.fast.kernels.rms_norm import rms_norm_rows_kernel
from batchinv.reference.errors import check_same_device
from batchinv.reference.rms_norm import check_rms_norm_args, eps_float32

#: Bytes of one vectorized access; rows aligned to it can be loaded 16 bytes at a time.
VECTOR_BYTES = 16


@dataclass(frozen=True)
class RmsNormConfig:
    """The launch configuration of the RMS norm kernels (``rms_norm``, ``fused_add_rms_norm``)
    for one (arch, dtype, hidden size).

    Attributes:
        block_m: rows per program (the rows of a tile are reduced independently).
        block_n: columns per chunk of the reduction tile; the row is summed in
            ``cdiv(N, block_n)`` chunks into a ``[block_m, block_n]`` accumulator.
        num_warps: warps per program (part of the compiled reduction layout).
        row_align: elements every row start is aligned to (16 bytes' worth when N allows it,
            else 1); inputs that miss it are staged into an aligned copy.
        fp64_sum: the squares are summed in fp64 (exact squares, no overflow for any finite
            row).  True in every pinned config; False only in baselines that model the
            production fp32 accumulation.
    """

    block_m: int
    block_n: int
    num_warps: int
    row_align: int
    fp64_sum: bool = True

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "row_align"):
            check_power_of_two(name, getattr(self, name))

    def single_tile(self, n_cols: int) -> bool:
        return self.block_n >= n_cols


ConfigKey = tuple[str, torch.dtype, int]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_GPU_ARCHES = ("sm90", "sm100")
#: Hidden sizes of the production lanes (plus an odd one, which has no aligned rows).
PRODUCTION_HIDDEN: tuple[int, ...] = (2048, 4096, 5121, 7168, 8192)
#: Whole rows up to this many columns are held in registers (one tile, one read of x).
_MAX_SINGLE_TILE = 8192
#: The chunk width beyond that.
_CHUNK = 4096


def _row_align(dtype: torch.dtype, n_cols: int) -> int:
    vec = VECTOR_BYTES // torch.empty((), dtype=dtype).element_size()
    return vec if n_cols % vec == 0 else 1


def derive_config(arch_name: str, dtype: torch.dtype, n_cols: int) -> RmsNormConfig:
    """The config rule, a function of (arch, dtype, hidden size) only (never of the rows).

    Whole rows up to 8192 columns sit in one tile (one read of x); wider rows loop over
    4096-column chunks.  GPUs take one row per program from 1024 columns up and pack short rows
    to about 1024 elements per program; the interpreter packs up to 512 rows per program, which
    only saves interpreter time (each row's column order is the same).
    """
    block_n = triton.next_power_of_2(n_cols)
    if block_n > _MAX_SINGLE_TILE:
        block_n = _CHUNK
    if arch_name == "interp":
        block_m = max(1, min(512, 131072 // block_n))
    else:
        block_m = max(1, 1024 // block_n)
    if arch_name != "interp" and block_n <= _MAX_SINGLE_TILE:
        # One whole row in registers: 4 warps up to 4096 columns, 8 above (runs 53-54, H200,
        # bf16: 7168 columns at 1024 rows 10.3 us with 8 warps, 12.1 with 16; at 4096 rows 37.7
        # with 8, 42.3 with 4; 4096 columns at 1024 rows 5.9 with 4, 6.5 with 8).
        num_warps = 4 if block_n <= 4096 else 8
    else:
        num_warps = min(16, max(4, block_n // 512))
    return RmsNormConfig(
        block_m=block_m, block_n=block_n, num_warps=num_warps, row_align=_row_align(dtype, n_cols)
    )


#: The config table.  Keyed ONLY on (arch, dtype, hidden size): never on the number of rows,
#: since anything that changes with the rows could change a row's reduction order and with it
#: its bits.  tests/components/test_rms_norm.py checks the key and that every M runs one config.
CONFIGS: MappingProxyType[ConfigKey, RmsNormConfig] = MappingProxyType(
    {(a, d, n): derive_config(a, d, n) for a in _GPU_ARCHES for d in _DTYPES for n in PRODUCTION_HIDDEN}
)


def config_for(arch_name: str, dtype: torch.dtype, n_cols: int) -> RmsNormConfig:
    """The config of (arch, dtype, hidden size): the table entry, else :func:`derive_config`."""
    return CONFIGS.get((arch_name, dtype, n_cols)) or derive_config(arch_name, dtype, n_cols)


def _aligned(t: torch.Tensor, row_align: int) -> torch.Tensor:
    """``t`` itself when its rows are unit-stride and start on ``row_align`` elements, else an
    aligned contiguous copy (same values, fresh allocation)."""
    if t.dim() == 1:
        ok = t.stride(0) == 1 or t.shape[0] <= 1
    else:
        ok = (t.stride(1) == 1 or t.shape[1] <= 1) and (t.shape[0] <= 1 or t.stride(0) % row_align == 0)
    ok = ok and t.data_ptr() % (row_align * t.element_size()) == 0
    if ok:
        return t
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _row_stride(t: torch.Tensor, row_align: int) -> int:
    # A single row has no meaningful row stride; 0 keeps the argument in one class.
    return 0 if t.shape[0] <= 1 else t.stride(0) // row_align


def launch_rows(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    config: RmsNormConfig,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Allocate the outputs, stage misaligned operands and launch the kernel with ``config``.

    Arguments are already validated.  Returns ``(out, residual_out)`` (the latter None without
    a residual).  Also used by the baselines, which pass a config of their own.
    """
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else None
    if n_rows == 0:
        return out, residual_out
    align = config.row_align
    # The kernel reads raw memory: negative-bit views (z.conj().imag) are materialized first.
    x = _aligned(kernel_operand(x), align)
    weight = _aligned(kernel_operand(weight), align)
    if residual is not None:
        residual = _aligned(kernel_operand(residual), align)
    grid = (triton.cdiv(n_rows, config.block_m),)
    # The interpreter evaluates the kernel with numpy, which warns on IEEE results such as
    # inf * 0 = NaN; they are the documented behaviour here, not errors.
    with interpreter_quiet():
        rms_norm_rows_kernel[grid](
            x,
            residual if residual is not None else x,
            weight,
            out,
            residual_out if residual_out is not None else out,
            n_rows,
            n_cols,
            _row_stride(x, align),
            _row_stride(residual, align) if residual is not None else 0,
            _row_stride(out, align),
            _row_stride(residual_out, align) if residual_out is not None else 0,
            eps_float32(eps),  # the eps rule: rounded to fp32 once, here (the reference too)
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            SINGLE_TILE=config.single_tile(n_cols),
            ROW_ALIGN=align,
            HAS_RESIDUAL=residual is not None,
            FP64_SUM=config.fp64_sum,
            num_warps=config.num_warps,
        )
    return out, residual_out


def _check_devices(x: torch.Tensor, *others: tuple[str, torch.Tensor]) -> None:
    check_launch_device("x", x)
    for name, t in others:
        check_launch_device(name, t)
        check_same_device(name, t, x.device)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """Batch-invariant RMS norm (Triton): fp64 sum of squares, fp32 scaling, one final rounding.

    ``out[m, n] = round(x[m, n] * rstd[m] * weight[n])``,
    ``rstd[m] = 1 / sqrt(sum_k x[m, k]^2 / N + eps32)``: the squares (exact in fp64) summed in
    fp64 in an order fixed by N (see :mod:`batchinv.fast.kernels.rms_norm`); mean, eps add,
    square root and reciprocal correctly rounded in fp64; rstd rounded once to fp32 (split off
    a power of two when it is below 2^-64, so it stays a normal fp32); the two products in
    fp32; then one rounding to x's dtype.  No finite row overflows: up to rounding,
    RMSNorm(a * x) = RMSNorm(x) wherever a^2 * mean(x^2) dominates eps, and for a power of two
    a the bits are equal whenever eps is below half an fp64 ULP of both mean squares and no
    value is subnormal.

    eps rule: eps32 = eps rounded to the nearest float32, here and in the reference
    (:func:`batchinv.reference.rms_norm.eps_float32`); every eps with a finite, nonzero float32
    rounding is accepted and computed correctly, since ``mean + eps32`` is formed in fp64 (for
    x = [5e18] * 4, eps = 3.3e38: 0.26537).

    Parameters
    ----------
    x : Tensor (M, N), bfloat16, float16 or float32; rows may be strided (column stride 1 is
        used as is, anything else is staged into a contiguous copy)
    weight : Tensor (N,), x's dtype
    eps : real, > 0 with a finite, nonzero float32 rounding (the value used)
    dim : int, the normalized dimension; only the last one (-1 or 1) is supported

    Returns
    -------
    Tensor (M, N), x's dtype, contiguous.  Bitwise invariant along M (the batch size), a row's
    position and neighbours, the row's offset inside a wider buffer, and repeated calls.
    NaN in a row makes the row NaN; +-inf makes mean(x^2) infinite, so finite elements become
    +-0 and infinite ones NaN; zeros keep the sign of x * weight.  An output whose value is past
    the dtype's range (a weight near the maximum) is +-inf.  Subnormal inputs are kept (no flush
    to zero in the data path).

    Raises
    ------
    DTypeError, ArgumentError : bad dtype, shape, ``dim`` or ``eps``
        (:func:`batchinv.reference.rms_norm.check_rms_norm_args`).
    DeviceError : operands on different devices, or CPU tensors outside the interpreter.

    Source: the one-row-per-program Triton norm of the Triton tutorials / flashinfer
    ``triton/norm.py``, with every tiling choice keyed on the hidden size.
    """
    check_rms_norm_args(x, weight, eps, dim)
    _check_devices(x, ("weight", weight))
    # Keyed on (arch, dtype, hidden size) only -- never on x.shape[0], the number of rows.
    config = config_for(arch(x.device), x.dtype, x.shape[1])
    out, _res = launch_rows(x, None, weight, eps, config)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    dim: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant residual add + RMS norm (Triton), one pass: ``(out, residual_out)``.

    ``residual_out = round(x + residual)`` (fp32 add, one rounding to x's dtype: correctly
    rounded, since fp32 holds 2p + 2 bits of bf16/fp16 operands), then
    ``out = rms_norm(residual_out, weight, eps)`` exactly as :func:`rms_norm` computes it.

    Parameters
    ----------
    x, residual : Tensor (M, N), bfloat16, float16 or float32, the same dtype and shape
    weight : Tensor (N,), x's dtype
    eps : real, > 0 with a finite, nonzero float32 rounding (the value used, as in :func:`rms_norm`)
    dim : int, the normalized dimension; only the last one (-1 or 1) is supported

    Returns
    -------
    (out, residual_out) : Tensors (M, N), x's dtype, new buffers (inputs are not modified).
    Bitwise invariant along the same axes as :func:`rms_norm`.  inf + -inf gives NaN.  A finite
    x + residual past the dtype's range rounds to +-inf in residual_out (IEEE overflow); that
    row is then an infinite input to the norm, not a finite one, and its out follows
    :func:`rms_norm`'s infinity rule (+-0 for finite elements, NaN for the infinite ones).

    Raises
    ------
    DTypeError, ArgumentError : bad dtype, shape, ``dim`` or ``eps``.
    DeviceError : operands on different devices, or CPU tensors outside the interpreter.

    Source: vLLM's ``fused_add_rms_norm`` contract, out-of-place.
    """
    check_rms_norm_args(x, weight, eps, dim, residual, with_residual=True)
    _check_devices(x, ("residual", residual), ("weight", weight))
    # Keyed on (arch, dtype, hidden size) only -- never on x.shape[0], the number of rows.
    config = config_for(arch(x.device), x.dtype, x.shape[1])
    out, residual_out = launch_rows(x, residual, weight, eps, config)
    assert residual_out is not None
    return out, residual_out
