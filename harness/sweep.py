"""``batchinv sweep``: every registered component on one lane.

For each component and each of its cases on the lane: agreement and every invariance check on
the fast kernel; then the negative controls: each baseline's invariance checks, stopping at the
first one that detects variance (a detection is all a negative control needs).  Pin candidates
run their batch-prefix check on every case, since where they vary is the finding.

Verdicts: a fast check is ``pass``/``fail``/``error``/``timeout`` (a call of the subject ran
past ``timeout``: a failure, like ``error``), or ``reference path`` where the fast
callable ran the reference instead of its kernel (counted apart from the passes, not a
failure); a negative control is ``detected`` (some check found different bits on the baseline,
as it must), ``inconclusive`` (nothing varied: the harness could not tell this baseline from a
pinned kernel here — never reported as a pass), ``not reached (--max-m N)`` (nothing varied,
but the M sweep was cut by ``--max-m``), ``error`` (the baseline crashed: a failure of the
sweep, never a detection) or ``timeout``; a pin candidate is ``invariant``, ``varies`` or ``error``.

Execution: the work is cut into *units* — one unit per (component, case) for the fast kernel
(its checks share one built batch), one per baseline (its checks stop at the first detection).
With ``jobs > 1`` the units run in a pool of worker processes (``spawn``; each enters the lane,
takes its share of the CPU threads and, on a multi-GPU machine, a GPU of its own), so Triton
compilations and case building, the two large costs of a cold GPU sweep, run in parallel.  The
parent watches them: a worker that dies (a segfault) or whose subject call overruns its limit
(killed) makes the check it was running an ``error`` (naming the signal) or ``timeout`` row, a
new worker takes its place and runs the unit's remaining checks, and the sweep goes on.  The
verdicts do not depend on ``jobs``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from typing import Any, TypeAlias

from batchinv.harness import child_process, compile_stats
from batchinv.harness.checks import (
    FAST,
    REFERENCE_PATH,
    TIMEOUT,
    CheckResult,
    SubjectLike,
    _limit,
    _new_result,
    control_results,
    cross_process_started_early,
    run_check,
    run_checks,
    subject_name,
)
from batchinv.harness.cross_process import WORKER_HASH_SEED
from batchinv.harness.lanes import Lane
from batchinv.harness.profiles import FULL, Selection
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
    timeouts: int = 0  # cases where a call of the subject ran past its time limit
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
        return self.passed + self.failed + self.errors + self.timeouts + self.reference_path

    @property
    def status(self) -> str:
        if self.errors:
            return "error"
        if self.timeouts:
            return TIMEOUT
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
        elif r.status == TIMEOUT:
            self.timeouts += 1
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
        """A verdict that makes the sweep exit non-zero: a crash, a timeout, or no detection where
        one is required."""
        return self.verdict in ("error", TIMEOUT) or (
            self.expected_to_vary and self.verdict == "inconclusive"
        )


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
    #: the profile the sweep ran (``quick``: the fast kernel's cases cut on the cpu lane, the
    #: informational baselines' on every lane; ``full``: every case)
    profile: str = "full"
    #: the checks selected (``--checks``), None: every applicable check
    checks_selected: tuple[str, ...] | None = None
    #: each swept component's applicable checks (a property none of whose checks ran is unknown)
    applicable: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def properties(self) -> dict[tuple[str, str], dict[str, str]]:
        """Per (component, subject) checked like fast: batch-invariant and deterministic at
        fixed shape, each ``yes`` / ``no`` / ``unknown`` (:mod:`batchinv.harness.properties`)."""
        from batchinv.harness.properties import by_subject

        return by_subject(self.checks, self.applicable or None)

    @property
    def ok(self) -> bool:
        return not self.failures and not any(c.is_failure for c in self.controls)

    def summary(self) -> dict[str, Any]:
        """The report's closing record (strict-JSON-able through :mod:`strict_json`)."""
        return {
            "ok": self.ok,
            "wall_seconds": self.wall_seconds,
            "check_seconds": self.check_seconds,
            "compile": self.compile.summary(),
            "jobs": self.jobs,
            "profile": self.profile,
            "checks_selected": list(self.checks_selected) if self.checks_selected is not None else None,
            "errors": sum(r.status == "error" for r in self.failures),
            "timeouts": self.timeouts,
            "checks": [vars(c) for c in self.checks],
            "properties": [
                {"component": comp, "subject": subject, **found}
                for (comp, subject), found in self.properties().items()
            ],
            "controls": [{**vars(c), "is_failure": c.is_failure} for c in self.controls],
            "not_on_lane": [{"component": name, "lanes": list(lanes)} for name, lanes in self.not_on_lane],
        }

    @property
    def timeouts(self) -> int:
        """Rows and controls whose subject call ran past its time limit (each also a failure)."""
        return sum(r.status == TIMEOUT for r in self.failures) + sum(
            c.verdict == TIMEOUT for c in self.controls
        )

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
    selection: Selection = FULL,
) -> list[Task]:
    """Every task of a sweep, in order (negative-control tasks may be cut short at run time);
    ``selection``: the profile and checks (:mod:`batchinv.harness.profiles`; default: full)."""
    tasks: list[Task] = []
    for comp in components:
        if lane not in comp.lanes:
            continue
        fast_units = selection.fast_units(comp, lane)
        fast_like: list[SubjectLike] = [FAST] if include_fast else []
        controls: list[SubjectLike] = []
        for subj in (subjects or {}).get(comp.name, ()):
            (controls if subj.is_baseline else fast_like).append(subj)
        for subject in fast_like:
            tasks += [Task(comp, subject, ch, i) for i, checks in fast_units for ch in checks]
        for b in _baselines(comp, lane) if include_baselines else []:
            tasks += [Task(comp, b.name, ch, i) for ch, i in selection.control_pairs(comp, b, lane)]
        for subject in controls:
            tasks += [Task(comp, subject, ch, i) for ch, i in selection.control_pairs(comp, None, lane)]
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
    #: the unit's checks, when not all of them (a profile's selection; the rest of a fast-like
    #: unit whose worker died)
    checks: tuple[str, ...] | None = None
    #: a control's (check, case index) pairs, in the order it runs them (None: every case, case
    #: by case, every invariance check; a pin candidate: batch_prefix)
    pairs: tuple[tuple[str, int], ...] | None = None


