"""Outside subjects of ``mean`` for the cross_process tests, imported by a fresh process as
``cross_process_subjects:NAME`` (tests/support is on the path; the child gets this process's).

Every one computes the mean with torch on the CPU (no kernel, so they cost nothing but the
child's start).  The planted ones behave otherwise in a child process only: a process whose id
is not ``$CROSS_PROCESS_TEST_PARENT`` (the test sets it to its own before the check runs).
"""

from __future__ import annotations

import os
import signal
import time

import torch

#: Two names whose set iterates "tile_a" first at PYTHONHASHSEED=1 and "tile_b" first at 2
#: (tests/harness/test_cross_process.py checks it).
NAMES: tuple[str, str] = ("tile_a", "tile_b")


def _mean(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return x.to(torch.float64).mean(dim=-1).to(dtype or x.dtype)


def _in_child() -> bool:
    parent = os.environ.get("CROSS_PROCESS_TEST_PARENT")
    return parent is not None and int(parent) != os.getpid()


def steady(x, dim=-1, keepdim=False, dtype=None):
    """The mean, the same in every process."""
    return _mean(x, dtype)


def hash_ordered(x, dim=-1, keepdim=False, dtype=None):
    """The mean, one ULP up on row 0 when "tile_b" comes first in ``set(NAMES)`` (its order
    follows the process's hash seed)."""
    y = _mean(x, dtype)
    if next(iter(set(NAMES))) == "tile_b":
        y[0] = torch.nextafter(y[0], torch.tensor(float("inf"), dtype=y.dtype))
    return y


def hangs_in_child(x, dim=-1, keepdim=False, dtype=None):
    """Sleeps for a minute in a child process (its own timer interrupts it)."""
    if _in_child():
        time.sleep(60)
    return _mean(x, dtype)


def hangs_without_alarm_in_child(x, dim=-1, keepdim=False, dtype=None):
    """Blocks SIGALRM and sleeps in a child process: only the parent's watchdog ends it."""
    if _in_child():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    return _mean(x, dtype)


def dies_in_child(x, dim=-1, keepdim=False, dtype=None):
    """Kills its own process with SIGSEGV in a child process."""
    if _in_child():
        os.kill(os.getpid(), signal.SIGSEGV)
    return _mean(x, dtype)
