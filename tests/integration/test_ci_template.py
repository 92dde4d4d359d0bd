"""The GitHub Actions template (docs/CI.md): GPU jobs on self-hosted runners labelled by lane,
label-gated on pull requests, JUnit and the HTML reports uploaded; the cpu lane on hosted
runners with the browser test required.  It is a template: nothing under .github/workflows."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "ci/github-actions-gpu.yml"


@pytest.fixture(scope="module")
def workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the template (it comes with the [models] extra)")
    return yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))


def _run_lines(job):
    return "\n".join(step.get("run", "") for step in job["steps"])


def _uploads(job):
    return "\n".join(
        step["with"]["path"]
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/upload-artifact")
    )


def test_gpu_jobs_run_on_lane_labelled_self_hosted_runners_behind_a_label(workflow):
    gpu = workflow["jobs"]["gpu"]
    assert gpu["strategy"]["matrix"]["lane"] == ["sm90", "sm100"]
    assert gpu["runs-on"][0] == "self-hosted" and "${{ matrix.lane }}" in gpu["runs-on"]
    assert "contains(github.event.pull_request.labels.*.name, 'gpu-ci')" in gpu["if"]
    assert "labeled" in workflow[True]["pull_request"]["types"]  # YAML 1.1 reads `on` as True
    runs = _run_lines(gpu)
    assert "--lane ${{ matrix.lane }}" in runs and "--junitxml=" in runs and "--batchinv-report=" in runs
    assert "report" in runs and "*.xml" in _uploads(gpu) and "*.html" in _uploads(gpu)


def test_the_cpu_lane_runs_on_hosted_runners_with_the_browser_required(workflow):
    cpu = workflow["jobs"]["cpu"]
    assert not str(cpu["runs-on"]).startswith("self-hosted")
    assert cpu["env"]["BATCHINV_REQUIRE_BROWSER"] == "1"
    runs = _run_lines(cpu)
    assert "install -y -qq chromium" in runs and "--junitxml=" in runs and "make report" in runs
    assert "*.xml" in _uploads(cpu) and "*.html" in _uploads(cpu)


def test_it_is_a_template_not_an_active_workflow():
    assert not (ROOT / ".github/workflows").exists() or not any((ROOT / ".github/workflows").iterdir())
