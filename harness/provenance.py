"""Launch provenance: which implementation a subject call actually ran.

One capture serves every Triton kernel -- ours, the baselines', an outside subject's -- without
touching a launcher: :func:`install` wraps ``triton.runtime.jit.JITFunction.run`` (compiled
launches) and ``triton.runtime.interpreter.InterpretedFunction.run`` (the cpu lane's
``TRITON_INTERPRET=1``), the one method every ``kernel[grid](...)`` launch goes through (also
behind ``triton.autotune`` and ``triton.heuristics``, whose final config arrives there as
keyword arguments; the autotuner's own benchmark launches are not recorded).  Each launch made
inside :func:`recording` appends one :class:`Launch` to a per-thread log: the kernel's name,
its grid, its constexpr values and launch options (never a tensor), and the launcher's name for
the execution where it picked one from a frozen table (:func:`batchinv.fast.execution.select_by_m`
notes it; ``fast/`` imports nothing of the harness).  Outside a recording a launch costs one
thread-local lookup.

**What an execution is.**  A launch's *execution* is its kernel and every constexpr and launch
option it was given (``BLOCK_M``, ``SPLIT_K``, ``USE_TMA``..., ``num_warps``, ``num_stages``):
the key :attr:`Launch.key`.  The grid is not part of it (it follows M and the planned SM count,
which the ``batch_prefix`` and ``partition`` checks judge).  All constexprs, rather than a
declared subset per kernel, because a kernel's constexprs are exactly what its compiler
specialises on: any one of them can change the code that runs.

A call that launches no Triton kernel is described as such: torch operators (a baseline calling
cuBLAS through torch: the algorithm cuBLAS picks is not exposed, so the description names the
library and the cuBLAS environment pins in force, :data:`cublas_audit.PIN_VARIABLES`, never a
guess), or the reference (a launch of ``fast`` outside ``Component.fast_path``, :func:`note`).
An adapter can :func:`note` what it knows (FlashInfer's backend).

The judge (:mod:`batchinv.harness.invariance`) records every subject call, keeps each call's
:class:`CallLaunches` beside its outputs (:func:`attach`), names both sides' executions in a
failing comparison's message (:func:`contrast`), and sums a check's launches by sweep point into
the report row (:class:`Tally`, ``CheckResult.launches``).  ``config_equivalence`` replays the
case's other checks in :func:`recording` ``(dry=True)`` (launches recorded, not run) and fails
when fast picks an execution that none of its runs proved (docs/DESIGN.md, "The checks").
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: A report row keeps at most this many distinct executions (and notes), and this many sweep
#: point labels for each: enough to read which M ran what, bounded for a GPU sweep's report.
MAX_EXECUTIONS = 16
MAX_LABELS = 8
#: A failure message names at most this many constexprs of a launch.
MAX_NAMED = 8

NO_TRITON = "no Triton kernel (torch operators"
REFERENCE = "the reference (outside the fast path, Component.fast_path)"

ExecutionKey = tuple[str, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class Launch:
    """One Triton launch: ``kernel`` (the ``@triton.jit`` function's name), ``module`` (where
    it is defined), ``constexprs`` (every constexpr parameter and launch option, in parameter
    order then the options: plain values), ``grid`` (None where it could not be evaluated) and
    ``execution`` (the launcher's name for it, from its frozen table; None where it picked none)."""

    kernel: str
    module: str
    constexprs: tuple[tuple[str, Any], ...]
    grid: tuple[int, ...] | None = None
    execution: str | None = None
    #: the launch's scalar runtime arguments (ints and floats that are no constexpr: sizes,
    #: strides, a split length): not part of the execution -- they follow the shapes -- but a
    #: reduction a runtime integer chooses shows only here (a failure message names those that
    #: differ between two launches of the same execution)
    scalars: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> ExecutionKey:
        """The execution: the kernel and its constexprs (the grid and the name left out)."""
        return (self.kernel, self.constexprs)

    def label(self) -> str:
        """``kernel [execution name]``."""
        return self.kernel + (f" [{self.execution}]" if self.execution else "")


@dataclass(frozen=True)
class CallLaunches:
    """What one subject call ran: its Triton launches in order and its notes (the reference,
    an adapter's backend)."""

    launches: tuple[Launch, ...] = ()
    notes: tuple[str, ...] = ()

    def executions(self) -> dict[ExecutionKey, Launch]:
        """The distinct executions, in launch order (the first launch of each)."""
        found: dict[ExecutionKey, Launch] = {}
        for launch in self.launches:
            found.setdefault(launch.key, launch)
        return found

    def describe(self, versus: CallLaunches | None = None) -> str:
        """One phrase: the notes, then each distinct execution as ``kernel [name]`` with its
        constexprs -- only those that differ from the same kernel's launch in ``versus`` when
        given (and none where ``versus`` launched the same execution) -- or, with no Triton
        launch, :func:`torch_only`."""
        parts = list(self.notes)
        theirs: dict[str, dict[str, Any]] = {}
        same: set[ExecutionKey] = set()
        if versus is not None:
            for launch in versus.launches:
                theirs.setdefault(launch.kernel, dict(launch.constexprs))
            same = set(versus.executions())
        for key, launch in self.executions().items():
            if versus is None or key in same:
                named = list(launch.constexprs) if versus is None else []
            else:
                other = theirs.get(launch.kernel, {})
                named = [(k, v) for k, v in launch.constexprs if k not in other or other[k] != v]
            text = launch.label()
            if named:
                shown = " ".join(f"{k}={v}" for k, v in named[:MAX_NAMED])
                text += " " + shown + (" ..." if len(named) > MAX_NAMED else "")
            parts.append(text)
        if not self.launches and not self.notes:
            parts.append(torch_only())
        return " + ".join(parts)


def torch_only() -> str:
    """A call with no Triton launch: torch operators; on a GPU, the cuBLAS pins in force (the
    algorithm cuBLAS or cuBLASLt picks is not exposed: named as such, never guessed)."""
    from batchinv.harness.cublas_audit import PIN_VARIABLES

    pins = [f"{v}={os.environ[v]}" for v in PIN_VARIABLES if os.environ.get(v)]
    extra = "; the BLAS algorithm is not exposed"
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            extra += f"; preferred BLAS {torch.backends.cuda.preferred_blas_library()}"
    except Exception:  # an old torch: nothing more to say
        pass
    if pins:
        extra += "; " + ", ".join(pins)
    return f"{NO_TRITON}{extra})"


# --- the capture ---------------------------------------------------------------------------------


class _State(threading.local):
    log: list[Launch | str] | None = None
    dry: bool = False
    pending: tuple[str, str | None] | None = None  # (execution name, module of its first launch)
    tuning: int = 0


_STATE = _State()
_INSTALL_LOCK = threading.Lock()
_INSTALLED = False


@dataclass(frozen=True)
class _Spec:
    """A kernel's parameters as a launch binds them (computed once per kernel object)."""

    name: str
    module: str
    constexprs: tuple[tuple[int, str, Any], ...]  # (position, name, default)
    params: frozenset[str]
    names: tuple[str, ...]
    positions: frozenset[int]  # of the constexpr parameters


def _is_constexpr(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return "constexpr" in annotation
    return getattr(annotation, "__name__", "") == "constexpr"


def _spec(kernel: Any) -> _Spec:
    spec = kernel.__dict__.get("_batchinv_spec")
    if spec is None:
        fn = getattr(kernel, "fn", kernel)
        params = list(inspect.signature(fn).parameters.values())
        spec = _Spec(
            name=getattr(fn, "__name__", type(kernel).__name__),
            module=getattr(fn, "__module__", "") or "",
            constexprs=tuple(
                (i, p.name, None if p.default is inspect.Parameter.empty else p.default)
                for i, p in enumerate(params)
                if _is_constexpr(p.annotation)
            ),
            params=frozenset(p.name for p in params),
            names=tuple(p.name for p in params),
            positions=frozenset(i for i, p in enumerate(params) if _is_constexpr(p.annotation)),
        )
        kernel.__dict__["_batchinv_spec"] = spec
    return spec


def _plain(value: Any) -> Any:
    """A JSON-able, hashable stand-in for a constexpr value (a ``tl.constexpr`` unwrapped, a
    dtype by its name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    inner = getattr(value, "value", value)  # tl.constexpr
    if inner is not value and (inner is None or isinstance(inner, (bool, int, float, str))):
        return inner
    return str(value)


def _grid(grid: Any, spec: _Spec, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int, ...] | None:
    try:
        if callable(grid):
            meta = dict(zip(spec.names, args, strict=False))
            for _, name, default in spec.constexprs:
                meta.setdefault(name, default)
            meta.update(kwargs)
            grid = grid(meta)
        return tuple(int(g) for g in grid)
    except Exception:  # a grid the judge cannot evaluate: recorded as unknown
        return None


def _wrap_run(original: Any) -> Any:
    @functools.wraps(original)
    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        state = _STATE
        log = state.log
        if log is None or warmup or state.tuning:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        spec = _spec(self)
        values = []
        for i, name, default in spec.constexprs:
            value = kwargs[name] if name in kwargs else (args[i] if i < len(args) else default)
            values.append((name, _plain(value)))
        values += [(k, _plain(v)) for k, v in kwargs.items() if k not in spec.params]
        scalars = tuple(
            (spec.names[i], v)
            for i, v in enumerate(args[: len(spec.names)])
            if type(v) in (int, float) and i not in spec.positions
        )
        pending = state.pending
        execution = None
        if pending is not None:
            name, owner = pending
            if owner is None:  # the first launch after the note takes it, and its module's others
                state.pending = (name, spec.module)
                execution = name
            elif owner == spec.module:
                execution = name
        log.append(
            Launch(spec.name, spec.module, tuple(values), _grid(grid, spec, args, kwargs), execution, scalars)
        )
        if state.dry:
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__batchinv_provenance__ = True  # type: ignore[attr-defined]
    return run


def _wrap_bench(original: Any) -> Any:
    @functools.wraps(original)
    def bench(*args: Any, **kwargs: Any) -> Any:
        _STATE.tuning += 1
        try:
            return original(*args, **kwargs)
        finally:
            _STATE.tuning -= 1

    bench.__batchinv_provenance__ = True  # type: ignore[attr-defined]
    return bench


def _patch(owner: type, attr: str, wrap: Any) -> None:
    current = owner.__dict__.get(attr)
    if current is not None and not getattr(current, "__batchinv_provenance__", False):
        setattr(owner, attr, wrap(current))


def _noted(execution: object) -> None:
    """The listener of :func:`batchinv.fast.execution.note_execution`: the next launch of this
    thread's recording (and its kernel module's launches after it) carries the name."""
    state = _STATE
    if state.log is None:
        return
    name = getattr(execution, "name", None)
    if isinstance(name, str):
        state.pending = (name, None)


def install() -> None:
    """Wrap Triton's launch methods (idempotent; thread-safe).  Triton 3.6-3.9: both classes
    keep ``run(self, *args, grid, warmup, **kwargs)``; a version without one is left alone."""
    global _INSTALLED
    if _INSTALLED:
        return
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        from triton.runtime import jit

        _patch(jit.JITFunction, "run", _wrap_run)
        try:
            from triton.runtime import interpreter

            _patch(interpreter.InterpretedFunction, "run", _wrap_run)
        except ImportError:  # pragma: no cover - every supported Triton has the interpreter
            pass
        try:
            from triton.runtime import autotuner

            _patch(autotuner.Autotuner, "_bench", _wrap_bench)
        except ImportError:  # pragma: no cover
            pass
        from batchinv.fast import execution

        execution.set_execution_listener(_noted)
        _INSTALLED = True


class Recording:
    """What :func:`recording` collected; :meth:`calls` is valid once the block has ended."""

    def __init__(self, log: list[Launch | str], start: int) -> None:
        self._log, self._start = log, start
        self._frozen: CallLaunches | None = None

    def _snapshot(self) -> CallLaunches:
        entries = self._log[self._start :]
        return CallLaunches(
            tuple(e for e in entries if isinstance(e, Launch)),
            tuple(e for e in entries if isinstance(e, str)),
        )

    def _freeze(self) -> None:
        self._frozen = self._snapshot()

    def calls(self) -> CallLaunches:
        """The launches and notes of the block (so far, if it is still running)."""
        return self._frozen if self._frozen is not None else self._snapshot()


@contextmanager
def recording(*, dry: bool = False) -> Iterator[Recording]:
    """Record this thread's Triton launches and notes inside the block.

    Nested blocks share one log (an outer block sees its inner blocks' launches).  ``dry``: the
    launches are recorded and not run (the launcher's host code runs; its outputs are left as
    allocated) -- only for replaying a launcher's choices, never for its outputs."""
    install()
    state = _STATE
    outer = state.log
    log: list[Launch | str] = outer if outer is not None else []
    saved = (state.dry, state.pending)
    state.log, state.dry, state.pending = log, saved[0] or dry, None
    rec = Recording(log, len(log))
    try:
        yield rec
    finally:
        rec._freeze()
        state.dry, state.pending = saved
        if outer is None:
            state.log = None


@contextmanager
def paused() -> Iterator[None]:
    """Neither record nor skip this thread's launches inside the block, even within a dry
    recording: the judge's own work (building a case's inputs, which a dry replay must not
    leave unwritten in the build cache)."""
    state = _STATE
    saved = state.log
    state.log = None
    try:
        yield
    finally:
        state.log = saved


def note(text: str) -> None:
    """Add ``text`` to this thread's recording (no-op outside one): what a call ran that is no
    Triton launch (:data:`REFERENCE`; an adapter's ``"flashinfer bmm_fp8 backend=cutlass"``)."""
    log = _STATE.log
    if log is not None:
        log.append(text)


def dry() -> bool:
    """Whether this thread is inside a dry :func:`recording` (launches not run)."""
    return _STATE.log is not None and _STATE.dry


# --- outputs and their launches ------------------------------------------------------------------


class _Launched(tuple):
    """A subject call's outputs with the call's :class:`CallLaunches` beside them."""

    launches: CallLaunches | None = None


def attach(outputs: Sequence[Any], calls: CallLaunches | None) -> tuple[Any, ...]:
    """``outputs`` as a tuple carrying ``calls`` (read back by :func:`of`)."""
    out = _Launched(outputs)
    out.launches = calls
    return out


def of(outputs: Any) -> CallLaunches | None:
    """The launches :func:`attach` put beside ``outputs`` (None: not known)."""
    return getattr(outputs, "launches", None)


def carry(source: Any, outputs: Sequence[Any]) -> tuple[Any, ...]:
    """``outputs`` (a part of ``source``: some rows) carrying ``source``'s launches."""
    calls = of(source)
    return attach(outputs, calls) if calls is not None else tuple(outputs)


def contrast(expected: CallLaunches | None, actual: CallLaunches | None, names: tuple[str, str]) -> str:
    """What the two sides of a comparison ran, for a failure message: ``"both ran K [name]"``
    when their executions are the same, else ``"alone ran K [a] BLOCK_M=16 SPLIT_K=True; in a
    batch of 17 ran K [b] BLOCK_M=64 SPLIT_K=False"`` (each side's constexprs that differ from
    the other's); "" when either side is unknown."""
    if expected is None or actual is None:
        return ""
    if set(expected.executions()) == set(actual.executions()) and expected.notes == actual.notes:
        return f"both ran {expected.describe(versus=expected)}" + _runtime_difference(expected, actual)
    return f"{names[0]} ran {expected.describe(actual)}; {names[1]} ran {actual.describe(expected)}"


def _runtime_difference(a: CallLaunches, b: CallLaunches) -> str:
    """Where two calls ran the same executions: the grids and scalar runtime arguments that
    differ between their first launches of each kernel (``" (runtime arguments differ:
    k_per_split 32 / 8; grid (2, 1, 5) / (1, 1, 20))"``), "" where none do."""
    theirs: dict[str, Launch] = {}
    for launch in b.launches:
        theirs.setdefault(launch.kernel, launch)
    parts: list[str] = []
    seen: set[str] = set()
    for launch in a.launches:
        other = theirs.get(launch.kernel)
        if other is None or launch.kernel in seen:
            continue
        seen.add(launch.kernel)
        mine, other_scalars = dict(launch.scalars), dict(other.scalars)
        parts += [
            f"{k} {v} / {other_scalars[k]}"
            for k, v in mine.items()
            if k in other_scalars and other_scalars[k] != v
        ]
        if launch.grid != other.grid and launch.grid is not None and other.grid is not None:
            parts.append(f"{launch.kernel} grid {launch.grid} / {other.grid}")
    if not parts:
        return ""
    return (
        " (runtime arguments differ: "
        + "; ".join(parts[:MAX_NAMED])
        + (" ..." if len(parts) > MAX_NAMED else "")
        + ")"
    )


# --- a check's launches, by sweep point ----------------------------------------------------------


class Tally:
    """A check's launches by sweep point: each distinct execution (or note) with the number of
    calls that ran it and the labels of the first :data:`MAX_LABELS` sweep points that did."""

    def __init__(self) -> None:
        self._seen: dict[int, CallLaunches] = {}  # id -> call (kept alive: ids stay unique)
        self._launches: dict[ExecutionKey, tuple[Launch, list[str], list[int]]] = {}
        self._notes: dict[str, tuple[list[str], list[int]]] = {}

    def add(self, calls: CallLaunches | None, label: str) -> None:
        """Count ``calls`` (once per call object) under ``label``."""
        if calls is None or id(calls) in self._seen:
            return
        self._seen[id(calls)] = calls
        notes = list(calls.notes)
        if not calls.launches and not notes:
            notes.append(NO_TRITON + ")")
        for text in notes:
            labels, count = self._notes.setdefault(text, ([], [0]))
            count[0] += 1
            if len(labels) < MAX_LABELS and label not in labels:
                labels.append(label)
        for key, launch in calls.executions().items():
            _, labels, count = self._launches.setdefault(key, (launch, [], [0]))
            count[0] += 1
            if len(labels) < MAX_LABELS and label not in labels:
                labels.append(label)

    def merge(self, other: Tally) -> None:
        """Fold ``other``'s calls in (their labels as ``other`` recorded them)."""
        for key, (launch, labels, count) in other._launches.items():
            _, mine, n = self._launches.setdefault(key, (launch, [], [0]))
            n[0] += count[0]
            mine += [lb for lb in labels if lb not in mine][: MAX_LABELS - len(mine)]
        for text, (labels, count) in other._notes.items():
            mine, n = self._notes.setdefault(text, ([], [0]))
            n[0] += count[0]
            mine += [lb for lb in labels if lb not in mine][: MAX_LABELS - len(mine)]

    def prefixed(self, prefix: str) -> Tally:
        """A copy whose labels read ``prefix label`` (``batch_prefix M=7``)."""
        out = Tally()
        for key, (launch, labels, count) in self._launches.items():
            out._launches[key] = (launch, [f"{prefix} {lb}" for lb in labels], list(count))
        for text, (labels, count) in self._notes.items():
            out._notes[text] = ([f"{prefix} {lb}" for lb in labels], list(count))
        return out

    def executions(self) -> dict[ExecutionKey, tuple[Launch, list[str]]]:
        """Each distinct execution: its first launch and its labels."""
        return {key: (launch, labels) for key, (launch, labels, _) in self._launches.items()}

    def to_json(self) -> list[dict[str, Any]]:
        """The report row's ``launches``: one entry per execution -- ``kernel``, ``execution``
        (the launcher's name or None), ``constexprs``, ``calls``, ``at`` (sweep point labels) --
        and per note (``note``, ``calls``, ``at``); at most :data:`MAX_EXECUTIONS` entries, then
        one ``{"more": n}`` (the tally itself keeps every execution: the verdicts see them all)."""
        rows: list[dict[str, Any]] = [
            {"note": text, "calls": count[0], "at": list(labels)}
            for text, (labels, count) in self._notes.items()
        ]
        for launch, labels, count in self._launches.values():
            if len(rows) >= MAX_EXECUTIONS:
                rows.append({"more": len(self._launches) + len(self._notes) - MAX_EXECUTIONS})
                break
            rows.append(
                {
                    "kernel": launch.kernel,
                    "execution": launch.execution,
                    "constexprs": dict(launch.constexprs),
                    "calls": count[0],
                    "at": list(labels),
                }
            )
        return rows


def lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A report row's ``launches`` (:meth:`Tally.to_json`) as text lines, one per execution or
    note: ``chunked_matmul_kernel [16x64 g2 w4 s3 split] BLOCK_M=16 ... (3 calls: M=1, M=2)``."""
    out = []
    for row in rows:
        if "more" in row:
            out.append(f"... {row['more']} more")
            continue
        head = row.get("note") or (
            str(row.get("kernel", "?"))
            + (f" [{row['execution']}]" if row.get("execution") else "")
            + "".join(f" {k}={v}" for k, v in (row.get("constexprs") or {}).items())
        )
        at = row.get("at") or []
        calls = row.get("calls", 0)
        out.append(
            f"{head} ({calls} call{'' if calls == 1 else 's'}" + (f": {', '.join(at)})" if at else ")")
        )
    return out
