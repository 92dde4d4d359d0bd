"""The installed pytest plugin stays out of other projects unless the run opts in.

Each test writes a throwaway project (its own ``pytest.ini`` registering its own ``slow``, ``gpu``
and ``cpu`` markers, ``--strict-markers``, a conftest adding its own ``--run-slow``) under ``tmp_path`` and runs ``python -m pytest`` on it
in a subprocess, in an environment stripped of ``CI``, ``TRITON_INTERPRET``, ``BATCHINV_*``,
``HYPOTHESIS_*`` and ``PYTEST_*``.  The batchinv plugin is loaded there through its ``pytest11``
entry point (the project's record says so), so these tests go red if it acts without the opt-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import lane_skip_reason

FOREIGN_INI = """\
[pytest]
addopts = --strict-markers
markers =
    slow: this project's slow tests (they run with its own --run-slow)
    gpu: this project's GPU tests (they run on the CPU here)
    cpu: this project's CPU tests
"""

# The common conftest pattern: batchinv must not register an option of the same name.
FOREIGN_CONFTEST = """\
import pytest


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--run-slow"):
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="their own --run-slow is off"))
"""

FOREIGN_TESTS = """\
import json
import os

import pytest


@pytest.mark.slow
def test_marked_slow():
    pass


@pytest.mark.gpu
def test_marked_gpu():
    pass


@pytest.mark.cpu
def test_marked_cpu():
    pass


def test_records_its_environment(request):
    from hypothesis import settings

    try:
        settings.get_profile("dev")
        dev_registered = True
    except Exception:
        dev_registered = False
    record = {
        "env": {key: os.environ.get(key) for key in ("TRITON_INTERPRET", "BATCHINV_LANE")},
        "profile": settings.get_current_profile_name(),
        "no_deadline": settings.default.deadline is None,
        "dev_registered": dev_registered,
        "markers": sorted(line.split(":")[0] for line in request.config.getini("markers")),
        "batchinv_loaded": request.config.pluginmanager.has_plugin("batchinv"),
    }
    with open("record.json", "w") as f:
        json.dump(record, f)
"""

FOREIGN_MARKED = {"test_marked_slow": "slow", "test_marked_gpu": "gpu", "test_marked_cpu": "cpu"}
ALL_TESTS = [*FOREIGN_MARKED, "test_records_its_environment"]


def _clean_env() -> dict[str, str]:
    """This environment without anything that would opt in or pick a profile or lane."""
    drop = ("CI", "TRITON_INTERPRET", "PYTHONPATH")
    prefixes = ("BATCHINV_", "HYPOTHESIS_", "PYTEST_")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(prefixes)}


def _project(root: Path, ini_extra: str = "", tests: str = FOREIGN_TESTS) -> Path:
    root.mkdir()
    (root / "pytest.ini").write_text(FOREIGN_INI + ini_extra)
    (root / "conftest.py").write_text(FOREIGN_CONFTEST)
    (root / "test_theirs.py").write_text(tests)
    return root


def _run(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, str], dict[str, Any]]:
    """Run pytest on ``project`` (``env`` added to a clean environment): the process, each test's
    outcome, the environment record."""
    junit = project / "junit.xml"
    record = project / "record.json"
    for stale in (junit, record):
        stale.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", f"--junitxml={junit}", *args],
        capture_output=True,
        text=True,
        cwd=project,
        env={**_clean_env(), **(env or {})},
        timeout=300,
    )
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kinds = {child.tag for child in case} & {"skipped", "failure", "error"}
            outcomes[case.get("name", "")] = kinds.pop() if kinds else "passed"
    return proc, outcomes, json.loads(record.read_text()) if record.exists() else {}


def test_without_the_opt_in_the_plugin_leaves_env_profile_and_outcomes_alone(tmp_path):
    project = _project(tmp_path / "theirs")
    proc, outcomes, record = _run(project, "--run-slow")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert record["batchinv_loaded"] is True, "the plugin did not load, so this run proves nothing"
    assert outcomes == dict.fromkeys(ALL_TESTS, "passed"), log
    assert record["env"] == {"TRITON_INTERPRET": None, "BATCHINV_LANE": None}
    assert (record["profile"], record["no_deadline"], record["dev_registered"]) == ("default", False, False)
    assert not {"negative_control", "sm90", "sm100"} & set(record["markers"]), "markers without the opt-in"
    assert "batchinv lane" not in proc.stdout, "a report header without the opt-in"

    # The same project with the plugin blocked gives the same outcomes and the same record.
    blocked, blocked_outcomes, blocked_record = _run(project, "--run-slow", "-p", "no:batchinv")
    assert blocked.returncode == 0, blocked.stdout + blocked.stderr
    assert blocked_outcomes == outcomes
    assert blocked_record == {**record, "batchinv_loaded": False}


def test_without_the_opt_in_strict_markers_still_rejects_batchinv_marker_names(tmp_path):
    """batchinv's marker names are not registered for a project that did not opt in."""
    project = _project(
        tmp_path / "theirs", tests="import pytest\n\n@pytest.mark.sm90\ndef test_x():\n    pass\n"
    )
    proc, _, _ = _run(project)
    assert proc.returncode != 0
    assert "'sm90' not found in `markers` configuration option" in proc.stdout + proc.stderr


