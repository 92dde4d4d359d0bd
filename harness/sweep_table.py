"""The tables ``batchinv sweep`` prints: component x check, then the negative controls and pin
candidates, then repro lines and the time (wall, summed over workers, and the compile share)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinv.harness.lanes import Lane
from batchinv.harness.sweep import CheckSummary, ControlSummary, SweepOutcome

_STYLE = {
    "pass": "green",
    "fail": "red",
    "error": "red",
    "timeout": "red",
    "skip": "dim",
    "reference path": "yellow",
}
_VERDICT_STYLE = {
    "detected": "green",
    "invariant": "cyan",
    "varies": "yellow",
    "inconclusive": "red",
    "error": "red",
    "timeout": "red",
}


def fmt_ulp(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value:g}"


def _line(console: Any, text: str) -> None:
    """One physical line, no markup (repro lines carry JSON with brackets)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


#: The line under the check table that says what its words and numbers mean.
LEGEND = (
    "fail (8/9): the check failed on 8 of the 9 cases it ran; reference path: the fast callable "
    "ran the reference there (outside its kernel's envelope), counted apart, never a pass; skip: "
    "nothing to compare on this lane; 'negative control detected: X': the check found different "
    "bits on baseline X, as it must (it has teeth); s: seconds summed over workers"
)


def _status_text(c: CheckSummary) -> str:
    status = f"[{_STYLE[c.status]}]{c.status}[/]"
    if c.status in ("fail", "error", "timeout") and c.cases:
        status += f" ({c.failed + c.errors + c.timeouts}/{c.cases})"
    if c.reference_path and c.status != "reference path":
        status += f" [yellow]({c.reference_path} reference path)[/]"
    if c.skipped and c.status != "skip":
        status += f" [dim]({c.skipped} skipped)[/]"
    return status


def _notes(c: CheckSummary) -> str:
    """A check row's notes: what differed (rows, ULP, first difference), the toleranced
    agreement's worst error over its bound, and the negative controls it detected."""
    from rich.markup import escape

    parts = []
    if c.rows_differing:
        parts.append(f"{c.rows_differing} rows differ")
    if c.worst_ulp is not None and (c.status != "pass" or c.check == "agreement"):
        parts.append(f"worst {fmt_ulp(c.worst_ulp)} ULP")
    if c.worst_bound_ratio is not None:
        parts.append(f"error/bound {c.worst_bound_ratio:.3g}")
    if c.first_difference:
        parts.append("first difference " + escape(c.first_difference[:80]))
    text = "; ".join(parts)
    if c.detected_by:
        detected = (
            "[green]negative control detected: " + escape(", ".join(dict.fromkeys(c.detected_by))) + "[/]"
        )
        text = f"{text}; {detected}" if text else detected
    return text or "-"


def _control_verdict(ctrl: ControlSummary) -> str:
    from rich.markup import escape

    verdict = ctrl.verdict
    if ctrl.pin_candidate:
        return f"[{_VERDICT_STYLE.get(verdict, 'white')}]{verdict}[/] (pin candidate)"
    if verdict == "inconclusive" and not ctrl.expected_to_vary:
        return "[dim]inconclusive (not required on this lane)[/]"
    if verdict.startswith("not reached"):
        return f"[yellow]{escape(verdict)}[/]"
    if not ctrl.expected_to_vary:
        return f"[{_VERDICT_STYLE.get(verdict, 'white')}]{verdict}[/] (not required here)"
    return f"[{_VERDICT_STYLE.get(verdict, 'white')}]{verdict}[/]"


