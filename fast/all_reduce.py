"""Batch-invariant tensor-parallel ``all_reduce``: the pinned tree, in one process and over
``torch.distributed``.

The tree: R fp32 *leaves* (the partials of a fixed split of K, one per rank at the widest
tensor-parallel degree) widened exactly to fp64 and added in leaf order r = 0..R-1, then one
rounding to fp32 (:mod:`batchinv.reference.all_reduce`).  Nothing of it follows the message:
not its rows M (no chunking, no ring position: an element's sum never depends on where it sits
in the message), not the ranks' arrival order, not the TP degree T (rank t holds the leaves
``[t R / T, (t + 1) R / T)`` and sends them unsummed).

* :func:`all_reduce` (the registry's subject): the tree emulated in one process on the stacked
  leaves ``[M, R, N]``; the local sum is ``moe_combine``'s kernel without weights (fp64 in slot
  order, ``enable_fp_fusion=False``, one rounding), so it is bitwise the reference's sequence.
* :func:`pinned_all_reduce`: the same tree across ranks, bit-identical to :func:`all_reduce` of
  the stacked leaves on every rank: ``method="all_gather"`` gathers every rank's leaves and
  sums them locally; ``method="reduce_scatter"`` sends each rank the leaves of its column slice
  (``all_to_all``: the bytes of a ring's reduce-scatter, R/T times over), sums them in leaf
  order and gathers the slices.  Elementwise, so a column slice's bits are the whole's.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
import torch.distributed as dist

from batchinv.fast.device import check_launch_device, interpreting
from batchinv.fast.moe_combine import launch as leaf_order_sum
from batchinv.reference.all_reduce import check_all_reduce_args
from batchinv.reference.errors import ArgumentError, check_tensor

#: The distributed methods of :func:`pinned_all_reduce`.
METHODS: tuple[str, ...] = ("all_gather", "reduce_scatter")
#: Serializes interpreted launches (the ranks of :mod:`batchinv.fast.gloo_threads` are threads).
_INTERPRETER_LOCK = threading.Lock()


def all_reduce(partials: torch.Tensor, tp_degree: int | None = None) -> torch.Tensor:
    """The pinned tensor-parallel all-reduce, emulated in one process.

    Parameters
    ----------
    partials : Tensor [M, R, N] float32, any strides: row m's R leaves (a rank-major stack
        ``[R, M, N]`` is ``stack.transpose(0, 1)``).
    tp_degree : int or None
        The TP degree T the leaves are spread over (a divisor of R; None: R).  Validated; it
        does not enter the result, which is the point.

    Returns
    -------
    Tensor [M, N] float32: the fp64 leaf-order sum rounded once, bitwise equal to
    :func:`batchinv.reference.all_reduce.all_reduce` and to :func:`pinned_all_reduce` at any
    degree; invariant along M, a row's position, the TP degree and repeats (canonical NaN).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As the reference; also a tensor that is not CUDA (CPU under ``TRITON_INTERPRET=1``).
    """
    check_all_reduce_args(partials, tp_degree)
    check_launch_device("partials", partials)
    # the interpreter patches triton.language while it runs: one launch at a time
    with _INTERPRETER_LOCK if interpreting() else contextlib.nullcontext():
        return leaf_order_sum(partials, None)


def _local_leaves(local: Any) -> torch.Tensor:
    check_tensor("local", local, dtypes=(torch.float32,), ndim=3)
    if local.shape[1] < 1:
        raise ArgumentError("local", "[M, L, N] with L >= 1 leaves", tuple(local.shape))
    return local.contiguous()


def process_group(group: Any = None) -> Any:
    """The ``ProcessGroup`` object of ``group`` (None: ``torch.distributed``'s default group).
    The collectives here call its methods (``allgather``, ``alltoall_base``...), so they run on
    a group of processes and on the in-process ranks of :mod:`batchinv.fast.gloo_threads` alike."""
    return group if group is not None else dist.distributed_c10d._get_default_group()


def gather_leaves(local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's leaves ``[M, L, N]`` gathered into ``[M, T L, N]`` in rank order (each
    rank's leaves in their order): the stacked leaves of the tree, on every rank."""
    local = _local_leaves(local)
    pg = process_group(group)
    parts = [torch.empty_like(local) for _ in range(pg.size())]
    pg.allgather([parts], [local]).wait()
    return torch.cat(parts, dim=1)


def pinned_all_reduce(local: torch.Tensor, group: Any = None, *, method: str = "all_gather") -> torch.Tensor:
    """The pinned tree across the ranks of ``group``.

    Parameters
    ----------
    local : Tensor [M, L, N] float32: this rank's L leaves (L = R / T; every rank the same shape).
    group : a process group (None: ``torch.distributed``'s default group), gloo or NCCL, or a
        rank of :func:`batchinv.fast.gloo_threads.gloo_threads`.
    method : ``"all_gather"`` or ``"reduce_scatter"`` (module docstring).

    Returns
    -------
    Tensor [M, N] float32, the same bits on every rank, bitwise equal to :func:`all_reduce` of
    the stacked leaves (and so to any other TP degree of the same leaves).

    Raises
    ------
    DTypeError, ArgumentError
        ``local`` not a float32 [M, L, N] tensor; an unknown ``method``.
    """
    local = _local_leaves(local)
    if method == "all_gather":
        return all_reduce(gather_leaves(local, group))
    if method != "reduce_scatter":
        raise ArgumentError("method", f"one of {METHODS}", method)
    pg = process_group(group)
    world = pg.size()
    rows, leaves, cols = local.shape
    width = -(-cols // world)  # rank t owns the columns [t w, (t + 1) w), the last ones padding
    padded = local.new_zeros((rows, leaves, world * width))
    padded[:, :, :cols] = local
    send = padded.view(rows, leaves, world, width).permute(2, 0, 1, 3).contiguous()  # [T, M, L, w]
    recv = torch.empty_like(send)  # recv[s]: rank s's leaves of this rank's columns
    pg.alltoall_base(recv, send, [], []).wait()
    mine = all_reduce(recv.permute(1, 0, 2, 3).reshape(rows, world * leaves, width))  # the tree, my slice
    slices = [torch.empty_like(mine) for _ in range(world)]
    pg.allgather([slices], [mine]).wait()
    return torch.cat(slices, dim=1)[:, :cols].contiguous()
