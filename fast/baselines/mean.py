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
* ``autotune_hash_ties``: the same fp32 path under a config an autotuner picks once per process
  (:func:`autotuned_mean`): it times two tiles of equal work and different lane widths, and a
  tie goes to the first name in a ``set``'s iteration order, which follows ``PYTHONHASHSEED``.
  Within a process every launch takes the same config (batch-invariant-looking); across
  processes the config, and the bits, may change: the negative control of ``cross_process``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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


# --- autotuned once per process, ties broken by the hash order of the config names ------------

#: Timings within this factor of the fastest count as a tie (the autotuner cannot tell them
#: apart).  The two candidates do equal work (``block_m * block_n`` elements per step, as many
#: steps), so on the interpreter, timed in CPU seconds (:func:`_seconds`), they tie with a wide
#: margin and the tie-break decides, whatever the machine's load.
AUTOTUNE_TIE = 2.0
#: Timed runs per candidate (the fastest counts).
AUTOTUNE_RUNS = 3

#: This process's picks: (device type, input dtype, row length, output dtype) -> the config name.
#: Filled once per key, at its first call, and never again in the process (as an autotuner's
#: cache): every later launch of the key, at any M, takes the same config.
_PICKED: dict[tuple[str, torch.dtype, int, torch.dtype], str] = {}


def autotune_candidates(device: torch.device, dtype: torch.dtype, n_cols: int) -> dict[str, RowConfig]:
    """The autotuned baseline's candidates, by name (``m64_n128``): the pinned tile and one with
    lanes twice as wide over half the rows -- the same elements per step, so about the same speed,
    and another reduction order (each lane sums other columns in fp32)."""
    pinned = mean_config(arch(device), dtype, n_cols)
    wide = RowConfig(max(1, pinned.block_m // 2), pinned.block_n * 2, pinned.num_warps)
    return {f"m{c.block_m}_n{c.block_n}": c for c in (pinned, wide)}


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    """The fastest of :data:`AUTOTUNE_RUNS` runs of ``fn``: wall-clock seconds around a
    synchronize on a GPU; on the CPU (the interpreter) the process's CPU seconds, which the
    machine's load does not stretch, so two tiles of equal work tie on a loaded host too."""
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    best = float("inf")
    for _ in range(AUTOTUNE_RUNS):
        if cuda:
            torch.cuda.synchronize(device)
        start = clock()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, clock() - start)
    return best


def autotuned_mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The mean kernel's fp32 path (fp32 lanes, a float lane sum) under a config an autotuner
    picks once per process and key (device type, dtype, row length, output dtype): it times the
    candidates of :func:`autotune_candidates` on the first call's input, and among those within
    :data:`AUTOTUNE_TIE` of the fastest takes the first in the iteration order of a ``set`` of
    their names -- which follows ``PYTHONHASHSEED`` (an autotune tie).  Inside one process every
    launch of a key takes one config, so its rows are as batch-invariant as the pinned
    kernel's; another process may pick the other config, and each row's bits with it."""
    out_dtype = check_mean_args(x, dim, keepdim, dtype)
    check_launch_device("x", x)
    key = (x.device.type, x.dtype, x.shape[-1], out_dtype)
    candidates = autotune_candidates(x.device, x.dtype, x.shape[-1])
    if key not in _PICKED:
        times = {
            name: _seconds(
                lambda c=config: launch(x, out_dtype, keepdim, config=c, fixed_point=False), x.device
            )
            for name, config in candidates.items()
        }
        fastest = min(times.values())
        tied = {name for name, t in times.items() if t <= fastest * AUTOTUNE_TIE}
        _PICKED[key] = next(iter(tied))  # a set: its order follows the process's hash seed
    return launch(x, out_dtype, keepdim, config=candidates[_PICKED[key]], fixed_point=False)
