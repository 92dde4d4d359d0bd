"""The sweep on a toy registry: verdicts, error rows that do not stop the sweep, the JSON-lines
report, and reproduction lines that re-run exactly the failing case."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import torch
from lane_env import needs_cpu_lane_child
from toy_component import crashes as _crashes
from toy_component import m_dependent as _m_dependent
from toy_component import scale as _scale
from toy_component import toy as _toy

from batchinv.harness.checks import run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Baseline, Case
from batchinv.harness.report import JsonlReport, read_report
from batchinv.harness.sweep import run_sweep


def test_invariant_component_passes_and_controls_get_verdicts():
    comp = _toy(
        baselines=[
            Baseline("m_dependent", _m_dependent, "adds a bias below 17 rows"),
            Baseline("pinned_too", _scale, "is actually invariant"),
        ]
    )
    seen = []
    outcome = run_sweep([comp], Lane.CPU, on_result=seen.append)
    # cross_process: the toy is not registered, no fresh process can rebuild it (a skip)
    assert all(c.status == ("skip" if c.check == "cross_process" else "pass") for c in outcome.checks)
    verdicts = {c.baseline: c.verdict for c in outcome.controls}
    assert verdicts == {"m_dependent": "detected", "pinned_too": "inconclusive"}
    # an inconclusive negative control on a lane where it must vary fails the sweep
    assert not outcome.ok
    detected = next(c for c in outcome.controls if c.baseline == "m_dependent")
    assert "batchinv repro toy --check batch_prefix --subject m_dependent" in detected.repro


def test_crash_becomes_error_row_and_sweep_goes_on():
    comp = _toy(fast=_crashes)
    outcome = run_sweep([comp], Lane.CPU, include_baselines=False)
    agreement = next(c for c in outcome.checks if c.check == "agreement")
    assert agreement.errors == 2 and agreement.status == "error"
    # every planned check still ran (and errored) instead of stopping at the first crash
    assert all(c.errors == 2 for c in outcome.checks if c.status != "skip")
    assert "planted crash" in outcome.failures[0].detail
    assert not outcome.ok


def test_m_dependent_fast_fails_batch_prefix_with_where():
    comp = _toy(fast=_m_dependent)
    r = run_check(comp, "fast", "batch_prefix", Case("toy", {"rows": 40, "cols": 8}, 0), Lane.CPU)
    assert r.status == "fail"
    assert r.where[0] == "M=1" and "M=17" not in r.where
    # M 1..16 in windows advancing through the 40 rows (restarting at row 0 when one would run
    # past the end): every row but row 39 sits in one of them
    assert r.rows_differing == 39


def test_report_is_jsonl_and_survives_a_truncated_tail(tmp_path):
    comp = _toy()
    path = tmp_path / "r.jsonl"
    with JsonlReport(path) as report:
        report.write("header", {"lane": "cpu"})
        run_sweep([comp], Lane.CPU, on_result=report.check, include_baselines=False)
    records = read_report(path)
    assert records[0]["kind"] == "header"
    assert {r["check"] for r in records[1:]} >= {"agreement", "batch_prefix", "position", "repeat"}
    with path.open("a") as fh:
        fh.write('{"kind": "check", "trunc')
    assert len(read_report(path)) == len(records)


def _first_detection():
    """A real registered baseline's failing check on the cpu lane (the negative control's hit)."""
    from batchinv.harness.registry import INVARIANCE_CHECKS, components

    for comp in components():
        for b in comp.baselines:
            if Lane.CPU not in b.expected_to_vary_on or b.is_pin_candidate:
                continue
            for case in comp.cases(Lane.CPU):
                for check in comp.applicable_checks():
                    if check in INVARIANCE_CHECKS:
                        r = run_check(comp, b.name, check, case, Lane.CPU)
                        if r.status == "fail":
                            return r
    raise AssertionError("no registered baseline fails on the cpu lane")


@needs_cpu_lane_child
def test_repro_line_reruns_exactly_the_failing_case():
    """The printed one-line reproduction, run as a command, reproduces the same failure."""
    failing = _first_detection()
    argv = shlex.split(failing.repro)
    assert argv[0] == "batchinv"
    proc = subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", *argv[1:]], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout
    assert failing.where[0] in proc.stdout


def test_agreement_checks_the_contract_output_dtype():
    """A fast output within the bound but of the wrong dtype (a missing final rounding) fails."""
    from dataclasses import replace

    from batchinv.harness.registry import Toleranced

    def reference64(x):
        return x.double() * 2.0

    toleranced = Toleranced(
        bound=lambda batch, ref: (torch.zeros((), dtype=torch.float64),),
        justification="exact doubling",
        out_dtypes=lambda batch: (batch.rows["x"].dtype,),
    )
    good = replace(_toy(), reference=reference64, agreement=toleranced)
    case = Case("toy", {"rows": 4, "cols": 8}, 0)
    assert run_check(good, "fast", "agreement", case, Lane.CPU).status == "pass"
    unrounded = replace(good, fast=reference64)  # returns fp64: equal values, wrong contract
    r = run_check(unrounded, "fast", "agreement", case, Lane.CPU)
    assert r.status == "fail" and "dtype" in r.detail


def test_every_toleranced_component_declares_its_output_dtypes():
    from batchinv.harness.registry import Toleranced, components

    missing = [
        c.name for c in components() if isinstance(c.agreement, Toleranced) and c.agreement.out_dtypes is None
    ]
    assert not missing, f"Toleranced agreement without out_dtypes: {missing}"


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", *args], capture_output=True, text=True, timeout=300
    )


@needs_cpu_lane_child
def test_cli_rejects_bad_arguments_without_a_traceback():
    bad_json = _cli("repro", "topk", "--check", "repeat", "--lane", "cpu", "--seed", "0", "--axes", "notjson")
    assert bad_json.returncode == 2 and "--axes" in bad_json.stderr and "Traceback" not in bad_json.stderr
    not_object = _cli(
        "repro", "topk", "--check", "repeat", "--lane", "cpu", "--seed", "0", "--axes", "[1, 2]"
    )
    assert not_object.returncode == 2 and "JSON object" in not_object.stderr
    zero_m = _cli("sweep", "topk", "--lane", "cpu", "--max-m", "0")
    assert zero_m.returncode == 2 and "expected an integer >= 1" in zero_m.stderr
    unknown = _cli("sweep", "nonesuch", "--lane", "cpu")
    assert unknown.returncode == 2 and "unknown component" in unknown.stderr
    # a new user's finding: both ran no check and ended OK
    empty_checks = _cli("sweep", "mean", "--lane", "cpu", "--checks", "")
    assert empty_checks.returncode == 2 and "--checks" in empty_checks.stderr, empty_checks.stderr
    foreign_check = _cli("sweep", "mean", "--lane", "cpu", "--checks", "tp_degree")
    assert foreign_check.returncode == 2 and "none of them applies to mean" in foreign_check.stderr
    assert "Traceback" not in empty_checks.stderr + foreign_check.stderr


def test_cli_gpu_lane_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = _cli("sweep", "topk", "--lane", "sm90")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_pin_candidate_cases_run_in_one_child_process_and_come_back():
    """The subprocess plumbing of pin candidates: every case comes back as a real row (on the cpu
    lane a cuBLAS recipe is meaningless, but the child must still run the check and report it)."""
    from batchinv.harness.checks import run_checks
    from batchinv.harness.registry import get

    comp = get("matmul")
    candidate = next(b for b in comp.baselines if b.is_pin_candidate)
    cases = list(comp.cases(Lane.CPU))[:2]
    results = run_checks(comp, candidate.name, "repeat", cases, Lane.CPU)
    assert [r.case for r in results] == [c.id for c in cases]
    assert all(r.status == "pass" and r.pin_candidate for r in results), [r.detail for r in results]
