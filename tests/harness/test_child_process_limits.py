"""harness/child_process.py: a child past its start-up limit is killed whenever its parent
waits -- at once, or later (a check that started its children early waits late)."""

from __future__ import annotations

import time

import pytest

from batchinv.harness.child_process import PREFIX, Child, fresh_environment

pytestmark = pytest.mark.cpu


def test_the_event_line_is_the_prefix_the_parent_reads() -> None:
    assert PREFIX == "batchinv-child "  # slow_start_child.py writes it by hand


@pytest.mark.parametrize("parent_waits_s", [0.0, 3.0], ids=["waits-at-once", "waits-late"])
def test_a_child_past_its_start_up_limit_is_killed_whenever_the_parent_waits(parent_waits_s: float) -> None:
    child = Child("slow_start_child", ["1.5"], fresh_environment(), startup_limit=0.5, call_limit=None)
    time.sleep(parent_waits_s)  # late: the child has long finished and its lines are queued
    ended = child.wait()
    assert ended.killed == (
        "killed: its start (imports, the case's build) ran past the limit of 0.5 s in the child process"
    )
    assert ended.last("done") is None


def test_a_child_within_its_limit_is_not_killed_when_the_parent_waits_late() -> None:
    child = Child("slow_start_child", ["0.0"], fresh_environment(), startup_limit=30.0, call_limit=None)
    time.sleep(2.0)
    ended = child.wait()
    assert not ended.killed
    assert ended.last("done") == {"event": "done", "status": "ok"}
