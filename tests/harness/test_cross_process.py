"""cross_process: the same case in fresh processes gives this process's bits (harness/cross_process.py).

The plumbing (a child that hangs, that dies, an outside subject, a subject no child can
import), the negative control (``mean``'s ``autotune_hash_ties``: detected by cross_process and
by no other check within one process), the hash seeds the check relies on, and the check in
the profile, the tables, the summary and ``batchinv list``.  The mutant is in tests/mutants.
Each check here starts one or two interpreters (about two seconds each on the cpu lane).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from batchinv.harness import cross_process
from batchinv.harness.checks import FAST, TIMEOUT, control_results, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.profiles import Selection
from batchinv.harness.registry import (
    BATCH_INVARIANCE_CHECKS,
    CHECKS,
    INVARIANCE_CHECKS,
    PROCESS_CHECKS,
    components,
    get,
)
from batchinv.harness.subjects import Subject
from batchinv.harness.sweep import CheckSummary, ControlSummary, SweepOutcome, run_sweep
from batchinv.harness.sweep_table import component_line, properties_line

pytestmark = pytest.mark.cpu

MEAN = get("mean")
CASE0 = MEAN.cases(Lane.CPU)[0]


def _outside(name: str, role: str = "fast") -> Subject:
    return Subject(name, f"cross_process_subjects:{name}", role=role)


@pytest.fixture
def parent_pid(monkeypatch):
    """The planted subjects of cross_process_subjects misbehave in processes other than this one."""
    monkeypatch.setenv("CROSS_PROCESS_TEST_PARENT", str(os.getpid()))


# --- the registry -------------------------------------------------------------------------------


def test_cross_process_is_the_last_check_apart_from_batch_invariance():
    assert PROCESS_CHECKS == ("cross_process",)
    assert CHECKS[-1] == "cross_process" and INVARIANCE_CHECKS[-1] == "cross_process"
    assert "cross_process" not in BATCH_INVARIANCE_CHECKS
    assert INVARIANCE_CHECKS == (*BATCH_INVARIANCE_CHECKS, *PROCESS_CHECKS)
    for comp in components():  # every component, tp_linear's narrowed checks included
        assert comp.applicable_checks()[-1] == "cross_process", comp.name


def test_the_check_runs_on_the_first_cases_of_each_lane():
    assert cross_process.case_skip_reason(0, Lane.CPU) == ""
    assert "first 1 case" in cross_process.case_skip_reason(1, Lane.CPU)
    assert cross_process.case_skip_reason(1, Lane.SM90) == ""
    assert "first 2 case" in cross_process.case_skip_reason(2, Lane.SM90)
    assert cross_process.case_skip_reason(None, Lane.CPU) == ""  # a repro's own axes run
    result = run_check(MEAN, FAST, "cross_process", MEAN.cases(Lane.CPU)[1], Lane.CPU)
    assert result.status == "skip" and "first 1 case" in result.detail


# --- the hash seeds -----------------------------------------------------------------------------


def _first_in_set(names: tuple[str, ...], seed: int) -> str:
    """The first element of ``set(names)`` in a bare interpreter at PYTHONHASHSEED=seed."""
    code = f"print(next(iter(set({list(names)!r}))))"
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_two_seeds_order_the_planted_names_differently():
    """The control's, the mutant's and the planted subject's ties are decided by the hash order
    of two names: the check's seeds 1 and 2 must order each pair differently, so that one of
    them differs from any parent (an assumption about CPython's hash, checked here)."""
    import cross_process_subjects
    import torch
    from mutants.process import TILE_NAMES

    from batchinv.fast.baselines.mean import autotune_candidates

    control = tuple(autotune_candidates(torch.device("cpu"), torch.float32, CASE0.axes["shape"][-1]))
    assert control == ("m64_n128", "m32_n256")
    assert cross_process.CHILD_HASH_SEEDS == (1, 2)
    for names in (control, TILE_NAMES, cross_process_subjects.NAMES):
        firsts = {seed: _first_in_set(names, seed) for seed in (1, 2)}
        assert firsts[1] != firsts[2], (names, firsts)


def test_a_hash_seed_set_after_the_start_is_not_trusted(monkeypatch):
    """os.environ says 2, but this process hashes with its own seed: two children."""
    if os.environ.get("PYTHONHASHSEED") == "2":
        pytest.skip("this process was started at PYTHONHASHSEED=2")
    monkeypatch.setattr(cross_process, "_OWN_SEED", [])
    monkeypatch.setenv("PYTHONHASHSEED", "2")
    assert cross_process.own_hash_seed() is None
    assert cross_process.child_seeds() == (1, 2)


def test_a_process_at_one_of_the_seeds_needs_one_child():
    code = "from batchinv.harness import cross_process as c; print(c.own_hash_seed(), c.child_seeds())"
    env = {**os.environ, "PYTHONHASHSEED": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "(1,)"]


# --- the shipped kernel, the control --------------------------------------------------------------


def test_the_shipped_kernel_gives_the_same_bits_in_fresh_processes():
    result = run_check(MEAN, FAST, "cross_process", CASE0, Lane.CPU)
    assert result.status == "pass", result.detail
    assert result.rows_total == CASE0.axes["shape"][0]
    labels = [p["label"] for p in result.points] if result.points else []
    assert not labels  # a pass keeps no points
    assert "batchinv repro mean --check cross_process --subject fast" in result.repro


def test_the_autotune_control_is_found_by_cross_process_and_by_no_other_check():
    """Within one process every launch of the control takes the config its autotune picked, so
    every other invariance check passes on the case (or has nothing to compare); cross_process,
    the last, finds the other config's bits in a fresh process -- whatever this process's seed."""
    checks = [c for c in MEAN.applicable_checks() if c in INVARIANCE_CHECKS]
    rows = list(control_results(MEAN, "autotune_hash_ties", Lane.CPU, pairs=[(c, CASE0) for c in checks]))
    by_check = {r.check: r for r in rows}
    assert list(by_check) == checks
    within = {c: r.status for c, r in by_check.items() if c != "cross_process"}
    assert set(within.values()) <= {"pass", "skip"}, within
    assert "pass" in within.values()
    found = by_check["cross_process"]
    assert found.status == "fail", found.detail
    assert found.where and all(w.startswith("fresh process PYTHONHASHSEED=") for w in found.where)
    assert found.first is not None and found.first["expected_bits"] != found.first["actual_bits"]
    assert found.rows_differing > 0


def test_the_control_is_found_from_a_worker_at_seed_2_with_one_child():
    """A sweep worker runs at PYTHONHASHSEED=2 and starts one child, at 1: found all the same."""
    code = (
        "from batchinv.harness.lanes import Lane, enter_lane; enter_lane(Lane.CPU)\n"
        "import json; from batchinv.harness.checks import run_check; from batchinv.harness.registry import get\n"
        "c = get('mean'); r = run_check(c, 'autotune_hash_ties', 'cross_process', c.cases(Lane.CPU)[0], Lane.CPU)\n"
        "print(json.dumps([r.status, r.where]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "2", "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    status, where = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "fail" and where == ["fresh process PYTHONHASHSEED=1"]


def test_the_quick_profile_tries_cross_process_first_for_the_control_and_leaves_it_to_required_controls():
    quick = Selection("quick")
    assert "cross_process" in quick.fast_checks(MEAN)
    pairs = quick.control_pairs(MEAN, MEAN.baseline("autotune_hash_ties"), Lane.CPU)
    assert pairs[0] == ("cross_process", 0)
    # torch_native must vary on GPU lanes only: the cpu lane's quick profile spares it the processes
    assert all(
        ch != "cross_process" for ch, _ in quick.control_pairs(MEAN, MEAN.baseline("torch_native"), Lane.CPU)
    )
    assert any(
        ch == "cross_process"
        for ch, _ in Selection("full").control_pairs(MEAN, MEAN.baseline("torch_native"), Lane.CPU)
    )


# --- outside subjects and the plumbing ------------------------------------------------------------


def test_an_outside_subject_runs_in_the_children_as_here(parent_pid):
    steady = run_check(MEAN, _outside("steady"), "cross_process", CASE0, Lane.CPU)
    assert steady.status == "pass", steady.detail
    ordered = run_check(MEAN, _outside("hash_ordered"), "cross_process", CASE0, Lane.CPU)
    assert ordered.status == "fail", ordered.detail
    assert ordered.first is not None and ordered.first["row"] == 0
    assert "--subject hash_ordered=cross_process_subjects:hash_ordered" in ordered.repro


def test_an_outside_subject_in_a_sweep_of_worker_processes(parent_pid):
    outcome = run_sweep(
        [MEAN],
        Lane.CPU,
        subjects={"mean": [_outside("hash_ordered")]},
        include_fast=False,
        include_baselines=False,
        jobs=2,
        selection=Selection("quick", frozenset({"cross_process"})),
    )
    (summary,) = outcome.checks
    assert (summary.subject, summary.check, summary.status) == ("hash_ordered", "cross_process", "fail")


def test_a_child_that_hangs_is_a_timeout_row(parent_pid):
    result = run_check(MEAN, _outside("hangs_in_child"), "cross_process", CASE0, Lane.CPU, timeout=1)
    assert result.status == TIMEOUT, result.detail
    assert "fresh process PYTHONHASHSEED=" in result.detail and "timed out" in result.detail


def test_a_child_deaf_to_its_timer_is_killed_by_the_parent(parent_pid):
    result = run_check(
        MEAN, _outside("hangs_without_alarm_in_child"), "cross_process", CASE0, Lane.CPU, timeout=1
    )
    assert result.status == TIMEOUT, result.detail
    assert "killed" in result.detail and "limit of 1 s" in result.detail


def test_a_child_that_dies_is_an_error_row_naming_the_signal(parent_pid):
    result = run_check(MEAN, _outside("dies_in_child"), "cross_process", CASE0, Lane.CPU)
    assert result.status == "error", result.detail
    assert "SIGSEGV" in result.detail and "during the subject's call" in result.detail


def test_what_a_fresh_process_cannot_import_is_a_skip_never_a_pass():
    def local(x, dim=-1, keepdim=False, dtype=None):
        return x.mean(dim=-1)

    in_process = run_check(MEAN, Subject("local", fn=local), "cross_process", CASE0, Lane.CPU)
    assert in_process.status == "skip" and "in-process callable" in in_process.detail
    closure = dataclasses.replace(MEAN, fast=local)
    replaced = run_check(closure, FAST, "cross_process", CASE0, Lane.CPU)
    assert replaced.status == "skip" and "cannot import" in replaced.detail
    unregistered = dataclasses.replace(MEAN, build=lambda case, device: MEAN.build(case, device))
    rebuilt = run_check(unregistered, FAST, "cross_process", CASE0, Lane.CPU)
    assert rebuilt.status == "skip" and "not the registered one" in rebuilt.detail


def test_an_importable_callable_in_fast_s_place_runs_in_the_children(parent_pid):
    """A callable that is not the registry's (a mutant's way in) is imported by its module and name."""
    import cross_process_subjects

    replaced = dataclasses.replace(MEAN, fast=cross_process_subjects.hash_ordered)
    assert cross_process.subject_spec(replaced, FAST) == {
        "kind": "callable",
        "target": "cross_process_subjects:hash_ordered",
    }
    assert run_check(replaced, FAST, "cross_process", CASE0, Lane.CPU).status == "fail"


# --- the tables and the summary -------------------------------------------------------------------


def _outcome(statuses: dict[str, dict[str, str]]) -> SweepOutcome:
    checks = []
    for comp, found in statuses.items():
        for check, status in found.items():
            summary = CheckSummary(comp, check)
            setattr(summary, {"pass": "passed", "fail": "failed", "skip": "skipped"}[status], 1)
            checks.append(summary)
    return SweepOutcome(checks, [ControlSummary("b", "x", False, True, verdict="detected")], [])


def test_the_summary_says_each_property_apart():
    outcome = _outcome(
        {
            "split_by_m": {
                "agreement": "pass",
                "batch_prefix": "fail",
                "repeat": "pass",
                "cross_process": "pass",
            },
            "autotuned": {
                "agreement": "pass",
                "batch_prefix": "pass",
                "repeat": "pass",
                "cross_process": "fail",
            },
            "pinned": {
                "agreement": "pass",
                "batch_prefix": "pass",
                "repeat": "skip",
                "cross_process": "pass",
            },
            "quick": {"agreement": "pass", "batch_prefix": "pass"},
        }
    )
    props = outcome.properties()
    assert props[("split_by_m", "fast")] == {"batch-invariant": "no", "deterministic at fixed shape": "yes"}
    assert props[("autotuned", "fast")] == {"batch-invariant": "yes", "deterministic at fixed shape": "no"}
    assert props[("pinned", "fast")] == {"batch-invariant": "yes", "deterministic at fixed shape": "yes"}
    assert props[("quick", "fast")]["deterministic at fixed shape"] == "unknown"  # not run
    line = properties_line(outcome)
    assert line.startswith("properties: batch-invariant 3/4, deterministic at fixed shape 2/4 (1 unknown)")
    assert "deterministic at fixed shape but not batch-invariant: split_by_m" in line
    assert "not deterministic across processes: autotuned" in line
    recorded = {p["component"]: p for p in outcome.summary()["properties"]}
    assert recorded["autotuned"]["deterministic at fixed shape"] == "no" and len(recorded) == 4
    # a registered component: its applicable checks missing from the summaries (a --checks
    # selection) make batch-invariant unknown, never yes
    partial = _outcome({"mean": {"agreement": "pass", "batch_prefix": "pass", "cross_process": "pass"}})
    line = component_line("mean", partial.checks, [], Lane.CPU)
    assert "[batch-invariant: unknown, deterministic at fixed shape: yes]" in line


def test_batchinv_list_shows_the_check(capsys):
    from batchinv.harness.cli import main

    assert main(["list", "mean", "--lane", "cpu", "--no-entry-points"]) == 0
    assert "cross_process" in capsys.readouterr().out


def test_the_html_matrix_has_the_check_s_column_and_the_two_properties():
    from batchinv.harness.html_report import _matrix_section

    def row(comp: str, check: str, status: str) -> dict:
        return {"component": comp, "subject": "fast", "check": check, "status": status, "case": "c"}

    page = _matrix_section(
        [
            row("autotuned", "batch_prefix", "pass"),
            row("autotuned", "cross_process", "fail"),
            row("split_by_m", "batch_prefix", "fail"),
            row("split_by_m", "cross_process", "pass"),
        ]
    )
    assert "<th>cross_process</th>" in page
    assert '<td class="property yes" data-property="batch-invariant">yes</td>' in page
    assert '<td class="property no" data-property="deterministic at fixed shape">no</td>' in page
    autotuned, split = page.split("<th>autotuned</th>")[1].split("<th>split_by_m</th>")
    assert 'class="property yes" data-property="batch-invariant"' in autotuned
    assert 'class="property no" data-property="batch-invariant"' in split


def test_the_childs_start_up_is_bounded_by_the_call_limit():
    """A child that hangs in its imports (the subject's module, before any call) ends at
    ``max(60 s, 4 x --timeout)``, not after the 600 s start-up default (a new user's finding:
    ``--timeout 5`` waited the full 600 s there); no call limit keeps the default."""
    from batchinv.harness.cross_process import STARTUP_FLOOR, STARTUP_LIMIT, startup_limit

    assert startup_limit(None) == STARTUP_LIMIT == 600.0
    assert startup_limit(5.0) == STARTUP_FLOOR == 60.0
    assert startup_limit(30.0) == 120.0
    assert startup_limit(300.0) == STARTUP_LIMIT


_PARENT_KILLED_AFTER_START = """
import json, os, sys
os.environ["CROSS_PROCESS_TEST_PARENT"] = str(os.getpid())  # the planted subject hangs in the children
from batchinv.harness.lanes import Lane, enter_lane
enter_lane(Lane.CPU)
import torch
from batchinv.harness import cross_process
from batchinv.harness.registry import get
from batchinv.harness.subjects import Subject
mean = get("mean")
subject = Subject("hangs", "cross_process_subjects:hangs_without_alarm_in_child", role="fast")
spec = cross_process.subject_spec(mean, subject)
children = cross_process.start(mean, spec, mean.cases(Lane.CPU)[0], Lane.CPU, torch.device("cpu"), None)
print(json.dumps({"pids": [c.proc.pid for _, c, _ in children.children], "folder": children.folder}), flush=True)
os.kill(os.getpid(), 9)  # a worker killed by the sweep's watchdog: no finally, no close()
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return False


def test_children_end_with_their_parent_and_take_the_check_s_folder_with_them():
    """A parent killed with its children running leaves no orphan and no folder behind.  (Their
    next event line to the dead pipe would end them too, so the orphan's life is the part before
    it -- on a GPU, the case's build and compiling into an empty cache -- and the folder, with
    those caches, stayed: without the watch this fails on the folder.)"""
    import time

    done = subprocess.run(
        [sys.executable, "-c", _PARENT_KILLED_AFTER_START],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    started = json.loads(done.stdout.strip().splitlines()[-1])
    assert started["pids"]
    deadline = time.monotonic() + 60  # their imports first (seconds on a loaded machine), then 0.5 s polls
    while time.monotonic() < deadline and any(_running(pid) for pid in started["pids"]):
        time.sleep(0.2)
    assert not any(_running(pid) for pid in started["pids"])
    assert not os.path.exists(started["folder"])


# --- the children started ahead of their check (a GPU sweep's units) ---------------------------


def _record_order(monkeypatch):
    """Each ``cross_process.start`` and each check's start, in the order they happen."""
    from batchinv.harness import sweep

    events: list[str] = []
    real_start, real_run_check = cross_process.start, sweep.run_check

    def start(*args, **kwargs):
        events.append("children started")
        return real_start(*args, **kwargs)

    def run_check_recorded(comp, subject, check, *args, **kwargs):
        events.append(check)
        return real_run_check(comp, subject, check, *args, **kwargs)

    monkeypatch.setattr(cross_process, "start", start)
    monkeypatch.setattr(sweep, "run_check", run_check_recorded)
    return events


@pytest.mark.parametrize("early", [True, False])
def test_a_unit_starts_the_children_first_and_the_check_waits_for_those(monkeypatch, early):
    from batchinv.harness import checks
    from batchinv.harness.sweep import Unit, run_unit

    events = _record_order(monkeypatch)
    unit = Unit("mean", FAST, case_index=0, checks=("repeat", "cross_process"))
    rows = run_unit(MEAN, unit, Lane.CPU, None, early_cross_process=early)
    assert [r.status for r in rows] == ["pass", "pass"], [r.detail for r in rows]
    if early:  # one set of children, started before the first check, taken over by the check
        assert events == ["children started", "repeat", "cross_process"]
    else:
        assert events == ["repeat", "cross_process", "children started"]
    assert not checks._STARTED_EARLY


def test_children_started_early_find_the_autotune_control(monkeypatch):
    """The early children are the check's own (no second start; taken before the block ends):
    the control only cross_process sees is found by them."""
    from batchinv.harness import checks

    starts: list[int] = []
    real_start = cross_process.start

    def start(*args, **kwargs):
        starts.append(1)
        return real_start(*args, **kwargs)

    monkeypatch.setattr(cross_process, "start", start)
    with checks.cross_process_started_early(MEAN, "autotune_hash_ties", CASE0, Lane.CPU):
        assert len(starts) == 1 and len(checks._STARTED_EARLY) == 1
        (found,) = control_results(MEAN, "autotune_hash_ties", Lane.CPU, pairs=[("cross_process", CASE0)])
        assert not checks._STARTED_EARLY  # taken over by the check
    assert len(starts) == 1
    assert found.status == "fail", found.detail
    assert found.where and all(w.startswith("fresh process PYTHONHASHSEED=") for w in found.where)


def test_children_started_early_are_killed_when_the_unit_ends_before_the_check(monkeypatch):
    from batchinv.harness import checks

    started: list[cross_process.Children] = []
    real_start = cross_process.start

    def start(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(cross_process, "start", start)
    with pytest.raises(KeyboardInterrupt), checks.cross_process_started_early(MEAN, FAST, CASE0, Lane.CPU):
        assert len(checks._STARTED_EARLY) == 1
        raise KeyboardInterrupt  # the user's Ctrl-C between two checks
    assert not checks._STARTED_EARLY
    (children,) = started
    assert all(child.proc.poll() is not None for _, child, _ in children.children)
    assert not os.path.exists(children.folder)


def test_nothing_starts_early_where_the_check_skips(monkeypatch):
    from batchinv.harness import checks

    events = _record_order(monkeypatch)
    later = MEAN.cases(Lane.CPU)[cross_process.CASES_CPU]  # past the cpu lane's first case
    with checks.cross_process_started_early(MEAN, FAST, later, Lane.CPU):
        assert not checks._STARTED_EARLY
    assert events == []


def test_an_early_start_that_fails_leaves_the_check_to_start_its_own(monkeypatch):
    from batchinv.harness import checks

    real_start, calls = cross_process.start, []

    def start_fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("no room for the children's folder")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(cross_process, "start", start_fails_once)
    with checks.cross_process_started_early(MEAN, FAST, CASE0, Lane.CPU):
        assert not checks._STARTED_EARLY
        result = run_check(MEAN, FAST, "cross_process", CASE0, Lane.CPU)
    assert len(calls) == 2 and result.status == "pass", result.detail
