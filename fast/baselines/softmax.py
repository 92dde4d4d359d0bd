"""Unpinned softmax / log_softmax paths: the negative controls of the ``softmax`` and
``log_softmax`` components.

* ``torch_native_*``: aten's own ``softmax`` / ``log_softmax``.  On CUDA, rows longer than 1024
  go to ``cunn_SoftMaxForward``: one block per row, whose vectorized loads start at the row's
  misalignment from 16 bytes.  When a row is not a multiple of 16 bytes long (vocab 50257) that
  misalignment -- and with it which thread sums which elements -- depends on the row's position
  in the batch.
* ``torch_sum_*``: the "batch-invariant softmax" of many serving stacks that falls back to a
  library sum, ``exp(x - max) / x.exp().sum(-1)``.  torch's CUDA reduction picks its block shape
  and its split across blocks from the number of output rows, so the sum's order changes with M.
* ``triton_rows_heuristic_*``: the Triton kernel of ``fast/softmax.py`` as a production kernel
  would run it: the lanes combined by a float ``tl.sum`` (the tutorial's reduction) and the column
  chunk sized from the number of rows by a production-style heuristic -- the choice the pinned
  launcher forbids.  Its reduction order changes with M on every lane, the interpreter included.
* ``split_float_partials_*``: the negative control of ``config_equivalence``: a row split over
  pass-1 programs whose combine adds each program's lanes as a float partial sum, then the
  partials (what a split-row softmax does when it does not pin its sum).  The same split at
  every M, so it is batch-invariant; but its association follows the split, and its bits are
  not the pinned executions'.
"""

from __future__ import annotations

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, sm_count
from batchinv.fast.row_config import RowConfig
from batchinv.fast.softmax import Split, launch, softmax_config
from batchinv.reference.softmax import check_softmax_args

#: Widest chunk the row heuristic uses (columns).
WIDE_LIMIT = 16384


def torch_native_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.softmax`` (``aten::_softmax(x, dim, half_to_float)`` on CUDA)."""
    check_softmax_args(x, dim, half_to_float)
    return torch_softmax_unchecked(x, dim, half_to_float)


def torch_softmax_unchecked(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """:func:`torch_native_softmax` without the argument checks (what ``torch.compile`` traces
    in the ``modes`` check: Dynamo does not trace the checks)."""
    return torch.softmax(x, dim=dim, dtype=torch.float32 if half_to_float else None)


def torch_native_log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.log_softmax`` (``aten::_log_softmax(x, dim, half_to_float)`` on CUDA)."""
    check_softmax_args(x, dim, half_to_float)
    return torch_log_softmax_unchecked(x, dim, half_to_float)


def torch_log_softmax_unchecked(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """:func:`torch_native_log_softmax` without the argument checks (the ``modes`` check's)."""
    return torch.log_softmax(x, dim=dim, dtype=torch.float32 if half_to_float else None)


def _shift(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf - xf.amax(dim=-1, keepdim=True)


def torch_sum_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``exp(x - max) / sum(exp(x - max))`` in fp32 with ``torch.sum`` as the row sum."""
    out_dtype = check_softmax_args(x, dim, half_to_float)
    e = _shift(x).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(out_dtype)


def torch_sum_log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``(x - max) - log(sum(exp(x - max)))`` in fp32 with ``torch.sum`` as the row sum."""
    out_dtype = check_softmax_args(x, dim, half_to_float)
    shifted = _shift(x)
    return (shifted - shifted.exp().sum(dim=-1, keepdim=True).log()).to(out_dtype)


def rows_heuristic_config(device: torch.device, dtype: torch.dtype, num_rows: int, n_cols: int) -> RowConfig:
    """A production-style plan keyed on the number of rows (the unpinned choice).

    Fewer rows than SMs leave the GPU under-filled, so each program takes its whole row (up to
    :data:`WIDE_LIMIT` columns) in one chunk to keep more loads in flight; with a full GPU it
    takes the table's chunk.  The chunk width sets the reduction order, so a row's bits now
    depend on how many rows share the launch (whenever the row is longer than the table's chunk).
    """
    pinned = softmax_config(arch(device), dtype, n_cols)
    wide = min(triton.next_power_of_2(max(n_cols, 1)), WIDE_LIMIT)
    block_n = wide if num_rows < sm_count(device) else pinned.block_n
    return RowConfig(pinned.block_m, block_n, pinned.num_warps)


def _rows_heuristic(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    num_rows = x.numel() // max(x.shape[-1], 1)
    config = rows_heuristic_config(x.device, x.dtype, num_rows, x.shape[-1])
    return launch(x, out_dtype, log=log, config=config, fixed_point=False)


def triton_rows_heuristic_softmax(
    x: torch.Tensor, dim: int = -1, half_to_float: bool = False
) -> torch.Tensor:
    """The softmax kernel with a float lane sum and a chunk width chosen from the number of rows."""
    return _rows_heuristic(x, dim, half_to_float, log=False)


def triton_rows_heuristic_log_softmax(
    x: torch.Tensor, dim: int = -1, half_to_float: bool = False
) -> torch.Tensor:
    """The log_softmax kernel with a float lane sum and a chunk width chosen from the number of rows."""
    return _rows_heuristic(x, dim, half_to_float, log=True)


#: The split of the ``split_float_partials`` baselines: 4 pass-1 programs per row (the fewest
#: lanes of any tile, 128 under the interpreter, still give 32 per program), hence 4 float
#: partials; under the interpreter 64 rows per program and one write program (it pays per program).
FLOAT_PARTIALS_SPLIT = Split(4, 4, 4, 1024, 16)
FLOAT_PARTIALS_SPLIT_INTERP = Split(4, 1, 1, 128, 1, block_m=64)


def _split_float_partials(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    split = FLOAT_PARTIALS_SPLIT_INTERP if arch(x.device) == "interp" else FLOAT_PARTIALS_SPLIT
    return launch(x, out_dtype, log=log, execution=split, fixed_point=False, float_parts=split.programs)


def split_float_partials_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Softmax over a fixed 4-program split whose row sum is 4 float partials added (unpinned)."""
    return _split_float_partials(x, dim, half_to_float, log=False)


def split_float_partials_log_softmax(
    x: torch.Tensor, dim: int = -1, half_to_float: bool = False
) -> torch.Tensor:
    """log_softmax over a fixed 4-program split whose row sum is 4 float partials added (unpinned)."""
    return _split_float_partials(x, dim, half_to_float, log=True)
