"""Batch-invariant expert-parallel combine across ranks (``moe_combine``'s sum, distributed).

Under expert parallelism a token's k expert outputs are computed on the ranks that own those
experts and returned to the token's rank, which sums them.  The pinned combine returns every
(token, slot) output to its token's rank (:func:`ep_return`: counts, then rows, by
``all_to_all``), places each at its (token, slot) (an exact copy: the arrival order of the
ranks and the order of pairs inside a message do not enter), and runs ``moe_combine``
(fp64 in slot order, no FMA, one rounding): a token's bits are those of
:func:`batchinv.fast.moe_combine.moe_combine` on its own ``[k, H]`` outputs and weights, at any
EP degree, beside any tokens of the other ranks, in any arrival order.

Process groups are objects with the ``ProcessGroup`` methods (``torch.distributed``'s groups,
gloo or NCCL, or the in-process ranks of :mod:`batchinv.fast.gloo_threads`).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.fast.all_reduce import process_group
from batchinv.fast.moe_combine import moe_combine
from batchinv.reference.errors import ArgumentError, check_tensor


def _exchange(rows: torch.Tensor, dest: torch.Tensor, pg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows [P, ...]`` sent to ranks ``dest [P]`` (all_to_all); returns the received rows (in
    source-rank order) and each one's source rank."""
    world = pg.size()
    order = torch.sort(dest, stable=True).indices
    send = rows.index_select(0, order.to(rows.device)).contiguous()
    counts = torch.bincount(dest, minlength=world).to(torch.int64).to(rows.device)  # NCCL: on the GPU
    recv_counts = torch.empty_like(counts)
    pg.alltoall_base(recv_counts, counts, [], []).wait()
    recv = rows.new_empty((int(recv_counts.sum()), *rows.shape[1:]))
    pg.alltoall_base(recv, send, recv_counts.tolist(), counts.tolist()).wait()
    src = torch.repeat_interleave(torch.arange(world), recv_counts.cpu())
    return recv, src


def ep_return(
    pair_out: torch.Tensor,
    pair_rank: torch.Tensor,
    pair_token: torch.Tensor,
    pair_slot: torch.Tensor,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the expert outputs this rank computed to their tokens' ranks.

    Parameters
    ----------
    pair_out : Tensor [P, H]: the outputs of the P (token, slot) pairs this rank's experts ran.
    pair_rank, pair_token, pair_slot : Tensor [P] int64: each pair's token rank, the token's
        index on that rank and the slot.

    Returns
    -------
    ``(y [Q, H], token [Q], slot [Q])``: the pairs of this rank's tokens, in source-rank order.
    """
    check_tensor("pair_out", pair_out, ndim=2)
    for name, t in (("pair_rank", pair_rank), ("pair_token", pair_token), ("pair_slot", pair_slot)):
        check_tensor(name, t, dtypes=(torch.int64,), ndim=1)
        if t.shape[0] != pair_out.shape[0]:
            raise ArgumentError(name, f"[P] with P = {pair_out.shape[0]}", list(t.shape))
    pg = process_group(group)
    meta = torch.stack([pair_token, pair_slot], dim=1).to(pair_out.device)
    dest = pair_rank.cpu()
    y, _ = _exchange(pair_out, dest, pg)
    idx, _ = _exchange(meta, dest, pg)
    return y, idx[:, 0], idx[:, 1]


def ep_combine(
    pair_out: torch.Tensor,
    pair_rank: torch.Tensor,
    pair_token: torch.Tensor,
    pair_slot: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_tokens: int,
    top_k: int,
    group: Any = None,
) -> torch.Tensor:
    """The pinned EP combine of this rank's ``num_tokens`` tokens (module docstring).

    Parameters
    ----------
    pair_out, pair_rank, pair_token, pair_slot : as :func:`ep_return`.
    topk_weights : Tensor [num_tokens, k] float32 (this rank's tokens), or None.
    num_tokens, top_k : this rank's tokens and the slots per token.

    Returns
    -------
    Tensor [num_tokens, H] of ``pair_out``'s dtype, bitwise
    ``moe_combine(y_local, topk_weights)`` where ``y_local[t, j]`` is the output of the
    (token, slot) pair (t, j); a pair never returned leaves NaN, so it shows.
    """
    y, token, slot = ep_return(pair_out, pair_rank, pair_token, pair_slot, group)
    local = torch.full(
        (num_tokens, top_k, pair_out.shape[1]), float("nan"), dtype=pair_out.dtype, device=pair_out.device
    )
    local[token, slot] = y  # each (token, slot) once: an exact copy, in any arrival order
    return moe_combine(local, topk_weights)