def _assert_batchinv_acted(
    proc: subprocess.CompletedProcess[str], outcomes: dict[str, str], record: dict
) -> None:
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    lane = Lane(record["env"]["BATCHINV_LANE"])
    assert record["env"]["TRITON_INTERPRET"] == ("1" if lane is Lane.CPU else None)
    for test, marker in FOREIGN_MARKED.items():
        skipped = marker == "slow" or lane_skip_reason({marker}, lane) is not None
        assert outcomes[test] == ("skipped" if skipped else "passed"), (test, log)
    assert outcomes["test_records_its_environment"] == "passed"
    assert (record["profile"], record["no_deadline"], record["dev_registered"]) == ("dev", True, True)
    assert {"negative_control", "sm90", "sm100"} <= set(record["markers"])


def test_the_ini_key_opts_in_in_every_xdist_worker(tmp_path):
    project = _project(tmp_path / "theirs", ini_extra="batchinv = true\n")
    proc, outcomes, record = _run(project, "--run-slow", "-n", "2")
    _assert_batchinv_acted(proc, outcomes, record)


def test_the_batchinv_option_opts_in(tmp_path):
    project = _project(tmp_path / "theirs")
    proc, outcomes, record = _run(project, "--run-slow", "--batchinv")
    _assert_batchinv_acted(proc, outcomes, record)
    assert f"batchinv lane: {record['env']['BATCHINV_LANE']}" in proc.stdout


FIXTURE_TEST = """\
import os


def test_uses_the_lane_fixture(lane, device):
    assert lane.value == os.environ["BATCHINV_LANE"]
    assert (os.environ.get("TRITON_INTERPRET") == "1") == (lane.value == "cpu")
    assert device.type == ("cpu" if lane.value == "cpu" else "cuda")
"""


def test_a_test_using_the_lane_fixture_enters_the_lane_without_the_opt_in(tmp_path):
    """With triton not yet imported, the fixture's first use enters the cpu lane in time."""
    project = _project(tmp_path / "theirs", tests=FIXTURE_TEST)
    proc, outcomes, _ = _run(project, env={"BATCHINV_LANE": "cpu"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes == {"test_uses_the_lane_fixture": "passed"}


def test_the_lane_fixture_names_the_opt_in_when_triton_was_imported_first(tmp_path):
    """Too late for the cpu lane: the fixture fails and says how to opt in."""
    project = _project(tmp_path / "theirs", tests="import triton  # noqa: F401\n" + FIXTURE_TEST)
    proc, outcomes, _ = _run(project, env={"BATCHINV_LANE": "cpu"})
    log = proc.stdout + proc.stderr
    assert outcomes == {"test_uses_the_lane_fixture": "error"}, log
    assert "set `batchinv = true` in the pytest ini file" in log
