"""Sweep profiles and check selection: which cases and checks ``batchinv sweep`` runs.

Two profiles, both read from the registry (never a hand list here):

* ``full``: every case of ``Component.cases(lane)`` for the fast kernel, every baseline over
  every case (a control still ends at its first detection).  ``batchinv sweep --profile full``,
  ``make sweep-full``; pytest and the mutant suite always run every case.
* ``quick`` (the default of ``batchinv sweep``): on the cpu lane, the fast kernel (and each
  outside subject checked like it) runs every one of its checks on the cases
  ``Component.quick_cases(lane)`` names (default: the first case, which is also batch_prefix's
  row-threshold case; and ``neighbours`` alone on the rest of the first three cases, over
  which the cpu lane shares its transforms out); every *required* negative control (a baseline that must vary on the
  lane, and every outside ``--as baseline`` subject) runs the same (case, check) pairs as in
  ``full``, the checks it is caught by (``Baseline.caught_by``) first: a control ends at its
  first detection, so any order of the same pairs gives the same verdict; the other
  baselines (pin candidates, controls not required on the lane) run on the quick cases, without
  ``cross_process`` (its fresh processes cost seconds a case; ``full`` runs it).  On GPU lanes
  ``quick`` cuts no case of the fast kernel (nor of an outside subject checked like it) and no
  pair of a required control: only the other baselines run on the quick cases without
  ``cross_process``, as on the cpu lane.  Those baselines decide nothing (their verdicts are
  information: "inconclusive", "detected", "varies"); over every GPU case they cost about 300 of
  a cold sweep's 2700 check-seconds on the H200 (run 63), most of it in the ones that never vary
  there (matmul's and grouped_gemm's other trees, prefill's dense SDPA, the sampler's tie sort)
  and so run every case.  ``full`` runs them over every case.

So the quick profile judges the same (component, check) pairs as the full one and detects the
same required negative controls (tests/harness/test_profiles.py checks both from the registry).
(A crash in a pair the full profile never reaches, having detected earlier, would show in the
quick profile alone: an ``error``, never a detection.)

``checks`` (``--checks agreement,co_batch``, ``--invariance-only``) narrows the checks of the
fast kernel and of the controls; a required control whose detecting check is not selected ends
``not reached (--checks)`` -- unknown, neither a pass nor a failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from batchinv.harness.lanes import Lane
from batchinv.harness.neighbours import CPU_TRANSFORM_GROUPS
from batchinv.harness.registry import (
    CHECKS,
    INVARIANCE_CHECKS,
    NEIGHBOUR_CHECKS,
    PROCESS_CHECKS,
    Baseline,
    Component,
)

#: The sweep profiles; the first is ``batchinv sweep``'s default.
PROFILES: tuple[str, ...] = ("quick", "full")
DEFAULT_PROFILE: str = PROFILES[0]


class ProfileError(ValueError):
    """A profile, a check name or a component's ``quick_cases`` the sweep cannot use."""