def _units(
    components: Sequence[Component],
    lane: Lane,
    include_baselines: bool,
    subjects: Subjects | None = None,
    include_fast: bool = True,
    selection: Selection = FULL,
    interleave: bool = False,
) -> list[Unit]:
    """Component by component (so each finishes, and is printed, as early as it can): its
    controls first (a control runs its cases one after another, the longest chains), then each
    case of the fast kernel and of each outside subject checked like it.

    ``interleave`` (a GPU lane's worker pool): the components' lists merged instead, each spread
    evenly over the whole sweep: unit ``i`` of a component of ``n`` units at ``i / n`` of the way
    (ties in component order), so the first units are one of each component.  In component order
    a cold pool's twelve workers all began on the first component's cases and compiled its
    kernels side by side, each before any had written the shared disk cache (run 59: topk, 669 s
    of a 3047 s sweep).  One unit of each in turn (runs 61-68) left the components with the most
    units -- the attention components, topk, matmul, whose checks are the GPU's heavy work -- to
    the end, alone: a cold sweep's first half was bound by the CPUs compiling (GPU 16-45% busy),
    its second by the GPU (75-99%; ``ci/sample_load.sh``, runs 67-68).  Spread evenly, the GPU's
    work runs beside the compiling."""
    by_component: list[list[Unit]] = []
    outside = {c.name: list((subjects or {}).get(c.name, ())) for c in components}
    for c in components:
        units: list[Unit] = []
        by_component.append(units)
        if include_baselines:
            units += [
                Unit(c.name, b.name, None, None, selection.control_pairs(c, b, lane))
                for b in _baselines(c, lane)
            ]
        units += [
            Unit(c.name, s, None, None, selection.control_pairs(c, None, lane))
            for s in outside[c.name]
            if s.is_baseline
        ]
        fast_like: list[SubjectLike] = [FAST] if include_fast else []
        fast_like += [s for s in outside[c.name] if not s.is_baseline]
        units += [
            Unit(c.name, s, i, checks) for s in fast_like for i, checks in selection.fast_units(c, lane)
        ]
    if not interleave:
        return [u for units in by_component for u in units]
    placed = [
        (Fraction(i, len(units)), c, u) for c, units in enumerate(by_component) for i, u in enumerate(units)
    ]
    return [u for _, _, u in sorted(placed, key=lambda p: (p[0], p[1]))]


