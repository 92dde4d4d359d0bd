"""Unpinned ``all_reduce`` paths: the negative controls of the ``all_reduce`` component.

Both sum the rank's own leaves in fp32 first (what a rank's matmul over its slice of K holds)
and then reduce the T rank partials in fp32, as a production TP layer does:

* ``torch_distributed``: ``torch.distributed``'s all-reduce (``ProcessGroup.allreduce``, SUM):
  the backend's own algorithm -- gloo's ring with its chunking on the cpu lane (an element's
  order of additions follows its position in the message: measured, a row's bits change with
  the rows beside it), NCCL's ring / tree choice by message size and rank count on GPUs.  The
  registry's subject runs it over in-process gloo ranks (:mod:`batchinv.fast.gloo_threads`); the
  multi-process tests run it over gloo processes, the ``gpu_2`` / ``gpu_4`` lane over NCCL.
* ``arrival_ring``: rank 0 starts from its own partial and adds the others' in the order they
  arrive (gloo's receive from any source; on NCCL an irecv from every rank, polled), then broadcasts: a ring whose order is the ranks'
  arrival order.  With T = 2 the one sum commutes (no variance is possible); from T = 3 on the
  order is a permutation.  The registry's subject runs under a rank skew that changes from call
  to call (:data:`SKEW_STEP_S`, rotated over ranks 1..T-1: the scheduler noise of a real step,
  made deterministic enough to test) and records each measured arrival order in
  :data:`ARRIVALS`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any

import torch

from batchinv.fast.all_reduce import process_group
from batchinv.fast.gloo_threads import gloo_threads
from batchinv.reference.all_reduce import check_all_reduce_args

#: The registry's ``arrival_ring``: rank r (r >= 1) sleeps ``SKEW_STEP_S * ((r + call) % (T - 1))``.
SKEW_STEP_S = 0.004
#: The arrival orders (ranks 1..T-1 as rank 0 received them) of the last ``arrival_ring`` calls.
ARRIVALS: deque[tuple[int, ...]] = deque(maxlen=256)
_CALLS = itertools.count()
_TAG = 29


def local_partial(local: torch.Tensor) -> torch.Tensor:
    """``[M, L, N]`` -> ``[M, N]``: a rank's leaves summed in fp32 in leaf order."""
    acc = local[:, 0].clone()
    for j in range(1, local.shape[1]):
        acc = acc + local[:, j]
    return acc.contiguous()


def default_all_reduce(local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The backend's all-reduce (SUM) of this rank's fp32 partial of ``local [M, L, N]``."""
    out = local_partial(local)
    process_group(group).allreduce([out]).wait()
    return out


def arrival_ring(
    local: torch.Tensor, group: Any = None, skew_s: float = 0.0
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The ring in arrival order (module docstring) after sleeping ``skew_s`` seconds.

    Returns ``(out [M, N] float32, order)``: ``order`` the ranks in the order rank 0 added them
    (on rank 0; ``()`` elsewhere).
    """
    pg = process_group(group)
    if skew_s > 0:
        time.sleep(skew_s)
    out = local_partial(local)
    order: list[int] = []
    if pg.rank() == 0 and pg.name() == "gloo":  # gloo receives from any source
        buf = torch.empty_like(out)
        for _ in range(1, pg.size()):
            work = pg.recv_anysource([buf], _TAG)
            work.wait()
            out = out + buf
            order.append(int(work._source_rank()))
    elif pg.rank() == 0:  # NCCL: an irecv from every rank, added as each completes
        bufs = {src: torch.empty_like(out) for src in range(1, pg.size())}
        works = {src: pg.recv([bufs[src]], src, _TAG) for src in bufs}
        while works:
            done = [src for src, w in works.items() if w.is_completed()]
            if not done:
                time.sleep(0.0002)
            for src in done:
                works.pop(src).wait()
                out = out + bufs[src]
                order.append(src)
    else:
        pg.send([out], 0, _TAG).wait()
    pg.broadcast(out, 0).wait()
    return out, tuple(order)


def _leaves_of(partials: torch.Tensor, rank: int, degree: int) -> torch.Tensor:
    width = partials.shape[1] // degree
    return partials[:, rank * width : (rank + 1) * width].cpu()


def torch_distributed_all_reduce(partials: torch.Tensor, tp_degree: int | None = None) -> torch.Tensor:
    """``torch.distributed``'s gloo all-reduce over T in-process ranks (rank t holding the
    leaves ``[t R / T, (t + 1) R / T)``, summed in fp32 first); rank 0's result."""
    _, _, _, degree = check_all_reduce_args(partials, tp_degree)
    results = gloo_threads(degree).run(lambda r, pg: default_all_reduce(_leaves_of(partials, r, degree), pg))
    return results[0].to(partials.device)


def arrival_ring_all_reduce(partials: torch.Tensor, tp_degree: int | None = None) -> torch.Tensor:
    """:func:`arrival_ring` over T in-process gloo ranks under the rotating skew of
    :data:`SKEW_STEP_S`; the measured order is appended to :data:`ARRIVALS`."""
    _, _, _, degree = check_all_reduce_args(partials, tp_degree)
    call = next(_CALLS)

    def rank(r: int, pg: Any) -> tuple[torch.Tensor, tuple[int, ...]]:
        skew = SKEW_STEP_S * ((r + call) % (degree - 1)) if r and degree > 2 else 0.0
        return arrival_ring(_leaves_of(partials, r, degree), pg, skew)

    out, order = gloo_threads(degree).run(rank)[0]
    ARRIVALS.append(order)
    return out.to(partials.device)
