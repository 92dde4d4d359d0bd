"""Check your own kernel from Python and pytest: :func:`check_subject`, and the pytest helpers
:func:`parametrize`, :func:`assert_subject` and :func:`assert_varies`.

The kernel is an outside subject (:mod:`batchinv.harness.subjects`): a callable with a
registered component's signature, or adapted to it (:class:`~batchinv.harness.subjects.Adapter`).
It is judged like the shipped kernel -- agreement with the reference (exact or within the
derived bound), every invariance check of the component, its bit-pattern cases -- by the same
:func:`batchinv.harness.checks.run_check`; a negative control (``role="baseline"``) must be
*detected* (some check finds different bits); a crash is an error, never a pass or a detection.

A pytest file::

    from batchinv.harness import testing
    from mylib import my_rms_norm

    @testing.parametrize("rms_norm")
    def test_my_rms_norm(point):
        testing.assert_subject(point, my_rms_norm)

One test per (case, check) of the component on the session's lane, ids like
``agreement-dtype=fp32-hidden=320-...``; a failure's message has the detail and a repro line.
Run it with the batchinv plugin enabled (``--batchinv`` or ``--lane cpu``) so the lane is
entered before anything imports triton.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from batchinv.harness.checks import (
    REFERENCE_PATH,
    TIMEOUT,
    BaselineCrashed,
    CheckResult,
    control_results,
    run_check,
)
from batchinv.harness.lanes import Lane, enter_lane, parse_lane
from batchinv.harness.registry import Case, Component, get
from batchinv.harness.subjects import Adapter, Declared, Subject, SubjectError, check_signature


def _lane(lane: Lane | str | None) -> Lane:
    """``lane`` (detected when None: the pytest session's, else the hardware's), entered."""
    if lane is None:
        from batchinv.harness.plugin import current_lane

        chosen = current_lane()
    else:
        chosen = parse_lane(lane) if isinstance(lane, str) else lane
    enter_lane(chosen)
    return chosen


def _target_of(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` when ``fn`` can be imported back from it (a repro re-imports it)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    import importlib

    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    return f"{module}:{qualname}" if obj is fn else None


def _component(component: Component | str) -> Component:
    """``component`` itself, or the registered one of that name (:class:`UnknownComponent`)."""
    if isinstance(component, Component):
        return component
    return get(component)


def as_subject(
    component: Component | str,
    fn: Callable[..., Any] | Subject,
    *,
    name: str | None = None,
    adapter: Adapter | None = None,
    role: str | None = None,
) -> Subject:
    """``fn`` as a :class:`Subject` of ``component``, its signature checked.

    ``fn`` may be a plain callable, a :func:`~batchinv.harness.subjects.declare`-d one (its
    adapter and role apply unless given here) or a :class:`Subject`.  The name defaults to the
    callable's ``__name__``; the import path is ``module:qualname`` when the callable can be
    imported back from it (else repro lines name it without one).

    Raises:
        SubjectError: ``fn`` is not callable, a signature that does not bind (naming the
            component's parameters), a bad name or role.
        UnknownComponent: ``component`` names no registered component (the message lists them).
    """
    comp = _component(component)
    if not isinstance(fn, Subject) and not callable(fn):
        raise SubjectError(
            "fn", "a callable (or a Subject) with the component's signature", type(fn).__name__
        )
    if isinstance(fn, Subject):
        subject = fn.loaded()
    else:
        declared = fn if isinstance(fn, Declared) else None
        inner = declared.fn if declared is not None else fn
        subject = Subject(
            name or getattr(inner, "__name__", "subject").strip("<>") or "subject",
            _target_of(fn) if declared is None else None,
            inner,
            role or (declared.role if declared is not None else "fast"),
            adapter or (declared.adapter if declared is not None else None),
            comp.name,
        )
    if role is not None and subject.role != role:
        subject = Subject(subject.name, subject.target, subject.fn, role, subject.adapter, comp.name)
    check_signature(comp, subject)
    return subject


@dataclass
class SubjectReport:
    """The results of :func:`check_subject`.

    ``ok``: for role ``fast``, no check failed or crashed and at least one passed (a subject
    every case skipped proved nothing); for role ``baseline``, some check found different bits
    and none crashed.
    """

    subject: Subject
    component: str
    lane: Lane
    results: list[CheckResult]

    @property
    def failures(self) -> list[CheckResult]:
        """Rows that failed (for a baseline: the detections), crashed or timed out."""
        return [r for r in self.results if r.status in ("fail", "error", TIMEOUT)]

    @property
    def errors(self) -> list[CheckResult]:
        """Rows that crashed or timed out (never a pass nor a detection)."""
        return [r for r in self.results if r.status in ("error", TIMEOUT)]

    @property
    def ok(self) -> bool:
        if self.subject.is_baseline:
            return not self.errors and any(r.status == "fail" for r in self.results)
        passed = any(r.status in ("pass", REFERENCE_PATH) for r in self.results)
        return passed and not self.failures

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.results)

    def summary(self) -> str:
        """One line per failing (or crashing) row with its repro line, after a count."""
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        head = (
            f"{self.component}/{self.subject.spec} as {self.subject.role} on lane {self.lane.value}: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            + (" -- OK" if self.ok else " -- NOT OK")
        )
        lines = [head]
        for r in self.failures:
            lines.append(f"  {r.status.upper()} {r.check} [{r.case}]: {r.detail}\n    repro: {r.repro}")
        return "\n".join(lines)


def check_subject(
    component: Component | str,
    fn: Callable[..., Any] | Subject,
    *,
    lane: Lane | str | None = None,
    name: str | None = None,
    adapter: Adapter | None = None,
    role: str | None = None,
    checks: Sequence[str] | None = None,
    m_limit: int | None = None,
    timeout: float | None = None,
) -> SubjectReport:
    """Check ``fn`` as a subject of ``component`` on ``lane`` and return every result.

    Role ``fast`` (the default): agreement and every applicable invariance check (or only
    ``checks``) on every case of the lane.  Role ``baseline``: the negative control, the
    invariance checks case by case until the first that finds different bits or crashes.
    ``m_limit`` cuts the M sweep as ``--max-m`` does.  Nothing raises for a failing check (see
    :attr:`SubjectReport.ok` and :meth:`SubjectReport.summary`).

    ``timeout``: the limit on one call of ``fn``, in seconds (None: the lane's default,
    :data:`batchinv.harness.isolation.DEFAULT_TIMEOUT`; 0: none); a call past it is a
    ``timeout`` row and the next check runs.  In this process the limit is a ``SIGALRM`` timer,
    so it interrupts a call only from the main thread and only where the call returns to the
    interpreter (Python code, a ``sleep``); a call hung inside C code is interrupted only by a
    sweep's worker processes (``batchinv sweep --jobs 2``), whose parent kills the worker.

    Raises:
        SubjectError: ``fn`` is not callable, the signature does not bind, or ``checks`` names
            a check that does not apply to the component.
        UnknownComponent: ``component`` names no registered component (the message lists them).
    """
    chosen = _lane(lane)
    comp = _component(component)
    subject = as_subject(comp, fn, name=name, adapter=adapter, role=role)
    applicable = comp.applicable_checks()
    wanted = list(checks) if checks is not None else list(applicable)
    unknown = [c for c in wanted if c not in applicable]
    if unknown:
        raise SubjectError("checks", f"checks of {comp.name} ({', '.join(applicable)})", unknown)
    if subject.is_baseline:
        results = list(control_results(comp, subject, chosen, m_limit=m_limit, timeout=timeout))
    else:
        results = [
            run_check(comp, subject, ch, case, chosen, m_limit=m_limit, timeout=timeout)
            for case in comp.cases(chosen)
            for ch in wanted
        ]
    return SubjectReport(subject, comp.name, chosen, results)


# --- pytest -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One (case, check) of a component on a lane: one parametrized test."""

    component: str
    case: Case
    check: str
    lane: Lane
    m_limit: int | None = None

    @property
    def id(self) -> str:
        return f"{self.check}-{self.case.id}"


def points(
    component: str,
    *,
    lane: Lane | str | None = None,
    checks: Sequence[str] | None = None,
    m_limit: int | None = None,
) -> list[Point]:
    """Every (case, check) of ``component`` on the lane (only ``checks`` when given)."""
    chosen = _lane(lane)
    comp = get(component)
    wanted = [c for c in comp.applicable_checks() if checks is None or c in checks]
    return [Point(comp.name, case, ch, chosen, m_limit) for case in comp.cases(chosen) for ch in wanted]


def parametrize(
    component: str,
    *,
    argname: str = "point",
    lane: Lane | str | None = None,
    checks: Sequence[str] | None = None,
    m_limit: int | None = None,
) -> Any:
    """``pytest.mark.parametrize(argname, points(component, ...))`` with readable ids."""
    import pytest

    found = points(component, lane=lane, checks=checks, m_limit=m_limit)
    return pytest.mark.parametrize(argname, found, ids=[p.id for p in found])


def assert_subject(
    point: Point,
    fn: Callable[..., Any] | Subject,
    *,
    name: str | None = None,
    adapter: Adapter | None = None,
) -> CheckResult:
    """Run ``point``'s check of ``fn`` (checked like ``fast``); return the row on a pass.

    Skips the test (``pytest.skip``) on a ``skip`` row (nothing to compare, or a case the
    subject cannot express); fails it (``pytest.fail``) on ``fail`` or ``error`` with the
    detail and the repro line.  The row is recorded first
    (:func:`batchinv.harness.plugin.record`: the test's ``user_properties``, and its
    ``--batchinv-report`` row).
    """
    __tracebackhide__ = True  # a failure shows the test's line and the check's message, not this frame
    import pytest

    from batchinv.harness.plugin import record

    subject = as_subject(point.component, fn, name=name, adapter=adapter, role="fast")
    r = run_check(get(point.component), subject, point.check, point.case, point.lane, m_limit=point.m_limit)
    record(r)  # the test's user_properties (--junitxml) and its --batchinv-report row
    if r.status == "skip":
        pytest.skip(r.detail)
    if r.status in ("fail", "error", TIMEOUT):
        pytest.fail(
            f"{r.status.upper()} {r.component}/{r.subject} {r.check} [{r.case}]: {r.detail}\n  repro: {r.repro}"
        )
    return r


def assert_varies(
    component: str,
    fn: Callable[..., Any] | Subject,
    *,
    lane: Lane | str | None = None,
    name: str | None = None,
    adapter: Adapter | None = None,
    m_limit: int | None = None,
) -> CheckResult:
    """The negative control of ``fn``: some invariance check must find different bits.

    Returns the detecting row.  Raises ``AssertionError`` when no check found variance
    (inconclusive) and :class:`~batchinv.harness.checks.BaselineCrashed` when a check crashed
    (an error, never a detection).
    """
    from batchinv.harness.plugin import record

    __tracebackhide__ = True  # a failure shows the test's line and the message, not this frame
    report = check_subject(
        component, fn, lane=lane, name=name, adapter=adapter, role="baseline", m_limit=m_limit
    )
    record(*report.results)  # the test's user_properties (--junitxml) and --batchinv-report rows
    for r in report.results:
        if r.status in ("error", TIMEOUT):
            raise BaselineCrashed(
                f"{r.component}/{r.subject} crashed in {r.check} [{r.case}]: {r.detail}\n  repro: {r.repro}"
            )
        if r.status == "fail":
            return r
    raise AssertionError(
        f"{component}/{report.subject.spec}: no invariance check found different bits on lane "
        f"{report.lane.value} ({len(report.results)} checks): inconclusive, not a detection"
    )
