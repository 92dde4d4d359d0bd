"""The pytest conventions: registry tests record ``user_properties`` (so ``--junitxml`` carries
them under xdist) and ``--batchinv-report PATH`` writes the sweep's JSON-lines rows, which
``batchinv report`` renders.

One pytest child, ``-n 2``, runs a tiny registry selection: two tests of
``tests/components/test_components.py`` (the shipped mean kernel's agreement and a negative
control) and a user's file written the way :mod:`batchinv.harness.testing` documents, whose
subject is the unpinned mean baseline (its batch prefix fails) and which asserts that baseline
varies.  The JUnit XML and the report are parsed, and the report rendered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from lane_env import needs_cpu_lane_child

from batchinv.harness.cli import main
from batchinv.harness.plugin import PROPERTIES
from batchinv.harness.report import read_report

# one worker under --dist loadgroup: the module fixture (a pytest child) runs once
pytestmark = [pytest.mark.cpu, needs_cpu_lane_child, pytest.mark.xdist_group("pytest_report")]

ROOT = Path(__file__).resolve().parents[2]
CASE = "shape=40x1000-dtype=float32-values=normal-layout=contiguous-keepdim=False-out_dtype=None-seed=1"
REGISTRY_TESTS = [
    f"tests/components/test_components.py::test_fast[mean-agreement-{CASE}]",
    "tests/components/test_components.py::test_negative_control[mean-triton_rows_heuristic]",
]
USER_FILE = """
    from batchinv.fast.baselines.mean import triton_rows_heuristic_mean
    from batchinv.harness import testing


    @testing.parametrize("mean", checks=["batch_prefix"], m_limit=4)
    def test_heuristic(point):
        testing.assert_subject(point, triton_rows_heuristic_mean)


    def test_heuristic_varies():
        testing.assert_varies("mean", triton_rows_heuristic_mean, m_limit=4)
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The child run: (process, JUnit root, report path)."""
    folder = tmp_path_factory.mktemp("pytest-report")
    user = folder / "test_user_subject.py"
    user.write_text(textwrap.dedent(USER_FILE))
    junit, report = folder / "junit.xml", folder / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "BATCHINV_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            "2",
            "--lane",
            "cpu",
            f"--junitxml={junit}",
            f"--batchinv-report={report}",
            *REGISTRY_TESTS,
            str(user),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert junit.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, ET.parse(junit).getroot(), report


def _props(case: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def test_junit_carries_each_registry_tests_properties_under_xdist(run):
    proc, root, _ = run
    assert proc.returncode == 1, proc.stdout[-3000:]  # the user's unpinned subject fails
    cases = {c.get("name", ""): c for c in root.iter("testcase")}
    assert len(cases) >= 4, sorted(cases)
    for name, case in cases.items():
        props = _props(case)
        assert list(props) == list(PROPERTIES), (name, props)
        assert props["lane"] == "cpu" and props["component"] == "mean"
        assert props["repro"].startswith("batchinv repro mean --check " + props["check"])
    fast = _props(cases[f"test_fast[mean-agreement-{CASE}]"])
    assert (fast["subject"], fast["check"], fast["status"], fast["case"]) == (
        "fast",
        "agreement",
        "pass",
        CASE,
    )
    assert "mean_kernel" in fast["launched"], fast  # launch provenance: what fast ran
    failing = _props(cases[f"test_heuristic[batch_prefix-{CASE}]"])
    assert failing["status"] == "fail" and int(failing["rows_differing"]) > 0
    assert float(failing["worst_ulp"]) > 0
    assert cases[f"test_heuristic[batch_prefix-{CASE}]"].find("failure") is not None
    # a negative control's deciding row is its detection
    control = _props(cases["test_negative_control[mean-triton_rows_heuristic]"])
    assert control["status"] == "fail" and control["subject"] == "triton_rows_heuristic"
    assert int(control["checks"]) >= 1
    varies = _props(cases["test_heuristic_varies"])
    assert varies["status"] == "fail" and varies["subject"] == "triton_rows_heuristic_mean"


def test_the_report_has_the_sweeps_rows_and_renders(run, tmp_path):
    _, root, report = run
    records = read_report(report)
    assert records[0]["kind"] == "header" and records[0]["lane"] == "cpu" and records[0]["source"] == "pytest"
    assert records[-1]["kind"] == "summary" and records[-1]["ok"] is False
    rows = [r for r in records if r["kind"] == "check"]
    assert records[-1]["rows"] == len(rows)
    assert not list(report.parent.glob("*.parts"))  # the per-worker parts are merged and gone
    tests = {c.get("name", "") for c in root.iter("testcase")}
    assert {r["test"].rsplit("::", 1)[-1] for r in rows} <= tests
    # the same row fields as a sweep's (CheckResult), and one per check the tests ran
    for key in ("component", "subject", "check", "case", "status", "repro", "points", "first"):
        assert all(key in r for r in rows), key
    failing = next(r for r in rows if r["subject"] == "triton_rows_heuristic_mean" and r["status"] == "fail")
    assert failing["first"]["expected_bits"] != failing["first"]["actual_bits"]
    page = tmp_path / "run.html"
    assert main(["report", str(report), "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert 'id="verdict">FAILED' in text and "source</th><td>pytest" in text
    assert failing["first"]["actual_bits"] in text and "<svg" in text
    assert "triton_rows_heuristic</td>" in text  # the negative control's row
