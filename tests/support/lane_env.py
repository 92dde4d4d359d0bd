"""Whether this environment can run a cpu-lane child process (the Triton interpreter).

The GPU image pairs Triton 3.6 with numpy 2.5, which the 3.6 interpreter cannot run and
:func:`batchinv.fast.versions.check_versions` refuses (H200, run 25): tests that start a
cpu-lane ``batchinv`` or pytest child skip there, naming the refusal; CI's venv (numpy < 2.4)
runs them.
"""

from __future__ import annotations

import pytest

from batchinv.fast.versions import UnsupportedVersionError, check_versions


def _interpreter_refusal() -> str | None:
    try:
        check_versions(interpreter=True)
    except UnsupportedVersionError as refused:
        return str(refused)
    return None


REFUSAL = _interpreter_refusal()

#: Marks a test that starts a cpu-lane child process.
needs_cpu_lane_child = pytest.mark.skipif(
    REFUSAL is not None, reason=f"this environment cannot run the cpu lane: {REFUSAL}"
)
