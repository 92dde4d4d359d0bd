"""Sweep profiles and check selection (batchinv.harness.profiles): the quick profile judges the
same (component, check) pairs and runs every required negative control exactly as the full
profile does, computed from the registry; ``--checks`` / ``--invariance-only`` narrow the checks;
the closing counts line, the per-component line and the launch names of an invariance diff."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import pytest
from toy_component import m_dependent as _m_dependent
from toy_component import scale as _scale
from toy_component import toy as _toy

from batchinv.harness.checks import FAST, run_check
from batchinv.harness.cli import main
from batchinv.harness.lanes import Lane
from batchinv.harness.profiles import FULL, ProfileError, Selection, parse_checks, quick_case_indices
from batchinv.harness.registry import INVARIANCE_CHECKS, PROCESS_CHECKS, Baseline, Case, components
from batchinv.harness.sweep import plan, run_sweep
from batchinv.harness.sweep_table import LEGEND, component_line, counts_line, print_outcome


def _by_subject(tasks):
    out = defaultdict(list)
    for t in tasks:
        out[(t.component.name, t.subject)].append((t.check, t.case_index))
    return out


@pytest.mark.parametrize("lane", [Lane.CPU, Lane.SM90, Lane.SM100], ids=lambda lane: lane.value)
def test_quick_profile_judges_every_check_and_runs_every_required_control_as_full(lane):
    comps = components()
    full = _by_subject(plan(comps, lane, selection=FULL))
    quick = _by_subject(plan(comps, lane, selection=Selection("quick")))
    fast_tasks = [sum(len(v) for (_, who), v in p.items() if who == FAST) for p in (quick, full)]
    if lane.is_gpu:  # no case of the fast kernel is cut on a GPU lane
        assert fast_tasks[0] == fast_tasks[1]
    else:
        assert fast_tasks[0] < fast_tasks[1] / 3  # the fast kernel's cases are cut
    assert set(quick) == set(full)  # every fast kernel and every baseline runs
    informational = 0
    for comp in comps:
        if lane not in comp.lanes:
            continue
        # the same (component, check) pairs are judged on the fast kernel
        assert {ch for ch, _ in quick[(comp.name, FAST)]} == set(comp.applicable_checks())
        assert 0 in {i for _, i in quick[(comp.name, FAST)]}  # the batch_prefix threshold case
        if lane.is_gpu:
            assert quick[(comp.name, FAST)] == full[(comp.name, FAST)]
        for b in comp.baselines:
            if lane not in b.lanes:
                continue
            if not b.is_pin_candidate and lane in b.expected_to_vary_on:
                # a required control: the same (check, case) pairs as in the full profile; it ends
                # at its first detection, so in any order it detects iff the full profile does
                q, f = quick[(comp.name, b.name)], full[(comp.name, b.name)]
                assert sorted(q) == sorted(f), (comp.name, b.name)
                first = set(b.caught_by) | ({"config_equivalence"} if b.config_control else set())
                n = sum(ch in first for ch, _ in f)
                assert {ch for ch, _ in q[:n]} <= first  # the checks it is caught by go first
                assert [p for p in q if p[0] not in first] == [p for p in f if p[0] not in first]
                # ... and the fresh-process checks it is not caught by go last, after every case's
                # in-process checks (seconds of start-up each, run only when those find nothing)
                process = [k for k, (ch, _) in enumerate(q) if ch in PROCESS_CHECKS and ch not in first]
                in_process = [k for k, (ch, _) in enumerate(q) if ch not in PROCESS_CHECKS]
                assert not process or not in_process or min(process) > max(in_process), (comp.name, b.name)
            else:  # quick leaves cross_process's fresh processes to the required controls
                cut = set() if b.is_pin_candidate else set(PROCESS_CHECKS)
                assert {ch for ch, _ in quick[(comp.name, b.name)]} == {
                    ch for ch, _ in full[(comp.name, b.name)]
                } - cut
                # ... and runs the others on the quick cases only, on every lane
                assert {i for _, i in quick[(comp.name, b.name)]} <= set(quick_case_indices(comp, lane))
                informational += len(full[(comp.name, b.name)]) - len(quick[(comp.name, b.name)])
    assert informational > 0  # some informational baseline's pairs are cut on this lane


def test_a_control_detected_in_full_is_detected_in_quick_whatever_the_order():
    from dataclasses import replace

    comp = _toy(baselines=[Baseline("varies", _m_dependent, "M", caught_by=("repeat",))])
    quick = replace(comp, quick_cases=lambda lane: (0,))
    full_outcome = run_sweep([comp], Lane.CPU, selection=FULL)
    quick_outcome = run_sweep([quick], Lane.CPU, selection=Selection("quick"))
    assert (
        [c.verdict for c in full_outcome.controls]
        == [c.verdict for c in quick_outcome.controls]
        == ["detected"]
    )
    # repeat (tried first) cannot see it on either case; batch_prefix on case 0 does
    assert quick_outcome.controls[0].cases == 3 and quick_outcome.controls[0].where.startswith("batch_prefix")


def test_quick_cases_are_checked():
    comp = _toy()
    assert quick_case_indices(comp, Lane.CPU) == (0,)
    from dataclasses import replace

    with pytest.raises(ProfileError, match="including 0"):
        quick_case_indices(replace(comp, quick_cases=lambda lane: (1,)), Lane.CPU)
    with pytest.raises(ProfileError, match="must be indices"):
        quick_case_indices(replace(comp, quick_cases=lambda lane: (0, 99)), Lane.CPU)
    with pytest.raises(ProfileError, match="--checks"):
        parse_checks("agreement,nonsense")
    assert parse_checks("agreement, co_batch") == {"agreement", "co_batch"}


def test_checks_narrow_the_sweep_and_an_unreachable_control_is_not_reached():
    comp = _toy(baselines=[Baseline("varies", _m_dependent, "M"), Baseline("pinned_too", _scale, "inv")])
    outcome = run_sweep([comp], Lane.CPU, selection=Selection("full", frozenset({"agreement", "repeat"})))
    assert [c.check for c in outcome.checks] == ["agreement", "repeat"]
    verdicts = {c.baseline: c.verdict for c in outcome.controls}
    # repeat cannot see an M-dependent baseline: unknown, not a failure (nor a detection)
    assert verdicts == {"varies": "not reached (--checks)", "pinned_too": "not reached (--checks)"}
    assert outcome.ok
    invariance = run_sweep([comp], Lane.CPU, selection=Selection("full", frozenset(INVARIANCE_CHECKS)))
    assert "agreement" not in [c.check for c in invariance.checks]
    assert {c.baseline: c.verdict for c in invariance.controls}["varies"] == "detected"


def test_cli_rejects_bad_check_selections(capsys):
    assert main(["sweep", "toy", "--checks", "agreement,nonsense"]) == 2
    assert "--checks" in capsys.readouterr().err
    assert main(["sweep", "--checks", "agreement", "--invariance-only"]) == 2
    assert "give one of them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "--profile", "nonsense"])


def test_counts_line_component_line_legend_and_80_columns():
    comp = _toy(fast=_m_dependent, baselines=[Baseline("varies", _m_dependent, "M")])
    lines: list[str] = []
    outcome = run_sweep(
        [comp],
        Lane.CPU,
        m_limit=33,
        on_component=lambda name, checks, controls: lines.append(
            component_line(name, checks, controls, Lane.CPU)
        ),
    )
    # cross_process is a skip: no fresh process can rebuild an unregistered component's cases
    assert lines == [
        "toy: agreement pass, batch_prefix fail (2/2), position pass, repeat pass, neighbours pass, "
        "cross_process skip; controls: varies detected (batch_prefix) "
        "[batch-invariant: no, deterministic at fixed shape: unknown] "
        f"[{sum(c.seconds for c in outcome.checks) + outcome.controls[0].seconds:.1f} s]"
    ]
    assert counts_line(outcome) == (
        "counts: checks 4 passed, 1 failed, 1 skipped, 0 reference path (of 6 component x check); "
        "negative controls 1/1 required detected"
    )
    from rich.console import Console

    buffer = io.StringIO()
    print_outcome(Console(file=buffer, width=80), outcome, Lane.CPU, {"device": "cpu"}, Path("r.jsonl"))
    text = buffer.getvalue()
    lines_out = text.splitlines()
    table = lines_out[: next(i for i, ln in enumerate(lines_out) if "batchinv repro" in ln)]  # the tables
    assert max(len(ln) for ln in table) <= 80, text
    flat = " ".join(text.split())  # the notes column wraps
    assert "negative control detected: varies" in flat and "fails on" not in flat
    assert " ".join(LEGEND.split()) in flat
    closing = text.rstrip().splitlines()
    assert closing[-3].startswith("counts: ") and closing[-1].startswith("FAILED")
    assert closing[-2] == (
        "properties: batch-invariant 0/1, deterministic at fixed shape 0/1 (1 unknown) (of 1 subject)"
    )


def test_an_invariance_diff_names_both_launches():
    r = run_check(
        _toy(fast=_m_dependent), "fast", "batch_prefix", Case("toy", {"rows": 40, "cols": 8}, 0), Lane.CPU
    )
    assert "in the launch of 40 rows" in r.detail and "in a launch of 1 " in r.detail
    assert "expected" not in r.detail and " got " not in r.detail
