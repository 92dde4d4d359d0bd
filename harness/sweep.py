"""``batchinv sweep``: every registered component on one lane.

For each component and each of its cases on the lane: agreement and every invariance check on
the fast kernel; then the negative controls: each baseline's invariance checks, stopping at the
first one that detects variance (a detection is all a negative control needs).  Pin candidates
run their batch-prefix check on every case, since where they vary is the finding.

Verdicts: a fast check is ``pass``/``fail``/``error``, or ``reference path`` where the fast
callable ran the reference instead of its kernel (counted apart from the passes, not a failure); a negative control is ``detected``
(some check failed on the baseline, as it must), ``inconclusive`` (nothing failed: the harness
could not tell this baseline from a pinned kernel here — never reported as a pass) or ``error``;
a pin candidate is ``invariant``, ``varies`` or ``error``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchinv.harness.checks import FAST, REFERENCE_PATH, CheckResult, run_check, run_checks
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import INVARIANCE_CHECKS, Baseline, Component


@dataclass
class CheckSummary:
    """Aggregate of one (component, check) over every case, for the fast kernel."""

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
    seconds: float = 0.0
    detected_by: list[str] = field(default_factory=list)

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

    @property
    def is_failure(self) -> bool:
        """A verdict that makes the sweep exit non-zero."""
        return self.expected_to_vary and self.verdict == "inconclusive"


@dataclass
class SweepOutcome:
    checks: list[CheckSummary]
    controls: list[ControlSummary]
    failures: list[CheckResult]

    @property
    def ok(self) -> bool:
        return not self.failures and not any(c.is_failure for c in self.controls)


@dataclass(frozen=True)
class Task:
    component: Component
    subject: str
    check: str
    case_index: int


def plan(components: Sequence[Component], lane: Lane) -> list[Task]:
    """Every task of a sweep, in order (negative-control tasks may be cut short at run time)."""
    tasks: list[Task] = []
    for comp in components:
        if lane not in comp.lanes:
            continue
        cases = comp.cases(lane)
        checks = comp.applicable_checks()
        tasks += [Task(comp, FAST, ch, i) for i in range(len(cases)) for ch in checks]
        for b in _baselines(comp, lane):
            b_checks = ("batch_prefix",) if b.is_pin_candidate else _invariance_checks(comp)
            tasks += [Task(comp, b.name, ch, i) for i in range(len(cases)) for ch in b_checks]
    return tasks


def _baselines(comp: Component, lane: Lane) -> list[Baseline]:
    return [b for b in comp.baselines if lane in b.lanes]


def _invariance_checks(comp: Component) -> tuple[str, ...]:
    return tuple(c for c in comp.applicable_checks() if c in INVARIANCE_CHECKS)


def run_sweep(
    components: Sequence[Component],
    lane: Lane,
    *,
    on_result: Callable[[CheckResult], None] = lambda r: None,
    on_skip: Callable[[int], None] = lambda n: None,
    m_limit: int | None = None,
    include_baselines: bool = True,
) -> SweepOutcome:
    """Run the sweep; ``on_result`` sees every result as it is made, ``on_skip`` is told how many
    planned tasks a detected negative control made unnecessary (for the progress bar)."""
    checks: dict[tuple[str, str], CheckSummary] = {}
    controls: list[ControlSummary] = []
    failures: list[CheckResult] = []
    for comp in components:
        if lane not in comp.lanes:
            continue
        cases = list(comp.cases(lane))
        for ch in comp.applicable_checks():
            checks[(comp.name, ch)] = CheckSummary(comp.name, ch)
        for case in cases:
            for ch in comp.applicable_checks():
                r = run_check(comp, FAST, ch, case, lane, m_limit=m_limit)
                on_result(r)
                checks[(comp.name, ch)].add(r)
                if r.status in ("fail", "error"):
                    failures.append(r)
        if not include_baselines:
            continue
        for b in _baselines(comp, lane):
            ctrl = ControlSummary(comp.name, b.name, b.is_pin_candidate, lane in b.expected_to_vary_on)
            controls.append(ctrl)
            b_checks = ("batch_prefix",) if b.is_pin_candidate else _invariance_checks(comp)
            planned = len(cases) * len(b_checks)
            done = 0
            wheres: list[str] = []
            if b.is_pin_candidate:  # one subprocess for every case; where it varies is the finding
                ch = b_checks[0]
                candidate_results = {
                    c.id: r
                    for c, r in zip(
                        cases, run_checks(comp, b.name, ch, cases, lane, m_limit=m_limit), strict=True
                    )
                }
            for case in cases:
                for ch in b_checks:
                    if b.is_pin_candidate:
                        r = candidate_results[case.id]
                    else:
                        r = run_check(comp, b.name, ch, case, lane, m_limit=m_limit)
                    done += 1
                    on_result(r)
                    ctrl.seconds += r.seconds
                    ctrl.cases += 1
                    if r.status == "fail":
                        checks[(comp.name, ch)].detected_by.append(b.name)
                        wheres.append(f"{ch} [{case.id}] {', '.join(r.where[:4])}")
                        if ctrl.verdict != "varies":
                            ctrl.detail, ctrl.repro = r.detail, r.repro
                        ctrl.verdict = "varies" if b.is_pin_candidate else "detected"
                    elif r.status == "error" and ctrl.verdict == "inconclusive":
                        ctrl.verdict, ctrl.detail, ctrl.repro = "error", r.detail, r.repro
                    if ctrl.verdict == "detected":
                        break
                if ctrl.verdict == "detected":
                    break
            on_skip(planned - done)
            if b.is_pin_candidate and ctrl.verdict == "inconclusive":
                ctrl.verdict = "invariant"
            ctrl.where = "; ".join(wheres[:3]) + (f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else "")
    return SweepOutcome(list(checks.values()), controls, failures)
