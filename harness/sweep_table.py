"""The tables ``batchinv sweep`` prints: component x check, then the negative controls and pin
candidates, then repro lines and the time (wall, summed over workers, and the compile share)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchinv.harness.lanes import Lane
from batchinv.harness.sweep import SweepOutcome

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


def print_outcome(console: Any, outcome: SweepOutcome, lane: Lane, env: dict[str, Any], report: Path) -> int:
    """Print the tables and the closing lines; return the exit status (0 only if ``outcome.ok``)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"batchinv sweep — lane {lane.value} — {env['device']}")
    numeric = ("rows differing", "worst ULP", "error/bound", "cases", "seconds")
    for col in (
        "component",
        "check",
        "fast",
        *numeric[:3],
        "first difference",
        "negative control",
        *numeric[3:],
    ):
        table.add_column(col, justify="right" if col in numeric else "left")
    for c in outcome.checks:
        if c.check == "agreement":
            nc = "n/a"
        elif c.detected_by:
            nc = "[green]fails on " + ", ".join(dict.fromkeys(c.detected_by)) + "[/]"
        else:
            nc = "-"
        status = f"[{_STYLE[c.status]}]{c.status}[/]"
        if c.status in ("fail", "error", "timeout") and c.cases:
            status += f" ({c.failed + c.errors + c.timeouts}/{c.cases})"
        if c.reference_path and c.status != "reference path":
            status += f" [yellow]({c.reference_path} reference path)[/]"
        if c.skipped and c.status != "skip":
            status += f" [dim]({c.skipped} skipped)[/]"
        table.add_row(
            escape(c.component if c.subject == "fast" else f"{c.component} ({c.subject})"),
            c.check,
            status,
            str(c.rows_differing),
            fmt_ulp(c.worst_ulp),
            "-" if c.worst_bound_ratio is None else f"{c.worst_bound_ratio:.3g}",
            escape(c.first_difference[:60]) or "-",
            nc,
            str(c.cases),
            f"{c.seconds:.1f}",
        )
    console.print(table)
    if outcome.controls:
        ctable = Table(title="negative controls and pin candidates")
        for col in ("component", "baseline", "kind", "verdict", "where", "cases", "seconds"):
            ctable.add_column(col)
        for ctrl in outcome.controls:
            kind = (
                "pin candidate"
                if ctrl.pin_candidate
                else (
                    "negative control" if ctrl.expected_to_vary else "baseline (variance not required here)"
                )
            )
            verdict = ctrl.verdict
            if verdict == "inconclusive" and not ctrl.expected_to_vary:
                verdict_text = "[dim]inconclusive (not required on this lane)[/]"
            elif verdict.startswith("not reached"):
                verdict_text = f"[yellow]{escape(verdict)}[/]"
            else:
                verdict_text = f"[{_VERDICT_STYLE.get(verdict, 'white')}]{verdict}[/]"
            ctable.add_row(
                ctrl.component,
                escape(f"{ctrl.baseline}={ctrl.subject_target}" if ctrl.subject_target else ctrl.baseline),
                kind,
                verdict_text,
                escape(ctrl.where or ctrl.detail[:100]),
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
            f"{len(not_reached)} negative control(s) not reached: the M sweep was cut by --max-m, "
            "so their verdict is unknown (not a failure): "
            + ", ".join(f"{c.component}/{c.baseline}" for c in not_reached),
        )
    for name, lanes in outcome.not_on_lane:
        _line(
            console,
            f"{name}: not run on this lane ({lane.value}); it runs on {', '.join(lanes)} (not a pass, not a failure)",
        )
    _line(console, time_line(outcome))
    _line(console, f"report: {report}")
    if outcome.ok:
        console.print("[green]OK[/]")
        return 0
    failed_controls = sum(c.is_failure for c in outcome.controls)
    timeouts = f", {outcome.timeouts} timed out" if outcome.timeouts else ""
    console.print(
        f"[red]FAILED[/] ({len(outcome.failures)} failing fast checks, {failed_controls} failing controls{timeouts})"
    )
    return 1


def time_line(outcome: SweepOutcome) -> str:
    """``total 41.2 s wall (jobs 12); checks 310.5 s summed over workers; compile 95.1 s in 131
    compilations (31% of check time)``."""
    text = (
        f"total {outcome.wall_seconds:.1f} s wall (jobs {outcome.jobs}); "
        f"checks {outcome.check_seconds:.1f} s summed over workers; "
    )
    stats = outcome.compile
    if not stats.available:
        return text + "compile share: n/a (no Triton compilation on this lane, or no compile listener)"
    share = 100.0 * stats.seconds / outcome.check_seconds if outcome.check_seconds else 0.0
    return text + (
        f"compile {stats.seconds:.1f} s in {stats.compilations} compilations "
        f"({share:.0f}% of check time; {stats.cache_hits} cache hits)"
    )
