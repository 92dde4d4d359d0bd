"""Unpinned baselines of RMS norm (negative controls), beside the pinned launchers.

* ``rows_block``: the batch-invariant kernel itself, but with the column tile chosen from the
  number of rows, the way production norms pick their block size from the token count (one
  public report: 1024 threads below 256 tokens, 256 above, 79 of 4096 rows one ULP off), and
  with their fp32 sum of squares (``fp64_sum=False``; the pinned kernel sums in fp64, where the
  order of a sum of exact bf16/fp16 squares rarely shows in the bits).  Below 256 rows a whole
  row is one tile (latency); from 256 rows on a half-row tile, summed over two chunks
  (occupancy).  The sum of squares is then accumulated in another order, so a row's bits
  depend on how many rows share the launch.  This varies on every lane, the interpreter
  included.
* ``torch``: ``torch.nn.functional.rms_norm`` (torch >= 2.4); the fused variant adds the
  residual with ``torch.add`` first.  On CUDA, ATen picks its vectorized one-block-per-row
  kernel only when every pointer is 16-byte aligned and falls back to a differently tiled
  kernel otherwise, so a row placed at an unaligned ``row_start`` can change bits (the
  composite fallback's reduction also plans its split from the number of rows).
* ``eps_by_batch_max``: the pinned kernel with ``eps`` scaled by the launch's largest finite
  ``|x|`` (``eps * max(1, amax)``), the way a norm that sizes its guard from the activations'
  dynamic range over the whole batch does: a row's rstd, hence its bits, follows the largest
  element of its neighbours.  Same shapes, same row, other neighbours' *values*: the negative
  control of the ``neighbours`` check (it also varies with M).  It syncs with the host (the amax
  becomes the launch's eps), so it is not timed.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from batchinv.fast.device import arch, check_launch_device
from batchinv.fast.rms_norm import RmsNormConfig, config_for, launch_rows, rms_norm
from batchinv.reference.rms_norm import check_rms_norm_args

#: The token count at which the rows-dependent heuristic switches tiles.
ROWS_SWITCH = 256


def rows_dependent_config(arch_name: str, dtype: torch.dtype, n_cols: int, n_rows: int) -> RmsNormConfig:
    """The pinned config with an fp32 sum of squares and ``block_n`` taken from the number of
    rows (the unpinned choice)."""
    pinned = replace(config_for(arch_name, dtype, n_cols), fp64_sum=False)
    if n_rows < ROWS_SWITCH:
        return pinned
    return replace(pinned, block_n=max(16, pinned.block_n // 2))


def rms_norm_rows_block(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> torch.Tensor:
    """:func:`batchinv.fast.rms_norm.rms_norm` with a rows-dependent column tile (unpinned)."""
    check_rms_norm_args(x, weight, eps, dim)
    check_launch_device("x", x)
    config = rows_dependent_config(arch(x.device), x.dtype, x.shape[1], x.shape[0])
    out, _res = launch_rows(x, None, weight, float(eps), config)
    return out


def fused_add_rms_norm_rows_block(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batchinv.fast.rms_norm.fused_add_rms_norm` with a rows-dependent column tile."""
    check_rms_norm_args(x, weight, eps, dim, residual, with_residual=True)
    check_launch_device("x", x)
    config = rows_dependent_config(arch(x.device), x.dtype, x.shape[1], x.shape[0])
    out, residual_out = launch_rows(x, residual, weight, float(eps), config)
    assert residual_out is not None
    return out, residual_out


def rms_norm_eps_by_batch_max(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> torch.Tensor:
    """:func:`batchinv.fast.rms_norm.rms_norm` with ``eps * max(1, amax)``, ``amax`` the largest
    finite ``|x|`` of the whole launch (unpinned: the eps of a row follows its neighbours)."""
    check_rms_norm_args(x, weight, eps, dim)
    xf = x.to(torch.float32)
    finite = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    amax = float(finite.amax()) if x.numel() else 0.0
    return rms_norm(x, weight, float(eps) * max(1.0, amax), dim)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` over the last dimension (the native op)."""
    check_rms_norm_args(x, weight, eps, dim)
    return rms_norm_torch_unchecked(x, weight, eps, dim)


def rms_norm_torch_unchecked(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> torch.Tensor:
    """:func:`rms_norm_torch` without the argument checks (the ``modes`` check's)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, float(eps))


def fused_add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` then ``torch.nn.functional.rms_norm(h)``: ``(out, h)`` (two native ops)."""
    check_rms_norm_args(x, weight, eps, dim, residual, with_residual=True)
    h = x + residual
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, float(eps)), h


def fused_add_rms_norm_torch_unchecked(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_add_rms_norm_torch` without the argument checks (the ``modes`` check's)."""
    h = x + residual
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, float(eps)), h