def run_unit(
    comp: Component,
    unit: Unit,
    lane: Lane,
    m_limit: int | None,
    timeout: float | None = None,
    *,
    early_cross_process: bool | None = None,
) -> list[CheckResult]:
    """The results of one unit, in order (a control ends at its first detection, crash or
    timeout).  ``timeout``: the limit on one subject call (see :func:`run_check`).

    ``early_cross_process`` (None: on GPU lanes): a case's unit whose checks include
    ``cross_process`` starts that check's fresh processes first
    (:func:`~batchinv.harness.checks.cross_process_started_early`), so that their start-up and
    compiling, seconds of CPU each, run beside the case's other checks instead of after them;
    the rows are the same.  The cpu lane runs them in turn (the interpreter's children and the
    checks would share the same few cores)."""
    subject = unit.subject.loaded() if isinstance(unit.subject, Subject) else unit.subject
    all_cases = comp.cases(lane)
    if unit.case_index is not None:
        case = all_cases[unit.case_index]
        checks = unit.checks if unit.checks is not None else comp.applicable_checks()
        early = lane.is_gpu if early_cross_process is None else early_cross_process
        started = (
            cross_process_started_early(comp, subject, case, lane, timeout=timeout)
            if early and "cross_process" in checks
            else contextlib.nullcontext()
        )
        with started:
            return [
                run_check(comp, subject, ch, case, lane, m_limit=m_limit, timeout=timeout) for ch in checks
            ]
    pairs = None if unit.pairs is None else [(ch, all_cases[i]) for ch, i in unit.pairs]
    if isinstance(subject, Subject):
        return list(control_results(comp, subject, lane, m_limit=m_limit, timeout=timeout, pairs=pairs))
    baseline = comp.baseline(subject)
    if baseline.is_pin_candidate:  # one subprocess for every case; where it varies is the finding
        cases = all_cases if pairs is None else [case for ch, case in pairs if ch == "batch_prefix"]
        if not cases:
            return []
        return run_checks(comp, baseline.name, "batch_prefix", cases, lane, m_limit=m_limit, timeout=timeout)
    return list(control_results(comp, baseline.name, lane, m_limit=m_limit, timeout=timeout, pairs=pairs))


# --- worker processes -------------------------------------------------------------------------


