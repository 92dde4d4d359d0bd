"""Registry-driven tests: every component, every case of this lane.

For each component: agreement with the reference and every applicable invariance check on the
fast kernel; one negative control per baseline (a strict xfail on the lanes where it must vary:
when the harness stops detecting variance there, this goes red); every error input against the
fast kernel and the reference.  The parameters come from the registry, so a new component is
covered by registering it.

A component whose ``lanes`` exclude this lane (``w4a16_nvfp4``: sm100 only) gets one test of
each kind, marked with its lanes and skipped with the reason "not run on this lane": the report
names it, never a silent absence nor a pass.
"""

from __future__ import annotations

import pytest

from batchinv.harness.checks import FAST, negative_control, run_check
from batchinv.harness.invariance import VarianceDetected
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane, lane_skip_reason, record
from batchinv.harness.registry import Component, components
from batchinv.harness.sweep import lane_names

LANE = current_lane()
LANE_MARK = pytest.mark.cpu if LANE is Lane.CPU else pytest.mark.gpu
COMPONENTS = [c for c in components() if LANE in c.lanes]
OFF_LANE = [c for c in components() if LANE not in c.lanes]


def _off_lane_param(comp: Component, kind: str, nargs: int) -> object:
    """One skipped test of ``kind`` for a component that does not run on this lane, marked with
    its lanes (so ``-m sm100`` selects it) and skipped with the plugin's lane reason."""
    names = lane_names(comp.lanes)
    why = lane_skip_reason(set(names), LANE) or "its lanes exclude this one"
    reason = f"{comp.name}: not run on this lane ({LANE.value}): {why}"
    marks = [getattr(pytest.mark, name) for name in names] + [pytest.mark.skip(reason=reason)]
    return pytest.param(comp, *([None] * (nargs - 1)), id=f"{comp.name}-{kind}-not-on-lane", marks=marks)


def _fast_params():
    for comp in COMPONENTS:
        for case in comp.cases(LANE):
            for check in comp.applicable_checks():
                # One xdist group per case: under --dist loadgroup a case's checks share a worker,
                # so its batch is built once there (harness/build_cache.py), not once per check.
                group = pytest.mark.xdist_group(f"{comp.name}-{case.id}")
                yield pytest.param(
                    comp, check, case, id=f"{comp.name}-{check}-{case.id}", marks=[LANE_MARK, group]
                )
    for comp in OFF_LANE:
        yield _off_lane_param(comp, "fast", 3)


@pytest.mark.parametrize(("component", "check", "case"), list(_fast_params()))
def test_fast(component, check, case):
    result = run_check(component, FAST, check, case, LANE)
    record(result)  # user_properties for --junitxml, and the --batchinv-report row
    if result.status == "skip":  # e.g. batch_prefix or position on a one-row case: nothing to vary
        pytest.skip(result.detail)
    # "reference path": fast ran the reference here (outside its kernel's envelope), agreement
    # checked against the oracle; the sweep reports it apart, tests/harness/test_harness_fast_path.py covers it.
    assert result.status in ("pass", "reference path"), (
        f"{result.status}: {result.detail}\n  where: {result.where}\n  repro: {result.repro}"
    )


def _control_params():
    for comp in COMPONENTS:
        for b in comp.baselines:
            if b.is_pin_candidate or LANE not in b.lanes:
                continue
            marks = [LANE_MARK, pytest.mark.negative_control]
            if LANE in b.expected_to_vary_on:
                marks.append(
                    pytest.mark.xfail(
                        strict=True, raises=VarianceDetected, reason=f"unpinned baseline: {b.why}"
                    )
                )
            else:
                marks.append(
                    pytest.mark.skip(
                        reason=f"{b.name} is not required to vary on the {LANE.value} lane (the sweep reports it)"
                    )
                )
            yield pytest.param(comp, b, id=f"{comp.name}-{b.name}", marks=marks)
    for comp in OFF_LANE:
        if comp.baselines:
            yield _off_lane_param(comp, "negative_control", 2)


@pytest.mark.parametrize(("component", "baseline"), list(_control_params()))
def test_negative_control(component, baseline):
    """Raises VarianceDetected at the first check that finds different bits on the baseline, as
    it must (a strict xfail that only VarianceDetected satisfies); a crash raises BaselineCrashed
    and fails the test; a baseline that never varies passes, which the strict xfail turns red."""
    negative_control(component, baseline.name, LANE, on_result=record)


def _error_params():
    import torch

    device = torch.device("cpu" if LANE is Lane.CPU else "cuda")
    for comp in COMPONENTS:
        for err in comp.error_cases(device):
            for impl in err.applies_to:
                yield pytest.param(comp, err, impl, id=f"{comp.name}-{err.name}-{impl}", marks=LANE_MARK)
    for comp in OFF_LANE:
        yield _off_lane_param(comp, "errors", 3)


@pytest.mark.parametrize(("component", "error_case", "impl"), list(_error_params()))
def test_bad_input_raises_typed_error(component, error_case, impl):
    fn = component.fast if impl == "fast" else component.reference
    with pytest.raises(error_case.error, match=error_case.match):
        fn(**error_case.kwargs)
