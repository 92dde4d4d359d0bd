"""``batchinv sweep``: every registered component on one lane.

For each component and each of its cases on the lane: agreement and every invariance check on
the fast kernel; then the negative controls: each baseline's invariance checks, stopping at the
first one that detects variance (a detection is all a negative control needs).  Pin candidates
run their batch-prefix check on every case, since where they vary is the finding.

Verdicts: a fast check is ``pass``/``fail``/``error``, or ``reference path`` where the fast
callable ran the reference instead of its kernel (counted apart from the passes, not a
failure); a negative control is ``detected`` (some check found different bits on the baseline,
as it must), ``inconclusive`` (nothing varied: the harness could not tell this baseline from a
pinned kernel here — never reported as a pass), ``not reached (--max-m N)`` (nothing varied,
but the M sweep was cut by ``--max-m``) or ``error`` (the baseline crashed: a failure of the
sweep, never a detection); a pin candidate is ``invariant``, ``varies`` or ``error``.

Execution: the work is cut into *units* — one unit per (component, case) for the fast kernel
(its checks share one built batch), one per baseline (its checks stop at the first detection).
With ``jobs > 1`` the units run in a pool of worker processes (``spawn``; each enters the lane,
takes its share of the CPU threads and, on a multi-GPU machine, a GPU of its own), so Triton
compilations and case building, the two large costs of a cold GPU sweep, run in parallel.  The
verdicts do not depend on ``jobs``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any, TypeAlias

from batchinv.harness import compile_stats
from batchinv.harness.checks import (
    FAST,
    REFERENCE_PATH,
    CheckResult,
    SubjectLike,
    control_results,
    run_check,
    run_checks,
    subject_name,
)
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import INVARIANCE_CHECKS, Baseline, Component
from batchinv.harness.subjects import Subject


@dataclass
class CheckSummary:
    """Aggregate of one (component, check) over every case, for the fast kernel or an outside
    subject checked like it (``subject``)."""

    component: str
    check: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    reference_path: int = 0  # cases where fast ran the reference, not its kernel (no failure)
    rows_differing: int = 0
    worst_ulp: float | None = None
    worst_abs: float | None = None
    worst_bound_ratio: float | None = None  # toleranced agreement: worst error / bound (< 1 passes)
    first_difference: str = ""
    seconds: float = 0.0
    detected_by: list[str] = field(default_factory=list)
    subject: str = FAST
    subject_target: str = ""  # an outside subject's import path

    @property
    def cases(self) -> int:
        return self.passed + self.failed + self.errors + self.reference_path

    @property
    def status(self) -> str:
        if self.errors:
            return "error"
        if self.failed:
            return "fail"
        if self.passed:
            return "pass"
        if self.reference_path:
            return REFERENCE_PATH
        return "skip"

    def add(self, r: CheckResult) -> None:
        self.seconds += r.seconds
        if r.status == "pass":
            self.passed += 1
        elif r.status == "fail":
            self.failed += 1
            if not self.first_difference and r.first_difference:
                self.first_difference = f"{r.first_difference} [{r.case}]"
        elif r.status == "error":
            self.errors += 1
        elif r.status == REFERENCE_PATH:
            self.reference_path += 1
        else:
            self.skipped += 1
        self.rows_differing += r.rows_differing if r.status == "fail" else 0
        if r.worst_ulp is not None:
            self.worst_ulp = max(self.worst_ulp or 0.0, r.worst_ulp)
        if r.worst_abs is not None:
            self.worst_abs = max(self.worst_abs or 0.0, r.worst_abs)
        if r.bound_ratio is not None:
            self.worst_bound_ratio = max(self.worst_bound_ratio or 0.0, r.bound_ratio)


@dataclass
class ControlSummary:
    """The verdict on one baseline (negative control or pin candidate)."""

    component: str
    baseline: str
    pin_candidate: bool
    expected_to_vary: bool
    verdict: str = "inconclusive"
    where: str = ""
    detail: str = ""
    repro: str = ""
    cases: int = 0
    seconds: float = 0.0
    subject_target: str = ""  # an outside subject's import path (``--as baseline``)

    @property
    def is_failure(self) -> bool:
        """A verdict that makes the sweep exit non-zero: a crash, or no detection where one is required."""
        return self.verdict == "error" or (self.expected_to_vary and self.verdict == "inconclusive")


@dataclass
class SweepOutcome:
    checks: list[CheckSummary]
    controls: list[ControlSummary]
    failures: list[CheckResult]
    wall_seconds: float = 0.0
    compile: compile_stats.CompileStats = field(default_factory=compile_stats.CompileStats)
    jobs: int = 1
    #: Components asked for whose ``lanes`` exclude the sweep's lane: not run, reported as such
    #: ("not run on this lane"), never a pass nor a failure.  Each entry: (name, its lanes).
    not_on_lane: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not any(c.is_failure for c in self.controls)

    def summary(self) -> dict[str, Any]:
        """The report's closing record (strict-JSON-able through :mod:`strict_json`)."""
        return {
            "ok": self.ok,
            "wall_seconds": self.wall_seconds,
            "check_seconds": self.check_seconds,
            "compile": vars(self.compile),
            "jobs": self.jobs,
            "checks": [vars(c) for c in self.checks],
            "controls": [{**vars(c), "is_failure": c.is_failure} for c in self.controls],
            "not_on_lane": [{"component": name, "lanes": list(lanes)} for name, lanes in self.not_on_lane],
        }

    @property
    def check_seconds(self) -> float:
        """Seconds spent in checks, summed over every worker (the fast kernel's and the controls')."""
        return sum(c.seconds for c in self.checks) + sum(c.seconds for c in self.controls)


