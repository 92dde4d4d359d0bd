"""In-process ranks: a gloo process group per thread, so that a registry subject with a
single-process signature can run a real collective (``torch.distributed``'s gloo backend, its
own algorithm and chunking) over T ranks in one call.

:func:`gloo_threads` gives a cached :class:`GlooThreads` of ``world`` ranks (one
``ProcessGroupGloo`` each over a shared ``HashStore``; no global ``torch.distributed`` state is
touched: ``init_process_group`` is never called); :meth:`GlooThreads.run` runs ``fn(rank, pg)``
in ``world`` threads and returns the results in rank order.  The collectives of
:mod:`batchinv.fast.all_reduce` and :mod:`batchinv.fast.baselines.all_reduce` take a process
group object (``pg.allreduce``, ``pg.allgather``...), so the same code runs on these ranks and
on a ``torch.distributed`` group of processes (``dist.group.WORLD``, gloo or NCCL).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

#: gloo's own timeout on each collective of these ranks, and the join limit of one run.
TIMEOUT_S = 60.0


class GlooThreads:
    """``world`` gloo ranks in this process (see the module docstring)."""

    def __init__(self, world: int) -> None:
        self.world = world
        store = dist.HashStore()
        self.groups: list[Any] = [None] * world
        self._each(lambda r: self._connect(store, r))

    def _connect(self, store: Any, rank: int) -> None:
        prefix = dist.PrefixStore(f"batchinv-gloo-threads-{self.world}", store)
        self.groups[rank] = dist.ProcessGroupGloo(prefix, rank, self.world, timedelta(seconds=TIMEOUT_S))

    def _each(self, fn: Callable[[int], Any]) -> list[Any]:
        results: list[Any] = [None] * self.world
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)

        threads = [
            threading.Thread(target=body, args=(r,), name=f"gloo-rank-{r}", daemon=True)
            for r in range(self.world)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"gloo thread ranks: a rank did not finish in {TIMEOUT_S} s")
        if errors:
            raise errors[0]
        return results

    def run(self, fn: Callable[[int, Any], Any]) -> list[Any]:
        """``[fn(0, pg_0), ..., fn(T-1, pg_T-1)]``, each in its own thread (the ranks meet in the
        collectives ``fn`` calls).

        Raises:
            TimeoutError: a rank still running after :data:`TIMEOUT_S` seconds.
            Exception: the first exception a rank raised.
        """
        return self._each(lambda r: fn(r, self.groups[r]))


_POOLS: dict[int, GlooThreads] = {}
_LOCK = threading.Lock()


def gloo_threads(world: int) -> GlooThreads:
    """The cached :class:`GlooThreads` of ``world`` ranks (created on first use: ~0.1 s)."""
    with _LOCK:
        if world not in _POOLS:
            _POOLS[world] = GlooThreads(world)
        return _POOLS[world]