def _worker_init(lane_value: str, threads: int, jobs: int, slot: int) -> None:
    """Runs once in each worker: lane first (before triton is imported), threads, GPU, compile stats."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C ends
    from batchinv.harness.lanes import enter_lane

    lane = Lane(lane_value)
    enter_lane(lane)
    if lane.is_gpu:  # twelve workers share the GPU: a wait for it sleeps, leaving the core free
        from batchinv.harness.cuda_wait import prefer_blocking_sync

        how = prefer_blocking_sync()
        if how != "block" and not how.startswith("spin (BATCHINV"):
            print(f"batchinv sweep worker {slot}: GPU waits spin: {how}", file=sys.stderr)
    import torch

    torch.set_num_threads(threads)
    if lane.is_gpu and torch.cuda.device_count() > 1:
        torch.cuda.set_device(slot % torch.cuda.device_count())
    if lane.is_gpu:
        from batchinv.harness import build_cache

        build_cache.share_device(-(-jobs // max(1, torch.cuda.device_count())))
    compile_stats.install()


class _PipeObserver:
    """A worker's reports to its parent: each check as it starts and ends, each subject call as
    it starts and ends (the parent's watchdog, :func:`_execute`)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def check_started(self, check: str, case_id: str) -> None:
        self.conn.send(("check", check, case_id))

    def check_ended(self, result: CheckResult) -> None:
        self.conn.send(("result", result))

    def call_started(self, limit: float | None) -> None:
        self.conn.send(("call", limit))

    def call_ended(self) -> None:
        self.conn.send(("called",))


def _worker_main(
    conn: Connection,
    lane_value: str,
    threads: int,
    jobs: int,
    slot: int,
    m_limit: int | None,
    timeout: float | None,
) -> None:
    """A worker process: runs the units its parent sends, one at a time, until it sends None."""
    _worker_init(lane_value, threads, jobs, slot)
    from batchinv.harness import isolation
    from batchinv.harness.build_cache import release_device_memory
    from batchinv.harness.registry import get

    isolation.set_observer(_PipeObserver(conn))
    lane = Lane(lane_value)
    while True:
        try:
            unit = conn.recv()
        except EOFError:  # the parent is gone
            return
        if unit is None:
            return
        before = compile_stats.snapshot()
        try:
            results = run_unit(get(unit.component), unit, lane, m_limit, timeout)
        except Exception as exc:  # outside any check (an outside subject's import): the parent's row
            conn.send(("failed", traceback.format_exception_only(type(exc), exc)[-1].strip()))
            continue
        release_device_memory()  # the other workers share this GPU
        conn.send(("done", results, compile_stats.snapshot() - before))


def default_jobs() -> int:
    """Worker processes for ``--jobs auto``: one per core, at most 12 (beyond that the GPU and
    the Triton cache's disk are the bottleneck)."""
    return max(1, min(12, os.cpu_count() or 1))


@dataclass
class _Job:
    """One unit's run in one worker (a unit resumed after a crash is a second job)."""

    index: int  # the unit's place in the sweep's list
    unit: Unit
    results: list[CheckResult] = field(default_factory=list)
    check: tuple[str, str] | None = None  # (check, case id) in flight
    call_since: float | None = None
    call_limit: float | None = None
    #: a re-run after a device out-of-memory error beside other workers: runs with no other
    #: unit in flight (:func:`_execute`)
    alone: bool = False


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    job: _Job | None = None


def _planned(comp: Component, unit: Unit, lane: Lane) -> list[tuple[str, int]]:
    """(check, case index) of every check the unit can run, in order."""
    cases = range(len(comp.cases(lane)))
    if unit.case_index is not None:
        return [(ch, unit.case_index) for ch in (unit.checks or comp.applicable_checks())]
    if unit.pairs is not None:
        return list(unit.pairs)
    if isinstance(unit.subject, str) and comp.baseline(unit.subject).is_pin_candidate:
        return [("batch_prefix", i) for i in cases]
    return [(ch, i) for i in cases for ch in _invariance_checks(comp)]


def _lost_row(
    comp: Component, job: _Job, lane: Lane, m_limit: int | None, status: str, why: str
) -> tuple[CheckResult, list[str]]:
    """The row of the check a dead (or killed) worker was running, and the unit's checks left
    after it that can still run (a fast-like unit's; a control ends at an error)."""
    planned = _planned(comp, job.unit, lane)
    cases = comp.cases(lane)
    if job.check is not None:
        check, case_id = job.check
        index = next((i for i, c in enumerate(cases) if c.id == case_id), 0)
        at = next((k for k, p in enumerate(planned) if p == (check, index)), len(job.results))
    else:
        at = min(len(job.results), len(planned) - 1)
        check, index = planned[at] if planned else ("agreement", job.unit.case_index or 0)
    row = _new_result(comp, job.unit.subject, check, cases[index], lane, m_limit)
    row.status = status
    row.detail = why
    rest = [ch for ch, _ in planned[at + 1 :]] if job.unit.case_index is not None else []
    return row, rest


#: How a check that ran out of device memory reads: ``torch.OutOfMemoryError``'s message (the
#: caching allocator), or ``cudaErrorMemoryAllocation`` as ``torch.AcceleratorError`` words it
#: (a CUDA call itself: a ``cross_process`` child's context or first allocation, run 67 on an H100).
_OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory", "CUDA error: out of memory")


def _out_of_memory(result: CheckResult) -> bool:
    """Whether the row is an ``error`` from running out of device memory."""
    return result.status == "error" and any(m in result.detail for m in _OUT_OF_MEMORY)


def _alone_note(jobs: int) -> str:
    return (
        f"re-run alone: its first run ran out of device memory in the pool of {jobs} workers sharing the GPU"
    )


def _execute(
    comps: dict[str, Component],
    units: list[Unit],
    lane: Lane,
    m_limit: int | None,
    jobs: int,
    timeout: float | None = None,
) -> Iterable[tuple[Unit, list[CheckResult], compile_stats.CompileStats]]:
    """Yield each unit's results as it completes (in order when ``jobs == 1``).

    With ``jobs > 1`` the units run in that many worker processes, one unit at a time each.  The
    workers share the GPU: a check that ran out of device memory (``torch.OutOfMemoryError``, or
    a CUDA call's ``CUDA error: out of memory``: :data:`_OUT_OF_MEMORY`) runs again at the end
    with no other unit in flight (a control's
    whole unit, a fast case's checks that ran out); its row says so, and an out-of-memory error
    when alone stays an ``error``.  A
    worker that dies (a segfault in a kernel, ``os._exit``) makes the check it was running an
    ``error`` row naming the signal; a worker whose subject call runs past its limit (plus a
    grace for the worker's own timer) is killed and the check is a ``timeout`` row.  Either way
    a new worker takes its place, the unit's remaining checks run there, and the sweep goes on.
    """
    if jobs <= 1:
        compile_stats.install()
        for unit in units:
            before = compile_stats.snapshot()
            results = run_unit(comps[unit.component], unit, lane, m_limit, timeout)
            yield unit, results, compile_stats.snapshot() - before
        return
    if lane.is_gpu:  # read by every worker (harness/cuda_wait.py): a bad value fails here, once
        from batchinv.harness.cuda_wait import wait_mode

        wait_mode()
    limit = _limit(lane, timeout)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = get_context("spawn")

    def start(slot: int) -> _Worker:
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=_worker_main,
            args=(theirs, lane.value, threads, jobs, slot, m_limit, timeout),
            daemon=False,  # a worker may start processes of its own (torch.compile's compile workers)
        )
        # Workers are born with SIGINT ignored (an ignored signal stays ignored across exec),
        # so a Ctrl-C in the terminal reaches only this process, which ends them: no worker
        # prints a traceback from the middle of an import.
        # Workers run at a known hash seed (the environment a spawned interpreter starts with):
        # their cross_process checks then need one fresh process, at the other seed of the
        # check's pair (harness/cross_process.py), and a worker's set orders are reproducible.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        seed = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = str(WORKER_HASH_SEED)
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, previous)
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed
        theirs.close()
        return _Worker(proc, ours)

    queue: deque[_Job] = deque(_Job(i, u) for i, u in enumerate(units))
    collected: dict[int, list[CheckResult]] = {i: [] for i in range(len(units))}
    workers = [start(slot) for slot in range(min(jobs, len(units)))]

    def finish(job: _Job, results: list[CheckResult], stats: compile_stats.CompileStats) -> Any:
        ran_out = [r for r in results if _out_of_memory(r)]
        if ran_out and not job.alone:
            u = job.unit
            if u.case_index is not None:  # the checks that ran out, again; the others stand
                collected[job.index] += [r for r in results if not _out_of_memory(r)]
                again = Unit(u.component, u.subject, u.case_index, tuple(r.check for r in ran_out), u.pairs)
            else:  # a control's verdict is its chain of checks: all of it, again
                collected[job.index] = []
                again = u
            queue.append(_Job(job.index, again, alone=True))
            return None
        if job.alone:
            note = _alone_note(jobs)
            for r in results:
                r.detail = f"{r.detail}; {note}" if r.detail else note
        collected[job.index] += results
        return units[job.index], collected.pop(job.index), stats

    def lost_in_place(job: _Job, why: str) -> Any:
        row, _ = _lost_row(comps[job.unit.component], job, lane, m_limit, "error", why)
        collected[job.index] += [*job.results, row]
        return units[job.index], collected.pop(job.index), compile_stats.CompileStats()

    def lost(slot: int, job: _Job, status: str, why: str) -> Any:
        comp = comps[job.unit.component]
        row, rest = _lost_row(comp, job, lane, m_limit, status, why)
        collected[job.index] += [*job.results, row]
        workers[slot].conn.close()
        workers[slot] = start(slot)
        if rest:  # the unit's other checks still run, in the new worker
            u = job.unit
            queue.appendleft(
                _Job(job.index, Unit(u.component, u.subject, u.case_index, tuple(rest), u.pairs))
            )
            return None
        return units[job.index], collected.pop(job.index), compile_stats.CompileStats()

    try:
        while queue or any(w.job is not None for w in workers):
            for w in workers:
                in_flight = [x.job for x in workers if x.job is not None]
                if any(j.alone for j in in_flight) or (queue and queue[0].alone and in_flight):
                    break  # a re-run after running out of device memory has the GPU to itself
                if w.job is None and queue:
                    w.job = queue.popleft()
                    u = w.job.unit
                    sent = (
                        Unit(u.component, u.subject.without_fn(), u.case_index, u.checks, u.pairs)
                        if isinstance(u.subject, Subject)
                        else u
                    )
                    try:
                        w.conn.send(sent)
                    except OSError:  # the worker is gone: found below, its unit's row says so
                        pass
            busy = [w for w in workers if w.job is not None]
            wait_for([x for w in busy for x in (w.conn, w.proc.sentinel)], timeout=1.0)
            for slot, w in enumerate(workers):
                job = w.job
                if job is None:
                    continue
                done: Any = None
                dead = False
                requeued = False
                try:
                    while done is None and w.conn.poll():
                        msg = w.conn.recv()
                        if msg[0] == "check":
                            job.check = (msg[1], msg[2])
                        elif msg[0] == "result":
                            job.results.append(msg[1])
                            job.check = None
                        elif msg[0] == "call":
                            job.call_since, job.call_limit = time.monotonic(), msg[1]
                        elif msg[0] == "called":
                            job.call_since = None
                        elif msg[0] == "done":
                            done = finish(job, msg[1], msg[2])
                            if done is None:  # queued to run again, alone
                                requeued = True
                                break
                        elif msg[0] == "failed":
                            done = lost_in_place(job, msg[1])
                except (EOFError, OSError):
                    dead = True
                if requeued:
                    w.job = None
                    continue
                if done is not None:
                    w.job = None
                    yield done
                    continue
                where = f" in {job.check[0]} [{job.check[1]}]" if job.check else ""
                if dead or not w.proc.is_alive():
                    w.proc.join(5)
                    w.job = None
                    why = f"the worker process died ({child_process.describe_exit(w.proc.exitcode)}){where}; a new worker runs the rest"
                    out = lost(slot, job, "error", why)
                    if out is not None:
                        yield out
                    continue
                overrun = job.call_since is not None and (job.call_limit or limit)
                if overrun and time.monotonic() - (job.call_since or 0.0) > overrun + child_process.grace(
                    overrun
                ):
                    w.proc.kill()
                    w.proc.join(5)
                    w.job = None
                    why = (
                        f"a call of the subject ran past the limit of {overrun:g} s{where} and did not "
                        "return to the interpreter: the worker was killed; a new worker runs the rest"
                    )
                    out = lost(slot, job, TIMEOUT, why)
                    if out is not None:
                        yield out
    finally:
        for w in workers:
            if w.job is None and w.proc.is_alive():
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        for w in workers:
            if w.job is not None:  # interrupted: end the worker now instead of waiting for its unit
                w.proc.terminate()
            w.proc.join(10)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()


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
    timeout: float | None = None,
    selection: Selection = FULL,
    on_component: Callable[[str, list[CheckSummary], list[ControlSummary]], None] = lambda n, c, k: None,
) -> SweepOutcome:
    """Run the sweep; ``on_result`` sees every result as it is made, ``on_skip`` is told how many
    planned tasks a detected negative control made unnecessary (for the progress bar),
    ``on_component`` gets each component's name, check summaries and control summaries as soon
    as its last unit is done.  ``selection``: the profile and the checks
    (:mod:`batchinv.harness.profiles`; default: the full profile, every check).

    ``subjects``: outside subjects per component name (:class:`Subject`), each checked like the
    fast kernel (agreement and every invariance check) or, with role ``baseline``, run as a
    negative control that must vary.  ``include_fast=False`` leaves out the component's own
    fast kernel (a sweep of outside subjects alone).  ``jobs > 1`` runs the units in that many
    worker processes (registered components, and outside subjects with an import path, only).
    ``timeout``: the limit on one subject call, seconds (None: the lane's default; 0: none); a
    call past it is a ``timeout`` row (a failure) and the sweep goes on.  A worker process that
    dies is an ``error`` row naming its check and signal (see :func:`_execute`).
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
            for ch in selection.fast_checks(comp):
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
    units = _units(
        comps, lane, include_baselines, subjects, include_fast, selection, jobs > 1 and lane.is_gpu
    )
    left = {c.name: sum(u.component == c.name for u in units) for c in comps}
    for unit, results, unit_stats in _execute(by_name, units, lane, m_limit, jobs, timeout):
        stats = stats + unit_stats
        comp = by_name[unit.component]
        name = subject_name(unit.subject)
        if unit.case_index is not None:
            for r in results:
                on_result(r)
                checks[(comp.name, name, r.check)].add(r)
                if r.status in ("fail", "error", TIMEOUT):
                    failures.append(r)
        else:
            baseline = comp.baseline(name) if isinstance(unit.subject, str) else None
            ctrl = controls[(comp.name, name)]
            pin = baseline is not None and baseline.is_pin_candidate
            _fold_control(ctrl, name, pin, results, checks, on_result)
            on_skip(len(_planned(comp, unit, lane)) - len(results))
            if ctrl.verdict == "inconclusive":
                if pin and results:
                    ctrl.verdict = "invariant"
                elif any(r.m_cut for r in results):
                    ctrl.verdict = f"not reached (--max-m {m_limit})"
                elif selection.checks_cut(comp, baseline):
                    ctrl.verdict = "not reached (--checks)"
        left[comp.name] -= 1
        if not left[comp.name]:
            on_component(
                comp.name,
                [c for c in checks.values() if c.component == comp.name],
                [c for c in controls.values() if c.component == comp.name],
            )
    return SweepOutcome(
        list(checks.values()),
        list(controls.values()),
        failures,
        wall_seconds=time.perf_counter() - start,
        compile=stats,
        jobs=jobs,
        not_on_lane=not_on_lane(components, lane),
        profile=selection.profile,
        checks_selected=tuple(sorted(selection.checks)) if selection.checks is not None else None,
        applicable={c.name: c.applicable_checks() for c in comps},
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
        elif r.status in ("error", TIMEOUT) and ctrl.verdict not in ("error", TIMEOUT):
            ctrl.verdict = r.status
            what = "crashed" if r.status == "error" else "timed out"
            ctrl.detail = f"the baseline {what} in {r.check} [{r.case}]: {r.detail}"
            ctrl.repro = r.repro
    ctrl.where = "; ".join(wheres[:3]) + (f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else "")
