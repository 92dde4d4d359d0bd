"""The matmul tuners' smoke mode (``TUNE_SMOKE=1``, ci/tuning.py): on the cpu lane each script
runs its tiny shapes under the interpreter end to end, writes its JSON with a comparator, the
candidates and a summary per shape, and every candidate of the table's tree gives the bits of
its reference (the claim ``config_equivalence`` makes of the executions of one tree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cpu
@pytest.mark.parametrize("script", ["tune_matmul", "tune_fp8_gemm"])
def test_tuner_smoke_mode_writes_its_rows_and_summary(script, tmp_path):
    env = dict(os.environ, TUNE_SMOKE="1", TRITON_INTERPRET="1")
    env.pop("TUNE_SHAPES", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci" / f"{script}.py"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / f"{script}.json").read_text(encoding="utf-8"))
    assert doc["smoke"] is True and doc["cut_by_deadline"] is False
    rows = doc["rows"]
    shapes = {r["shape"] for r in rows if r["kind"] == "comparator"}
    assert shapes and all(r.get("us") for r in rows if r["kind"] == "comparator")
    summaries = {r["shape"]: r for r in rows if r["kind"] == "summary"}
    assert set(summaries) == shapes
    for shape in shapes:
        cands = [r for r in rows if r["kind"] == "candidate" and r["shape"] == shape]
        table_tree = cands[0]["tree"]  # each script times the table's tree first
        assert {r["tree"] for r in cands} - {table_tree}, "a neighbouring tree was timed too"
        assert any(r["execution"].endswith("grid2") for r in cands)
        differ = [r["execution"] for r in cands if r["tree"] == table_tree and not r["same_bits"]]
        assert not differ, f"{shape}: executions of the table's tree with other bits: {differ}"
        assert summaries[shape]["tree"] in {r["tree"] for r in cands}
    assert "SUMMARY" in proc.stdout and "SHIP tree" in proc.stdout
