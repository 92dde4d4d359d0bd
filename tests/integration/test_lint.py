"""Strict defaults hold: ruff over the tree, mypy over harness/ and reference/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("ruff", ["check", "."]),
        ("ruff", ["format", "--check", "."]),
        ("mypy", ["harness", "reference"]),
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_checks(tool, args):
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (it comes with the [dev] extra)")
    proc = subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
