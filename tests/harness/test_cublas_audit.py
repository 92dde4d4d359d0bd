"""Tests of ``batchinv audit cublas`` (harness/cublas_audit.py): the matrix, the files, one
subprocess per pin, and graceful degradation (no GPU, a child that dies)."""

from __future__ import annotations

import json

import pytest

from batchinv.harness import cublas_audit
from batchinv.harness.cublas_audit import AuditRow, to_markdown


@pytest.mark.cpu
def test_cpu_dry_run_writes_the_matrix(tmp_path, capsys):
    code = cublas_audit.main(
        ["--lane", "cpu", "--out-dir", str(tmp_path), "--pins", "default,pin_ws1", "--ms", "1,2,7,8"]
    )
    assert code == 0
    data = json.loads((tmp_path / "cublas_audit.json").read_text())
    rows = data["rows"]
    assert len(rows) == 1 * 3 * 2 * 2  # shapes x dtypes x bias x pins
    assert {r["pin"] for r in rows} == {"default", "pin_ws1"}
    assert all(r["status"] in ("invariant", "varies") for r in rows), [r["detail"] for r in rows]
    for r in rows:
        assert (r["status"] == "varies") == bool(r["varies_at"])
        assert set(r["varies_at"]) <= {1, 2, 7}
    md = (tmp_path / "cublas_audit.md").read_text()
    assert "| shape (NxK) | dtype | bias | default | pin_ws1 |" in md
    assert "CUBLAS_WORKSPACE_CONFIG=:16:8" in md
    assert "pin_ws1" in capsys.readouterr().out


@pytest.mark.cpu
def test_no_gpu_means_nothing_to_audit(capsys):
    assert cublas_audit.main([]) == 0
    assert "no GPU: nothing to audit" in capsys.readouterr().out


@pytest.mark.cpu
def test_a_child_that_dies_gives_error_cells_and_the_audit_goes_on():
    spec = {
        "lane": "cpu",
        "shapes": [[24, 40]],
        "dtypes": ["bf16"],
        "bias": [False, True],
        "ms": [1, 2],
        "seed": 0,
    }
    rows = cublas_audit._run_pin("pin_lt_ws0", spec, timeout=0.01)
    assert [r.status for r in rows] == ["error", "error"]
    assert all("timed out" in r.detail for r in rows)


def test_bad_options_exit_2():
    assert cublas_audit.main(["--lane", "cpu", "--pins", "nope", "--no-save"]) == 2


def test_markdown_cells():
    rows = [
        AuditRow("default", 256, 4096, "fp32", False, "varies", varies_at=[1, 2, 7], ms=[1, 2, 7, 8, 4096]),
        AuditRow("pin_lt_ws1", 256, 4096, "fp32", False, "invariant", ms=[1, 2, 7, 8, 4096]),
        AuditRow("pin_lt_ws0", 256, 4096, "fp32", False, "error", detail="OOM trying to allocate workspace"),
    ]
    md = to_markdown(
        rows,
        ["default", "pin_lt_ws1", "pin_lt_ws0"],
        {"lane": "sm90", "device": "H200", "torch": "2.11", "ms": [1]},
    )
    line = next(ln for ln in md.splitlines() if ln.startswith("| 256x4096"))
    assert line == (
        "| 256x4096 | fp32 | no | varies at M=1,2,7 (3/4 M) | invariant | error: OOM trying to allocate workspace |"
    )
