"""Built batches, once per case per process.

Every check of a case (agreement, batch_prefix, position, row_start, partition, repeat, each
baseline's negative control) needs the same inputs, and building them is the sweep's largest
host cost on a GPU lane (seeded CPU generators, special bit patterns, layouts: measured on an
H200, 2026-11-30, 84 s of a 183 s warm sweep went to ``torch.randn`` in the case builders).
:func:`built` builds a case once and hands every caller a private copy.

The copy duplicates each tensor's whole *storage* and re-creates the view on it, so a padded,
strided or transposed layout keeps its strides and the special bit patterns in the bytes around
the view (``Tensor.clone`` would compact a non-dense view and drop them).  An implementation
that writes into its inputs therefore corrupts only its own copy, never the next check's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from batchinv.harness import provenance
from batchinv.harness.registry import Batch, Case, Component

#: How many built batches a process keeps (least recently used first out).
MAX_ENTRIES = 12
#: ... and at most this many bytes of them (a GPU-lane case can be ~150 MB).
MAX_BYTES = 4 << 30

_CACHE: OrderedDict[tuple[Any, ...], tuple[Batch, int]] = OrderedDict()


def _copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor with the same dtype, shape, strides, storage offset and storage bytes, in new memory."""
    storage = tensor.untyped_storage().clone()
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    out.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())
    return out


def _copy_value(value: Any) -> Any:
    return _copy_tensor(value) if isinstance(value, torch.Tensor) else value


def copy_batch(batch: Batch) -> Batch:
    """A deep copy of ``batch``: every tensor (rows and shared operands) in new storage, layouts kept."""
    return Batch(
        {k: _copy_tensor(v) for k, v in batch.rows.items()},
        {k: _copy_value(v) for k, v in batch.shared.items()},
    )


def _nbytes(batch: Batch) -> int:
    tensors = [*batch.rows.values(), *(v for v in batch.shared.values() if isinstance(v, torch.Tensor))]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def built(component: Component, case: Case, device: torch.device) -> Batch:
    """``component.build(case, device)``, built once per process and returned as a private copy.

    The key is the component's name and build function, the case's axes and seed, and the
    device, so two components (or a test's toy component) never share an entry.
    """
    key = (component.name, id(component.build), case.axes_json(), case.seed, str(device))
    hit = _CACHE.get(key)
    if hit is None:
        with provenance.paused():  # the judge's work: run, never recorded nor replayed dry
            batch = component.build(case, device)
        size = _nbytes(batch)
        if size > MAX_BYTES:  # too large to keep: build it for this caller only
            return batch
        _CACHE[key] = (batch, size)
        while len(_CACHE) > MAX_ENTRIES or sum(s for _, s in _CACHE.values()) > MAX_BYTES:
            _CACHE.popitem(last=False)
        hit = (batch, size)
    else:
        _CACHE.move_to_end(key)
    return copy_batch(hit[0])


def clear() -> None:
    """Forget every built batch (tests; or to release device memory)."""
    _CACHE.clear()


def share_device(processes_per_device: int) -> None:
    """Budget the cache for ``processes_per_device`` processes sharing one GPU (xdist workers,
    sweep workers): at most a quarter of the device's memory for all their caches together, so
    the checks themselves keep room (measured on an H200: 16 pytest workers with a 4 GiB cache
    each and an unreleased allocator ran the GPU out of memory)."""
    global MAX_BYTES
    import torch

    if not torch.cuda.is_available():
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    MAX_BYTES = min(MAX_BYTES, total // (4 * max(1, processes_per_device)))


def release_device_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back to the driver, so processes sharing a
    GPU can use what this one no longer holds (a no-op without CUDA)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
