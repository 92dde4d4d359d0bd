"""Route a whole torch model's GEMMs through the batch-invariant kernel: ``batchinv.fast.enable()``.

Spelling: ``import batchinv.fast`` then ``with batchinv.fast.enable(): ...`` (the package exports
:func:`enable` lazily, so importing it does not import triton).

Inside ``with enable():`` the aten kernels of ``mm`` and ``addmm`` (the ops ``torch.mm``,
``torch.addmm``, ``@`` on matrices and ``torch.nn.functional.linear`` reach, with or without a
bias, for 2-D and flattened N-D inputs) are overridden for the CPU and CUDA dispatch keys by
:func:`batchinv.fast.matmul.matmul` through a ``torch.library.Library("aten", "IMPL")``.  On exit
the library is destroyed and the original kernels are back.

Calls the kernel cannot take (dtypes other than bf16 / fp16 / fp32, mixed dtypes, CPU tensors
without the Triton interpreter) fall back to ``torch.bmm`` of a batch of one, which is not
overridden, and are counted in :attr:`EnableStats.fallback` so a caller can assert there were
none.  ``addmm`` with ``beta``/``alpha`` other than 1 or a non-row ``input`` adds
``beta * input`` to ``alpha * mm`` elementwise (still row-local).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from batchinv.fast.device import interpreting
from batchinv.fast.matmul import matmul as _pinned_matmul

_SUPPORTED = (torch.bfloat16, torch.float16, torch.float32)
_DISPATCH_KEYS = ("CPU", "CUDA")


@dataclass
class EnableStats:
    """Calls seen inside one ``enable()`` block: ``pinned[op]`` and ``fallback[op]`` counts."""

    pinned: Counter[str] = field(default_factory=Counter)
    fallback: Counter[str] = field(default_factory=Counter)


_active: list[tuple[Any, EnableStats, int | None]] = []


def _launchable(*tensors: torch.Tensor) -> bool:
    first = tensors[0]
    if first.dtype not in _SUPPORTED or any(t.dtype != first.dtype for t in tensors):
        return False
    if any(t.device != first.device or t.dim() != 2 for t in tensors):
        return False
    return first.device.type == "cuda" or (first.device.type == "cpu" and interpreting())


def _stats() -> EnableStats:
    return _active[0][1]


def _num_sms() -> int | None:
    return _active[0][2]


def _unpinned_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not _launchable(a, b):
        _stats().fallback["mm"] += 1
        return _unpinned_mm(a, b)
    _stats().pinned["mm"] += 1
    return _pinned_matmul(a, b, layout="mm", num_sms=_num_sms())


def _addmm(
    inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    n = b.shape[-1] if b.dim() == 2 else -1
    row_bias = inp.dim() == 1 or (inp.dim() == 2 and inp.shape[0] == 1)
    if not _launchable(a, b) or inp.dtype != a.dtype or inp.device != a.device:
        _stats().fallback["addmm"] += 1
        product = _unpinned_mm(a, b)
    elif beta == 1 and alpha == 1 and row_bias and inp.shape[-1] == n:
        _stats().pinned["addmm"] += 1
        return _pinned_matmul(a, b, inp.reshape(n), layout="mm", num_sms=_num_sms())
    else:
        _stats().pinned["addmm"] += 1
        product = _pinned_matmul(a, b, layout="mm", num_sms=_num_sms())
    if beta == 0:  # like aten: input is ignored (its NaNs too)
        return product * alpha if alpha != 1 else product
    return beta * inp + (alpha * product if alpha != 1 else product)


@contextmanager
def enable(*, num_sms: int | None = None) -> Iterator[EnableStats]:
    """Run every ``mm`` / ``addmm`` (``torch.mm``, ``torch.addmm``, ``F.linear``) batch-invariantly.

    Parameters
    ----------
    num_sms : int, optional
        Passed to :func:`batchinv.fast.matmul.matmul` (the planned SM count; any value gives the
        same bits).

    Yields
    ------
    EnableStats
        Counts of pinned and fallback calls by op.

    Notes
    -----
    Re-entrant: a nested ``enable()`` shares the outer override (and its stats).  Rows of every
    overridden op are bitwise invariant along M; fallback calls are not pinned.  Source: the
    aten-override approach of vLLM's batch-invariant mode and Thinking Machines'
    ``batch_invariant_ops``.
    """
    if _active:
        yield _active[0][1]
        return
    lib = torch.library.Library("aten", "IMPL")
    stats = EnableStats()
    _active.append((lib, stats, num_sms))
    try:
        with warnings.catch_warnings():
            # torch warns once that an aten kernel is overridden; that is the point here.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for key in _DISPATCH_KEYS:
                lib.impl("mm", _mm, key)
                lib.impl("addmm", _addmm, key)
        yield stats
    finally:
        _active.clear()
        lib._destroy()
