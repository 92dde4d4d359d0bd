"""Fresh child processes: a new interpreter, watched by its parent, and how it ended.

Two checks run work in a child process: a pin candidate's checks (``checks.run_checks``, under
the candidate's environment, which libraries read once at handle creation) and
``cross_process`` (a case's outputs in a fresh process, :mod:`batchinv.harness.cross_process`).
Both start it with :class:`Child`: ``python -m MODULE SPEC`` through :mod:`subprocess` -- a
*spawned* interpreter (fork + exec), never a forked copy of this one, so nothing of the parent's
imports, caches or state reaches it but its environment.

The child talks to its parent by *events*: lines ``batchinv-child {json}`` on its stdout
(:func:`send`; other output is ignored, so a subject that prints cannot forge one).  The parent
watches two limits: ``startup_limit`` seconds for everything outside a subject call (imports,
building the case, sending the outputs back) and, between a ``{"event": "call"}`` and the next
``{"event": "called"}``, the subject call's own limit plus a grace for the child's own timer
(:func:`grace`).  A child past either is killed: :attr:`Ended.killed` says why.  A child that
dies is named by its signal (:func:`describe_exit`: ``signal SIGSEGV``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

#: The prefix of an event line on a child's stdout.
PREFIX = "batchinv-child "


def send(event: Mapping[str, Any]) -> None:
    """Send ``event`` (JSON-able) to the parent: one prefixed line on stdout, flushed."""
    sys.stdout.write(PREFIX + json.dumps(dict(event), default=str) + "\n")
    sys.stdout.flush()


def grace(limit: float) -> float:
    """How long past a call's limit the parent waits for the child's own timer before it kills
    (as the sweep does for its workers): ``max(2, limit / 4)`` seconds."""
    return max(2.0, 0.25 * limit)


def describe_exit(code: int | None) -> str:
    """``signal SIGSEGV`` for a child killed by a signal, ``exit status 3`` otherwise."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


@dataclass
class Ended:
    """How a child ended.

    Attributes:
        returncode: its exit status (negative: the signal that ended it).
        events: every event it sent, in order.
        stderr_tail: the last lines of its stderr.
        killed: why the parent killed it ("" if it was not): a limit it ran past.
        in_call: whether it was inside a subject call when it ended (a ``call`` event without
            its ``called``).
    """

    returncode: int | None
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""
    killed: str = ""
    in_call: bool = False

    def last(self, name: str) -> dict[str, Any] | None:
        """The last event named ``name`` (None: none)."""
        return next((e for e in reversed(self.events) if e.get("event") == name), None)

    @property
    def how(self) -> str:
        """How it ended, in words: killed (why), the signal or the exit status."""
        return self.killed or describe_exit(self.returncode)


class Child:
    """``python -m module *args`` in a fresh interpreter under ``env``, started at once.

    Args:
        module: the module to run (its ``__main__`` block reads ``args``).
        args: its command-line arguments.
        env: its whole environment.
        startup_limit: seconds it may spend outside subject calls (None: no limit).
        call_limit: seconds one subject call may take (None: no limit); the parent kills the
            child at ``call_limit + grace(call_limit)``.
    """

    def __init__(
        self,
        module: str,
        args: list[str],
        env: Mapping[str, str],
        *,
        startup_limit: float | None,
        call_limit: float | None,
    ) -> None:
        self.startup_limit = startup_limit
        self.call_limit = call_limit
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self._lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._ended: Ended | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put((time.monotonic(), line))
        self._lines.put((time.monotonic(), None))

    def _deadline(self, since: float, in_call: bool) -> float | None:
        if in_call:
            if self.call_limit is None:
                return None
            return since + self.call_limit + grace(self.call_limit)
        return None if self.startup_limit is None else since + self.startup_limit

    def wait(self) -> Ended:
        """Wait for the child to end (killing it past a limit) and say how it ended."""
        if self._ended is not None:
            return self._ended
        events: list[dict[str, Any]] = []
        since, in_call, killed = self.started, False, ""
        while True:
            deadline = self._deadline(since, in_call)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                stamp, line = self._lines.get(timeout=wait)
                # a line stamped past the deadline came from a child already past its limit: the
                # same verdict whenever this waits (a parent that waits late finds it queued)
                late = deadline is not None and stamp > deadline
            except queue.Empty:
                late = True
            if late:
                limit = self.call_limit if in_call else self.startup_limit
                what = "a call of the subject" if in_call else "its start (imports, the case's build)"
                killed = f"killed: {what} ran past the limit of {limit:g} s in the child process"
                self.proc.kill()
                break
            if line is None:
                break
            if not line.startswith(PREFIX):
                continue
            try:
                event = json.loads(line[len(PREFIX) :])
            except json.JSONDecodeError:
                continue
            events.append(event)
            if event.get("event") == "call":
                since, in_call = stamp, True
            elif event.get("event") == "called":
                since, in_call = stamp, False
        returncode = self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()
        self._ended = Ended(returncode, events, self._tail(), killed, in_call)
        self._stderr.close()
        return self._ended

    def _tail(self, lines: int = 6) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        """End the child now if it still runs (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        if self._ended is None:
            self.wait()


def fresh_environment(base: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """The environment of a child: ``base`` (default ``os.environ``) with ``overrides``, and
    ``PYTHONPATH`` led by this process's ``sys.path``, so the child imports what this process
    can (a subject in a test's folder, a module next to the user)."""
    env = dict(os.environ if base is None else base)
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env.update(overrides)
    return env
