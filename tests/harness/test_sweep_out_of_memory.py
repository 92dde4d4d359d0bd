"""A check that ran out of device memory in a sweep's worker pool runs again alone.

The workers of ``batchinv sweep --jobs N`` share one GPU; on the H200 (run 56) eleven busy workers
left a twelfth without memory and fused_moe's large cases ended ``error`` with
``torch.OutOfMemoryError``.  The parent now queues such a check (a control's whole unit) to run
again at the end with no other unit in flight, and its row says it was re-run; an out-of-memory
error when running alone (``--jobs 1``, or the re-run) stays an ``error``.

The subject here raises ``torch.OutOfMemoryError`` on its first call for the 40x1000 case of
``mean`` (a marker file makes it once per sweep); cost: two small cpu sweeps of mean's fast
subject, about 20 s on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

SUBJECTS = """
import os
from pathlib import Path

import torch

from batchinv.reference.mean import mean as exact_mean

MARKS = Path(os.environ["OOM_MARKS"])


def short_of_memory_once(x, dim=-1, keepdim=False, dtype=None):
    mark = MARKS / "ran_out"
    if tuple(x.shape) == (40, 1000) and not mark.exists():
        mark.write_text("1")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.75 GiB (planted)")
    return exact_mean(x, dim, keepdim, dtype).to(dtype or x.dtype)
"""


def _sweep(tmp_path: Path, jobs: int) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    work = tmp_path / f"jobs{jobs}"
    (work / "marks").mkdir(parents=True)
    (work / "oom_subjects.py").write_text(textwrap.dedent(SUBJECTS))
    report = work / "report.jsonl"
    env = {**os.environ, "OOM_MARKS": str(work / "marks"), "PYTHONPATH": str(work)}
    cmd = [sys.executable, "-m", "batchinv.harness.cli", "sweep", "mean", "--lane", "cpu"]
    cmd += ["--subject", "short=oom_subjects:short_of_memory_once", "--no-entry-points", "--profile", "full"]
    cmd += ["--checks", "agreement,repeat", "--jobs", str(jobs), "--no-progress", "--report", str(report)]
    proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    return proc, [r for r in rows if r["kind"] == "check" and r["subject"] == "short"]


def test_a_check_that_ran_out_of_memory_in_the_pool_runs_again_alone_and_says_so(tmp_path: Path):
    proc, rows = _sweep(tmp_path, jobs=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = [r for r in rows if "re-run alone" in r["detail"]]
    assert len(again) == 1 and again[0]["status"] == "pass", rows
    assert again[0]["check"] == "agreement" and "pool of 2 workers" in again[0]["detail"], again
    assert sorted(r["check"] for r in rows if r["case"] == again[0]["case"]) == ["agreement", "repeat"]
    assert all(r["status"] == "pass" for r in rows), rows


def test_out_of_memory_when_running_alone_stays_an_error(tmp_path: Path):
    proc, rows = _sweep(tmp_path, jobs=1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [r for r in rows if r["status"] == "error"]
    assert len(errors) == 1 and "OutOfMemoryError" in errors[0]["detail"], rows
    assert not any("re-run alone" in r["detail"] for r in rows)


@pytest.mark.parametrize(
    "detail",
    [
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB",
        # a cross_process child's words on an H100 (run 67): the CUDA call, not the allocator
        "batchinv.harness.cross_process.ChildFailed: fresh process PYTHONHASHSEED=1: could not set up the "
        "case: torch.AcceleratorError: CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'",
    ],
)
def test_both_ways_of_running_out_of_device_memory_are_recognised(detail: str):
    from batchinv.harness.checks import CheckResult
    from batchinv.harness.sweep import _out_of_memory

    row = CheckResult("fused_moe", "fast", "cross_process", "case", {}, 0, "sm90", "error", detail=detail)
    assert _out_of_memory(row)
    row.status = "fail"  # only an error row is re-run
    assert not _out_of_memory(row)
    row.status, row.detail = "error", "CUDA error: an illegal memory access was encountered"
    assert not _out_of_memory(row)
