"""Unpinned mean paths: the negative controls of the ``mean`` component.

* ``torch_native``: ``torch.mean``.  torch's CUDA reduction picks its block shape (threads per
  output along the row) and its split across blocks from the number of output rows, so the
  order of a row's additions changes with M.
* ``triton_rows_heuristic``: the Triton kernel of ``fast/mean.py`` as a production kernel would
  run it: fp32 lanes (as ``torch.mean`` accumulates), a float ``tl.sum`` over them, an fp32
  division, and a chunk width chosen from the number of rows -- the choice the pinned launcher
  forbids.  Its order changes with M on every lane, the interpreter included.  (It keeps fp32 on
  purpose: it is the production default, and with fp64 lanes a changed order would rarely show
  through the final rounding to fp32, so the negative control would prove less.)
"""

from __future__ import annotations

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, sm_count
from batchinv.fast.mean import launch, mean_config
from batchinv.fast.row_config import RowConfig
from batchinv.reference.mean import check_mean_args

#: Widest chunk the row heuristic uses (columns).
WIDE_LIMIT = 16384


def torch_native_mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.mean(x, dim, keepdim, dtype=dtype)``."""
    check_mean_args(x, dim, keepdim, dtype)
    return torch_mean_unchecked(x, dim, keepdim, dtype)


def torch_mean_unchecked(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """:func:`torch_native_mean` without the argument checks (the ``modes`` check's)."""
    return torch.mean(x, dim=dim, keepdim=keepdim, dtype=dtype)


def rows_heuristic_config(device: torch.device, dtype: torch.dtype, num_rows: int, n_cols: int) -> RowConfig:
    """A production-style plan keyed on the number of rows (the unpinned choice): with fewer
    rows than SMs each program takes its whole row in one chunk (up to :data:`WIDE_LIMIT`), with
    a full GPU the table's chunk.  The chunk width sets the order of the additions."""
    pinned = mean_config(arch(device), dtype, n_cols)
    wide = min(triton.next_power_of_2(max(n_cols, 1)), WIDE_LIMIT)
    block_n = wide if num_rows < sm_count(device) else pinned.block_n
    return RowConfig(pinned.block_m, block_n, pinned.num_warps)


def triton_rows_heuristic_mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The mean kernel's fp32 path (fp32 lanes, a float lane sum, fp32 division) with a chunk
    width chosen from the number of rows."""
    out_dtype = check_mean_args(x, dim, keepdim, dtype)
    check_launch_device("x", x)
    num_rows = x.numel() // max(x.shape[-1], 1)
    config = rows_heuristic_config(x.device, x.dtype, num_rows, x.shape[-1])
    return launch(x, out_dtype, keepdim, config=config, fixed_point=False)
