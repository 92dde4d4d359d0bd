"""Out-of-envelope launches are not kernel agreement: a toy component whose fast callable runs
its "kernel" up to 8 columns and the reference past them (``Component.fast_path``).  Checks
that ran the reference report ``reference path`` (row, JSON line, sweep summary, CLI table),
agreement there is against the oracle (so a wrong reference path fails), and a check mixing
kernel and reference launches is not a kernel pass."""

from __future__ import annotations

import json

import pytest
import torch

from batchinv.harness import cli
from batchinv.harness import registry as registry_module
from batchinv.harness.checks import REFERENCE_PATH, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, Case, Component
from batchinv.harness.report import JsonlReport, read_report
from batchinv.harness.sweep import run_sweep

KERNEL_MAX_COLS = 8


def _build(case: Case, device) -> Batch:
    g = torch.Generator().manual_seed(case.seed)
    x = torch.randint(-8, 8, (case.axes["rows"], case.axes["cols"]), generator=g).float()
    return Batch({"x": x.to(device)})


def _row_sum(x):  # the reference: exact on small integers in any order
    return x.sum(dim=1, keepdim=True)


def _kernel(x):  # the toy "kernel": another summation order, the same exact sums
    return x.flip(1).cumsum(dim=1)[:, -1:]


def _fast(x):
    return _kernel(x) if x.shape[1] <= KERNEL_MAX_COLS else _row_sum(x)


def _oracle(x):
    return torch.tensor([[float(sum(int(v) for v in row))] for row in x.tolist()], device=x.device)


def _pad_left(batch: Batch, offset: int, generator: torch.Generator) -> Batch:
    """The same rows after ``offset`` zero columns: the sums do not move, the rows widen."""
    x = batch.rows["x"]
    return Batch({"x": torch.cat([x.new_zeros(x.shape[0], offset), x], dim=1)}, batch.shared)


def _fast_path(batch: Batch) -> bool:
    return batch.rows["x"].shape[1] <= KERNEL_MAX_COLS


def _toy(*, fast=_fast, reference=_row_sum, oracle=_oracle, cols=(3, 9), shift=None):
    return Component(
        name="toy",
        summary="row sums, a kernel up to 8 columns",
        reference=reference,
        fast=fast,
        baselines=(),
        cases=lambda lane: [Case("toy", {"rows": 20, "cols": c}, seed=c) for c in cols],
        build=_build,
        shift_row_start=shift,
        fast_path=_fast_path,
        oracle=oracle,
    )


IN_ENVELOPE = Case("toy", {"rows": 20, "cols": 3}, seed=3)
OUTSIDE = Case("toy", {"rows": 20, "cols": 9}, seed=9)


def test_checks_outside_the_fast_path_are_reference_path_not_pass(tmp_path):
    path = tmp_path / "r.jsonl"
    with JsonlReport(path) as report:
        outcome = run_sweep([_toy()], Lane.CPU, on_result=report.check, include_baselines=False)
    rows = [r for r in read_report(path) if r["kind"] == "check" and r["check"] != "cross_process"]
    assert {r["status"] for r in rows if r["axes"]["cols"] == 3} == {"pass"}
    assert {r["status"] for r in rows if r["axes"]["cols"] == 9} == {REFERENCE_PATH}
    agreement = next(r for r in rows if r["axes"]["cols"] == 9 and r["check"] == "agreement")
    assert "oracle" in agreement["detail"]
    # cross_process: a skip (the toy is not registered: no fresh process can rebuild its cases)
    for summary in (s for s in outcome.checks if s.check != "cross_process"):
        assert (summary.passed, summary.reference_path, summary.failed) == (1, 1, 0), summary
        assert summary.status == "pass" and summary.cases == 2
    assert outcome.ok and not outcome.failures  # reference-path rows are not failures


def test_only_reference_path_cases_summarize_as_reference_path():
    outcome = run_sweep([_toy(cols=(9,))], Lane.CPU, include_baselines=False)
    in_process = [s for s in outcome.checks if s.check != "cross_process"]  # the toy's is a skip
    assert {s.status for s in in_process} == {REFERENCE_PATH} and outcome.ok


