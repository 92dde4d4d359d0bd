"""Batch-invariant softmax and log_softmax over the last dim: launchers of ``kernels/softmax.py``.

Each launcher validates its arguments (typed errors), allocates the output, picks the kernel
configuration from :data:`SOFTMAX_TABLE` (keyed on arch, dtype and row length only) and
launches one program per tile of ``block_m`` rows (one per row for vocabulary-sized rows on GPUs).
No host synchronisation, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.softmax import softmax_kernel
from batchinv.fast.row_config import ANY_LENGTH, Bucket, RowConfig, lookup
from batchinv.reference.softmax import check_softmax_args

# The configuration table.  It is keyed ONLY on (arch, dtype, row length): the tile sets the
# reduction order, so a key on the number of rows would make a row's bits depend on its batch.
# Never add the row count (or anything derived from it, like "rows < SM count") to this key;
# a CPU test checks that the launcher's plan is the same at every M.
SOFTMAX_TABLE: Final = MappingProxyType(
    {
        # GPUs: short rows share a program; vocabulary rows get one program each and loop over
        # 4096 (fp32) / 8192 (16-bit) column chunks -- 32 bytes per thread per chunk at 16 warps.
        # Vocab 151936 does not fit one register-resident block.
        ("gpu", torch.float32): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(4096, RowConfig(1, 4096, 8)),
            Bucket(ANY_LENGTH, RowConfig(1, 4096, 16)),
        ),
        ("gpu", torch.bfloat16): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(ANY_LENGTH, RowConfig(1, 8192, 16)),
        ),
        ("gpu", torch.float16): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(ANY_LENGTH, RowConfig(1, 8192, 16)),
        ),
        # The Triton interpreter (cpu lane) pays per operation, not per element: 64-row tiles,
        # and 128-column chunks so short rows still loop and end in a masked tail.  Rows longer
        # than 1024 take the GPUs' vocabulary path shape (one program per row).
        ("interp", torch.float32): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
        ("interp", torch.bfloat16): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
        ("interp", torch.float16): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
    }
)


def softmax_config(arch_name: str, dtype: torch.dtype, n_cols: int) -> RowConfig:
    """The configuration for rows of ``n_cols`` elements of input ``dtype`` on ``arch_name``.

    The signature is the key: (arch, dtype, row length), never the number of rows.
    """
    return lookup(SOFTMAX_TABLE, arch_name, dtype, n_cols)


def reduction_depth(config: RowConfig, n_cols: int) -> tuple[int, int]:
    """(chunks, combine) of the pinned reduction, in fp32 roundings: each lane adds ``chunks``
    terms in sequence; the fixed-point combine costs two roundings (int64 -> fp64 -> fp32) plus
    truncations below 2**-29 of the largest lane, counted as part of them.  For tolerances."""
    return max(1, math.ceil(n_cols / config.block_n)), 2


def launch(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    log: bool,
    config: RowConfig | None = None,
    fixed_point: bool = True,
) -> torch.Tensor:
    """Launch the kernel on validated arguments.  ``config`` (instead of the table) and
    ``fixed_point=False`` (a float ``tl.sum`` lane combine) are for the unpinned baseline only."""
    x = kernel_operand(x)  # a negated view (x.conj().imag) is resolved, never read raw
    n_cols = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, n_cols)  # (R, V); a view whenever the strides allow
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)  # contiguous (..., V)
    num_rows = x2.shape[0]
    if num_rows == 0 or n_cols == 0:
        return y
    if config is None:
        config = softmax_config(arch(x.device), x.dtype, n_cols)
    grid = (triton.cdiv(num_rows, config.block_m),)
    with interpreter_quiet():
        softmax_kernel[grid](
            x2,
            y,
            num_rows,
            n_cols,
            x2.stride(0),
            x2.stride(1),
            n_cols,  # y is contiguous (R, V)
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            LOG=log,
            FIXED_POINT=fixed_point,
            num_warps=config.num_warps,
        )
    return y


def softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Batch-invariant softmax over the last dim (Triton, one program per row tile).

    ``y[r, v] = exp(x[r, v] - max_v' x[r, v']) / sum_v'' exp(x[r, v''] - max_v' x[r, v'])``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16; any strides
        (a 3-D input whose leading dims cannot be merged is copied first).
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        As ``aten::_softmax(x, dim, half_to_float)``: bf16/fp16 in, float32 out.

    Returns
    -------
    Tensor, same shape as ``x``, contiguous; dtype float32 if ``half_to_float`` else ``x.dtype``.

    Notes
    -----
    Math in fp32: per-lane online max/sum over fixed ``block_n``-column chunks, an order-free
    fixed-point combine of the lanes, then ``exp(x - max) / sum``.  ``block_n`` comes from
    :data:`SOFTMAX_TABLE` keyed on (arch, dtype, V), so a row's output bits are invariant along
    the batch axes: the number of rows, the row's position and neighbours, its strides (the
    combine does not follow the vector width Triton derives from alignment), and earlier calls.
    NaN or +inf anywhere in a row, or a row of all -inf: the whole row is NaN (as aten).
    -inf entries of a finite row give +0; outputs are never -0.  Subnormal inputs are ordinary
    values; a GPU may flush subnormal intermediates (outputs below 2**-126) to zero.

    Raises
    ------
    DTypeError
        ``x`` is not float32/bfloat16/float16.
    ArgumentError
        ``x`` not 2-D/3-D; ``dim`` not the last dim or out of range; ``half_to_float`` with a
        float32 input.
    DeviceError
        ``x`` is not a CUDA tensor (CPU tensors are accepted under ``TRITON_INTERPRET=1``).

    Source: online softmax (Milakov & Gimelshein 2018), with the reduction order pinned.
    """
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    return launch(x, out_dtype, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Batch-invariant log_softmax over the last dim (Triton, one program per row tile).

    ``y[r, v] = (x[r, v] - max_v' x[r, v']) - log(sum_v'' exp(x[r, v''] - max_v' x[r, v']))``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16; any strides.
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        As ``aten::_log_softmax(x, dim, half_to_float)``: bf16/fp16 in, float32 out.

    Returns
    -------
    Tensor, same shape as ``x``, contiguous; dtype float32 if ``half_to_float`` else ``x.dtype``.

    Notes
    -----
    Same pinned reduction as :func:`softmax`, so the same invariance axes.  NaN or +inf in a
    row, or a row of all -inf: the whole row is NaN; -inf entries of a finite row give -inf.
    The row maximum gives exactly +0 when the sum is exactly 1 (all other terms underflow).
    ``x - max`` is formed in fp32: where it falls below -3.4e38 (a row holding both -max_normal
    and +max_normal) the output is -inf, as in torch's fp32 log_softmax.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As :func:`softmax`.

    Source: online softmax (Milakov & Gimelshein 2018), with the reduction order pinned.
    """
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    return launch(x, out_dtype, log=True)
