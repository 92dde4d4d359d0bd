"""The harness never passes without checking (issue 7, items 1, 6 and the sweep's execution).

* A negative control passes only by finding different bits: a crashing baseline fails the
  sweep and the pytest negative-control test; one that never varies is inconclusive and fails
  where detection is required; ``--max-m`` cutting the M sweep gives ``not reached``.
* Reports are strict JSON; repro lines are one physical line and carry every option.
* CLI mistakes are usage errors (exit 2) naming the key; commands that cannot run on a lane
  exit 3; Ctrl-C leaves the partial report's path and no traceback.
* Built batches are private copies that keep their layout; the parallel sweep runs every check.
"""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from toy_component import ROWS
from toy_component import crashes as _crashes
from toy_component import m_dependent as _m_dependent
from toy_component import scale as _scale
from toy_component import toy as _toy

from batchinv.harness import build_cache
from batchinv.harness.checks import BaselineCrashed, negative_control, repro_command, run_check
from batchinv.harness.cli import build_parser, main
from batchinv.harness.invariance import VarianceDetected
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Baseline, Batch, Case, Component, get
from batchinv.harness.report import JsonlReport, read_report
from batchinv.harness.sweep import run_sweep


def _varies_only_between_17_and_39_rows(x):
    """Different bits only for 17 <= M < 40: the full 40-row batch is fine, so only a batch
    prefix of 17 or more rows finds it (``--max-m 16`` cannot)."""
    return x * 2.0 + (2.0**-10 if 17 <= x.shape[0] < ROWS else 0.0)


def _nan_row_below_17(x):
    out = x * 2.0
    if x.shape[0] < 17:
        out[0] = float("nan")
    return out


# --- item 1: a negative control passes only by finding variance ------------------------------


def test_a_crashing_baseline_fails_the_sweep_and_says_which_and_why():
    comp = _toy(baselines=[Baseline("crashes", _crashes, "planted"), Baseline("varies", _m_dependent, "M")])
    outcome = run_sweep([comp], Lane.CPU)
    verdicts = {c.baseline: c for c in outcome.controls}
    assert verdicts["crashes"].verdict == "error" and verdicts["crashes"].is_failure
    assert "planted crash" in verdicts["crashes"].detail
    assert "--subject crashes" in verdicts["crashes"].repro
    assert verdicts["varies"].verdict == "detected"
    assert not outcome.ok


def test_a_baseline_that_never_varies_is_inconclusive_and_fails_where_detection_is_required():
    comp = _toy(baselines=[Baseline("pinned_too", _scale, "is invariant")])
    outcome = run_sweep([comp], Lane.CPU)
    (ctrl,) = outcome.controls
    assert ctrl.verdict == "inconclusive" and ctrl.is_failure and not outcome.ok
    relaxed = _toy(baselines=[Baseline("pinned_too", _scale, "invariant", expected_to_vary_on=frozenset())])
    assert run_sweep([relaxed], Lane.CPU).ok  # reported, not required on this lane


def test_negative_control_raises_variance_detected_only_for_variance():
    comp = _toy(baselines=[Baseline("crashes", _crashes, "x"), Baseline("varies", _m_dependent, "M")])
    with pytest.raises(VarianceDetected, match="varies in batch_prefix"):
        negative_control(comp, "varies", Lane.CPU)
    with pytest.raises(BaselineCrashed, match="planted crash") as info:
        negative_control(comp, "crashes", Lane.CPU)
    assert not isinstance(info.value, VarianceDetected)
    assert (
        len(negative_control(_toy(baselines=[Baseline("same", _scale, "x")]), "same", Lane.CPU)) == 2 * 5
    )  # 2 cases x (batch_prefix, position, repeat, neighbours, cross_process: a skip for the toy)