@dataclass(frozen=True)
class Task:
    component: Component
    subject: SubjectLike
    check: str
    case_index: int


#: Outside subjects of a sweep, per component name.
Subjects: TypeAlias = Mapping[str, Sequence[Subject]]


def plan(
    components: Sequence[Component],
    lane: Lane,
    *,
    subjects: Subjects | None = None,
    include_fast: bool = True,
    include_baselines: bool = True,
) -> list[Task]:
    """Every task of a sweep, in order (negative-control tasks may be cut short at run time)."""
    tasks: list[Task] = []
    for comp in components:
        if lane not in comp.lanes:
            continue
        cases = comp.cases(lane)
        checks = comp.applicable_checks()
        fast_like: list[SubjectLike] = [FAST] if include_fast else []
        controls: list[SubjectLike] = []
        for subj in (subjects or {}).get(comp.name, ()):
            (controls if subj.is_baseline else fast_like).append(subj)
        for subject in fast_like:
            tasks += [Task(comp, subject, ch, i) for i in range(len(cases)) for ch in checks]
        for b in _baselines(comp, lane) if include_baselines else []:
            b_checks = ("batch_prefix",) if b.is_pin_candidate else _invariance_checks(comp)
            tasks += [Task(comp, b.name, ch, i) for i in range(len(cases)) for ch in b_checks]
        for subject in controls:
            tasks += [
                Task(comp, subject, ch, i) for i in range(len(cases)) for ch in _invariance_checks(comp)
            ]
    return tasks


def _baselines(comp: Component, lane: Lane) -> list[Baseline]:
    return [b for b in comp.baselines if lane in b.lanes]


def _invariance_checks(comp: Component) -> tuple[str, ...]:
    return tuple(c for c in comp.applicable_checks() if c in INVARIANCE_CHECKS)


@dataclass(frozen=True)
class Unit:
    """Work one process does in one go: every check of one case on the fast kernel or an
    outside subject checked like it (``case_index`` set), or a baseline's (or an outside
    negative control's) whole control (``case_index`` None)."""

    component: str
    subject: SubjectLike
    case_index: int | None = None


def _units(
    components: Sequence[Component],
    lane: Lane,
    include_baselines: bool,
    subjects: Subjects | None = None,
    include_fast: bool = True,
) -> list[Unit]:
    """Controls first (a control runs its cases one after another, the longest chains), then
    each case of the fast kernel and of each outside subject checked like it."""
    units: list[Unit] = []
    outside = {c.name: list((subjects or {}).get(c.name, ())) for c in components}
    if include_baselines:
        units += [Unit(c.name, b.name) for c in components for b in _baselines(c, lane)]
    units += [Unit(c.name, s) for c in components for s in outside[c.name] if s.is_baseline]
    for c in components:
        fast_like: list[SubjectLike] = [FAST] if include_fast else []
        fast_like += [s for s in outside[c.name] if not s.is_baseline]
        units += [Unit(c.name, s, i) for s in fast_like for i in range(len(c.cases(lane)))]
    return units


def run_unit(comp: Component, unit: Unit, lane: Lane, m_limit: int | None) -> list[CheckResult]:
    """The results of one unit, in order (a control ends at its first detection or crash)."""
    subject = unit.subject.loaded() if isinstance(unit.subject, Subject) else unit.subject
    if unit.case_index is not None:
        case = comp.cases(lane)[unit.case_index]
        return [run_check(comp, subject, ch, case, lane, m_limit=m_limit) for ch in comp.applicable_checks()]
    if isinstance(subject, Subject):
        return list(control_results(comp, subject, lane, m_limit=m_limit))
    baseline = comp.baseline(subject)
    if baseline.is_pin_candidate:  # one subprocess for every case; where it varies is the finding
        return run_checks(comp, baseline.name, "batch_prefix", comp.cases(lane), lane, m_limit=m_limit)
    return list(control_results(comp, baseline.name, lane, m_limit=m_limit))