def test_a_wrong_reference_path_fails_against_the_oracle():
    """The reference (and so the fast path's fallback) is wrong past 8 columns: comparing fast
    with the reference would pass; the oracle catches it."""

    def wrong_past_8(x):
        return _row_sum(x) + (1.0 if x.shape[1] > KERNEL_MAX_COLS else 0.0)

    def fast(x):
        return _kernel(x) if x.shape[1] <= KERNEL_MAX_COLS else wrong_past_8(x)

    comp = _toy(fast=fast, reference=wrong_past_8)
    assert run_check(comp, "fast", "agreement", IN_ENVELOPE, Lane.CPU).status == "pass"
    r = run_check(comp, "fast", "agreement", OUTSIDE, Lane.CPU)
    assert r.status == "fail" and r.rows_differing == 20
    assert "oracle" in r.detail


def test_a_wrong_oracle_fails_too():
    comp = _toy(oracle=lambda x: _oracle(x) * 2)
    assert run_check(comp, "fast", "agreement", OUTSIDE, Lane.CPU).status == "fail"


def test_row_start_widening_past_the_envelope_is_not_a_kernel_pass():
    """An 8-column case: the row_start check runs the kernel at offset 0 and the reference at
    every wider offset.  That compares the kernel with the reference, not the kernel with
    itself: reported as reference path, with the launch count."""
    comp = _toy(shift=_pad_left)
    r = run_check(comp, "fast", "row_start", Case("toy", {"rows": 20, "cols": 8}, seed=8), Lane.CPU)
    assert r.status == REFERENCE_PATH
    # the unshifted call and offset 0 ran the kernel; offsets 1, 7, 31, 32, 33 and a random one did not
    assert "6 of 8 launches ran the reference" in r.detail
    # a shift that keeps the width inside the envelope leaves the same check a kernel pass
    comp_in_place = _toy(shift=lambda b, off, g: b)
    assert run_check(comp_in_place, "fast", "row_start", IN_ENVELOPE, Lane.CPU).status == "pass"


def test_a_failure_mixing_kernel_and_reference_launches_stays_a_failure():
    def fallback_off_by_one(x):
        return _kernel(x) if x.shape[1] <= KERNEL_MAX_COLS else _row_sum(x) + 1.0

    comp = _toy(fast=fallback_off_by_one, shift=_pad_left)
    r = run_check(comp, "fast", "row_start", Case("toy", {"rows": 20, "cols": 8}, seed=8), Lane.CPU)
    assert r.status == "fail" and "launches ran the reference" in r.detail


def test_baselines_are_not_marked_reference_path():
    """fast_path describes the fast callable only; a baseline's rows keep pass / fail."""
    from dataclasses import replace

    from batchinv.harness.registry import Baseline

    comp = replace(_toy(), baselines=(Baseline("same", _fast, "the fast callable again"),))
    assert run_check(comp, "same", "repeat", OUTSIDE, Lane.CPU).status == "pass"


def test_fast_path_without_an_oracle_is_refused():
    with pytest.raises(ValueError, match="oracle"):
        _toy(oracle=None)


@pytest.mark.cpu  # the CLI enters the cpu lane (TRITON_INTERPRET=1): only where that is the lane
def test_cli_table_shows_reference_path_counts(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(registry_module, "components", lambda names=None: [_toy()])
    code = cli.main(
        [
            "sweep",
            "--lane",
            "cpu",
            "--no-progress",
            "--no-baselines",
            "--profile",
            "full",
            "--jobs",
            "1",
            "--report",
            str(tmp_path / "r.jsonl"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pass (1 reference path)" in out
    summary = read_report(tmp_path / "r.jsonl")[-1]
    assert summary["kind"] == "summary"
    in_process = [c for c in summary["checks"] if c["check"] != "cross_process"]  # the toy's: a skip
    assert all(c["reference_path"] == 1 for c in in_process), json.dumps(summary)
