"""Run one check of one component on one case, for the fast kernel or a baseline.

This is where the registry meets the drivers: it builds the case's inputs, calls the right
driver, times it, turns any exception into an error row (the sweep goes on), and writes the
one-line reproduction.  Pin candidates (baselines with ``env``) run in a subprocess, since the
libraries they configure read their environment at handle creation; ``cross_process`` runs the
case again in fresh processes (:mod:`batchinv.harness.cross_process`).  Both start their
processes through :mod:`batchinv.harness.child_process`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shlex
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeAlias

import torch

from batchinv.harness import (
    child_process,
    cross_process,
    invariance,
    isolation,
    neighbours,
    provenance,
    strict_json,
)
from batchinv.harness.build_cache import built
from batchinv.harness.compare import (
    BitwiseReport,
    ToleranceReport,
    compare_bitwise,
    compare_exact,
    compare_tolerance,
)
from batchinv.harness.lanes import Lane, lane_device
from batchinv.harness.profiles import FULL
from batchinv.harness.registry import (
    CHECKS,
    NEIGHBOUR_CHECKS,
    PADDING_CHECKS,
    PHASE_CHECKS,
    REQUEST_CHECKS,
    ROW_CHECKS,
    ROW_OFFSET_RANDOM,
    ROW_OFFSETS,
    Baseline,
    Batch,
    Case,
    Component,
    Exact,
    Outputs,
    RequestModel,
    Toleranced,
    as_outputs,
    co_batch_sizes,
    m_sweep,
    prefix_sweep,
    threshold_cycle,
)
from batchinv.harness.subjects import Subject, Unsupported, accepts_keyword, accepts_partition, bound_call
from batchinv.reference.exact import round_once

FAST = "fast"
#: The status of a check of ``fast`` in which some launch ran the reference instead of the
#: kernel (outside its envelope, ``Component.fast_path``): what agreed or stayed invariant
#: there was the reference, not the kernel, so it is never counted as a kernel ``pass``.
REFERENCE_PATH = "reference path"
#: The status of a check in which a call of the subject ran past its time limit
#: (:func:`batchinv.harness.isolation.time_limit`): a failure of the subject, like ``error``.
TIMEOUT = "timeout"


@dataclass
class CheckResult:
    """One row of the report: a check of one subject (fast or a baseline) on one case.

    ``status`` is ``pass``, ``fail``, ``error`` (the check crashed, or the subject changed the
    judge's state: :mod:`batchinv.harness.isolation`), ``timeout`` (:data:`TIMEOUT`: a call of
    the subject ran past its time limit), ``skip``, or ``reference path`` (:data:`REFERENCE_PATH`: no failure, but some launch of ``fast`` ran the
    reference; agreement there is checked against the component's oracle).
    """

    component: str
    subject: str
    check: str
    case: str
    axes: dict[str, Any]
    seed: int
    lane: str
    status: str
    rows_total: int = 0
    rows_differing: int = 0
    worst_ulp: float | None = None
    worst_abs: float | None = None
    worst_rel: float | None = None
    #: agreement only: the worst |fast - reference| / bound over the toleranced elements (the
    #: judged bound: the tight one where the component has one); None if not finite or none.
    bound_ratio: float | None = None
    where: list[str] = field(default_factory=list)
    first_difference: str = ""
    detail: str = ""
    seconds: float = 0.0
    repro: str = ""
    negative_control: bool = False
    pin_candidate: bool = False
    #: an outside subject's import path (``pkg.mod:attr``; "" for ours and in-process callables)
    subject_target: str = ""
    m_cut: bool = False  # --max-m removed an M value this case could have run
    #: a failing invariance check's sweep points, for the HTML report's heatmap
    #: (:attr:`invariance.DriverResult.points`: label, row ids compared and differing; empty
    #: on a pass, to keep the report small)
    points: list[dict[str, Any]] = field(default_factory=list)
    #: the first differing element with both sides' bits in hex and values
    #: (:attr:`invariance.DriverResult.first`; exact agreement: expected is the reference)
    first: dict[str, Any] | None = None
    #: launch provenance: each distinct execution the subject's calls ran in this check (Triton
    #: kernel, the launcher's execution name, constexprs), with its number of calls and the sweep
    #: points that ran it, and each note (the reference, torch operators only, an adapter's
    #: backend): :meth:`provenance.Tally.to_json`, at most :data:`provenance.MAX_EXECUTIONS`
    launches: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        """One line of strict JSON (non-finite figures as the strings "inf", "-inf", "nan")."""
        return strict_json.dumps(asdict(self))


#: What a check runs: ``fast``, a baseline's name, or an outside :class:`Subject`.
SubjectLike: TypeAlias = str | Subject


def subject_name(subject: SubjectLike) -> str:
    """The name a report row gives the subject."""
    return subject.name if isinstance(subject, Subject) else subject


def repro_command(
    component: str, subject: SubjectLike, check: str, case: Case, lane: Lane, m_limit: int | None = None
) -> str:
    """The one-line command that re-runs exactly this check on exactly this case: every option
    that changes what runs (lane, seed, axes, ``--max-m``) is on it, and it is one physical line
    (the axes are compact JSON, shell-quoted).  An outside subject appears as
    ``--subject name=pkg.mod:attr`` (re-imported by the repro; ``--as baseline`` for a negative
    control); an in-process callable has no import path, so its line names it alone."""
    max_m = f" --max-m {m_limit}" if m_limit is not None else ""
    if isinstance(subject, Subject):
        spelled = shlex.quote(subject.spec) + (" --as baseline" if subject.is_baseline else "")
    else:
        spelled = subject
    return (
        f"batchinv repro {component} --check {check} --subject {spelled} --lane {lane.value} "
        f"--seed {case.seed}{max_m} --axes {shlex.quote(case.axes_json())}"
    )


@dataclass(frozen=True)
class _View:
    """A subject as a check runs it."""

    call: Callable[..., Any]
    fast_path: Callable[[Batch], bool] | None  # ``fast`` only: Component.fast_path
    accepts_partition: bool
    modes: Callable[..., Any] | None  # what the modes check compiles (None: skip)


def _baseline_of(component: Component, subject: SubjectLike) -> Baseline | None:
    if isinstance(subject, Subject) or subject == FAST:
        return None
    return component.baseline(subject)


def _view(component: Component, subject: SubjectLike, timeout: float | None) -> _View:
    """The subject's callable behind the judge's guard (:func:`isolation.guarded`): its time
    limit, and the judge's state checked and restored around each call."""
    if isinstance(subject, Subject):
        call = bound_call(component, subject)
        return _View(
            isolation.guarded(call, timeout, component), None, accepts_partition(component, subject), None
        )
    if subject == FAST:
        return _View(
            isolation.guarded(component.fast, timeout, component),
            component.fast_path,
            True,
            component.torch_op,
        )
    b = component.baseline(subject)
    return _View(isolation.guarded(b.fn, timeout, component), None, b.accepts_partition, b.modes)


def _limit(lane: Lane, timeout: float | None) -> float | None:
    """The limit on one subject call: ``timeout`` seconds (0: none), the lane's default if None."""
    if timeout is None:
        return isolation.default_timeout(lane)
    return timeout if timeout > 0 else None


def run_check(
    component: Component,
    subject: SubjectLike,
    check: str,
    case: Case,
    lane: Lane,
    *,
    m_limit: int | None = None,
    timeout: float | None = None,
) -> CheckResult:
    """Run ``check`` (one of :data:`registry.CHECKS`, by its driver in :data:`DRIVERS`) of
    ``subject`` on ``case`` and report it.

    ``subject`` is ``fast``, a baseline's name, or an outside :class:`Subject`.  Never raises for
    a failure inside the check: a crash becomes a ``status="error"`` row with the traceback's
    last line in ``detail``; a case an outside subject cannot express (its adapter raised
    :class:`Unsupported`) is a ``skip``.  A pin candidate runs in a subprocess under its
    environment (see :func:`run_checks`).

    Every call of the subject is guarded (:mod:`batchinv.harness.isolation`): a call past
    ``timeout`` seconds (None: the lane's default, :data:`isolation.DEFAULT_TIMEOUT`; 0: no
    limit) makes the row ``timeout``; a call that changed the floating-point environment or the
    judge's data (a component's reference, the registry) makes it ``error`` naming the change,
    which is undone first.  The check itself runs with the CPU's flush-to-zero off, whatever
    the caller's thread had (an extension built with ``-ffast-math`` sets it on import), so the
    reference and the comparator never run under a subject's state.  The judge's data is
    checked once more when the check ends: a change made outside the subject's calls (by a
    thread it left running) makes the row ``error`` too, and is undone.
    """
    baseline = _baseline_of(component, subject)
    if baseline is not None and baseline.is_pin_candidate and os.environ.get(_CHILD_ENV) != "1":
        return run_checks(component, subject, check, [case], lane, m_limit=m_limit, timeout=timeout)[0]
    result = _new_result(component, subject, check, case, lane, m_limit)
    observer = isolation.current_observer()
    if observer is not None:
        observer.check_started(check, case.id)
    start = time.perf_counter()
    entry_fp = isolation.fp_state()
    entry_judge = isolation.judge_snapshot(component)  # re-checked at the end: a subject's thread
    try:
        if entry_fp["cpu denormals-are-zero"] or entry_fp["cpu flush-to-zero"]:
            torch.set_flush_denormal(False)
        _run(component, subject, check, case, lane, result, m_limit, _limit(lane, timeout))
    except Unsupported as exc:  # the subject cannot express this case: not a pass, not a failure
        result.status, result.detail = "skip", f"unsupported by the subject: {exc}"
    except isolation.SubjectTimeout as exc:  # the run goes on; the row names the case and check
        result.status = TIMEOUT
        result.detail = f"a call of the subject timed out: {exc}"
    except KeyboardInterrupt:  # the user's Ctrl-C stops the run
        raise
    except BaseException as exc:  # an error row, and the sweep goes on (a subject's exit, GeneratorExit too)
        result.status = "error"
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        result.detail = last
    finally:
        isolation.restore_fp_state(entry_fp)
        late = isolation.restore_judge(entry_judge)
    if late and not result.detail.startswith(_CHANGED):
        # changed outside every guarded call (a thread the subject left running): never a pass
        result.status = "error"
        result.detail = f"{_LATE}: {'; '.join(late[:6])}"
    result.seconds = time.perf_counter() - start
    if observer is not None:
        observer.check_ended(result)
    return result


_CHANGED = "batchinv.harness.isolation.StateChanged"
_LATE = "the judge's state changed during the check, outside the subject's calls (restored)"


def _new_result(
    component: Component, subject: SubjectLike, check: str, case: Case, lane: Lane, m_limit: int | None = None
) -> CheckResult:
    """The report row of a check before it runs (status ``error`` until the check says else)."""
    baseline = _baseline_of(component, subject)
    outside = subject if isinstance(subject, Subject) else None
    return CheckResult(
        component=component.name,
        subject=subject_name(subject),
        check=check,
        case=case.id,
        axes=dict(case.axes),
        seed=case.seed,
        lane=lane.value,
        status="error",
        repro=repro_command(component.name, subject, check, case, lane, m_limit),
        negative_control=(baseline is not None and not baseline.is_pin_candidate)
        or (outside is not None and outside.is_baseline),
        pin_candidate=baseline is not None and baseline.is_pin_candidate,
        subject_target=(outside.target or "") if outside is not None else "",
    )


@dataclass(frozen=True)
class _Run:
    """What a check's driver is given: one check of one subject on one built case.

    ``call`` runs the subject on a batch (noting each launch in ``launches``, refusing a write
    to the inputs); for the request checks and partition of a component whose request model has
    ``local``, it returns each request's own work (``local`` of the outputs).
    """

    component: Component
    subject: SubjectLike
    check: str
    case: Case
    lane: Lane
    m_limit: int | None
    device: torch.device
    batch: Batch
    view: _View
    launches: _Launches
    call: Callable[[Batch], Outputs]
    local: Callable[[Outputs], Outputs] | None
    generator: torch.Generator
    result: CheckResult
    #: the limit on one subject call, seconds (None: none); cross_process's children keep it too
    limit: float | None = None

    def skip(self, detail: str) -> None:
        """Make the row a ``skip`` saying why (the driver then returns None)."""
        self.result.status, self.result.detail = "skip", detail


#: A check's driver: the :class:`invariance.DriverResult` the row is made from, or None when the
#: driver wrote the row itself (agreement, or a skip through :meth:`_Run.skip`).
Driver: TypeAlias = Callable[[_Run], "invariance.DriverResult | None"]


def _run(
    component: Component,
    subject: SubjectLike,
    check: str,
    case: Case,
    lane: Lane,
    result: CheckResult,
    m_limit: int | None,
    timeout: float | None,
) -> None:
    """Run ``check`` through its driver in :data:`DRIVERS` and write the row into ``result``."""
    run = _prepare(component, subject, check, case, lane, result, m_limit, timeout)
    reason = _not_applicable(run)
    if reason:
        result.status, result.detail = "skip", reason
        return
    driver = DRIVERS.get(check)
    if driver is None:
        raise ValueError(f"check: expected one of {', '.join(CHECKS)}; got {check!r}")
    outcome = driver(run)
    if outcome is not None:  # None: the driver wrote the row (agreement, a skip)
        _record(outcome, run)


def _prepare(
    component: Component,
    subject: SubjectLike,
    check: str,
    case: Case,
    lane: Lane,
    result: CheckResult,
    m_limit: int | None,
    timeout: float | None,
) -> _Run:
    """The case built on the lane's device and the subject wrapped as every driver calls it."""
    device = torch.device(lane_device(lane))
    batch = built(component, case, device)
    view = _view(component, subject, timeout)
    impl = view.call
    launches = _Launches(view.fast_path)

    def call(b: Batch) -> Outputs:
        launches.note(b)
        with invariance.inputs_untouched(b):
            return as_outputs(impl(**b.kwargs()))

    local = component.requests.local if component.requests is not None else None
    if local is not None and (check in REQUEST_CHECKS or check in ("partition", *NEIGHBOUR_CHECKS)):
        whole = call  # the request checks and partition compare each request's own work

        def call(b: Batch) -> Outputs:
            return local(whole(b))

    generator = torch.Generator().manual_seed(case.seed + 1_000_003)
    return _Run(
        component=component,
        subject=subject,
        check=check,
        case=case,
        lane=lane,
        m_limit=m_limit,
        device=device,
        batch=batch,
        view=view,
        launches=launches,
        call=call,
        local=local,
        generator=generator,
        result=result,
        limit=timeout,
    )


def _not_applicable(run: _Run) -> str:
    """Why ``run.check`` has nothing to check on this case ("" if it has): an empty case, a
    request check of a row-wise component, a row check of a request-level one."""
    component, check = run.component, run.check
    if run.batch.num_rows == 0:
        unit = "requests" if component.requests is not None else "rows"
        return f"nothing to compare: the case has no {unit}"
    if check in REQUEST_CHECKS and component.requests is None:
        return "a row-wise component has no request model"
    if check in PHASE_CHECKS and component.phase is None:
        return "the component declares no phase model (Component.phase): it has no phases to compare"
    if check in PADDING_CHECKS and (component.padding is None or component.requests is None):
        return "the component declares no padding model (Component.padding): its launches have no padding"
    if check in NEIGHBOUR_CHECKS and not any(d.is_floating_point for d in component.dtypes):
        return "the component declares no floating-point dtype (Component.dtypes): no contents to rewrite"
    if check in ROW_CHECKS and check not in ("partition", "repeat") and component.requests is not None:
        return f"{check} is a row check; this component is request-level"
    return ""


def _record(outcome: invariance.DriverResult, run: _Run) -> None:
    """The row from a driver's outcome: ``skip`` if it compared nothing, and ``reference path``
    where a launch of ``fast`` ran the reference (:meth:`_Launches.mark`)."""
    result = run.result
    result.status = "pass" if outcome.passed else "fail"
    if outcome.passed and not outcome.comparisons:
        result.status = "skip"
        outcome.detail = f"nothing to compare: {outcome.vacuous or 'no sweep point applies to this case'}"
    result.rows_total = outcome.rows_total
    result.rows_differing = outcome.rows_differing
    result.worst_ulp = outcome.worst_ulp
    result.where = outcome.where
    result.first_difference = outcome.first_difference
    result.points = [] if outcome.passed else outcome.points  # the heatmap of a failure only
    result.first = outcome.first
    result.detail = outcome.detail
    result.launches = outcome.launches.to_json()
    run.launches.mark(result)


def _agreement_check(run: _Run) -> None:
    """agreement: ``fast`` against the reference (the oracle where ``fast`` ran the reference);
    the row names what fast ran (a failure's detail too)."""
    with provenance.recording() as rec:
        fast_out = run.call(run.batch)
    if run.launches.reference:
        _oracle_agreement(run.component, run.batch, fast_out, run.result)
    else:
        _agreement(run.component, run.batch, fast_out, run.result)
    tally = provenance.Tally()
    tally.add(rec.calls(), "agreement")
    run.result.launches = tally.to_json()
    if run.result.status == "fail":
        run.result.detail += f"; {subject_name(run.subject)} ran {rec.calls().describe()}"


def threshold_case(component: Component, case: Case, lane: Lane) -> bool:
    """Whether batch_prefix runs the row-threshold sweep (:data:`ROW_THRESHOLD_MS`, the case's
    rows cycled up to :func:`threshold_cycle` rows) on ``case``: every case of a GPU lane;
    on the cpu lane (the interpreter, where each launch costs tens of milliseconds) the first
    case of the component's list, the others keeping :data:`M_SWEEP` (docs/DESIGN.md)."""
    if lane.is_gpu:
        return True
    cases = component.cases(lane)
    return bool(cases) and (cases[0].axes_json(), cases[0].seed) == (case.axes_json(), case.seed)


def _batch_prefix(run: _Run) -> invariance.DriverResult:
    full = threshold_case(run.component, run.case, run.lane)
    cycle_to = threshold_cycle(run.lane) if full else 0
    n = run.batch.num_rows
    ms = prefix_sweep(run.lane, run.m_limit, thresholds=full)
    # --max-m removed an M this case could have run: a clean result proves less than it says.
    every = invariance.prefix_launches(n, prefix_sweep(run.lane, thresholds=full), cycle_to)
    run.result.m_cut = len(invariance.prefix_launches(n, ms, cycle_to)) < len(every)
    return invariance.batch_prefix(run.call, run.batch, ms, cycle_to=cycle_to)


def _position(run: _Run) -> invariance.DriverResult:
    neighbours = built(run.component, run.case.with_seed(run.case.seed + 7919), run.device)
    n = run.batch.num_rows
    targets = sorted({0, n - 1, int(torch.randint(n, (1,), generator=run.generator))})
    m = neighbours.num_rows
    positions = sorted({0, 1, m // 2, m - 1, int(torch.randint(m, (1,), generator=run.generator))})
    return invariance.position(run.call, run.batch, neighbours, targets, positions)


def _row_start(run: _Run) -> invariance.DriverResult | None:
    shift = run.component.shift_row_start
    if shift is None:
        run.skip("no row window")
        return None
    low, high = ROW_OFFSET_RANDOM
    offsets = (*ROW_OFFSETS, int(torch.randint(low, high, (1,), generator=run.generator)))
    return invariance.row_start(run.call, run.batch, shift, offsets, run.generator)


def _partition(run: _Run) -> invariance.DriverResult | None:
    arg = run.component.partition_arg
    if arg is None or not run.view.accepts_partition:
        run.skip("no partition parameter")
        return None
    impl, local, launches = run.view.call, run.local, run.launches

    def call_with(b: Batch, count: int | None) -> Outputs:
        launches.note(b)
        kwargs = b.kwargs()
        if count is not None:
            kwargs[arg] = count
        with invariance.inputs_untouched(b):
            out = as_outputs(impl(**kwargs))
        return local(out) if local is not None else out

    from batchinv.fast.device import sm_count

    counts = invariance.sm_partition_counts(sm_count(run.device if run.lane.is_gpu else None))
    return invariance.partition(call_with, run.batch, counts)


def _repeat(run: _Run) -> invariance.DriverResult:
    # a request-level batch takes its half through the request model (shared operands may
    # index the requests: grouped_gemm's align tensors)
    model = run.component.requests
    return invariance.repeat(run.call, run.batch, take=model.take if model else None)


def neighbour_victims(num_units: int, lane: Lane, generator: torch.Generator) -> list[int]:
    """The victims of the neighbours check: one unit at random on the cpu lane (the interpreter
    pays per launch), the first and one at random on GPU lanes."""
    if num_units <= 0:
        return []
    pick = int(torch.randint(num_units, (1,), generator=generator))
    return [pick] if not lane.is_gpu else sorted({0, pick})


#: The cpu lane runs the neighbours check on the first this many cases of each component's cpu
#: list (the interpreter pays seconds per attention launch), case i with the transforms of
#: :data:`neighbours.CPU_TRANSFORM_GROUPS` [i]; its later cases are a skip saying so.
NEIGHBOUR_CASES_CPU = len(neighbours.CPU_TRANSFORM_GROUPS)


def _case_index(component: Component, case: Case, lane: Lane) -> int | None:
    """``case``'s index in the component's case list on ``lane`` (None: not one of them)."""
    key = (case.axes_json(), case.seed)
    for i, c in enumerate(component.cases(lane)):
        if (c.axes_json(), c.seed) == key:
            return i
    return None


def _neighbours(run: _Run) -> invariance.DriverResult | None:
    """neighbours: the victims of :func:`neighbour_victims` beside their neighbours rewritten by
    every transform of :data:`neighbours.TRANSFORMS` (GPU lanes, and a cpu case outside the
    component's list), or on the cpu lane's first :data:`NEIGHBOUR_CASES_CPU` cases by their
    share, :data:`neighbours.CPU_TRANSFORM_GROUPS`; through the request
    model's ``rewrite_others`` for a request-level component, whose one-request cases put their
    request first beside up to 3 requests of the co_batch pool (:func:`_pools`; a row-wise
    one-row case has no neighbour: a skip).  Only the component's ``content_rows`` are
    rewritten where it names them (its other floating-point rows are parameters)."""
    model = run.component.requests
    rewrite = model.rewrite_others if model is not None and model.rewrite_others is not None else None
    index = None if run.lane.is_gpu else _case_index(run.component, run.case, run.lane)
    if index is not None and index >= NEIGHBOUR_CASES_CPU:
        run.skip(
            f"not run on this case on the cpu lane: neighbours runs on the first {NEIGHBOUR_CASES_CPU} "
            "cases of each component there (the interpreter pays per launch); GPU lanes run every case"
        )
        return None
    transforms = neighbours.TRANSFORMS if index is None else neighbours.CPU_TRANSFORM_GROUPS[index]
    batch, n = run.batch, run.batch.num_rows
    if model is not None and n < 2:  # one request: beside the first requests of the co_batch pool
        pool = next(iter(_pools(run, model).values()))
        if pool.num_rows:
            batch = model.concat([batch, model.take(pool, list(range(min(3, pool.num_rows))))])
    rewrite = rewrite if rewrite is not None else neighbours.rewrite_rows
    content = run.component.content_rows
    if content is not None:  # only the named rows are contents (the others: parameters)
        rewrite = functools.partial(rewrite, content_rows=content)
    return invariance.neighbours(
        run.call,
        batch,
        neighbour_victims(n, run.lane, run.generator),
        rewrite,
        transforms,
        "request" if model is not None else "row",
    )


def _config_equivalence(run: _Run) -> invariance.DriverResult | None:
    if run.component.configs is None:
        run.skip("the component declares no configs")
        return None
    if isinstance(run.subject, Subject):
        run.skip("the component's configs are executions of its own kernel, not the subject's")
        return None
    baseline = _baseline_of(run.component, run.subject)
    if baseline is not None and not baseline.config_control:
        run.skip(
            "not a config of the component's kernel (Baseline.config_control): its bits differ from "
            "the configs' by construction, which is no variance"
        )
        return None
    outcome = invariance.config_equivalence(
        run.call, run.batch, _config_calls(run.component, run.batch, run.lane)
    )
    if run.subject == FAST:
        _unproved_executions(run, outcome)
    return outcome


#: The checks whose launches :func:`_unproved_executions` replays (those of them a component
#: applies): every invariance check that launches the subject in this process, but
#: ``config_equivalence`` itself, ``modes`` (torch.compile re-traces the eager launches) and the
#: layout checks ``row_start`` and ``placement`` (a layout the tables do not key on -- an
#: unaligned row read through pointers instead of TMA -- is judged there, bitwise, against the
#: launch of the original layout).  Named, not derived: a new check joins by choice.
REPLAYED_CHECKS: tuple[str, ...] = (
    "batch_prefix",
    "position",
    "partition",
    "repeat",
    "co_batch",
    "slot",
    "phase",
    "padding",
    "neighbours",
    "tp_degree",
)


def _swept_launches(run: _Run) -> provenance.Tally:
    """fast's launches in the case's other checks (:data:`REPLAYED_CHECKS` the component applies), replayed
    dry (:func:`provenance.recording`: launches recorded, not run): each check's driver set up
    exactly as :func:`run_check` sets it up (the same seeded generator, so the same random
    targets and offsets), its comparisons thrown away.  A check whose replay raises is left out."""
    tally = provenance.Tally()
    # The component's own checks (its fields and ``checks``), not a narrowed selection (a
    # subclass restricting applicable_checks, as the mutant suite's): the verdict is about what
    # the launcher picks for the case, whichever checks this run selected.
    for check in Component.applicable_checks(run.component):
        if check not in REPLAYED_CHECKS:
            continue
        scratch = _new_result(run.component, run.subject, check, run.case, run.lane, run.m_limit)
        with provenance.recording(dry=True):
            replay = _prepare(
                run.component, run.subject, check, run.case, run.lane, scratch, run.m_limit, None
            )
            if _not_applicable(replay):
                continue
            try:
                outcome = DRIVERS[check](replay)
            except Exception:  # garbage outputs tripped a driver: that check's launches unknown
                continue
        if outcome is not None:
            tally.merge(outcome.launches.prefixed(check))
    return tally


def _unproved_executions(run: _Run, outcome: invariance.DriverResult) -> None:
    """Fail ``outcome`` loudly where fast, anywhere in the case's sweep (:func:`_swept_launches`),
    launches an execution (:attr:`provenance.Launch.key`: the kernel and every constexpr and
    launch option) that none of this check's runs proved: neither the shipped launch on the case
    nor any of ``configs`` -- the table picked an execution its ``configs`` do not list, whose
    bits config_equivalence never compared with the shipped launch's on this case."""
    proved = set(outcome.launches.executions())
    swept = _swept_launches(run)
    unproved = {k: v for k, v in swept.executions().items() if k not in proved}
    if not unproved:
        return
    shown = []
    for launch, labels in list(unproved.values())[:4]:
        at = ", ".join(labels[:6]) + (" ..." if len(labels) > 6 else "")
        constexprs = " ".join(f"{k}={v}" for k, v in launch.constexprs)
        shown.append(f"{launch.label()} {constexprs} at {at}")
    names = sorted(
        {(launch.execution or launch.kernel) for launch, _ in outcome.launches.executions().values()}
    )
    reason = (
        f"fast launched {len(unproved)} execution(s) config_equivalence never proved: "
        + "; ".join(shown)
        + f" (proved on this case: {len(proved)} execution(s): {', '.join(names[:8])})"
    )
    report = BitwiseReport(False, run.batch.num_rows, 0, reason=reason)
    outcome.record("unproved execution", [report], meaningful=False)
    if reason not in outcome.detail:  # bits differed first: the verdict is said too
        outcome.detail += f"; unproved execution: {reason}"
    outcome.launches.merge(swept)


def _modes_check(run: _Run) -> invariance.DriverResult | None:
    fn = run.view.modes
    if fn is None:
        run.skip("not an operator (no torch_op; a baseline without modes)")
        return None
    return _modes(fn, run.batch, run.lane, run.m_limit, fullgraph=run.subject == FAST)


def _request_model(run: _Run) -> RequestModel:
    model = run.component.requests
    assert model is not None  # _run dispatches request checks of request-level components only
    return model


def _pools(run: _Run, model: RequestModel) -> dict[str, Batch]:
    """The other requests of co_batch and slot: the model's ``neighbours`` (one case per length
    mix), or, without it, the same case built with another seed (as the position check's
    neighbours)."""
    if model.neighbours is None:
        return {"": built(run.component, run.case.with_seed(run.case.seed + 7919), run.device)}
    return {
        mix: built(run.component, c, run.device) for mix, c in model.neighbours(run.case, run.lane).items()
    }


def _co_batch(run: _Run) -> invariance.DriverResult:
    """co_batch of a request-level component: the mixes of :func:`_pools` dealt round-robin over
    its (target, size) pairs, cycling through a pool's requests to reach each co-batch size of
    :func:`co_batch_sizes` (``--max-m`` cuts the sizes whose launch, the target and its co-batch,
    would pass it)."""
    model = _request_model(run)
    pools = _pools(run, model)
    lane_sizes = (
        model.co_batch_sizes(run.lane) if model.co_batch_sizes is not None else co_batch_sizes(run.lane)
    )
    sizes = tuple(k for k in lane_sizes if run.m_limit is None or k + 1 <= run.m_limit)
    run.result.m_cut = len(sizes) < len(lane_sizes) and any(p.num_rows > 0 for p in pools.values())
    others: Batch | dict[str, Batch] = pools[""] if "" in pools else pools
    return invariance.co_batch(run.call, run.batch, others, model, sizes, run.generator)


def _slot(run: _Run) -> invariance.DriverResult:
    """slot of a request-level component, beside the first pool of :func:`_pools`."""
    model = _request_model(run)
    pools = _pools(run, model)
    return invariance.slot(run.call, run.batch, next(iter(pools.values())), model, run.generator)


def _placement(run: _Run) -> invariance.DriverResult:
    """placement of a request-level component (its requests relocated by the model)."""
    return invariance.placement(run.call, run.batch, _request_model(run), run.generator)


def _phase(run: _Run) -> invariance.DriverResult:
    """phase of a request-level attention component: its phase model's launches (at most
    :data:`phases.MAX_LAUNCHES`, cut points and positions from the case seed plus the mandatory
    page boundaries and split multiples +-1) over the first, the last and a random request."""
    model = run.component.phase
    assert model is not None  # _not_applicable skips components without one
    targets = invariance.request_targets(len(model.lengths(run.batch)), run.generator)
    return invariance.phase(run.call, run.batch, model, targets, run.case.seed)


def _padding(run: _Run) -> invariance.DriverResult:
    """padding of a dense request-level component: its padding model's amounts on each side,
    alone and inside batches of the other-length pools of :func:`_pools`."""
    model = run.component.padding
    assert model is not None  # _not_applicable skips components without one
    return invariance.padding(
        run.call,
        run.batch,
        model,
        _request_model(run),
        _pools(run, _request_model(run)),
        run.lane,
        run.generator,
    )


def _tp_degree(run: _Run) -> invariance.DriverResult | None:
    """tp_degree (a collective, a tensor-parallel layer): the subject called with ``tp_degree=T``
    for each degree of ``Component.tp_degrees`` gives the bits of ``tp_degree=1``."""
    degrees = run.component.tp_degrees
    if degrees is None:
        run.skip("the component declares no TP degrees")
        return None
    if isinstance(run.subject, Subject) and not accepts_keyword(run.subject, "tp_degree"):
        run.skip("the outside subject takes no tp_degree keyword")
        return None
    impl, launches = run.view.call, run.launches

    def call_with(b: Batch, degree: int) -> Outputs:
        launches.note(b)
        with invariance.inputs_untouched(b):
            return as_outputs(impl(**b.kwargs(), tp_degree=degree))

    return invariance.tp_degree(call_with, run.batch, degrees(run.batch))


def _cross_process_spec(
    component: Component, subject: SubjectLike, case: Case, lane: Lane
) -> dict[str, Any] | str:
    """The subject's spec for ``cross_process``'s children on ``case``, or why the check skips
    there (the case is not among the component's first on the lane, or a fresh process cannot
    rebuild the subject)."""
    reason = cross_process.case_skip_reason(_case_index(component, case, lane), lane)
    return reason if reason else cross_process.subject_spec(component, subject)


#: ``cross_process``'s children started ahead of their check by :func:`cross_process_started_early`,
#: by (component, subject, case id): the check takes them from here instead of starting its own.
_STARTED_EARLY: dict[tuple[str, str, str], cross_process.Children] = {}


@contextlib.contextmanager
def cross_process_started_early(
    component: Component, subject: SubjectLike, case: Case, lane: Lane, *, timeout: float | None = None
) -> Iterator[None]:
    """Start ``cross_process``'s fresh processes for ``subject`` on ``case`` on entry, so that they
    import, compile into their empty caches and run the case while this process runs the case's
    other checks; the check, when it comes inside the block, waits for those children instead of
    starting its own.  The same processes (seeds, empty caches, shifted allocations, the call
    limit of ``timeout`` as :func:`run_check` takes it), the same comparison, the same verdict:
    only when they run changes (a sweep's GPU workers: the children's compiling on the CPUs
    beside the parent's checks on the GPU).  Nothing starts where the check would skip.  On exit
    the children the check did not take are killed and their folder removed.

    A start that fails here (``OSError``, a CUDA error) starts nothing: the check tries again
    itself when its turn comes and its row reports the failure, as without the early start.
    """
    key = (component.name, subject_name(subject), case.id)
    spec = _cross_process_spec(component, subject, case, lane)
    if isinstance(spec, str) or key in _STARTED_EARLY:
        yield
        return
    try:
        device = torch.device(lane_device(lane))
        children = cross_process.start(component, spec, case, lane, device, _limit(lane, timeout))
    except Exception:  # the check starts its own then, and its row reports the failure
        yield
        return
    _STARTED_EARLY[key] = children
    try:
        yield
    finally:
        if _STARTED_EARLY.get(key) is children:
            del _STARTED_EARLY[key]
        children.close()


def _cross_process(run: _Run) -> invariance.DriverResult | None:
    """cross_process: the case rebuilt in fresh processes (:mod:`batchinv.harness.cross_process`:
    one per seed of ``CHILD_HASH_SEEDS``, empty Triton caches, the subject's time limit) gives
    this process's bits, over every output.  On the cpu lane the component's first case, on GPU
    lanes its first two (``case_skip_reason``; a case outside the list runs); a subject or
    component a fresh process cannot rebuild is a skip saying why.  Children started ahead by
    :func:`cross_process_started_early` are taken over instead of starting new ones."""
    spec = _cross_process_spec(run.component, run.subject, run.case, run.lane)
    if isinstance(spec, str):
        run.skip(spec)
        return None
    early = _STARTED_EARLY.pop((run.component.name, subject_name(run.subject), run.case.id), None)
    children = early or cross_process.start(run.component, spec, run.case, run.lane, run.device, run.limit)
    try:
        return invariance.cross_process(run.call, run.batch, children.outputs)
    finally:
        children.close()


#: Every check's driver, by name, in :data:`registry.CHECKS` order (the sweep's and the report's
#: column order).  The registry owns the names (components validate theirs against them without
#: importing this module); this table must name exactly those, in that order: an import-time error
#: otherwise, so that a check cannot be declared without a driver nor a driver added without a name.
DRIVERS: Mapping[str, Driver] = MappingProxyType(
    {
        "agreement": _agreement_check,
        "batch_prefix": _batch_prefix,
        "position": _position,
        "row_start": _row_start,
        "partition": _partition,
        "repeat": _repeat,
        "co_batch": _co_batch,
        "slot": _slot,
        "placement": _placement,
        "phase": _phase,
        "padding": _padding,
        "neighbours": _neighbours,
        "config_equivalence": _config_equivalence,
        "modes": _modes_check,
        "tp_degree": _tp_degree,
        "cross_process": _cross_process,
    }
)
if tuple(DRIVERS) != CHECKS:
    raise ImportError(
        f"harness.checks.DRIVERS names {tuple(DRIVERS)}; registry.CHECKS names {CHECKS}: "
        "every check needs exactly one driver, in the same order"
    )


#: ``torch.compile`` backend per lane kind: Inductor on GPU lanes; AOT autograd without code
#: generation on the cpu lane (Inductor's C++ compile would cost seconds per case there; the
#: cpu lane checks the tracing: fake implementations, functionalization, opaque operators).
COMPILE_BACKEND = {True: "inductor", False: "aot_eager"}


def _modes(
    fn: Callable[..., Any], batch: Batch, lane: Lane, m_limit: int | None, *, fullgraph: bool
) -> invariance.DriverResult:
    """The ``modes`` driver's three executions of ``fn`` on ``batch``: eager, compiled
    (``dynamic=True``, one graph for every M; ``fullgraph`` for the operators, which must not
    break a graph; a baseline compiles as production code does, graph breaks allowed) and, on GPU
    lanes, a CUDA graph captured on the batch and replayed.  For the operators (``fullgraph``)
    each compiled call must also run the ``torch.ops.batchinv`` operators its eager call runs, at
    run time (:func:`batchinv.fast.enable.ops.thread_calls`): bits equal to the kernel's on the
    case's inputs are no proof that the compiled graph kept the kernel."""
    with warnings.catch_warnings():
        # Inductor imports torch.jit pieces that warn of their own deprecation, and its lowerings
        # warn of choices they make (H200, run 24: "Online softmax is disabled on the fly" when
        # it splits a reduction): notes on how it compiles, never on the bits, which this check
        # compares; under pytest's warnings-as-errors they would turn the check into an error.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
        import torch._dynamo

        def eager(b: Batch) -> Outputs:
            with torch.no_grad(), invariance.inputs_untouched(b):
                return as_outputs(fn(**b.kwargs()))

        torch._dynamo.reset()
        compiled_fn = torch.compile(
            fn, backend=COMPILE_BACKEND[lane.is_gpu], dynamic=True, fullgraph=fullgraph
        )

        def compiled(b: Batch) -> Outputs:
            with torch.no_grad(), invariance.inputs_untouched(b):
                return as_outputs(compiled_fn(**b.kwargs()))

        graphed = _graph_replay(fn) if lane.is_gpu else None
        calls = None
        if fullgraph:  # an operator: it must run at run time in the compiled graph (issue 25)
            from batchinv.fast.enable.ops import thread_calls

            calls = thread_calls
        return invariance.modes(eager, compiled, graphed, batch, m_sweep(lane, m_limit), calls)


def _graph_replay(fn: Callable[..., Any]) -> Callable[[Batch], Outputs]:
    """``fn`` captured in a CUDA graph on the batch's own tensors (after a warm-up on a side
    stream), replayed once; the outputs are the graph's static outputs, cloned."""

    def run(b: Batch) -> Outputs:
        kwargs = b.kwargs()
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn(**kwargs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = as_outputs(fn(**kwargs))
            graph.replay()
            torch.cuda.synchronize()
        return tuple(t.clone() for t in static)

    return run


def _config_calls(component: Component, batch: Batch, lane: Lane) -> dict[str, Callable[[Batch], Outputs]]:
    """``Component.configs`` as drivers' implementations (each refused if it writes its inputs)."""
    assert component.configs is not None

    def wrap(fn: Callable[..., Any]) -> Callable[[Batch], Outputs]:
        def call(b: Batch) -> Outputs:
            with invariance.inputs_untouched(b):
                return as_outputs(fn(**b.kwargs()))

        return call

    return {name: wrap(fn) for name, fn in component.configs(batch, lane).items()}


@dataclass
class _Launches:
    """Which launches of ``fast`` ran its kernel and which the reference (``Component.fast_path``;
    None: every launch runs the kernel, or the subject is a baseline)."""

    fast_path: Callable[[Batch], bool] | None
    kernel: int = 0
    reference: int = 0

    def note(self, batch: Batch) -> None:
        """Count the launch of ``batch`` (a launch off the fast path is noted in the call's
        launch provenance: :data:`provenance.REFERENCE`)."""
        if self.fast_path is None:
            return
        if self.fast_path(batch):
            self.kernel += 1
        else:
            self.reference += 1
            provenance.note(provenance.REFERENCE)

    def mark(self, result: CheckResult) -> None:
        """A pass becomes ``reference path`` when any launch ran the reference (an invariance
        check comparing the kernel with the reference, or the reference with itself, says
        nothing of the kernel's invariance); a failure stays a failure."""
        if not self.reference:
            return
        what = (
            f"{self.reference} of {self.kernel + self.reference} launches ran the reference "
            "(outside the fast path)"
        )
        if result.status == "pass":
            result.status = REFERENCE_PATH
            result.detail = f"{what}; {result.detail}" if result.detail else what
        elif result.status == "fail":
            result.detail = f"{result.detail} [{what}]"


def _oracle_agreement(component: Component, batch: Batch, fast_out: Outputs, result: CheckResult) -> None:
    """Agreement of a batch ``fast`` sent to the reference: compared with the independent oracle
    (the reference would be compared with itself); ``reference path`` if it agrees."""
    if component.oracle is None:  # Component requires one with fast_path; a guard for mypy
        raise ValueError(f"component {component.name!r} declares fast_path without an oracle")
    _agreement(replace(component, reference=component.oracle), batch, fast_out, result)
    if result.status == "pass":
        result.status = REFERENCE_PATH
    detail = result.detail.replace("the reference", "the oracle")
    result.detail = f"fast ran the reference (outside the fast path), compared with the oracle: {detail}"


def _agreement(component: Component, batch: Batch, fast_out: Outputs, result: CheckResult) -> None:
    ref_out = as_outputs(component.reference(**batch.kwargs()))
    result.rows_total = fast_out[0].shape[0] if fast_out[0].dim() else 1
    if len(ref_out) != len(fast_out):
        result.status, result.detail = "fail", f"{len(fast_out)} outputs, reference has {len(ref_out)}"
        return
    agreement = component.agreement
    if isinstance(agreement, Exact):
        reports = [compare_bitwise(r, f) for r, f in zip(ref_out, fast_out, strict=True)]
        bad = [r for r in reports if not r.equal]
        result.status = "fail" if bad else "pass"
        result.rows_differing = max((r.rows_differing for r in reports), default=0)
        ulps = [r.worst_ulp for r in bad if r.worst_ulp is not None]
        result.worst_ulp = max(ulps) if ulps else (0.0 if not bad else None)
        result.detail = str(bad[0]) if bad else "bitwise equal to the reference"
        result.first_difference = bad[0].first.where if bad and bad[0].first else ""
        if bad and bad[0].first is not None:
            d = bad[0].first
            result.first = {
                "point": "fast vs the reference",
                "output": next(i for i, r in enumerate(reports) if r is bad[0]),
                "row": d.row,
                "col": d.col,
                "expected_bits": d.expected_bits,
                "actual_bits": d.actual_bits,
                "expected_value": d.expected_value,
                "actual_value": d.actual_value,
            }
        return
    if agreement.out_dtypes is not None:
        wanted = agreement.out_dtypes(batch)
        got = tuple(o.dtype for o in fast_out)
        if got != tuple(wanted):
            result.status = "fail"
            result.rows_differing = result.rows_total
            result.detail = f"output dtypes {got}, the contract says {tuple(wanted)}"
            return
    _toleranced_agreement(agreement, batch, ref_out, fast_out, result)


#: Output dtypes :func:`round_once` rounds to.
_ROUNDABLE = (torch.float32, torch.bfloat16, torch.float16)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _toleranced_agreement(
    agreement: Toleranced, batch: Batch, ref_out: Outputs, fast_out: Outputs, result: CheckResult
) -> None:
    """Bitwise inside ``agreement.exact``'s envelope (against the reference rounded once to the
    output dtype), within the judged bound elsewhere (the tight one, never above the rigorous)."""
    hard = agreement.bound(batch, ref_out)
    tight = agreement.tight_bound(batch, ref_out) if agreement.tight_bound is not None else None
    masks = agreement.exact(batch, ref_out) if agreement.exact is not None else None
    tol_reports: list[ToleranceReport] = []
    hard_reports: list[ToleranceReport] = []
    exact_reports: list[BitwiseReport] = []
    exact_counts = [0, 0]  # elements held bitwise, elements in all
    for i, (r, f) in enumerate(zip(ref_out, fast_out, strict=True)):
        if masks is not None and f.dtype in _ROUNDABLE and f.shape == r.shape:
            mask = torch.broadcast_to(masks[i].to(r.device, torch.bool), r.shape)
        else:  # no envelope, an output dtype with no one rounding, or a wrong shape: the bound
            mask = torch.zeros(r.shape, dtype=torch.bool, device=r.device)
        exact_counts[0] += int(mask.sum())
        exact_counts[1] += r.numel()
        inf = torch.full((), math.inf, dtype=torch.float64, device=r.device)
        h = torch.broadcast_to(hard[i].to(r.device, torch.float64), r.shape)
        judged = h if tight is None else torch.minimum(h, tight[i].to(r.device, torch.float64))
        # Elements of the envelope are judged bitwise below: the tolerance sees them as exact
        # (reference = fast there), so its worst errors and ratios are those of the others.
        r_else = torch.where(mask, f.to(r.device, torch.float64), r) if bool(mask.any()) else r
        tol_reports.append(compare_tolerance(r_else, f, torch.where(mask, inf, judged)))
        if tight is not None:
            hard_reports.append(compare_tolerance(r_else, f, torch.where(mask, inf, h)))
        if bool(mask.any()):
            exact_reports.append(compare_exact(round_once(r, f.dtype), f, mask))
    bad_t = [t for t in tol_reports if not t.within]
    bad_e = [e for e in exact_reports if not e.equal]
    result.status = "fail" if bad_t or bad_e else "pass"
    result.rows_differing = max(
        max((t.rows_outside for t in tol_reports), default=0),
        max((e.rows_differing for e in exact_reports), default=0),
    )
    result.worst_ulp = max(t.worst_ulp for t in tol_reports)
    result.worst_abs = max(t.worst_abs for t in tol_reports)
    result.worst_rel = max(t.worst_rel for t in tol_reports)
    result.bound_ratio = _finite_or_none(max(t.worst_ratio for t in tol_reports))
    parts = []
    held, total = exact_counts
    if held:
        state = f"{len(bad_e)} output(s) differ: {bad_e[0]}" if bad_e else "bitwise equal"
        parts.append(f"exact (one rounding of the exact value) on {held}/{total} elements: {state}")
    if held < total:
        worst = bad_t[0] if bad_t else max(tol_reports, key=lambda t: t.worst_ratio)
        kind = "tight bound" if tight is not None else "bound"
        text = f"elsewhere {worst}" if held else str(worst)
        text = text.replace("worst error / bound", f"worst error / {kind}")
        if hard_reports:
            hard_ratio = max(t.worst_ratio for t in hard_reports)
            hard_bad = [t for t in hard_reports if not t.within]
            text += f"; worst error / rigorous bound {hard_ratio:.3g}" + (" (exceeded)" if hard_bad else "")
        parts.append(text)
    if result.status == "fail":
        parts.append(_diagnosis(agreement, batch, fast_out))
    result.detail = "; ".join(p for p in parts if p)


def _diagnosis(agreement: Toleranced, batch: Batch, fast_out: Outputs) -> str:
    """The failure's likely cause: the first of ``agreement.precision_models`` whose outputs the
    failing ``fast_out`` meets within the judged bound (every element, the exact envelope
    included), phrased as the model's diagnosis with the worst error / bound around it; "" when
    none matches (or none applies to the batch: a model that raises is not considered)."""
    for model in agreement.precision_models:
        try:
            modelled = as_outputs(model.fn(**batch.kwargs()))
        except Exception:  # the flaw cannot occur on this batch (TF32 on bf16 inputs)
            continue
        if len(modelled) != len(fast_out):
            continue
        hard = agreement.bound(batch, modelled)
        tight = agreement.tight_bound(batch, modelled) if agreement.tight_bound is not None else None
        ratios = []
        for i, (m, f) in enumerate(zip(modelled, fast_out, strict=True)):
            judged = torch.broadcast_to(hard[i].to(m.device, torch.float64), m.shape)
            if tight is not None:
                judged = torch.minimum(judged, tight[i].to(m.device, torch.float64))
            report = compare_tolerance(m, f, judged)
            if not report.within:
                break
            ratios.append(report.worst_ratio)
        else:
            worst = max(ratios, default=0.0)
            return f"{model.diagnosis} (worst error / bound around the {model.name} model {worst:.3g})"
    return ""


class BaselineCrashed(RuntimeError):
    """A baseline raised while a negative control ran it: an error, never a detection."""


def control_results(
    component: Component,
    baseline: SubjectLike,
    lane: Lane,
    *,
    m_limit: int | None = None,
    timeout: float | None = None,
    pairs: Sequence[tuple[str, Case]] | None = None,
) -> Iterator[CheckResult]:
    """The negative control of ``baseline``: its invariance checks over the lane's cases, in
    the full profile's order (:meth:`batchinv.harness.profiles.Selection.control_pairs`: case by
    case, the checks a registered baseline is caught by first; a pin candidate's batch_prefix, as
    the sweep runs it), ending after the first check that finds variance (``fail``), crashes
    (``error``) or times out (``timeout``).  ``pairs``: the ``(check, case)`` pairs to run
    instead, in that order (a sweep profile's)."""
    if pairs is None:
        cases = component.cases(lane)
        known = _baseline_of(component, baseline)
        pairs = [(check, cases[i]) for check, i in FULL.control_pairs(component, known, lane)]
    for check, case in pairs:
        result = run_check(component, baseline, check, case, lane, m_limit=m_limit, timeout=timeout)
        yield result
        if result.status in ("fail", "error", TIMEOUT):
            return


def negative_control(
    component: Component,
    baseline: SubjectLike,
    lane: Lane,
    *,
    m_limit: int | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run the negative control of ``baseline`` and raise on what it finds (``on_result`` sees
    each row first: the pytest plugin's report, :func:`batchinv.harness.plugin.record`).

    Raises:
        VarianceDetected: a check found different bits (the expected outcome for an unpinned
            baseline; the message has the check, the case and the repro line).
        BaselineCrashed: a check crashed: an error, never a detection.

    Returns:
        Every result, when no check found variance (the control is inconclusive here).
    """
    results = []
    label = subject_name(baseline)
    for r in control_results(component, baseline, lane, m_limit=m_limit):
        results.append(r)
        if on_result is not None:
            on_result(r)
        if r.status in ("error", TIMEOUT):
            raise BaselineCrashed(
                f"{component.name}/{label} crashed in {r.check} [{r.case}]: {r.detail}\n  repro: {r.repro}"
            )
        if r.status == "fail":
            raise invariance.VarianceDetected(
                f"{component.name}/{label} varies in {r.check} [{r.case}]: {r.detail}\n  repro: {r.repro}"
            )
    return results


_CHILD_ENV = "BATCHINV_CHECK_CHILD"


def run_checks(
    component: Component,
    subject: SubjectLike,
    check: str,
    cases: Sequence[Case],
    lane: Lane,
    *,
    m_limit: int | None = None,
    timeout: float | None = None,
) -> list[CheckResult]:
    """:func:`run_check` over ``cases``; a pin candidate runs them all in one subprocess (its
    environment is read once, at library handle creation, and a process start costs seconds)."""
    baseline = _baseline_of(component, subject)
    if baseline is None or not baseline.is_pin_candidate or os.environ.get(_CHILD_ENV) == "1":
        return [
            run_check(component, subject, check, case, lane, m_limit=m_limit, timeout=timeout)
            for case in cases
        ]
    results = [_new_result(component, subject, check, case, lane, m_limit) for case in cases]
    start = time.perf_counter()
    try:
        children = _spawn_child(
            component.name, subject_name(subject), check, cases, lane, m_limit, baseline.env or {}, timeout
        )
        for result, child in zip(results, children, strict=True):
            for key in (
                "status",
                "rows_total",
                "rows_differing",
                "worst_ulp",
                "worst_abs",
                "worst_rel",
                "where",
                "first_difference",
                "points",
                "first",
                "launches",
                "detail",
                "seconds",
            ):
                setattr(result, key, child[key])
    except Exception as exc:  # every case of the candidate becomes an error row
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        per_case = (time.perf_counter() - start) / max(1, len(results))
        for result in results:
            result.status, result.detail, result.seconds = "error", last, per_case
    return results


def _spawn_child(
    component: str,
    subject: str,
    check: str,
    cases: Sequence[Case],
    lane: Lane,
    m_limit: int | None,
    env: Mapping[str, str],
    timeout: float | None = None,
) -> list[dict[str, Any]]:
    spec = {
        "timeout": timeout,
        "component": component,
        "subject": subject,
        "check": check,
        "cases": [{"axes": dict(c.axes), "seed": c.seed} for c in cases],
        "lane": lane.value,
        "m_limit": m_limit,
    }
    child_env = {**os.environ, **dict(env), _CHILD_ENV: "1"}
    child = child_process.Child(
        "batchinv.harness.checks",
        [json.dumps(spec)],
        child_env,
        startup_limit=PIN_CANDIDATE_LIMIT,
        call_limit=None,
    )
    ended = child.wait()
    done = ended.last("results")
    if ended.returncode != 0 or done is None:
        tail = (ended.stderr_tail.splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pin-candidate subprocess ended ({ended.how}): {tail}")
    children: list[dict[str, Any]] = done["rows"]
    return children


#: Seconds a pin candidate's subprocess may run in all (its calls keep their own limit inside).
PIN_CANDIDATE_LIMIT = 1800.0


def _child_main(argv: list[str]) -> int:
    from batchinv.harness.lanes import enter_lane
    from batchinv.harness.registry import get

    spec = json.loads(argv[0])
    lane = Lane(spec["lane"])
    enter_lane(lane)
    component = get(spec["component"])
    cases = [Case(component.name, c["axes"], c["seed"]) for c in spec["cases"]]
    out = run_checks(
        component,
        spec["subject"],
        spec["check"],
        cases,
        lane,
        m_limit=spec["m_limit"],
        timeout=spec.get("timeout"),
    )
    child_process.send({"event": "results", "rows": [asdict(r) for r in out]})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
