"""The request model of plan components: a few integers per request, no pages.

A plan (prefill chunking, CUDA-graph bucket choice...) takes per-request integers (a prompt
length, a request kind) in ``rows`` (dim 0 = requests) and configuration in ``shared``.  Its
:class:`~batchinv.harness.registry.RequestModel` takes requests by index, concatenates batches
(shared operands of the first part: every part of a co-batch has the same configuration) and
relocates a batch by giving each rows tensor another memory layout: a strided view (stride 2,
storage offset 1) into a buffer whose other elements are junk, so a plan that reads its inputs
through their data pointer rather than their strides shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, Case, RequestModel
from batchinv.harness.requests import take_requests

#: The value of every element of a relocated buffer that no request owns.
JUNK = -(2**31) + 7


#: The requests at ``requests`` (an index may repeat), in that order: the paged model's take
#: (:func:`batchinv.harness.requests.take_requests`), which copies the rows and keeps ``shared``.
take = take_requests


def concat(parts: Sequence[Batch]) -> Batch:
    """Every part's requests in order, in one launch (the first part's configuration)."""
    return Batch.concat(parts)


def strided_over_junk(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a view of stride 2 (along dim 0), offset 1, into a :data:`JUNK` buffer."""
    buf = torch.full((2 * t.shape[0] + 1, *t.shape[1:]), JUNK, dtype=t.dtype, device=t.device)
    view = buf[1::2]
    view.copy_(t)
    return view


def relocate(batch: Batch, generator: torch.Generator) -> Batch:
    """The same requests with every rows tensor at another place in memory (strided, junk
    around); ``generator`` is unused (the layout is fixed) and kept for the model's signature."""
    del generator
    return Batch({k: strided_over_junk(v) for k, v in batch.rows.items()}, batch.shared)


def plan_model(
    neighbours: Callable[[Case, Lane], Mapping[str, Case]] | None = None,
    co_batch_sizes: Callable[[Lane], tuple[int, ...]] | None = None,
) -> RequestModel:
    """The :class:`RequestModel` of a plan component (see the module docstring)."""
    return RequestModel(
        take=take, concat=concat, relocate=relocate, neighbours=neighbours, co_batch_sizes=co_batch_sizes
    )


__all__ = ["JUNK", "concat", "plan_model", "relocate", "strided_over_junk", "take"]