def test_pytest_negative_controls_fail_on_a_crash_and_on_no_variance(tmp_path):
    """The strict xfail of tests/components/test_components.py, on planted baselines, in a real pytest run."""
    (tmp_path / "test_planted.py").write_text(
        textwrap.dedent(
            """
            import pytest, torch
            from batchinv.harness.checks import negative_control
            from batchinv.harness.invariance import VarianceDetected
            from batchinv.harness.lanes import Lane
            from batchinv.harness.registry import Baseline, Batch, Case, Component

            def build(case, device):
                g = torch.Generator().manual_seed(case.seed)
                return Batch({"x": torch.randn(40, 8, generator=g)})

            def crashes(x):
                raise RuntimeError("planted crash")

            def varies(x):
                return x * 2.0 + (0.0 if x.shape[0] >= 17 else 2.0**-10)

            TOY = Component(
                name="toy", summary="", reference=lambda x: x * 2.0, fast=lambda x: x * 2.0,
                baselines=(Baseline("crashes", crashes, ""), Baseline("never_varies", lambda x: x * 2.0, ""),
                           Baseline("varies", varies, "")),
                cases=lambda lane: [Case("toy", {}, 0)], build=build,
            )

            @pytest.mark.xfail(strict=True, raises=VarianceDetected)
            @pytest.mark.parametrize("name", ["crashes", "never_varies", "varies"])
            def test_control(name):
                negative_control(TOY, name, Lane.CPU)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "test_planted.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    out = proc.stdout
    assert "FAILED test_planted.py::test_control[crashes]" in out, out
    assert "planted crash" in out
    assert "FAILED test_planted.py::test_control[never_varies]" in out and "XPASS(strict)" in out, out
    assert "XFAIL test_planted.py::test_control[varies]" in out, out
    assert proc.returncode == 1


def test_max_m_below_what_a_control_needs_is_not_reached_and_not_a_failure():
    comp = _toy(baselines=[Baseline("late", _varies_only_between_17_and_39_rows, "needs M >= 17")])
    assert run_sweep([comp], Lane.CPU).controls[0].verdict == "detected"
    cut = run_sweep([comp], Lane.CPU, m_limit=16)
    assert cut.controls[0].verdict == "not reached (--max-m 16)"
    assert not cut.controls[0].is_failure and cut.ok


# --- item 6: reports and repro lines ---------------------------------------------------------


def _refuse_non_finite(token: str) -> float:
    raise ValueError(f"non-finite JSON constant {token}")


def test_report_rows_are_strict_json_even_with_non_finite_figures(tmp_path):
    comp = _toy(fast=_nan_row_below_17, baselines=[Baseline("varies", _m_dependent, "M")])
    path = tmp_path / "r.jsonl"
    with JsonlReport(path) as report:
        report.write("header", {"lane": "cpu", "odd": math.nan, "big": math.inf})
        outcome = run_sweep([comp], Lane.CPU, on_result=report.check)
        report.write("summary", outcome.summary())
    assert not outcome.ok
    lines = path.read_text().splitlines()
    records = [json.loads(line, parse_constant=_refuse_non_finite) for line in lines]
    infs = [r for r in records if r.get("worst_ulp") == "inf"]
    assert infs, "the planted NaN row must give a non-finite worst ULP, written as a string"
    assert records[-1]["kind"] == "summary" and records[-1]["ok"] is False
    assert records[0]["odd"] == "nan" and records[0]["big"] == "inf"
    assert read_report(path) == records


def test_a_failing_exact_check_names_rows_and_the_first_differing_index():
    comp = _toy(fast=_m_dependent)
    outcome = run_sweep([comp], Lane.CPU, include_baselines=False)
    prefix = next(c for c in outcome.checks if c.check == "batch_prefix")
    assert prefix.status == "fail" and prefix.rows_differing > 0
    assert prefix.first_difference.startswith("M=1: (row 0, col 0)")


def test_repro_lines_carry_max_m_and_lane_and_parse_as_one_command():
    case = Case("topk", {"num_rows": 3, "rows": "mixed", "shape": [3, 7]}, seed=4)
    line = repro_command("topk", "fast", "batch_prefix", case, Lane.CPU, m_limit=16)
    assert "\n" not in line and "--max-m 16" in line and "--lane cpu" in line
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert (args.max_m, args.lane, args.seed, json.loads(args.axes)) == (16, "cpu", 4, dict(case.axes))


def test_printed_repro_lines_stay_on_one_physical_line_in_a_narrow_terminal():
    from rich.console import Console

    from batchinv.harness.sweep_table import print_outcome

    comp = _toy(fast=_m_dependent, baselines=[Baseline("varies", _m_dependent, "M")])
    outcome = run_sweep([comp], Lane.CPU, m_limit=33)
    buffer = io.StringIO()
    console = Console(file=buffer, width=40, force_terminal=False)
    assert print_outcome(console, outcome, Lane.CPU, {"device": "cpu"}, Path("r.jsonl")) == 1
    repro_lines = [ln for ln in buffer.getvalue().splitlines() if "batchinv repro" in ln]
    assert repro_lines
    for ln in repro_lines:
        assert ln.rstrip().endswith("'") and "--max-m 33" in ln and '{"cols":8,"rows":40}' in ln


# --- item 6: CLI errors ------------------------------------------------------------------------

#: The lane of this run: the CLI tests below pass it (a GPU run cannot switch to the cpu lane once
#: triton is imported; the usage errors come before anything runs on either).
LANE = current_lane().value

TOPK_AXES = {
    "bounds": "int32",
    "k": 512,
    "layout": "contiguous",
    "num_cols": 700,
    "num_rows": 3,
    "rows": "mixed",
}


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "check", "message"),
    [
        ({}, "no_such_check", r"--check: expected one of .*'no_such_check'"),
        ({}, "partition", r"--check: 'partition' does not apply to topk"),
        ({"colour": 3}, "agreement", r"--axes: unknown key\(s\) \['colour'\]"),
        ({"k": None}, "agreement", r"--axes: missing key\(s\) \['k'\]"),
        ({"num_rows": "3"}, "agreement", r"--axes: key 'num_rows' expects int, got str '3'"),
        ({"rows": "plaid"}, "agreement", r"--axes: key 'rows' expects one of \[.*'mixed'.*\], got 'plaid'"),
        ({"bounds": "int16"}, "agreement", r"--axes: key 'bounds' expects one of \['int32', 'int64'\]"),
        ({"num_rows": -2}, "agreement", r"--axes: key 'num_rows' expects a value > 0, got -2"),
        ({"k": 0}, "agreement", r"--axes: key 'k' expects a value > 0, got 0"),
    ],
)
def test_repro_mistakes_are_usage_errors_naming_the_key(capsys, change, check, message):
    import re

    axes = {k: v for k, v in {**TOPK_AXES, **change}.items() if v is not None}
    code, err = _cli(
        capsys, "repro", "topk", "--lane", LANE, "--check", check, "--seed", "0", "--axes", json.dumps(axes)
    )
    assert code == 2, err
    assert re.search(message, err), err


def test_other_cli_mistakes_are_usage_errors(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, err = _cli(capsys, "sweep", "topk", "--lane", LANE, "--report", str(blocker / "r.jsonl"))
    assert code == 2 and "--report: cannot write" in err
    code, err = _cli(capsys, "sweep", "topk", "--lane", LANE, "--jobs", "0")
    assert code == 2 and "--jobs" in err
    code, err = _cli(
        capsys,
        "repro",
        "topk",
        "--lane",
        LANE,
        "--check",
        "agreement",
        "--subject",
        "nope",
        "--seed",
        "0",
        "--axes",
        json.dumps(TOPK_AXES),
    )
    assert code == 2 and "--subject" in err
    code, err = _cli(capsys, "bench", "no_such_component", "--lane", LANE)
    assert code == 2 and "no_such_component" in err
    with pytest.raises(SystemExit) as info:
        main(["bench", "--lane", LANE, "--reps", "0"])
    assert info.value.code == 2


@pytest.mark.cpu
def test_bench_and_audit_say_they_cannot_run_on_the_cpu_lane(capsys):
    code, err = _cli(capsys, "bench", "--lane", LANE)
    assert code == 3 and "needs a GPU lane" in err
    code, err = _cli(capsys, "audit", "cublas", "--lane", LANE)
    assert code == 3 and "needs a GPU lane" in err


def _interruptible() -> None:
    """In the child before it execs: SIGINT to its default action.  A process started in the
    background by a shell without job control (``cmd &`` in a script) ignores SIGINT, its
    children inherit that, and Python installs its Ctrl-C handler only where SIGINT is not
    ignored at start: the sweep under test would take a terminal's Ctrl-C for nothing and end OK."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sweep_process(component: str, report: Path, *, new_session: bool = False) -> subprocess.Popen[str]:
    """``batchinv sweep COMPONENT --lane cpu --jobs 2`` in a child process, its output piped,
    Ctrl-C at its default whatever this process inherited (:func:`_interruptible`)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchinv.harness.cli",
            "sweep",
            component,
            "--lane",
            "cpu",
            "--no-progress",
            "--profile",
            "full",
            "--jobs",
            "2",
            "--report",
            str(report),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=new_session,
        preexec_fn=_interruptible,
    )


@pytest.mark.cpu
def test_ctrl_c_leaves_the_partial_report_path_and_no_traceback(tmp_path):
    report = tmp_path / "partial.jsonl"
    proc = _sweep_process("topk", report, new_session=False)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if report.exists() and len(report.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert str(report) in err
    assert read_report(report)[0]["kind"] == "header"


# --- item 8: built batches and the parallel sweep ---------------------------------------------


def test_built_batches_are_private_copies_that_keep_layout_and_hidden_bytes():
    def build(case, device):
        buffer = torch.full((4, 10), float("nan"))
        buffer[:, :6] = torch.arange(24.0).view(4, 6)
        return Batch({"x": buffer[:, :6]}, {"w": torch.ones(3)})

    comp = Component("cached_toy", "", _scale, _scale, (), lambda lane: [], build)
    case = Case("cached_toy", {"rows": 4}, 0)
    build_cache.clear()
    first = build_cache.built(comp, case, torch.device("cpu"))
    x = first.rows["x"]
    assert x.stride() == (10, 1) and torch.isnan(torch.as_strided(x, (4, 10), (10, 1))[:, 6:]).all()
    x.mul_(-1)
    first.shared["w"].zero_()
    second = build_cache.built(comp, case, torch.device("cpu"))
    assert torch.equal(second.rows["x"], torch.arange(24.0).view(4, 6))
    assert torch.equal(second.shared["w"], torch.ones(3))
    assert second.rows["x"].data_ptr() != x.data_ptr()


@pytest.mark.cpu
def test_the_parallel_sweep_runs_every_check_and_gets_the_verdicts():
    comp = get("mean")
    outcome = run_sweep([comp], Lane.CPU, jobs=2)
    assert outcome.ok and outcome.jobs == 2
    cases = len(comp.cases(Lane.CPU))
    assert all(c.cases + c.skipped == cases for c in outcome.checks)
    assert {c.baseline: c.verdict for c in outcome.controls if c.expected_to_vary} == {
        "triton_rows_heuristic": "detected",
        "autotune_hash_ties": "detected",  # by cross_process, from a worker at seed 2 with one child
    }
    with pytest.raises(ValueError, match="registered components only"):
        run_sweep([_toy()], Lane.CPU, jobs=2)


# --- review findings: contract violations are errors, vacuous checks are not passes ----------


def _writes_into_input(x):
    x.zero_()
    return torch.zeros_like(x)


def _baseline_writes_into_input(x):
    x.mul_(2.0)
    return x * 1.0


def _extra_row(x):
    return torch.cat([x * 2.0, torch.zeros_like(x[:1])])


def _output_count_depends_on_m(x):
    return (x * 2.0, x * 3.0) if x.shape[0] == 1 else x * 2.0


def test_a_subject_writing_into_its_inputs_is_an_error_never_agreement_or_variance():
    outcome = run_sweep(
        [_toy(fast=_writes_into_input, baselines=[Baseline("mutates", _baseline_writes_into_input, "x")])],
        Lane.CPU,
    )
    agreement = next(c for c in outcome.checks if c.check == "agreement")
    assert agreement.status == "error"
    assert "wrote into its input 'x'" in outcome.failures[0].detail
    (ctrl,) = outcome.controls
    assert ctrl.verdict == "error" and "wrote into its input" in ctrl.detail


@pytest.mark.parametrize("fn", [_extra_row, _output_count_depends_on_m])
def test_another_shape_or_output_count_is_an_error_not_a_detection(fn):
    with pytest.raises(BaselineCrashed, match="ContractViolation"):
        negative_control(_toy(baselines=[Baseline("odd", fn, "x")]), "odd", Lane.CPU)


def _toy_rows(rows: int, **kw):
    comp = _toy(**kw)
    return Component(
        **{**comp.__dict__, "cases": lambda lane: [Case("toy", {"rows": rows, "cols": 8}, seed=0)]}
    )


def test_checks_that_compare_nothing_are_skipped_not_passed():
    empty = run_sweep([_toy_rows(0)], Lane.CPU, include_baselines=False)
    assert {c.check: c.status for c in empty.checks} == dict.fromkeys(
        ("agreement", "batch_prefix", "position", "repeat", "neighbours", "cross_process"), "skip"
    )
    one = {c.check: c.status for c in run_sweep([_toy_rows(1)], Lane.CPU, include_baselines=False).checks}
    # batch_prefix cycles the first case's row to 2..8 rows (the row-threshold sweep): it compares
    # neighbours: a one-row case has no other row whose contents could change
    # cross_process: the toy is not a registered component, so no fresh process can rebuild it
    assert one == {
        "agreement": "pass", "batch_prefix": "pass", "position": "skip", "repeat": "pass", "neighbours": "skip",
        "cross_process": "skip",
    }  # fmt: skip
    # a one-row case further down the list has no M below its rows: nothing to compare
    comp = _toy_rows(1)
    two_cases = Component(
        **{**comp.__dict__, "cases": lambda lane: [Case("toy", {"rows": 4, "cols": 8}, 0), *comp.cases(lane)]}
    )
    later = run_check(two_cases, "fast", "batch_prefix", two_cases.cases(Lane.CPU)[1], Lane.CPU)
    assert later.status == "skip", later.detail


def test_max_m_that_cuts_nothing_the_cases_could_run_leaves_the_verdict_inconclusive():
    comp = _toy(baselines=[Baseline("pinned_too", _scale, "invariant")])
    assert run_sweep([comp], Lane.CPU, m_limit=512).controls[0].verdict == "inconclusive"
    assert not run_sweep([comp], Lane.CPU, m_limit=512).ok
    assert run_sweep([comp], Lane.CPU, m_limit=16).controls[0].verdict == "not reached (--max-m 16)"


def test_a_refused_sweep_leaves_an_existing_report_alone(capsys, tmp_path):
    precious = tmp_path / "precious.jsonl"
    precious.write_text("keep me\n")
    code, err = _cli(capsys, "sweep", "mean", "--lane", LANE, "--report", str(precious), "--jobs", "0")
    assert code == 2 and precious.read_text() == "keep me\n"
    code, err = _cli(capsys, "sweep", "mean", "--lane", LANE, "--jobs", str(2**31))
    assert code == 2 and "--jobs" in err


@pytest.mark.parametrize(
    ("axes_text", "message"),
    [
        ('{"k": 512, "k": 1024}', r"duplicate key\(s\) \['k'\]"),
        (json.dumps({**TOPK_AXES, "num_cols": 7.5}), r"key 'num_cols' expects int, got float"),
    ],
)
def test_more_axes_mistakes_are_usage_errors(capsys, axes_text, message):
    import re

    code, err = _cli(
        capsys, "repro", "topk", "--lane", LANE, "--check", "agreement", "--seed", "0", "--axes", axes_text
    )
    assert code == 2 and re.search(message, err), err


def test_list_items_and_seeds_are_checked(capsys):
    axes = {
        "dtype": "float32",
        "keepdim": False,
        "layout": "contiguous",
        "out_dtype": None,
        "shape": [40, True],
        "values": "normal",
    }
    code, err = _cli(
        capsys,
        "repro",
        "mean",
        "--lane",
        LANE,
        "--check",
        "agreement",
        "--seed",
        "0",
        "--axes",
        json.dumps(axes),
    )
    assert code == 2 and "expects items of int" in err, err
    with pytest.raises(SystemExit) as info:
        main(["repro", "mean", "--lane", LANE, "--check", "agreement", "--seed", str(2**64), "--axes", "{}"])
    assert info.value.code == 2


@pytest.mark.cpu
def test_ctrl_c_to_the_whole_process_group_during_worker_start_up_prints_no_traceback(tmp_path):
    """As a terminal delivers it: SIGINT to every process of the group, while workers import."""
    report = tmp_path / "early.jsonl"
    proc = _sweep_process("mean", report, new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (report.exists() and report.read_text()):
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err + out and "Exception in thread" not in err, err
    assert str(report) in err


def test_the_sweep_table_has_a_header_for_every_column():
    from rich.console import Console

    from batchinv.harness.sweep_table import print_outcome

    outcome = run_sweep([_toy(fast=_m_dependent)], Lane.CPU, include_baselines=False)
    buffer = io.StringIO()
    print_outcome(Console(file=buffer, width=300), outcome, Lane.CPU, {"device": "cpu"}, Path("r.jsonl"))
    lines = buffer.getvalue().splitlines()
    header = next(ln for ln in lines if "check" in ln and "notes" in ln)
    row = next(ln for ln in lines if "batch_prefix" in ln)
    assert header.split() == ["check", "result", "cases", "s", "notes"]
    # the notes name what differed: rows, worst ULP, the first difference
    assert "rows differ" in row and "ULP" in row and "first difference" in row
