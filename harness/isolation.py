"""The judge's guard around every call of a subject: state it can change, and a time limit.

A subject runs in the judge's process (or in a sweep worker that also computes the
references), so anything it leaves behind would be the judge's too.  :func:`guarded` wraps a
subject's callable so that every call:

* probes the floating-point environment before and after (the CPU thread's flush-to-zero and
  denormals-are-zero, torch's default dtype, the float32 matmul precision and the TF32 and
  reduced-precision-reduction switches); a call that moved it is an error
  (:class:`StateChanged`, naming what moved), and the state is put back first, so the reference
  and the comparator never run under the subject's state (an extension built with
  ``-ffast-math`` sets flush-to-zero on import or on its first call);
* snapshots the judge's data (every registered component's fields, one level into their
  nested dataclasses and baselines, the registry's cache, the names bound in the judge's
  modules, in every loaded ``batchinv.reference`` module and in torch's namespaces, and
  ``torch.Tensor``'s attributes); a call that changed one is an error naming it, and the
  original is restored, so a subject that replaces ``component.reference`` (or a helper or
  torch function the reference calls) neither passes nor poisons a later subject;
* runs under a time limit (:func:`time_limit`): past it the call is a :class:`SubjectTimeout`
  (a ``timeout`` row).  In-process the limit is a ``SIGALRM`` timer (POSIX, main thread only),
  re-fired every second until the call ends, so a subject that swallows the first one gets
  another; a hang in C code that never returns to the interpreter cannot be interrupted that
  way -- a sweep's worker processes are also watched by the parent, which kills a worker whose
  call overruns (see :mod:`batchinv.harness.sweep`).  Off the main thread (or without
  ``setitimer``) the limit is only checked when the call returns.

The probes and the snapshot cost under a millisecond per call.
"""

from __future__ import annotations

import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Any, Protocol

import torch

from batchinv.harness.lanes import Lane

#: Per-lane default limit, seconds, on one subject call (generous: the cpu lane runs kernels in
#: the Triton interpreter; a GPU call that takes a minute is hung).
DEFAULT_TIMEOUT: dict[Lane, float] = {lane: (600.0 if not lane.is_gpu else 120.0) for lane in Lane}


def default_timeout(lane: Lane) -> float:
    """The default limit on one subject call on ``lane``, in seconds (:data:`DEFAULT_TIMEOUT`)."""
    return DEFAULT_TIMEOUT[lane]


class SubjectTimeout(BaseException):
    """A subject call ran past its time limit.  A ``BaseException`` so that a subject's own
    ``except Exception`` does not swallow it; the check reports it as a ``timeout`` row."""


class StateChanged(RuntimeError):
    """A subject call changed state the judge shares with it (floating-point environment,
    registry, judge modules); the state was restored before this was raised."""


# --- floating-point state ------------------------------------------------------------------------

_TINY: torch.Tensor | None = None


def _flush_state() -> tuple[bool, bool]:
    """(flushes a subnormal operand, flushes a subnormal result) on this CPU thread."""
    global _TINY
    if _TINY is None:
        _TINY = torch.tensor([1.401298464324817e-45, 2.350988701644575e-38, 1.0], dtype=torch.float32)
    tiny = _TINY
    daz = bool(tiny[0] * tiny[2] == 0)
    ftz = bool(tiny[1] / 2 == 0)
    return daz, ftz


