"""Unpinned production paths of the indexer top-k: the negative controls of ``topk``.

Both share one shortcut: lanes outside ``[row_start, row_end)`` are masked to ``-inf`` and stay
in the competition, then dropped when the indices are made row-local.  A masked lane then ties
with every in-window ``-inf``, so on a row whose cutoff falls on a ``-inf`` plateau the masked
lanes take slots the in-window lanes should have had: how many, and which, depends on how many
masked lanes the packer put before and after the row, i.e. on its neighbours.

* :func:`masked_torch_topk`: ``masked_fill(-inf)``, ``torch.topk``, ``sort`` -- the common eager
  shortcut; ``torch.topk`` breaks ties in no specified order (and on GPU by an algorithm chosen
  from the shape).
* :func:`masked_fused_topk`: the same Triton selection as the pinned kernel but with masked
  lanes as candidates (seed write-up 003's first defect): the tie budget is spent in column
  order, so the masked lanes before ``row_start`` consume it first and the row emits fewer
  indices the further right it sits.
"""

from __future__ import annotations

import torch

from batchinv.fast.kernels.topk import topk_masked_lanes_compete_kernel
from batchinv.fast.topk import launch_rows
from batchinv.reference.topk import check_topk_arguments, clamped_window

__all__ = ["masked_fused_topk", "masked_torch_topk"]


def masked_torch_topk(
    scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int
) -> torch.Tensor:
    """Mask out-of-window lanes to -inf, ``torch.topk``, drop the masked picks, sort.

    Same signature, shapes and dtypes as :func:`batchinv.fast.topk.topk`; NOT batch invariant:
    masked lanes compete with in-window ``-inf`` ties (and ``torch.topk`` ranks every NaN above
    ``+inf`` and breaks ties arbitrarily).  A negative control.

    Raises:
        DTypeError, ArgumentError, DeviceError: as :func:`batchinv.fast.topk.topk`.
    """
    k = check_topk_arguments(scores, row_starts, row_ends, k)
    num_rows, num_cols = scores.shape
    start, end = clamped_window(row_starts, row_ends, num_cols)  # [R]
    col = torch.arange(num_cols, device=scores.device)
    in_window = (col[None, :] >= start[:, None]) & (col[None, :] < end[:, None])  # [R, C]
    masked = scores.masked_fill(~in_window, float("-inf"))
    picked = torch.topk(masked, min(k, num_cols), dim=1).indices  # [R, min(k, C)]
    local = picked - start[:, None]
    kept = (local >= 0) & (local < (end - start)[:, None])
    local = torch.sort(torch.where(kept, local, torch.full_like(local, num_cols)), dim=1).values
    local = torch.where(local == num_cols, torch.full_like(local, -1), local).to(torch.int32)
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=scores.device)
    out[:, : local.shape[1]] = local
    return out


def masked_fused_topk(
    scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int
) -> torch.Tensor:
    """The fused Triton top-k with out-of-window lanes keyed as -inf candidates.

    Same signature, shapes, dtypes and envelope as :func:`batchinv.fast.topk.topk` (outside the
    envelope it runs :func:`masked_torch_topk`).  NOT batch invariant along ``row_start``: the
    masked lanes before the window spend the tie budget of an in-window ``-inf`` plateau.
    A negative control.

    Raises:
        DTypeError, ArgumentError, DeviceError: as :func:`batchinv.fast.topk.topk`.
    """
    return launch_rows(
        topk_masked_lanes_compete_kernel, scores, row_starts, row_ends, k, fallback=masked_torch_topk
    )
