"""Route a whole torch model's covered ops through the batch-invariant kernels: ``batchinv.enable()``.

Spelling: ``import batchinv`` then ``with batchinv.enable(): ...`` (``batchinv.fast.enable`` is
the same object; both packages export :func:`enable` lazily, so importing them does not import
triton).

Inside ``with enable():`` two layers route the covered ops to the pinned kernels: a
torch-function mode (:mod:`batchinv.fast.enable.function_mode`), which answers ``F.linear``, the
matrix products, ``F.rms_norm``, ``softmax`` / ``log_softmax`` / ``mean`` over the last dim
with the ``torch.ops.batchinv`` operators and which ``torch.compile`` traces (so compiled
graphs keep them); and beneath it the aten kernels of ``mm``, ``addmm``, ``bmm`` and their
``out=`` overloads (:data:`ATEN_OVERRIDES`), overridden for the CPU and CUDA dispatch keys by
:func:`batchinv.fast.matmul.matmul` through a ``torch.library.Library("aten", "IMPL")`` (for
calls that reach aten directly).  On exit the
mode is popped, the library destroyed and the original kernels are back.

Calls the kernels cannot take raise :class:`batchinv.fast.enable.function_mode.UnpinnedOpError` under
``strict=True`` (the default); with ``strict=False`` they run unpinned and are counted in
:attr:`EnableStats.fallback` (at the aten layer they fall back to ``torch.baddbmm``, which is not
overridden).  ``addmm`` with ``beta``/``alpha`` other than 1 or a non-row
``input`` (``strict=False``) adds ``beta * input`` to ``alpha * mm`` elementwise (row-local).
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
    """Calls inside one ``enable()`` block.

    ``pinned[op]``: runtime calls of the pinned operators (``matmul``, ``rms_norm``, ``softmax``,
    ``log_softmax``, ``mean``: :data:`batchinv.fast.enable.ops.RUNTIME_CALLS` during the block, so a
    compiled graph's calls count when it runs, never when it is traced) plus the aten-level
    ``mm`` / ``addmm`` override's kernel calls.  ``fallback[op]``: calls that ran unpinned
    (``strict=False`` only), by covered op at the torch-function level and as ``aten::mm`` /
    ``aten::addmm`` at the aten level (a fallback ``F.linear`` reaches both).
    """

    aten: Counter[str] = field(default_factory=Counter)
    fallback: Counter[str] = field(default_factory=Counter)
    _start: Counter[str] = field(default_factory=Counter)
    _end: Counter[str] | None = None

    @property
    def pinned(self) -> Counter[str]:
        from batchinv.fast.enable.ops import RUNTIME_CALLS

        now = self._end if self._end is not None else RUNTIME_CALLS
        return (now - self._start) + self.aten


_active: list[tuple[Any, EnableStats, int | None, bool]] = []


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


def _unpinned_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The library's own product for a call no pinned kernel takes: ``baddbmm`` with beta 0,
    an aten kernel the override leaves alone (``mm``/``bmm`` would come back here)."""
    return torch.baddbmm(a.new_zeros(a.shape[0], a.shape[1], b.shape[2]), a, b, beta=0)


def _unpinned_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _unpinned_bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)


def _unlaunchable(op: str) -> None:
    """Count a call the aten layer cannot pin, or refuse it under ``strict``."""
    if _active[0][3]:
        from batchinv.fast.enable.function_mode import UnpinnedOpError

        raise UnpinnedOpError(f"aten::{op}", "operands the pinned kernel does not take (dtype, device, rank)")
    _stats().fallback[f"aten::{op}"] += 1


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunction():  # the enable() mode must not route our own calls
        return _mm_body(a, b)


