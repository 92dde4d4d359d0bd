"""Launch provenance: what each subject call ran, in the report, in failure messages, and the
``config_equivalence`` verdict on an execution no run proved.

The capture (``harness/provenance.py``) wraps Triton's launch method once, so a kernel is
recorded wherever it comes from: a kernel defined here, our launchers, an outside subject's
module.  On the cpu lane every launch goes through the interpreter's ``InterpretedFunction``.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from batchinv.fast import matmul as fast_matmul
from batchinv.harness import invariance, provenance
from batchinv.harness.checks import FAST, REPLAYED_CHECKS, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, Case, get
from batchinv.harness.testing import as_subject

pytestmark = pytest.mark.cpu


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)


def _scale(x: torch.Tensor, factor: float, block: int = 16) -> torch.Tensor:
    y = torch.zeros_like(x)
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n, factor, BLOCK=block, num_warps=2)
    return y


def test_the_interpreter_runs_the_kernels_here():
    assert type(scale_kernel).__name__ == "InterpretedFunction"


def test_a_launch_is_recorded_with_its_constexprs_options_and_grid():
    x = torch.arange(40.0)
    with provenance.recording() as rec:
        y = _scale(x, 2.0)
    assert torch.equal(y, x * 2.0)
    (launch,) = rec.calls().launches
    # FACTOR passed by position, BLOCK by keyword; num_warps is a launch option
    assert launch.kernel == "scale_kernel" and launch.module == __name__
    assert launch.constexprs == (("FACTOR", 2.0), ("BLOCK", 16), ("num_warps", 2))
    assert launch.grid == (3,)  # the callable grid, evaluated with the launch's constexprs
    assert launch.key == ("scale_kernel", launch.constexprs)


def test_nothing_is_recorded_outside_a_recording_and_nested_ones_share_the_log():
    x = torch.arange(8.0)
    _scale(x, 1.0)  # no recording: nothing to keep, the kernel still runs
    with provenance.recording() as outer:
        _scale(x, 1.0)
        with provenance.recording() as inner:
            _scale(x, 3.0, block=8)
    assert [dict(la.constexprs)["FACTOR"] for la in inner.calls().launches] == [3.0]
    assert [dict(la.constexprs)["FACTOR"] for la in outer.calls().launches] == [1.0, 3.0]


def test_a_dry_recording_records_the_launch_and_runs_nothing():
    x = torch.arange(8.0) + 1
    with provenance.recording(dry=True) as rec:
        y = _scale(x, 5.0)
    assert torch.equal(y, torch.zeros_like(x))  # the kernel never wrote it
    assert [la.kernel for la in rec.calls().launches] == ["scale_kernel"]


def test_the_launcher_names_the_execution_its_table_picked():
    """The matmul launcher picks its execution by M from its frozen table (``select_by_m``
    notes it): split-K at M <= 16 under the interpreter, a walk above; its chunk-sum kernel, in
    the same kernel module, carries the name too.  Dry: no kernel runs."""
    comp = get("matmul")
    batch = comp.build(comp.cases(Lane.CPU)[0], torch.device("cpu"))
    x = batch.rows["x"]
    kwargs = {k: v for k, v in batch.kwargs().items() if k != "x"}
    with provenance.recording(dry=True) as small:
        fast_matmul.matmul(x[:1], **kwargs)
    with provenance.recording(dry=True) as large:
        fast_matmul.matmul(x, **kwargs)
    split = small.calls().launches
    assert [la.kernel for la in split] == ["chunked_matmul_kernel", "chunk_sum_kernel"]
    assert all(la.execution is not None and la.execution.endswith("split") for la in split)
    assert dict(split[0].constexprs)["SPLIT_K"] is True
    (walk,) = large.calls().launches
    assert dict(walk.constexprs)["SPLIT_K"] is False and "split" not in (walk.execution or "")
    text = small.calls().describe(large.calls())
    assert "SPLIT_K=True" in text and "BLOCK_M=16" in text


def _factor_by_m(b: Batch) -> tuple[torch.Tensor, ...]:
    """A planted subject: one Triton kernel whose FACTOR constexpr follows M (3 from 4 rows)."""
    x = b.rows["x"]
    return (_scale(x.reshape(-1), 2.0 if x.shape[0] < 4 else 3.0).reshape(x.shape),)


def test_a_failure_message_names_what_each_side_ran():
    batch = Batch({"x": torch.arange(24.0).reshape(8, 3) + 1})
    out = invariance.batch_prefix(_factor_by_m, batch, [1, 2, 7])
    assert not out.passed
    assert (
        "in the launch of 8 rows ran scale_kernel FACTOR=3.0; in a launch of 1 ran scale_kernel FACTOR=2.0"
        in (out.detail)
    ), out.detail
    assert out.first is not None and "FACTOR=2.0" in out.first["launched"]
    # the row's launches: each execution with the sweep points that ran it
    rows = {row["constexprs"]["FACTOR"]: row for row in out.launches.to_json()}
    assert rows[2.0]["at"] == ["M=1", "M=2"] and rows[3.0]["at"] == ["in the launch of 8 rows", "M=7"]


def test_a_failure_where_both_sides_ran_the_same_execution_says_so():
    def noisy(b: Batch) -> tuple[torch.Tensor, ...]:  # the same launch; bits moved afterwards
        x = b.rows["x"]
        y = _scale(x.reshape(-1), 2.0).reshape(x.shape)
        return (y + (1e-3 if x.shape[0] < 4 else 0.0),)

    out = invariance.batch_prefix(noisy, Batch({"x": torch.ones(8, 3)}), [1])
    assert not out.passed and "both ran scale_kernel (runtime arguments differ: n 24 / 3" in out.detail, (
        out.detail
    )
    assert "scale_kernel grid (2,) / (1,)" in out.detail  # what follows M, named, not an execution


def test_a_call_with_no_triton_launch_says_so():
    batch = Batch({"x": torch.ones(8, 3)})
    out = invariance.batch_prefix(lambda b: (b.rows["x"] * (2.0 if b.num_rows < 4 else 3.0),), batch, [1])
    assert not out.passed and "both ran no Triton kernel (torch operators" in out.detail, out.detail
    assert "the BLAS algorithm is not exposed" in out.detail


def test_the_report_row_carries_the_launches_by_sweep_point():
    comp = get("matmul")
    case = comp.cases(Lane.CPU)[1]
    r = run_check(comp, FAST, "batch_prefix", case, Lane.CPU, m_limit=17)
    assert r.status == "pass", r.detail
    rows = json.loads(r.to_json())["launches"]
    main = [row for row in rows if row.get("kernel") == "chunked_matmul_kernel"]
    split = [row for row in main if row["constexprs"]["SPLIT_K"]]
    walk = [row for row in main if not row["constexprs"]["SPLIT_K"]]
    assert split and walk, rows
    # fp32 on the cpu lane: two-row split tiles at M <= 2, 16-row ones to M = 16, a walk above
    assert all(row["execution"].endswith("split") for row in split), split
    assert "M=1" in split[0]["at"] and split[0]["constexprs"]["BLOCK_M"] == 2, split
    assert any("M=16" in row["at"] for row in split[1:]), split
    assert any(label.startswith("M=17") or "rows" in label for row in walk for label in row["at"])


def test_agreement_names_what_fast_ran():
    comp = get("matmul")
    r = run_check(comp, FAST, "agreement", comp.cases(Lane.CPU)[1], Lane.CPU)
    assert r.status == "pass" and r.launches and r.launches[0]["at"] == ["agreement"]


def test_config_equivalence_fails_loudly_on_an_execution_it_never_proved():
    """The mutant ``matmul_untabled_execution_at_7_rows`` runs, at M = 7, a split tile the
    table does not hold: the same bits (batch_prefix passes), yet config_equivalence fails,
    naming the execution and the sweep point; the shipped launcher passes it."""
    from mutants.kernels import UNTABLED_EXECUTION, matmul_untabled_execution_at_7_rows

    comp = get("matmul")
    case = comp.cases(Lane.CPU)[1]
    assert "batch_prefix" in REPLAYED_CHECKS
    shipped = run_check(comp, FAST, "config_equivalence", case, Lane.CPU)
    assert shipped.status == "pass", shipped.detail
    from dataclasses import replace

    mutated = replace(comp, fast=matmul_untabled_execution_at_7_rows())
    same_bits = run_check(mutated, FAST, "batch_prefix", case, Lane.CPU, m_limit=17)
    assert same_bits.status == "pass", same_bits.detail
    caught = run_check(mutated, FAST, "config_equivalence", case, Lane.CPU)
    assert caught.status == "fail" and "unproved execution" in caught.where, caught.detail
    assert "config_equivalence never proved" in caught.detail
    assert f"BLOCK_M={UNTABLED_EXECUTION.block_m} BLOCK_N={UNTABLED_EXECUTION.block_n}" in caught.detail
    assert "batch_prefix M=7" in caught.detail, caught.detail


OUTSIDE = """
import torch
import triton
import triton.language as tl


