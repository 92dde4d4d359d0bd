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
mode is popped; the last block open in the process destroys the library and the original
kernels are back.

Per thread (issue 25): a block, its strictness, ``num_sms``, stats and mode belong to the thread
that opened it (:mod:`batchinv.fast.enable.state`).  The aten library is process-wide (torch has
no per-thread kernels), so every override looks at the *calling* thread first: outside a block
of its own, a thread's ``torch.mm`` runs the original aten kernel (taken with
``torch.library.get_kernel`` before the override), uncounted and never refused.

Calls the kernels cannot take raise :class:`batchinv.fast.enable.function_mode.UnpinnedOpError` under
``strict=True`` (the default); with ``strict=False`` they run unpinned and are counted in
:attr:`EnableStats.fallback` (at the aten layer they fall back to ``torch.baddbmm``, which is not
overridden).  ``addmm`` with ``beta``/``alpha`` other than 1 or a non-row
``input`` (``strict=False``) adds ``beta * input`` to ``alpha * mm`` elementwise (row-local).
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from batchinv.fast.device import interpreting
from batchinv.fast.enable import state
from batchinv.fast.enable.state import Frame
from batchinv.fast.matmul import matmul as _pinned_matmul

_SUPPORTED = (torch.bfloat16, torch.float16, torch.float32)
_DISPATCH_KEYS = ("CPU", "CUDA")


@dataclass
class EnableStats:
    """Calls inside one ``enable()`` block, of the thread that opened it.

    Each call is counted once, when it completed: a call that raised is not counted.
    ``pinned[op]``: calls of the pinned operators that ran to the end (``matmul``, ``rms_norm``,
    ``softmax``, ``log_softmax``, ``mean``, ...: the block's thread's
    :func:`batchinv.fast.enable.ops.thread_calls` during the block, so a compiled graph's calls
    count when it runs, never when it is traced, and another thread's never) plus the aten-level
    ``mm`` / ``addmm`` / ``bmm`` overrides' completed kernel calls.  ``fallback[op]``: calls
    that ran unpinned (``strict=False`` only), by covered op at the torch-function level, or as
    ``aten::mm`` / ``aten::addmm`` / ``aten::bmm`` for a call that reached aten directly.  A
    torch-function fallback is counted there alone: the aten calls it makes are pinned where
    they can be (``addmm``'s product under ``beta`` / ``alpha``) but not counted again.
    """

    aten: Counter[str] = field(default_factory=Counter)
    fallback: Counter[str] = field(default_factory=Counter)
    _calls: Counter[str] = field(default_factory=Counter)  # the owner thread's thread_calls()
    _start: Counter[str] = field(default_factory=Counter)
    _end: Counter[str] | None = None

    @property
    def pinned(self) -> Counter[str]:
        now = self._end if self._end is not None else self._calls
        return (now - self._start) + self.aten


def _launchable(*tensors: torch.Tensor) -> bool:
    first = tensors[0]
    if first.dtype not in _SUPPORTED or any(t.dtype != first.dtype for t in tensors):
        return False
    if any(t.device != first.device or t.dim() != 2 for t in tensors):
        return False
    return first.device.type == "cuda" or (first.device.type == "cpu" and interpreting())


Unpinned = Callable[..., torch.Tensor]  # the original aten kernel of the overload