# --- worker processes -------------------------------------------------------------------------


def _worker_init(lane_value: str, threads: int, jobs: int) -> None:
    """Runs once in each worker: lane first (before triton is imported), threads, GPU, compile stats."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C ends
    from batchinv.harness.lanes import enter_lane

    lane = Lane(lane_value)
    enter_lane(lane)
    import torch

    torch.set_num_threads(threads)
    if lane.is_gpu and torch.cuda.device_count() > 1:
        import multiprocessing

        identity = multiprocessing.current_process()._identity  # 1-based worker number
        torch.cuda.set_device(((identity[0] - 1) if identity else 0) % torch.cuda.device_count())
    if lane.is_gpu:
        from batchinv.harness import build_cache

        build_cache.share_device(-(-jobs // max(1, torch.cuda.device_count())))
    compile_stats.install()


def _worker_run(
    unit: Unit, lane_value: str, m_limit: int | None
) -> tuple[list[CheckResult], compile_stats.CompileStats]:
    from batchinv.harness.build_cache import release_device_memory
    from batchinv.harness.registry import get

    before = compile_stats.snapshot()
    results = run_unit(get(unit.component), unit, Lane(lane_value), m_limit)
    release_device_memory()  # the other workers share this GPU
    return results, compile_stats.snapshot() - before


def default_jobs() -> int:
    """Worker processes for ``--jobs auto``: one per core, at most 12 (beyond that the GPU and
    the Triton cache's disk are the bottleneck)."""
    return max(1, min(12, os.cpu_count() or 1))


def _execute(
    comps: dict[str, Component],
    units: list[Unit],
    lane: Lane,
    m_limit: int | None,
    jobs: int,
) -> Iterable[tuple[Unit, list[CheckResult], compile_stats.CompileStats]]:
    """Yield each unit's results as it completes (in order when ``jobs == 1``)."""
    if jobs <= 1:
        compile_stats.install()
        for unit in units:
            before = compile_stats.snapshot()
            results = run_unit(comps[unit.component], unit, lane, m_limit)
            yield unit, results, compile_stats.snapshot() - before
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=get_context("spawn"),
        initializer=_worker_init,
        initargs=(lane.value, threads, jobs),
    )
    pending: dict[Future[Any], Unit] = {}
    # Workers are started while units are submitted; they are born with SIGINT ignored (an
    # ignored signal stays ignored across exec), so a Ctrl-C in the terminal reaches only this
    # process, which ends them: no worker prints a traceback from the middle of an import.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for unit in units:
            sent = (
                Unit(unit.component, unit.subject.without_fn(), unit.case_index)
                if isinstance(unit.subject, Subject)
                else unit
            )
            pending[pool.submit(_worker_run, sent, lane.value, m_limit)] = unit
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                unit = pending.pop(fut)
                results, stats = fut.result()
                yield unit, results, stats
    finally:
        if pending:  # interrupted: end the workers now instead of waiting for their units
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        # No future is cancelled by hand: the pool fails the pending ones itself once its
        # workers are gone (cancelling them first makes its manager thread raise).
        pool.shutdown(wait=True)


def _check_registered(components: Sequence[Component]) -> None:
    from batchinv.harness.registry import COMPONENT_MODULES, get

    for comp in components:
        if comp.name not in COMPONENT_MODULES or get(comp.name) is not comp:
            raise ValueError(
                f"jobs > 1 runs registered components only (workers look them up by name); "
                f"{comp.name!r} is not the registered one: use jobs=1"
            )


