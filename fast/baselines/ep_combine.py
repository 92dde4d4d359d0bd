"""The unpinned EP combine: the negative control of :mod:`batchinv.fast.ep_combine`.

``arrival_ep_combine``: each rank adds its tokens' weighted expert outputs into an fp32
accumulator in the order they come in -- its own experts' pairs first, then each other rank's
message in arrival order (gloo's receive from any source), each message in the sender's pair
order (expert-major, as an align sort leaves it) -- and rounds to the output dtype: a token's
order of additions follows the expert placement (the EP degree) and the ranks' arrival.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from batchinv.fast.all_reduce import process_group

_TAG = 31


def _accumulate(acc: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None) -> None:
    """``rows [P, H + 2]`` (output, token, slot) added in order into ``acc`` (fp32)."""
    for row in rows:
        token, slot = int(row[-2]), int(row[-1])
        if token < 0:  # padding
            continue
        term = row[:-2].float()
        acc[token] += term if weights is None else weights[token, slot] * term


def arrival_ep_combine(
    pair_out: torch.Tensor,
    pair_rank: torch.Tensor,
    pair_token: torch.Tensor,
    pair_slot: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_tokens: int,
    top_k: int,
    group: Any = None,
    skew_s: float = 0.0,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The combine in arrival order (module docstring), after sleeping ``skew_s`` seconds
    before sending.  Arguments as :func:`batchinv.fast.ep_combine.ep_combine` (float32
    ``pair_out``: the token and slot ride in two extra fp32 columns, exact below 2^24).

    Returns ``(out [num_tokens, H], order)``: ``order`` the source ranks in the order added.
    """
    pg = process_group(group)
    world, rank = pg.size(), pg.rank()
    hidden = pair_out.shape[1]
    rows = torch.cat([pair_out.float().cpu(), pair_token[:, None].float(), pair_slot[:, None].float()], dim=1)
    dest = pair_rank.cpu()
    counts = torch.bincount(dest, minlength=world).to(torch.int64)
    width = counts.clone()
    pg.allreduce([width], dist_max()).wait()  # every message padded to the longest
    pad = int(width.max())
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32)
    weights = None if topk_weights is None else topk_weights.float().cpu()
    order = [rank]
    _accumulate(acc, rows[dest == rank], weights)
    if skew_s > 0:
        time.sleep(skew_s)
    sends = []
    for other in range(world):
        if other == rank:
            continue
        msg = torch.full((pad, hidden + 2), -1.0)
        part = rows[dest == other]
        msg[: part.shape[0]] = part
        sends.append(pg.send([msg], other, _TAG))
    buf = torch.empty((pad, hidden + 2))
    for _ in range(world - 1):
        work = pg.recv_anysource([buf], _TAG)
        work.wait()
        order.append(int(work._source_rank()))
        _accumulate(acc, buf, weights)
    for w in sends:
        w.wait()
    return acc.to(pair_out.dtype).to(pair_out.device), tuple(order)


def dist_max() -> Any:
    """An ``AllreduceOptions`` with op MAX."""
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    return opts
