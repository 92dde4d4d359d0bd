"""The judge does not trust the subject's process (issue 25, section 1).

A subject runs in the judge's process (or a sweep worker that also computes references), so:

* a subject that turns on flush-to-zero (``torch.set_flush_denormal(True)``, what an extension
  built with ``-ffast-math`` does) is an error naming the change, never a pass, and the state is
  back afterwards; a flush-to-zero already on when the check starts does not reach the judge;
* a subject that replaces the component's reference (or its registry entry) neither passes nor
  poisons a later, correct subject in the same process;
* a subject call past its time limit is a ``timeout`` row naming the case, and the run goes on
  (in-process: ``check_subject(timeout=...)``; in a sweep's worker processes: the parent kills a
  worker whose call does not return, and a worker that segfaults is an ``error`` row naming the
  check and the signal; the other units run and the summary is written);
* ``check_subject`` with an unknown component or a non-callable subject raises a typed error up
  front.

Cost on the cpu lane: the in-process tests run ``mean``'s agreement check (its six cheap cases,
an fp64 torch subject) a few times, about 3 s; the sweep test starts worker processes (two, and
two replacements), about 15 s on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from batchinv.harness import check_subject
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get
from batchinv.reference.errors import ArgumentError
from batchinv.reference.mean import mean as exact_mean

pytestmark = pytest.mark.cpu

COMPONENT = "mean"


def _flushes() -> bool:
    """Whether this thread flushes a subnormal fp32 operand (the judge's probe, re-done here)."""
    tiny = torch.tensor(1.401298464324817e-45, dtype=torch.float32)
    return bool(tiny * torch.ones(()) == 0)


def good(x, dim=-1, keepdim=False, dtype=None):
    """A correct mean: the exact mean rounded once to the output dtype."""
    return exact_mean(x, dim, keepdim, dtype).to(dtype or x.dtype)


def flushing(x, dim=-1, keepdim=False, dtype=None):
    """A mean that flushes subnormal inputs to zero (a kernel built with -ffast-math)."""
    x = torch.where(x.abs() < torch.finfo(x.dtype).tiny, torch.zeros_like(x), x)
    return good(x, dim, keepdim, dtype)


def flushing_and_setting_ftz(x, dim=-1, keepdim=False, dtype=None):
    torch.set_flush_denormal(True)
    return flushing(x, dim, keepdim, dtype)


@pytest.fixture
def judge_fp_restored():
    yield
    torch.set_flush_denormal(False)


def test_subject_that_sets_flush_to_zero_is_an_error_and_the_state_is_restored(judge_fp_restored):
    report = check_subject(COMPONENT, flushing_and_setting_ftz, lane="cpu", checks=["agreement"])
    statuses = {r.status for r in report.results}
    assert "pass" not in statuses and not report.ok, report.summary()
    assert statuses == {"error"}, report.summary()
    assert all("denormals-are-zero False -> True" in r.detail for r in report.results), report.summary()
    assert not _flushes()  # the judge's thread is back to its own state


def lowering_matmul_precision(x, dim=-1, keepdim=False, dtype=None):
    torch.set_float32_matmul_precision("medium")
    return good(x, dim, keepdim, dtype)


def test_subject_that_changes_a_global_torch_setting_is_an_error_and_it_is_restored():
    before = torch.get_float32_matmul_precision()
    try:
        report = check_subject(COMPONENT, lowering_matmul_precision, lane="cpu", checks=["agreement"])
        assert {r.status for r in report.results} == {"error"}, report.summary()
        assert all("float32 matmul precision" in r.detail for r in report.results), report.summary()
        assert torch.get_float32_matmul_precision() == before
    finally:
        torch.set_float32_matmul_precision(before)


def test_flush_to_zero_on_before_the_check_does_not_reach_the_judge(judge_fp_restored):
    """An extension that set flush-to-zero on import: the reference and the comparator still run
    without it, so a subject that flushes subnormal inputs fails agreement (as it does without)."""
    plain = check_subject(COMPONENT, flushing, lane="cpu", checks=["agreement"])
    assert any(r.status == "fail" for r in plain.results), plain.summary()  # the teeth
    torch.set_flush_denormal(True)
    report = check_subject(COMPONENT, flushing, lane="cpu", checks=["agreement"])
    assert [r.status for r in report.results] == [r.status for r in plain.results], report.summary()
    assert _flushes()  # the caller's state is its own again after the check


def _bad(x, dim=-1, keepdim=False, dtype=None):
    return torch.zeros_like(good(x, dim, keepdim, dtype))


def _replace_reference(x, dim=-1, keepdim=False, dtype=None):
    object.__setattr__(get(COMPONENT), "reference", _bad)
    return _bad(x, dim, keepdim, dtype)


def _replace_registry_entry(x, dim=-1, keepdim=False, dtype=None):
    from dataclasses import replace

    from batchinv.harness import registry

    registry._CACHE[COMPONENT] = replace(registry._CACHE[COMPONENT], reference=_bad)
    return _bad(x, dim, keepdim, dtype)


@pytest.mark.parametrize(
    "tamper", [_replace_reference, _replace_registry_entry], ids=["reference", "registry"]
)
def test_subject_replacing_the_reference_neither_passes_nor_poisons_the_next(tamper):
    from batchinv.harness import registry

    component = get(COMPONENT)
    reference = component.reference
    try:
        report = check_subject(COMPONENT, tamper, lane="cpu", checks=["agreement"])
        assert not any(r.status == "pass" for r in report.results), report.summary()
        assert all(r.status == "error" and "replaced" in r.detail for r in report.results), report.summary()
        assert get(COMPONENT) is component and component.reference is reference
        after = check_subject(COMPONENT, good, lane="cpu", checks=["agreement"])
        assert after.ok and {r.status for r in after.results} == {"pass"}, after.summary()
    finally:  # never leave the registry poisoned for other tests of this worker
        object.__setattr__(component, "reference", reference)
        registry._CACHE[COMPONENT] = component


def _hangs_once(swallow: bool):
    calls = []

    def subject(x, dim=-1, keepdim=False, dtype=None):
        calls.append(1)
        if len(calls) == 1:
            import time

            try:
                time.sleep(60)
            except BaseException:
                if not swallow:
                    raise
                time.sleep(60)  # a subject that swallows the first interruption
        return good(x, dim, keepdim, dtype)

    return subject


@pytest.mark.parametrize("swallow", [False, True], ids=["plain", "swallows-the-first"])
def test_a_hung_call_is_a_timeout_row_and_the_run_goes_on(swallow):
    report = check_subject(
        COMPONENT, _hangs_once(swallow), lane="cpu", checks=["agreement"], timeout=0.5, name="hangs"
    )
    statuses = [r.status for r in report.results]
    assert statuses[0] == "timeout" and "0.5 s" in report.results[0].detail, report.summary()
    assert statuses[1:] == ["pass"] * (len(statuses) - 1), report.summary()
    assert not report.ok and report.results[0] in report.failures
    assert report.results[0].case == get(COMPONENT).cases(report.lane)[0].id


def test_check_subject_refuses_an_unknown_component_and_a_non_callable_up_front():
    with pytest.raises(ArgumentError) as info:
        check_subject("nope", good, lane="cpu")
    assert "'nope'" in str(info.value) and "mean" in str(info.value)
    assert isinstance(info.value, KeyError)  # what the lookup raised before it had a type
    from batchinv.harness.subjects import SubjectError

    with pytest.raises(SubjectError, match="callable"):
        check_subject(COMPONENT, 5, lane="cpu")


SUBJECTS = '''
import os, signal, time
from pathlib import Path

from batchinv.reference.mean import mean as exact_mean

MARKS = Path(os.environ["ISOLATION_MARKS"])


def _once(name):
    mark = MARKS / name
    if mark.exists():
        return False
    mark.write_text("1")
    return True


def unruly(x, dim=-1, keepdim=False, dtype=None):
    """Segfaults once on the 40x1000 case, hangs once (past every interruption) on the 12x257 one."""
    if tuple(x.shape) == (40, 1000) and _once("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if tuple(x.shape) == (12, 257) and _once("hang"):
        while True:
            try:
                time.sleep(100)
            except BaseException:
                pass
    return exact_mean(x, dim, keepdim, dtype).to(dtype or x.dtype)
'''


def test_sweep_workers_survive_a_segfault_and_a_hang(tmp_path: Path):
    (tmp_path / "unruly_subjects.py").write_text(textwrap.dedent(SUBJECTS))
    marks = tmp_path / "marks"
    marks.mkdir()
    report_path = tmp_path / "report.jsonl"
    env = {**os.environ, "ISOLATION_MARKS": str(marks), "PYTHONPATH": str(tmp_path)}
    cmd = [
        sys.executable,
        "-m",
        "batchinv.harness.cli",
        "sweep",
        COMPONENT,
        "--lane",
        "cpu",
        "--subject",
        "unruly=unruly_subjects:unruly",
        "--no-entry-points",
        "--profile",
        "full",
        "--jobs",
        "2",
        "--timeout",
        "2",
        "--no-progress",
        "--report",
        str(report_path),
    ]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BrokenProcessPool" not in proc.stderr
    records = [json.loads(line) for line in report_path.read_text().splitlines()]
    rows = [r for r in records if r["kind"] == "check"]
    summary = [r for r in records if r["kind"] == "summary"]
    assert len(summary) == 1, proc.stdout + proc.stderr
    comp = get(COMPONENT)
    cases = [c.id for c in comp.cases(Lane.CPU)]
    crashed = [r for r in rows if r["status"] == "error"]
    timed_out = [r for r in rows if r["status"] == "timeout"]
    assert len(crashed) == 1 and "SIGSEGV" in crashed[0]["detail"], crashed
    assert crashed[0]["case"] == cases[0] and crashed[0]["check"] == "agreement", crashed
    assert len(timed_out) == 1 and timed_out[0]["case"] == cases[2], timed_out
    assert timed_out[0]["check"] in timed_out[0]["detail"], timed_out
    # every (case, check) has its row: the units after the crash and the kill still ran
    checks = comp.applicable_checks()
    assert sorted((r["case"], r["check"]) for r in rows) == sorted((c, ch) for c in cases for ch in checks)
    assert {r["status"] for r in rows} <= {"pass", "skip", "error", "timeout"}
    assert summary[0]["ok"] is False and summary[0]["timeouts"] == 1 and summary[0]["errors"] == 1