@triton.jit
def outside_mean_kernel(x_ptr, y_ptr, n, stride, BLOCK_N: tl.constexpr, FP64: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride + offs, mask=offs < n, other=0.0)
    if FP64:
        total = tl.sum(x.to(tl.float64), axis=0).to(tl.float32)
    else:
        total = tl.sum(x, axis=0)
    tl.store(y_ptr + row, total / n)


def _mean(x, fp64):
    y = torch.empty(x.shape[0], dtype=x.dtype)
    outside_mean_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK_N=64, FP64=fp64)
    return y


def steady(x, dim=-1, keepdim=False, dtype=None):
    return _mean(x, False)


def varies(x, dim=-1, keepdim=False, dtype=None):
    return _mean(x, x.shape[0] <= 8)
"""


@pytest.fixture
def outside(tmp_path, monkeypatch):
    (tmp_path / "outside_provenance_subject.py").write_text(textwrap.dedent(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("outside_provenance_subject")
    yield module
    sys.modules.pop("outside_provenance_subject", None)


def test_an_outside_subjects_triton_launches_are_recorded_as_ours(outside):
    comp = get("mean")
    case = Case("mean", {"shape": [12, 64], "dtype": "float32", "values": "normal"}, 3)
    steady = run_check(comp, as_subject(comp, outside.steady, name="steady"), "batch_prefix", case, Lane.CPU)
    assert steady.status == "pass", steady.detail
    (row,) = steady.launches
    assert row["kernel"] == "outside_mean_kernel" and row["constexprs"] == {"BLOCK_N": 64, "FP64": False}
    varies = run_check(comp, as_subject(comp, outside.varies, name="varies"), "batch_prefix", case, Lane.CPU)
    assert varies.status == "fail", varies.detail
    assert "in the launch of 12 rows ran outside_mean_kernel FP64=False" in varies.detail, varies.detail
    assert "ran outside_mean_kernel FP64=True" in varies.detail


def test_the_cli_shows_launches_in_list_and_repro(capsys):
    from batchinv.harness.cli import main

    assert main(["list", "matmul", "--lane", "cpu", "--launches", "--no-entry-points"]) == 0
    listed = capsys.readouterr().out
    assert "fast launches (first case)" in listed and "chunked_matmul_kernel" in listed, listed
    comp = get("matmul")
    case = comp.cases(Lane.CPU)[1]
    argv = ["repro", "matmul", "--check", "agreement", "--lane", "cpu", "--seed", str(case.seed)]
    assert main([*argv, "--axes", case.axes_json()]) == 0
    shown = capsys.readouterr().out
    assert "launched:" in shown and "chunked_matmul_kernel" in shown and "(1 call: agreement)" in shown, shown


def test_the_html_report_folds_each_cases_launches():
    from batchinv.harness import html_report

    row = {
        "status": "pass",
        "case": "c",
        "launches": [
            {
                "kernel": "k",
                "execution": "16x64 split",
                "constexprs": {"BLOCK_M": 16},
                "calls": 2,
                "at": ["M=1"],
            },
            {"note": provenance.REFERENCE, "calls": 1, "at": ["M=2"]},
        ],
    }
    page = html_report._case_block(row)
    assert "launched: 2 execution(s)" in page and "k [16x64 split] BLOCK_M=16 (2 calls: M=1)" in page


def test_the_report_keeps_at_most_max_executions_and_the_verdicts_see_them_all():
    tally = provenance.Tally()
    for i in range(provenance.MAX_EXECUTIONS + 3):
        launch = provenance.Launch("k", "m", (("BLOCK", i),))
        tally.add(provenance.CallLaunches((launch,)), f"M={i}")
    rows = tally.to_json()
    assert len(rows) == provenance.MAX_EXECUTIONS + 1 and rows[-1] == {"more": 3}
    assert len(tally.executions()) == provenance.MAX_EXECUTIONS + 3
    assert provenance.lines(rows)[-1] == "... 3 more"
