"""Batch-invariant mean over the last dim: the launcher of ``kernels/mean.py``.

Validates its arguments (typed errors), allocates the output, picks the tile from
:data:`MEAN_TABLE` (keyed on arch, dtype and row length only) and launches one program per tile
of ``block_m`` rows.  No host synchronisation, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.mean import mean_kernel
from batchinv.fast.row_config import ANY_LENGTH, Bucket, RowConfig, lookup
from batchinv.reference.mean import check_mean_args

# The configuration table.  It is keyed ONLY on (arch, input dtype, row length): the tile sets
# the order of the additions, so a key on the number of rows would make a row's bits depend on
# its batch.  Never add the row count (or anything derived from it) to this key; a CPU test
# checks that the launcher's plan is the same at every M.
# Rows of 2049..8192 columns: 512-column chunks, 4 warps, one row per program (run 53, H200:
# 4096 columns bf16 took 27.5 us at 1024 rows with the 8192-column tile against torch.mean's
# 5.7, and 5.3 us with this one; the wide tile's fixed-point lane combine over 8192 lanes, most
# of them empty, dominated).  docs/BENCHMARKS.md has the table.
# ``RowConfig.num_stages`` pipelines the chunk loop without changing a bit (``ci/tune_rows.py``
# times depths 1-6).  Runs 65 and 67 (H100, docs/DEVICE_RUNS.md): the 512-column tile is fastest
# at depth 1 at every row count; the 16-bit vocabulary tile (8192-column chunks) is 2-11% faster
# with 8 warps at depth 3 than with 16 at depth 1 at 1, 64 and 1024 rows of 151936 columns, in
# both runs (run 67: 11.35 / 11.74 / 129.8 us against 11.54 / 12.42 / 144.1), with the same bits
# (the chunk order is the loop's, whatever the depth or warps).  fp32 keeps its 4096-column tile.
_GPU_UP_TO_8K: Final = Bucket(8192, RowConfig(1, 512, 4))
_GPU_16BIT: Final = (
    Bucket(256, RowConfig(8, 256, 4)),
    Bucket(2048, RowConfig(2, 2048, 8)),
    _GPU_UP_TO_8K,
    Bucket(ANY_LENGTH, RowConfig(1, 8192, 8, num_stages=3)),
)
_INTERP: Final = (
    Bucket(1024, RowConfig(64, 128, 1)),
    Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
)
MEAN_TABLE: Final = MappingProxyType(
    {
        ("gpu", torch.float32): (
            Bucket(256, RowConfig(8, 256, 4)),
            Bucket(2048, RowConfig(2, 2048, 8)),
            _GPU_UP_TO_8K,
            Bucket(ANY_LENGTH, RowConfig(1, 4096, 16)),
        ),
        ("gpu", torch.bfloat16): _GPU_16BIT,
        ("gpu", torch.float16): _GPU_16BIT,
        # The interpreter (cpu lane) pays per operation: 64-row tiles, 128-column chunks so
        # short rows still loop and end in a masked tail.
        ("interp", torch.float32): _INTERP,
        ("interp", torch.bfloat16): _INTERP,
        ("interp", torch.float16): _INTERP,
    }
)


def mean_config(arch_name: str, dtype: torch.dtype, n_cols: int) -> RowConfig:
    """The configuration for rows of ``n_cols`` elements of input ``dtype`` on ``arch_name``.

    The signature is the key: (arch, dtype, row length), never the number of rows.
    """
    return lookup(MEAN_TABLE, arch_name, dtype, n_cols)


#: The fixed-point lane combine truncates each lane to the grid 2**(e - 45), e the exponent of
#: the row's largest |lane|, over at most 2**16 lanes: it loses under 2**-29 of the largest lane.
COMBINE_LOSS: Final = 2.0**-29


def reduction_depth(config: RowConfig, n_cols: int) -> int:
    """Additions in sequence per lane (fp64 roundings at most) of the pinned sum: ``ceil(N /
    block_n)``.  The lane combine adds :data:`COMBINE_LOSS` of the largest lane and one rounding
    (int64 -> fp64).  For tolerances."""
    return max(1, math.ceil(n_cols / config.block_n))


def launch(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    keepdim: bool,
    config: RowConfig | None = None,
    fixed_point: bool = True,
) -> torch.Tensor:
    """Launch the kernel on validated arguments.  ``config`` (instead of the table) and
    ``fixed_point=False`` (the production-style fp32 path: fp32 lanes, a float ``tl.sum`` lane
    combine, fp32 division) are for the unpinned baseline only."""
    x = kernel_operand(x)  # a negated view (x.conj().imag) is resolved, never read raw
    n_cols = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, n_cols)  # (R, N); a view whenever the strides allow
    out_shape = (*x.shape[:-1], 1) if keepdim else x.shape[:-1]
    y = torch.empty(out_shape, dtype=out_dtype, device=x.device)  # contiguous: row r at flat index r
    num_rows = x2.shape[0]
    if num_rows == 0:
        return y
    if config is None:
        config = mean_config(arch(x.device), x.dtype, n_cols)
    grid = (triton.cdiv(num_rows, config.block_m),)
    with interpreter_quiet():
        mean_kernel[grid](
            x2,
            y,
            num_rows,
            n_cols,
            x2.stride(0),
            x2.stride(1),
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            FIXED_POINT=fixed_point,
            STAGES=config.num_stages,
            num_warps=config.num_warps,
        )
    return y


def mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Batch-invariant mean over the last dim (Triton, one program per row tile).

    ``y[r] = (1 / N) * sum_n x[r, n].to(dtype)``, accumulated and divided in fp64, rounded once.

    Parameters
    ----------
    x : Tensor, (R, N) or (B, S, N), float32, bfloat16 or float16; any strides (a 3-D input
        whose leading dims cannot be merged is copied first).
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``): the only dim whose reduction keeps rows
        independent.  Any other dim raises :class:`ArgumentError`.
    keepdim : bool
        Keep the reduced dim with size 1.
    dtype : torch.dtype or None
        As documented for ``torch.mean``: ``x`` is cast to it (float32, bfloat16 or float16)
        before reducing; the output has this dtype (``x.dtype`` when None).  (torch's own CPU
        kernel sums the uncast values for a bf16/fp16 ``dtype``; this follows the documentation.)

    Returns
    -------
    Tensor, (R,) or (B, S) -- (R, 1) / (B, S, 1) with ``keepdim`` -- contiguous, dtype as above.

    Notes
    -----
    Each element is rounded to ``dtype`` and widened to fp64 (exactly).  Each lane of a
    ``block_n``-column chunk adds its elements in fp64 in column order, then an order-free
    fixed-point combine adds the lanes (exact up to 2**-29 of the largest lane, then one
    rounding to fp64); ``block_n`` comes from :data:`MEAN_TABLE` keyed on (arch, dtype, N).
    The sum is divided by N in fp64 (correctly rounded on GPUs too: only fp32 ``/`` is
    approximate there) and rounded once to ``dtype`` (bf16/fp16 through fp32 rounded to odd,
    so no double rounding).  So a row's output bits are invariant along the batch axes: the
    number of rows, the row's position and neighbours, its strides, and earlier calls.  A mean
    of N equal values v is v exactly; the result is within a few fp64 ulps plus 2**-29 mean|x|
    of the exact mean before its one rounding to ``dtype``.
    NaN in a row gives NaN; +inf and -inf together give NaN; one sign of inf gives that inf.
    The sum starts from +0, so a row of -0 gives +0.  N = 0 gives NaN.  fp64 lanes cannot
    overflow on fp32/bf16/fp16 values (|lane| < 2**128 * N), so a row whose mean is finite
    gives a finite mean even when fp32 partial sums would overflow (unlike ``torch.mean`` on
    CUDA); a mean beyond ``dtype``'s range -- only when the cast to ``dtype`` overflows, since
    the mean lies between the row's extremes -- is +-inf.  Subnormal inputs are ordinary
    values unless the GPU flushes them (then they count as 0).

    Raises
    ------
    DTypeError
        ``x`` is not float32/bfloat16/float16, or ``dtype`` is not None or one of those.
    ArgumentError
        ``x`` not 2-D/3-D; ``dim`` not the last dim or out of range; ``keepdim`` not a bool.
    DeviceError
        ``x`` is not a CUDA tensor (CPU tensors are accepted under ``TRITON_INTERPRET=1``).

    Source: the definition, with ``torch.mean``'s cast-then-reduce meaning of ``dtype``.
    """
    out_dtype = check_mean_args(x, dim, keepdim, dtype)
    check_launch_device("x", x)
    return launch(x, out_dtype, keepdim)
