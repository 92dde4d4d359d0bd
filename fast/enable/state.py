"""Per-thread state of ``batchinv.enable()`` (issue 25, section 2).

An ``enable()`` block belongs to the thread that opened it: its strictness, ``num_sms``, stats
and torch-function mode live in :data:`_THREAD` (a ``threading.local``), and the aten overrides --
registered once for the whole process, since torch's dispatcher has no per-thread kernels --
consult the *calling* thread's state: a thread outside every block gets the original aten
kernel, untouched and uncounted, whatever another thread is doing.  The process-wide
registration is reference-counted by the blocks open in all threads (:func:`hold`,
:func:`release`), so the thread that exits first leaves the others' blocks pinned.

Nothing here imports triton or the kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from batchinv.reference.errors import BatchinvError


class BlockOrderError(BatchinvError, RuntimeError):
    """An ``enable()`` block of a thread was closed while a block opened inside it was still
    open (two asyncio tasks, or generators, sharing the thread and closing their blocks out of
    order): the inner block would run unpinned after the outer one exits."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"enable() blocks closed out of order: {detail}")


@dataclass(eq=False)
class Frame:
    """One open ``enable()`` block of the calling thread.

    Attributes:
        stats: the block's :class:`~batchinv.fast.enable.aten_override.EnableStats` (shared with
            the enclosing block of the same thread).
        strict: this block's strictness (an explicit ``strict`` of an inner block wins; ``None``
            inherits the enclosing block's).
        num_sms: the aten-level matmul's ``num_sms``.
        mode: the thread's :class:`~batchinv.fast.enable.function_mode.PinnedOps` (one per
            thread: a nested block sets its ``strict`` and restores it on exit).
    """

    stats: Any
    strict: bool
    num_sms: int | None
    mode: Any


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.fallback = 0  # > 0: inside a torch-function fallback (strict=False), counted there
        self.passthrough = 0  # > 0: inside an original aten kernel the aten layer fell back to


_THREAD = _ThreadState()


def current() -> Frame | None:
    """The calling thread's innermost open block, or None outside every block (and inside an
    original aten kernel that the aten layer fell back to: its own aten calls are not routed)."""
    if _THREAD.passthrough or not _THREAD.frames:
        return None
    return _THREAD.frames[-1]


def frames() -> list[Frame]:
    """The calling thread's open blocks, outermost first (the list itself)."""
    return _THREAD.frames


def in_fallback() -> bool:
    """Whether the calling thread runs a torch-function fallback now: the aten calls it makes
    still run the pinned kernels where they can, but are not counted (the call is counted once,
    as a fallback)."""
    return _THREAD.fallback > 0


@contextmanager
def fallback() -> Iterator[None]:
    """The calling thread runs a ``strict=False`` fallback of the torch-function layer
    (:func:`in_fallback`)."""
    _THREAD.fallback += 1
    try:
        yield
    finally:
        _THREAD.fallback -= 1


@contextmanager
def passthrough() -> Iterator[None]:
    """The calling thread runs an original aten kernel: no aten call inside it is routed."""
    _THREAD.passthrough += 1
    try:
        yield
    finally:
        _THREAD.passthrough -= 1


# --- the process-wide aten registration, held by the open blocks of every thread --------------

_LOCK = threading.Lock()
_HOLDERS = 0
_REGISTRATION: Any = None


def hold(register: Callable[[], Any]) -> None:
    """One more open block (any thread): the first registers the aten overrides (``register()``
    returns the library, destroyed by the last :func:`release`)."""
    global _HOLDERS, _REGISTRATION
    with _LOCK:
        if _HOLDERS == 0:
            _REGISTRATION = register()
        _HOLDERS += 1


def release() -> None:
    """One block fewer: the last one destroys the aten registration (the original kernels are
    back for every thread)."""
    global _HOLDERS, _REGISTRATION
    with _LOCK:
        _HOLDERS -= 1
        if _HOLDERS == 0 and _REGISTRATION is not None:
            _REGISTRATION._destroy()
            _REGISTRATION = None


def registered() -> bool:
    """Whether the aten overrides are registered now (some thread holds an open block)."""
    with _LOCK:
        return _REGISTRATION is not None
