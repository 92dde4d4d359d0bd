"""Lane detection and the plugin's skip rules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lane_env import needs_cpu_lane_child

from batchinv.harness.lanes import Lane, parse_lane
from batchinv.harness.plugin import lane_skip_reason


def test_parse_lane_accepts_known_and_names_the_choices():
    assert parse_lane("SM90") is Lane.SM90
    with pytest.raises(ValueError, match="cpu, sm90, sm100"):
        parse_lane("sm80")


@pytest.mark.parametrize(
    ("markers", "lane", "runs"),
    [
        ({"cpu"}, Lane.CPU, True),
        ({"cpu"}, Lane.SM90, False),
        ({"gpu"}, Lane.CPU, False),
        ({"gpu"}, Lane.SM100, True),
        ({"sm90"}, Lane.SM90, True),
        ({"sm90"}, Lane.SM100, False),
        ({"sm100", "negative_control"}, Lane.SM100, True),
        ({"cpu", "gpu"}, Lane.SM90, True),
        (set(), Lane.SM90, True),
        ({"slow"}, Lane.CPU, True),
    ],
)
def test_lane_skip_rules(markers, lane, runs):
    assert (lane_skip_reason(markers, lane) is None) == runs


@needs_cpu_lane_child
def test_cpu_lane_sets_the_interpreter_before_triton_loads(tmp_path):
    """A fresh pytest on the cpu lane sees TRITON_INTERPRET=1 when a test module imports triton."""
    test = tmp_path / "test_probe.py"
    test.write_text(
        "import os, pytest\n"
        "import triton\n"
        "@pytest.mark.cpu\n"
        "def test_probe():\n"
        "    assert os.environ['TRITON_INTERPRET'] == '1'\n"
        "@pytest.mark.sm90\n"
        "def test_gpu_only():\n"
        "    raise AssertionError('must be skipped on the cpu lane')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "BATCHINV_LANE")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--lane", "cpu", str(test), "-rs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "this is the cpu lane" in proc.stdout