def fp_state() -> dict[str, Any]:
    """The floating-point environment a subject could change, as a dict of plain values."""
    daz, ftz = _flush_state()
    return {
        "cpu denormals-are-zero": daz,
        "cpu flush-to-zero": ftz,
        "torch default dtype": torch.get_default_dtype(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cuda matmul allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda fp16 reduced-precision reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda bf16 reduced-precision reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }


def restore_fp_state(state: dict[str, Any]) -> None:
    """Put back ``state`` (from :func:`fp_state`); only what differs is set."""
    now = fp_state()
    if now == state:
        return
    flush = ("cpu denormals-are-zero", "cpu flush-to-zero")
    if any(now[k] != state[k] for k in flush):
        torch.set_flush_denormal(bool(state[flush[0]] or state[flush[1]]))
    if now["torch default dtype"] != state["torch default dtype"]:
        torch.set_default_dtype(state["torch default dtype"])
    if now["float32 matmul precision"] != state["float32 matmul precision"]:
        torch.set_float32_matmul_precision(state["float32 matmul precision"])
    now = fp_state()  # the precision also sets the TF32 switches
    matmul = torch.backends.cuda.matmul
    if now["cuda matmul allow_tf32"] != state["cuda matmul allow_tf32"]:
        matmul.allow_tf32 = state["cuda matmul allow_tf32"]
    if now["cudnn allow_tf32"] != state["cudnn allow_tf32"]:
        torch.backends.cudnn.allow_tf32 = state["cudnn allow_tf32"]
    key = "cuda fp16 reduced-precision reduction"
    if now[key] != state[key]:
        matmul.allow_fp16_reduced_precision_reduction = state[key]
    key = "cuda bf16 reduced-precision reduction"
    if now[key] != state[key]:
        matmul.allow_bf16_reduced_precision_reduction = state[key]


def _moved(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [f"{k} {before[k]!r} -> {after[k]!r}" for k in before if before[k] != after[k]]


# --- the judge's data ----------------------------------------------------------------------------

#: Judge modules whose bound names a subject must not rebind (the comparators, the drivers).
_JUDGE_MODULES = (
    "batchinv.harness.checks",
    "batchinv.harness.compare",
    "batchinv.harness.invariance",
    "batchinv.harness.registry",
    "batchinv.reference.exact",
)

#: Module prefixes whose loaded modules' bound names are snapshot too: the references (a
#: reference calls its module's helpers by name) and the torch namespaces they call into.
_REFERENCE_PREFIX = "batchinv.reference."
_TORCH_MODULES = ("torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft")

#: Classes whose attributes a subject must not replace (``torch.Tensor.double``, ``.sum``...).
_JUDGE_CLASSES: tuple[type, ...] = (torch.Tensor,)

_Snapshot = list[tuple[str, Any, str, Any]]  # (label, owner, attribute, value)


_WATCHED: tuple[int, list[str]] = (-1, [])


def _watched_modules() -> list[str]:
    """The judge modules, every loaded reference module and the torch namespaces (recomputed
    when the number of loaded modules changes)."""
    global _WATCHED
    if _WATCHED[0] != len(sys.modules):
        references = sorted(m for m in list(sys.modules) if m.startswith(_REFERENCE_PREFIX))
        _WATCHED = (len(sys.modules), [*dict.fromkeys([*_JUDGE_MODULES, *references, *_TORCH_MODULES])])
    return _WATCHED[1]


def _fields_of(label: str, obj: Any, depth: int, out: _Snapshot) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        out.append((f"{label}.{f.name}", obj, f.name, value))
        if depth <= 0:
            continue
        items = value if isinstance(value, tuple) else (value,)
        for i, item in enumerate(items):
            if is_dataclass(item) and not isinstance(item, type):
                sub = f"{label}.{f.name}" + (f"[{i}]" if isinstance(value, tuple) else "")
                _fields_of(sub, item, depth - 1, out)


def judge_snapshot(
    component: Any = None,
) -> tuple[
    _Snapshot,
    dict[str, Any],
    list[tuple[str, dict[str, Any], dict[str, Any]]],
    list[tuple[type, dict[str, Any]]],
]:
    """The judge's data as it is now: ``component``'s fields (two levels; None: every
    registered component's), the registry cache's entries, the watched modules' namespaces
    and the judge classes' attributes (shallow copies)."""
    from batchinv.harness import registry

    attrs: _Snapshot = []
    judged = registry._CACHE.items() if component is None else [(component.name, component)]
    for name, comp in judged:
        _fields_of(f"component {name!r}", comp, 2, attrs)
    modules = [
        (m, vars(sys.modules[m]), dict(vars(sys.modules[m]))) for m in _watched_modules() if m in sys.modules
    ]
    classes = [(cls, dict(vars(cls))) for cls in _JUDGE_CLASSES]
    return attrs, dict(registry._CACHE), modules, classes


def restore_judge(snapshot: Any) -> list[str]:
    """Put back what changed since ``snapshot`` (:func:`judge_snapshot`); what was put back."""
    from batchinv.harness import registry

    attrs, cache, modules, classes = snapshot
    changed: list[str] = []
    for name, comp in cache.items():
        if registry._CACHE.get(name) is not comp:
            changed.append(f"registry entry {name!r} replaced")
            registry._CACHE[name] = comp
    for label, owner, attr, value in attrs:
        if getattr(owner, attr) is not value:
            changed.append(f"{label} replaced")
            object.__setattr__(owner, attr, value)
    for mod_name, namespace, copy in modules:
        if all(map(operator.is_, copy.values(), map(namespace.get, copy))):
            continue  # the common case, at C speed
        for key, value in copy.items():
            now = namespace.get(key, _MISSING)
            if now is not value and not _torch_wrapper(now, value):
                changed.append(f"{mod_name}.{key} rebound")
                namespace[key] = value
    for cls, copy in classes:
        namespace = vars(cls)
        if all(map(operator.is_, copy.values(), map(namespace.get, copy))):
            continue
        for key, value in copy.items():
            if vars(cls).get(key, _MISSING) is not value:
                changed.append(f"{cls.__module__}.{cls.__qualname__}.{key} replaced")
                setattr(cls, key, value)
    return changed


_MISSING = object()
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _torch_wrapper(new: Any, old: Any) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old`` (importing ``torch._dynamo`` rebinds
    ``torch.manual_seed`` to a ``functools.wraps`` wrapper defined in torch): not a subject's."""
    code = getattr(new, "__code__", None)
    return (
        getattr(new, "__wrapped__", _MISSING) is old
        and code is not None
        and code.co_filename.startswith(_TORCH_DIR)
    )


# --- time limit ----------------------------------------------------------------------------------


class Observer(Protocol):
    """What a sweep worker tells its parent (see :func:`set_observer`): each check as it starts
    and ends (:func:`batchinv.harness.checks.run_check`), each guarded call as it starts and ends."""

    def check_started(self, check: str, case_id: str) -> None: ...

    def check_ended(self, result: Any) -> None: ...

    def call_started(self, limit: float | None) -> None: ...

    def call_ended(self) -> None: ...


_OBSERVER: Observer | None = None


def set_observer(observer: Observer | None) -> None:
    """Tell ``observer`` when each guarded call starts and ends (a sweep worker's parent watches
    the time limit from outside, where an in-process timer cannot interrupt the call)."""
    global _OBSERVER
    _OBSERVER = observer


def current_observer() -> Observer | None:
    """The observer :func:`set_observer` installed (None: none)."""
    return _OBSERVER


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`SubjectTimeout` in the body after ``seconds`` (None or 0: no limit), by a
    ``SIGALRM`` timer re-fired every second (main thread, POSIX); elsewhere, on return."""
    if not seconds or seconds <= 0:
        yield
        return
    start = time.monotonic()
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        if time.monotonic() - start > seconds:
            raise SubjectTimeout(
                f"the call took {time.monotonic() - start:.1f} s, past the limit of {seconds:g} s"
            )
        return

    active = [True]  # off before the timer is: a late tick after the call is a no-op

    def fire(signum: int, frame: Any) -> None:
        if active[0]:
            raise SubjectTimeout(f"the call ran past the limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, fire)
    outer_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        active[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay > 0:  # someone else's timer (pytest-timeout): re-armed with what is left
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_delay - (time.monotonic() - start)))
    if time.monotonic() - start > seconds:  # the subject swallowed the exception and returned
        raise SubjectTimeout(
            f"the call took {time.monotonic() - start:.1f} s, past the limit of {seconds:g} s"
        )


def guarded(fn: Callable[..., Any], timeout: float | None, component: Any = None) -> Callable[..., Any]:
    """``fn`` with the judge's guard around each call: the time limit ``timeout`` (seconds;
    None: none), and the floating-point state and judge data (``component``'s fields, the
    registry, the judge's modules) checked and restored after it.

    Raises (from a call):
        SubjectTimeout: the call ran past ``timeout``.
        StateChanged: the call changed the judge's state (put back first; the message says what).
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        fp_before = fp_state()
        judge = judge_snapshot(component)
        observer = _OBSERVER
        if observer is not None:
            observer.call_started(timeout)
        try:
            with time_limit(timeout):
                out = fn(*args, **kwargs)
        finally:
            if observer is not None:
                observer.call_ended()
            fp_after = fp_state()
            moved = _moved(fp_before, fp_after)
            if moved:
                restore_fp_state(fp_before)
            changed = restore_judge(judge)
        if moved or changed:
            what = "; ".join([*moved, *changed[:6]]) + (
                f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
            )
            raise StateChanged(f"the subject changed the judge's state during its call (restored): {what}")
        return out

    return call