def _unlaunchable(frame: Frame, op: str, unpinned: Unpinned, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A call the aten layer cannot pin: refused under ``strict``, else the original aten
    kernel, its own aten calls unrouted, counted once it returned."""
    if frame.strict:
        from batchinv.fast.enable.function_mode import UnpinnedOpError

        raise UnpinnedOpError(f"aten::{op}", "operands the pinned kernel does not take (dtype, device, rank)")
    with state.passthrough():
        out = unpinned(*args, **kwargs)
    frame.stats.fallback[f"aten::{op}"] += 1
    return out


def _mm(frame: Frame, unpinned: Unpinned, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not _launchable(a, b):
        return _unlaunchable(frame, "mm", unpinned, a, b)
    out = _pinned_matmul(a, b, layout="mm", num_sms=frame.num_sms)
    frame.stats.aten["mm"] += 1
    return out


def _addmm(
    frame: Frame,
    unpinned: Unpinned,
    inp: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    beta: Any = 1,
    alpha: Any = 1,
) -> torch.Tensor:
    n = b.shape[-1] if b.dim() == 2 else -1
    row_bias = inp.dim() == 1 or (inp.dim() == 2 and inp.shape[0] == 1)
    if not _launchable(a, b) or inp.dtype != a.dtype or inp.device != a.device:
        return _unlaunchable(frame, "addmm", unpinned, inp, a, b, beta=beta, alpha=alpha)
    if beta == 1 and alpha == 1 and row_bias and inp.shape[-1] == n:
        out = _pinned_matmul(a, b, inp.reshape(n), layout="mm", num_sms=frame.num_sms)
    else:
        product = _pinned_matmul(a, b, layout="mm", num_sms=frame.num_sms)
        if beta == 0:  # like aten: input is ignored (its NaNs too)
            out = product * alpha if alpha != 1 else product
        else:
            out = beta * inp + (alpha * product if alpha != 1 else product)
    frame.stats.aten["addmm"] += 1
    return out


def _bmm(frame: Frame, unpinned: Unpinned, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() != 3 or b.dim() != 3 or not _launchable(a.flatten(0, 1), b.flatten(0, 1)):
        return _unlaunchable(frame, "bmm", unpinned, a, b)
    from batchinv.fast.enable.ops import batched_matmul

    out = batched_matmul(a, b, num_sms=frame.num_sms)
    frame.stats.aten["bmm"] += 1
    return out


def _out_form(body: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The ``out=`` overload of ``body``: the pinned result written into ``out`` (resized to its
    shape, aten's contract); a fallback runs the original ``out=`` kernel itself."""

    def kernel(
        frame: Frame, unpinned: Unpinned, *args: Any, out: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        result = body(frame, functools.partial(unpinned, out=out), *args, **kwargs)
        if result is out:
            return out
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)

    return kernel


#: The aten overloads overridden inside ``enable()`` and their pinned kernels (each called as
#: ``kernel(frame, original, *args, **kwargs)`` for a thread inside a block).
ATEN_OVERRIDES: dict[str, Callable[..., torch.Tensor]] = {
    "mm": _mm,
    "mm.out": _out_form(_mm),
    "addmm": _addmm,
    "addmm.out": _out_form(_addmm),
    "bmm": _bmm,
    "bmm.out": _out_form(_bmm),
}


def _routed(body: Callable[..., torch.Tensor], original: Any) -> Callable[..., torch.Tensor]:
    """The registered kernel: the calling thread's block decides; a thread outside every block
    gets the original kernel, untouched; under a torch-function fallback the kernel runs
    uncounted."""

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        frame = state.current()
        if frame is None:
            return original.call_boxed(keyset, *args, **kwargs)
        if state.in_fallback():  # pinned where it can be, counted once, by the fallback itself
            frame = Frame(EnableStats(), frame.strict, frame.num_sms, frame.mode)
        with torch._C.DisableTorchFunction():  # the enable() mode must not route our own calls
            return body(frame, functools.partial(original.call_boxed, keyset), *args, **kwargs)

    return kernel


def _register() -> torch.library.Library:
    """The process-wide aten library of :data:`ATEN_OVERRIDES` (for each dispatch key this torch
    has kernels for), each override holding the original kernel it replaces."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # torch warns once that an aten kernel is overridden; that is the point here.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
        for key in _DISPATCH_KEYS:
            for overload, body in ATEN_OVERRIDES.items():
                name = f"aten::{overload}"
                if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, key):
                    continue  # a CPU-only torch has no CUDA kernels (and no CUDA tensors)
                original = torch.library.get_kernel(name, key)
                lib.impl(overload, _routed(body, original), key, with_keyset=True)
    return lib


@contextmanager
def enable(*, strict: bool | None = None, num_sms: int | None = None) -> Iterator[EnableStats]:
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
    strict : bool or None, default None (True)
        None: the enclosing block's strictness in this thread, True for an outermost block.  A
        covered call no pinned kernel can take (dtype, device, dim, a tensor requiring grad,
        addmm with ``beta``/``alpha``) raises
        :class:`batchinv.fast.enable.function_mode.UnpinnedOpError` naming the op and the reason (at
        trace time under ``torch.compile``).  ``False``: it runs unpinned and is counted in
        ``EnableStats.fallback``.  The default is loud, because a silently unpinned op is
        exactly the failure this project exists to prevent.  An explicit value of a nested
        block wins inside it (an inner ``strict=True`` inside ``strict=False`` is strict) and
        the enclosing one's is back on its exit.
    num_sms : int, optional
        Passed to the aten-level :func:`batchinv.fast.matmul.matmul` (any value, the same bits);
        None inside a nested block: the enclosing block's.

    Yields
    ------
    EnableStats
        Runtime counts of pinned and fallback calls by op, of this thread (:class:`EnableStats`).

    Raises
    ------
    ArgumentError
        ``strict`` other than True, False or None.
    BlockOrderError
        On exit: the thread's blocks were closed out of order (an enclosing block before one
        opened inside it, e.g. by two asyncio tasks sharing the thread); the state is cleared.

    Notes
    -----
    Per thread: a block routes and counts the calls of the thread that opened it; another
    thread's calls run unpinned, as without ``enable()``, until it opens a block of its own
    (which has its own strictness and stats and stays pinned when the first thread's block
    exits).  Re-entrant: a nested ``enable()`` in the same thread shares the enclosing block's
    mode, override and stats, with its own ``strict`` and ``num_sms`` when given.  Ops
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
    from batchinv.reference.errors import ArgumentError

    if strict is not None and not isinstance(strict, bool):
        raise ArgumentError("strict", "True, False or None", repr(strict))
    frames = state.frames()
    if frames:
        yield from _nested(frames, strict, num_sms)
        return
    from batchinv.fast.enable import ops
    from batchinv.fast.enable.function_mode import PinnedOps

    calls = ops.thread_calls()
    stats = EnableStats(_calls=calls, _start=calls.copy())
    mode = PinnedOps(True if strict is None else strict)
    mode.fallback = stats.fallback
    frame = Frame(stats, mode.strict, num_sms, mode)
    state.hold(_register)
    try:
        frames.append(frame)
        with mode:
            yield stats
    finally:
        stats._end = calls.copy()
        inner_open = len(frames) - 1
        frames.clear()
        state.release()
        if inner_open > 0:
            raise state.BlockOrderError(
                f"the outermost block of this thread exited with {inner_open} block(s) opened inside it "
                "still open (they would run unpinned)"
            )


def _nested(frames: list[Frame], strict: bool | None, num_sms: int | None) -> Iterator[EnableStats]:
    """A block inside an open block of the same thread: the enclosing stats and mode, this
    block's explicit ``strict`` / ``num_sms`` (the mode's strictness restored on exit)."""
    outer = frames[-1]
    frame = Frame(
        outer.stats,
        outer.strict if strict is None else strict,
        outer.num_sms if num_sms is None else num_sms,
        outer.mode,
    )
    frames.append(frame)
    outer.mode.strict = frame.strict  # Dynamo guards on it: a graph traced under the other recompiles
    try:
        yield frame.stats
    finally:
        if not frames or frames[-1] is not frame:
            if frame in frames:
                frames.remove(frame)
            raise state.BlockOrderError(
                "a nested block exited after its enclosing block or before a block opened inside it"
            )
        frames.pop()
        outer.mode.strict = outer.strict