def print_outcome(console: Any, outcome: SweepOutcome, lane: Lane, env: dict[str, Any], report: Path) -> int:
    """Print the tables and the closing lines; return the exit status (0 only if ``outcome.ok``).

    The tables fit 80 columns: the check table has a heading row per component (then check,
    result, cases, seconds, notes), the notes column wraps."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    profile = "" if outcome.profile == "full" else f" — {outcome.profile} profile"
    table = Table(title=f"batchinv sweep — lane {lane.value} — {env['device']}{profile}", box=box.SIMPLE_HEAD)
    for col in ("check", "result", "cases", "s", "notes"):
        table.add_column(col, justify="right" if col in ("cases", "s") else "left", no_wrap=col != "notes")
    heading = None
    for c in outcome.checks:
        who = c.component if c.subject == "fast" else f"{c.component} ({c.subject})"
        if who != heading:
            heading = who
            table.add_row(f"[bold]{escape(who)}[/]", "", "", "", "", end_section=False)
        table.add_row("  " + c.check, _status_text(c), str(c.cases), f"{c.seconds:.1f}", _notes(c))
    console.print(table)
    console.print(LEGEND, markup=False, highlight=False)
    if outcome.controls:
        ctable = Table(title="negative controls and pin candidates", box=box.SIMPLE_HEAD)
        for col in ("component / baseline", "verdict", "where", "cases", "s"):
            ctable.add_column(
                col, justify="right" if col in ("cases", "s") else "left", no_wrap=col != "where"
            )
        for ctrl in outcome.controls:
            name = f"{ctrl.baseline}={ctrl.subject_target}" if ctrl.subject_target else ctrl.baseline
            ctable.add_row(
                escape(f"{ctrl.component} / {name}"),
                _control_verdict(ctrl),
                escape(ctrl.where or ctrl.detail[:100]) or "-",
                str(ctrl.cases),
                f"{ctrl.seconds:.1f}",
            )
        console.print(ctable)
    outside = sorted({(c.subject, c.subject_target) for c in outcome.checks if c.subject != "fast"})
    for name, target in outside:
        _line(console, f"subject {name}: {target or 'an in-process callable'}")
    for ctrl in outcome.controls:
        if ctrl.repro and ctrl.verdict in ("detected", "varies"):
            _line(console, f"{ctrl.component}/{ctrl.baseline} {ctrl.verdict}; repro: {ctrl.repro}")
    for ctrl in outcome.controls:
        if ctrl.verdict in ("error", "timeout"):
            _line(console, f"{ctrl.verdict.upper()} baseline {ctrl.component}/{ctrl.baseline}: {ctrl.detail}")
            _line(console, f"  repro: {ctrl.repro}")
        elif ctrl.is_failure:
            _line(
                console,
                f"INCONCLUSIVE negative control {ctrl.component}/{ctrl.baseline}: no check found "
                f"different bits on a baseline that must vary on lane {lane.value}; the harness has "
                "lost its teeth here.",
            )
    not_reached = [c for c in outcome.controls if c.verdict.startswith("not reached")]
    if not_reached:
        _line(
            console,
            f"{len(not_reached)} negative control(s) not reached (by the cut of --max-m or --checks "
            "named beside each), so their verdict is unknown (not a failure): "
            + ", ".join(
                f"{c.component}/{c.baseline} {c.verdict.removeprefix('not reached ')}" for c in not_reached
            ),
        )
    for name, lanes in outcome.not_on_lane:
        _line(
            console,
            f"{name}: not run on this lane ({lane.value}); it runs on {', '.join(lanes)} (not a pass, not a failure)",
        )
    _line(console, time_line(outcome))
    heaviest = compile_line(outcome)
    if heaviest:
        _line(console, heaviest)
    _line(console, f"report: {report}")
    _line(console, counts_line(outcome))
    _line(console, properties_line(outcome))
    if outcome.ok:
        console.print("[green]OK[/]")
        return 0
    failed_controls = sum(c.is_failure for c in outcome.controls)
    timeouts = f", {outcome.timeouts} timed out" if outcome.timeouts else ""
    console.print(
        f"[red]FAILED[/] ({len(outcome.failures)} failing fast checks, {failed_controls} failing controls{timeouts})"
    )
    return 1


def compile_line(outcome: SweepOutcome, top: int = 5) -> str:
    """``compile by kernel: topk_kernel 120.4 s (60), ...``: the ``top`` kernels by compile
    seconds (distinct compilations in brackets); empty where nothing was compiled."""
    heaviest = outcome.compile.by_kernel()[:top]
    if not heaviest:
        return ""
    return "compile by kernel: " + ", ".join(f"{name} {sec:.1f} s ({n})" for name, n, sec in heaviest)


def time_line(outcome: SweepOutcome) -> str:
    """``total 41.2 s wall (jobs 12); checks 310.5 s summed over workers; compile 95.1 s in 131
    compilations (31% of check time; 40 cache hits); 12 of them (9.3 s) compiled a kernel another
    worker had compiled`` (the last clause only where some were)."""
    text = (
        f"total {outcome.wall_seconds:.1f} s wall (jobs {outcome.jobs}); "
        f"checks {outcome.check_seconds:.1f} s summed over workers; "
    )
    stats = outcome.compile
    if not stats.available:
        return text + "compile share: n/a (no Triton compilation on this lane, or no compile listener)"
    share = 100.0 * stats.seconds / outcome.check_seconds if outcome.check_seconds else 0.0
    text += (
        f"compile {stats.seconds:.1f} s in {stats.compilations} compilations "
        f"({share:.0f}% of check time; {stats.cache_hits} cache hits)"
    )
    if stats.repeated:
        text += (
            f"; {stats.repeated} of them ({stats.repeated_seconds:.1f} s) compiled a kernel another "
            "worker had compiled"
        )
    return text


def counts_line(outcome: SweepOutcome) -> str:
    """The sweep's closing counts: ``checks: 95 passed, 1 failed, 2 skipped, 0 reference path
    (of 98 component x check); negative controls: 34/34 required detected``.  A (component,
    check) counts once, by its status over its cases; ``failed`` includes errors and timeouts."""
    status = [c.status for c in outcome.checks]
    failed = sum(s in ("fail", "error", "timeout") for s in status)
    broke = [
        f"{n} {w}" for w, n in (("errors", status.count("error")), ("timeouts", status.count("timeout"))) if n
    ]
    required = [c for c in outcome.controls if c.expected_to_vary and not c.pin_candidate]
    detected = sum(c.verdict == "detected" for c in required)
    others = [c for c in outcome.controls if not c.expected_to_vary and not c.pin_candidate]
    pins = [c for c in outcome.controls if c.pin_candidate]
    not_reached = sum(c.verdict.startswith("not reached") for c in required)
    text = (
        f"counts: checks {status.count('pass')} passed, {failed} failed"
        + (f" ({', '.join(broke)})" if broke else "")
        + f", {status.count('skip')} skipped, {status.count('reference path')} reference path"
        f" (of {len(status)} component x check); negative controls {detected}/{len(required)} required detected"
    )
    if not_reached:
        text += f" ({not_reached} not reached)"
    if others:
        text += f", {sum(c.verdict == 'detected' for c in others)}/{len(others)} not required detected"
    if pins:
        text += f"; pin candidates {sum(c.verdict == 'invariant' for c in pins)}/{len(pins)} invariant"
    return text


def properties_line(outcome: SweepOutcome) -> str:
    """``properties: batch-invariant 21/25, deterministic at fixed shape 25/25 (of 25 subjects)``
    and the subjects that have one property and not the other (:mod:`batchinv.harness.properties`):
    batch invariance and determinism at fixed shape are judged apart."""
    from batchinv.harness.properties import BATCH_INVARIANT, DETERMINISTIC, NO, YES, tally

    found = outcome.properties()
    text = f"properties: {tally(found)} (of {len(found)} subject{'' if len(found) == 1 else 's'})"
    only = [
        f"{comp}{'' if subject == 'fast' else f' ({subject})'}"
        for (comp, subject), v in found.items()
        if v[DETERMINISTIC] == YES and v[BATCH_INVARIANT] == NO
    ]
    if only:
        text += f"; deterministic at fixed shape but not batch-invariant: {', '.join(only)}"
    unstable = [
        f"{comp}{'' if subject == 'fast' else f' ({subject})'}"
        for (comp, subject), v in found.items()
        if v[DETERMINISTIC] == NO
    ]
    if unstable:
        text += f"; not deterministic across processes: {', '.join(unstable)}"
    return text


def component_line(name: str, checks: list[CheckSummary], controls: list[ControlSummary], lane: Lane) -> str:
    """One line when a component finishes: its checks' verdicts and its controls' (plain text).

    ``mean: agreement pass, batch_prefix pass, ...; controls: triton_rows_heuristic detected
    (batch_prefix), torch_native inconclusive (not required) [batch-invariant: yes,
    deterministic at fixed shape: yes] [41.2 s]`` (a property none of whose checks ran, or only
    some of them, is ``unknown``)."""
    parts = []
    for c in checks:
        who = "" if c.subject == "fast" else f"{c.subject} "
        status = c.status
        if status in ("fail", "error", "timeout") and c.cases:
            status += f" ({c.failed + c.errors + c.timeouts}/{c.cases})"
        parts.append(f"{who}{c.check} {status}")
    text = f"{name}: " + ", ".join(parts)
    words = []
    for ctrl in controls:
        verdict = ctrl.verdict
        if verdict in ("detected", "varies") and ctrl.where:
            verdict += f" ({ctrl.where.split(' ', 1)[0]})"
        elif verdict == "inconclusive" and not ctrl.expected_to_vary:
            verdict += " (not required)"
        words.append(f"{ctrl.baseline} {verdict}")
    if words:
        text += "; controls: " + ", ".join(words)
    from batchinv.harness.properties import by_subject
    from batchinv.harness.registry import COMPONENT_MODULES, get

    applicable = {name: get(name).applicable_checks()} if name in COMPONENT_MODULES else None
    for (_, subject), found in by_subject(checks, applicable).items():
        who = "" if subject == "fast" else f"{subject}: "
        text += " [" + who + ", ".join(f"{prop}: {verdict}" for prop, verdict in found.items()) + "]"
    seconds = sum(c.seconds for c in checks) + sum(c.seconds for c in controls)
    return text + f" [{seconds:.1f} s]"