def _mm_body(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not _launchable(a, b):
        _unlaunchable("mm")
        return _unpinned_mm(a, b)
    _stats().aten["mm"] += 1
    return _pinned_matmul(a, b, layout="mm", num_sms=_num_sms())


def _addmm(
    inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    with torch._C.DisableTorchFunction():  # the enable() mode must not route our own calls
        return _addmm_body(inp, a, b, beta, alpha)


def _addmm_body(inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    n = b.shape[-1] if b.dim() == 2 else -1
    row_bias = inp.dim() == 1 or (inp.dim() == 2 and inp.shape[0] == 1)
    if not _launchable(a, b) or inp.dtype != a.dtype or inp.device != a.device:
        _unlaunchable("addmm")
        product = _unpinned_mm(a, b)
    elif beta == 1 and alpha == 1 and row_bias and inp.shape[-1] == n:
        _stats().aten["addmm"] += 1
        return _pinned_matmul(a, b, inp.reshape(n), layout="mm", num_sms=_num_sms())
    else:
        _stats().aten["addmm"] += 1
        product = _pinned_matmul(a, b, layout="mm", num_sms=_num_sms())
    if beta == 0:  # like aten: input is ignored (its NaNs too)
        return product * alpha if alpha != 1 else product
    return beta * inp + (alpha * product if alpha != 1 else product)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunction():  # the enable() mode must not route our own calls
        if a.dim() != 3 or b.dim() != 3 or not _launchable(a.flatten(0, 1), b.flatten(0, 1)):
            _unlaunchable("bmm")
            return _unpinned_bmm(a, b)
        from batchinv.fast.enable.ops import batched_matmul

        _stats().aten["bmm"] += 1
        return batched_matmul(a, b, num_sms=_num_sms())


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """aten's out= contract: ``out`` resized to the result's shape, then written."""
    with torch._C.DisableTorchFunction():
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)


def _mm_out(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, _mm(a, b))


def _addmm_out(
    inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1, out: torch.Tensor
) -> torch.Tensor:
    return _into(out, _addmm(inp, a, b, beta=beta, alpha=alpha))


def _bmm_out(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, _bmm(a, b))


#: The aten overloads overridden inside ``enable()`` and their pinned kernels.
ATEN_OVERRIDES = {
    "mm": _mm,
    "mm.out": _mm_out,
    "addmm": _addmm,
    "addmm.out": _addmm_out,
    "bmm": _bmm,
    "bmm.out": _bmm_out,
}


@contextmanager
def enable(*, strict: bool = True, num_sms: int | None = None) -> Iterator[EnableStats]:
    """Run every op the components cover batch-invariantly, eager, in CUDA graphs and compiled.

    Two layers: a torch-function mode (:class:`batchinv.fast.enable.function_mode.PinnedOps`) answers
    ``F.linear``, ``mm`` / ``addmm``, ``bmm``, ``matmul`` / ``@`` (N-D, broadcast), two-operand
    ``einsum``, ``F.grouped_mm``, ``F.rms_norm``, ``softmax`` / ``log_softmax`` / ``mean`` over
    the last dim with the ``torch.ops.batchinv``
    operators, which ``torch.compile`` keeps as opaque calls; beneath it the aten kernels of
    ``mm``, ``addmm`` and ``bmm`` are overridden for the CPU and CUDA dispatch keys (calls that reach aten
    without passing the torch-function level: C++ composites, and any code a compiled graph
    runs opaquely, such as another library's custom op, during which Dynamo has popped the
    mode), with their ``out=`` overloads, and so is ``bmm``.

    Parameters
    ----------
    strict : bool, default True
        A covered call no pinned kernel can take (dtype, device, dim, a tensor requiring grad,
        addmm with ``beta``/``alpha``) raises
        :class:`batchinv.fast.enable.function_mode.UnpinnedOpError` naming the op and the reason (at
        trace time under ``torch.compile``).  ``False``: it runs unpinned and is counted in
        ``EnableStats.fallback``.  The default is loud, because a silently unpinned op is
        exactly the failure this project exists to prevent.
    num_sms : int, optional
        Passed to the aten-level :func:`batchinv.fast.matmul.matmul` (any value, the same bits).

    Yields
    ------
    EnableStats
        Runtime counts of pinned and fallback calls by op.

    Notes
    -----
    Re-entrant: a nested ``enable()`` shares the outer one (its mode, override and stats).  Ops
    not covered (embeddings, elementwise ops, ``topk``) run as they are: elementwise ops are
    row-local already.  Fused attention (``F.scaled_dot_product_attention``, Hugging Face's
    default ``sdpa``) runs ``batchinv::sdpa``: each query row over its own visible keys, splits
    counted from its first one, so left and right padding give the same bits; a mask whose
    visible keys are not one range per row, an additive mask with other values than 0 and
    -inf / finfo.min, or dropout is unpinned.  A model that computes attention with matmul and
    softmax (Hugging Face's ``eager``) runs pinned and is invariant to right padding and the
    batch, but *not* to left padding: padding before a row's keys moves them across the
    matmul's fixed K tiles (a documented negative control, tests/integration/test_transformers_client.py).  Source: the aten-override approach of vLLM's batch-invariant mode and Thinking
    Machines' ``batch_invariant_ops``, plus a torch-function mode that ``torch.compile`` traces.
    """
    if _active:
        yield _active[0][1]
        return
    from batchinv.fast.enable import ops
    from batchinv.fast.enable.function_mode import PinnedOps

    lib = torch.library.Library("aten", "IMPL")
    stats = EnableStats(_start=ops.RUNTIME_CALLS.copy())
    mode = PinnedOps(strict)
    mode.fallback = stats.fallback
    _active.append((lib, stats, num_sms, strict))
    try:
        with warnings.catch_warnings():
            # torch warns once that an aten kernel is overridden; that is the point here.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for key in _DISPATCH_KEYS:
                for overload, kernel in ATEN_OVERRIDES.items():
                    lib.impl(overload, kernel, key)
        with mode:
            yield stats
    finally:
        stats._end = ops.RUNTIME_CALLS.copy()
        _active.clear()
        lib._destroy()