def run_sweep(
    components: Sequence[Component],
    lane: Lane,
    *,
    on_result: Callable[[CheckResult], None] = lambda r: None,
    on_skip: Callable[[int], None] = lambda n: None,
    m_limit: int | None = None,
    include_baselines: bool = True,
    jobs: int = 1,
    subjects: Subjects | None = None,
    include_fast: bool = True,
) -> SweepOutcome:
    """Run the sweep; ``on_result`` sees every result as it is made, ``on_skip`` is told how many
    planned tasks a detected negative control made unnecessary (for the progress bar).

    ``subjects``: outside subjects per component name (:class:`Subject`), each checked like the
    fast kernel (agreement and every invariance check) or, with role ``baseline``, run as a
    negative control that must vary.  ``include_fast=False`` leaves out the component's own
    fast kernel (a sweep of outside subjects alone).  ``jobs > 1`` runs the units in that many
    worker processes (registered components, and outside subjects with an import path, only).
    Raises ``KeyboardInterrupt`` through after ending the workers.
    """
    start = time.perf_counter()
    comps = [c for c in components if lane in c.lanes]
    if jobs > 1:
        _check_registered(comps)
        for subject_list in (subjects or {}).values():
            for s in subject_list:
                s.without_fn()  # an in-process callable cannot reach a worker: refused here
    by_name = {c.name: c for c in comps}
    checks: dict[tuple[str, str, str], CheckSummary] = {}
    controls: dict[tuple[str, str], ControlSummary] = {}
    for comp in comps:
        outside = list((subjects or {}).get(comp.name, ()))
        fast_like = ([(FAST, "")] if include_fast else []) + [
            (s.name, s.target or "") for s in outside if not s.is_baseline
        ]
        for name, target in fast_like:
            for ch in comp.applicable_checks():
                checks[(comp.name, name, ch)] = CheckSummary(
                    comp.name, ch, subject=name, subject_target=target
                )
        if include_baselines:
            for b in _baselines(comp, lane):
                controls[(comp.name, b.name)] = ControlSummary(
                    comp.name, b.name, b.is_pin_candidate, lane in b.expected_to_vary_on
                )
        for s in outside:
            if s.is_baseline:
                controls[(comp.name, s.name)] = ControlSummary(
                    comp.name, s.name, False, True, subject_target=s.target or ""
                )
    failures: list[CheckResult] = []
    stats = compile_stats.CompileStats()
    for unit, results, unit_stats in _execute(
        by_name, _units(comps, lane, include_baselines, subjects, include_fast), lane, m_limit, jobs
    ):
        stats = stats + unit_stats
        comp = by_name[unit.component]
        name = subject_name(unit.subject)
        if unit.case_index is not None:
            for r in results:
                on_result(r)
                checks[(comp.name, name, r.check)].add(r)
                if r.status in ("fail", "error"):
                    failures.append(r)
            continue
        baseline = comp.baseline(name) if isinstance(unit.subject, str) else None
        ctrl = controls[(comp.name, name)]
        pin = baseline is not None and baseline.is_pin_candidate
        planned = len(comp.cases(lane)) * (1 if pin else len(_invariance_checks(comp)))
        _fold_control(ctrl, name, pin, results, checks, on_result)
        on_skip(planned - len(results))
        if ctrl.verdict == "inconclusive":
            if pin:
                ctrl.verdict = "invariant"
            elif any(r.m_cut for r in results):
                ctrl.verdict = f"not reached (--max-m {m_limit})"
    return SweepOutcome(
        list(checks.values()),
        list(controls.values()),
        failures,
        wall_seconds=time.perf_counter() - start,
        compile=stats,
        jobs=jobs,
        not_on_lane=not_on_lane(components, lane),
    )


def not_on_lane(components: Sequence[Component], lane: Lane) -> list[tuple[str, tuple[str, ...]]]:
    """``(name, lanes)`` of each of ``components`` that does not run on ``lane``, in order."""
    return [(c.name, lane_names(c.lanes)) for c in components if lane not in c.lanes]


def lane_names(lanes: frozenset[Lane]) -> tuple[str, ...]:
    """``lanes`` as their names, in :class:`Lane`'s order."""
    return tuple(lane.value for lane in Lane if lane in lanes)


def _fold_control(
    ctrl: ControlSummary,
    name: str,
    pin_candidate: bool,
    results: list[CheckResult],
    checks: dict[tuple[str, str, str], CheckSummary],
    on_result: Callable[[CheckResult], None],
) -> None:
    """A control's verdict from its results: a crash is ``error`` whatever else happened."""
    wheres: list[str] = []
    for r in results:
        on_result(r)
        ctrl.seconds += r.seconds
        ctrl.cases += 1
        if r.status == "fail":
            if (r.component, FAST, r.check) in checks:
                checks[(r.component, FAST, r.check)].detected_by.append(name)
            wheres.append(f"{r.check} [{r.case}] {', '.join(r.where[:4])}")
            if ctrl.verdict == "inconclusive":
                ctrl.detail, ctrl.repro = r.detail, r.repro
                ctrl.verdict = "varies" if pin_candidate else "detected"
        elif r.status == "error" and ctrl.verdict != "error":
            ctrl.verdict = "error"
            ctrl.detail = f"the baseline crashed in {r.check} [{r.case}]: {r.detail}"
            ctrl.repro = r.repro
    ctrl.where = "; ".join(wheres[:3]) + (f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else "")