def parse_checks(text: str) -> frozenset[str]:
    """``"agreement,co_batch"`` -> the set of those check names.

    Raises:
        ProfileError: an empty list or a name that is not one of :data:`CHECKS`.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if not names or unknown:
        raise ProfileError(f"--checks: expected a comma-separated list of {', '.join(CHECKS)}; got {text!r}")
    return frozenset(names)


def quick_case_indices(comp: Component, lane: Lane) -> tuple[int, ...]:
    """The indices into ``comp.cases(lane)`` of the quick profile's fast-kernel cases, ascending.

    Raises:
        ProfileError: ``comp.quick_cases`` names an index out of range or leaves out index 0
            (batch_prefix's row-threshold case).
    """
    n = len(comp.cases(lane))
    if n == 0:
        return ()
    chosen = tuple(comp.quick_cases(lane)) if comp.quick_cases is not None else (0,)
    bad = [i for i in chosen if not (isinstance(i, int) and 0 <= i < n)]
    if bad or 0 not in chosen:
        raise ProfileError(
            f"component {comp.name!r}: quick_cases({lane.value}) must be indices in [0, {n}) "
            f"including 0 (the row-threshold case); got {chosen!r}"
        )
    return tuple(sorted(set(chosen)))


@dataclass(frozen=True)
class Selection:
    """What a sweep runs: a profile (:data:`PROFILES`) and, optionally, only some checks.

    Attributes:
        profile: ``quick`` or ``full``.
        checks: the check names selected; None: every applicable check.
    """

    profile: str = "full"
    checks: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ProfileError(f"--profile: expected one of {', '.join(PROFILES)}; got {self.profile!r}")
        if self.checks is not None:
            unknown = sorted(set(self.checks) - set(CHECKS))
            if unknown or not self.checks:
                raise ProfileError(
                    f"--checks: unknown or empty {sorted(self.checks)}; known: {', '.join(CHECKS)}"
                )

    def quick_on(self, lane: Lane) -> bool:
        """Whether this selection cuts the fast kernel's cases on ``lane`` (the quick profile, cpu lane)."""
        return self.profile == "quick" and not lane.is_gpu

    @property
    def cuts_informational_baselines(self) -> bool:
        """Whether the baselines that decide nothing on a lane (pin candidates, controls not
        required there) run on the quick cases only, without ``cross_process``: the quick
        profile, on every lane."""
        return self.profile == "quick"

    def _keep(self, checks: Iterable[str]) -> tuple[str, ...]:
        return tuple(c for c in checks if self.checks is None or c in self.checks)

    def fast_checks(self, comp: Component) -> tuple[str, ...]:
        """The fast kernel's checks (and an outside subject's checked like it), in sweep order."""
        return self._keep(comp.applicable_checks())

    def control_checks(self, comp: Component, baseline: Baseline | None) -> tuple[str, ...]:
        """A control's checks: a pin candidate's batch_prefix, else the invariance checks
        (``baseline`` None: an outside ``--as baseline`` subject)."""
        if baseline is not None and baseline.is_pin_candidate:
            return self._keep(("batch_prefix",))
        return self._keep(c for c in comp.applicable_checks() if c in INVARIANCE_CHECKS)

    def checks_cut(self, comp: Component, baseline: Baseline | None) -> bool:
        """Whether ``checks`` left out any of the control's checks (its verdict is then not final)."""
        return len(self.control_checks(comp, baseline)) < len(
            Selection("full").control_checks(comp, baseline)
        )

    def fast_cases(self, comp: Component, lane: Lane) -> tuple[int, ...]:
        """Indices into ``comp.cases(lane)`` the fast kernel runs on."""
        if self.quick_on(lane):
            return quick_case_indices(comp, lane)
        return tuple(range(len(comp.cases(lane))))

    def fast_units(self, comp: Component, lane: Lane) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """``(case index, checks)`` the fast kernel (and an outside subject checked like it) runs:
        every check on each of :meth:`fast_cases`; under the quick profile also ``neighbours``
        alone on the rest of the cases its transforms are shared out over on the cpu lane
        (:data:`~batchinv.harness.neighbours.CPU_TRANSFORM_GROUPS`: one group per case), so every
        transform runs in the quick profile as in the full one."""
        checks = self.fast_checks(comp)
        cases = self.fast_cases(comp, lane)
        units = [(i, checks) for i in cases]
        spread = tuple(c for c in checks if c in NEIGHBOUR_CHECKS)
        if self.quick_on(lane) and spread:
            total = len(comp.cases(lane))
            units += [(i, spread) for i in range(min(len(CPU_TRANSFORM_GROUPS), total)) if i not in cases]
        return tuple(units)

    def control_pairs(
        self, comp: Component, baseline: Baseline | None, lane: Lane
    ) -> tuple[tuple[str, int], ...]:
        """``(check, case index)`` of a control, in the order it runs them (it ends at the first
        detection): case by case, every check of the case, except that a baseline first runs the
        checks it is caught by (``Baseline.caught_by``, ``config_equivalence`` for a
        ``config_control``) over every case, then the rest, the fresh-process checks
        (``cross_process``, seconds of start-up each) last -- the same pairs in another order, so
        the same verdict, found without first running the checks that cannot see it (in every
        profile: the pytest controls and the GPU sweep too).  The one exception: a control also
        ends at its first crash or timeout, so where a pair crashes the order decides whether the
        control meets the crash or a detection first (as in the quick profile before).  Under the
        quick profile (every lane) a control not required on the lane leaves out ``cross_process``
        (it runs the quick cases only)."""
        checks = self.control_checks(comp, baseline)
        pairs = [(ch, i) for i in self.control_cases(comp, baseline, lane) for ch in checks]
        if baseline is None or baseline.is_pin_candidate:
            return tuple(pairs)
        if (
            self.cuts_informational_baselines and lane not in baseline.expected_to_vary_on
        ):  # no fresh processes
            pairs = [p for p in pairs if p[0] not in PROCESS_CHECKS]
        first = set(baseline.caught_by) | ({"config_equivalence"} if baseline.config_control else set())

        def rank(pair: tuple[str, int]) -> int:
            if pair[0] in first:
                return 0
            return 2 if pair[0] in PROCESS_CHECKS else 1  # a fresh interpreter costs seconds

        return tuple(sorted(pairs, key=rank))  # stable: order kept within each

    def control_cases(self, comp: Component, baseline: Baseline | None, lane: Lane) -> tuple[int, ...]:
        """Indices into ``comp.cases(lane)`` a control runs over, in order: every case for a
        required negative control (``baseline`` None: an outside ``--as baseline`` subject, always
        required), the quick cases for the other baselines under the quick profile (every lane)."""
        required = baseline is None or (
            not baseline.is_pin_candidate and lane in baseline.expected_to_vary_on
        )
        if required or not self.cuts_informational_baselines:
            return tuple(range(len(comp.cases(lane))))
        return quick_case_indices(comp, lane)


#: The full profile, every check: what a sweep runs unless told otherwise (pytest, the API).
FULL: Selection = Selection("full")
