"""The ``batchinv`` command: ``sweep``, ``list``, ``repro``, ``bench``, ``audit``.

The lane is entered (``TRITON_INTERPRET=1`` on the cpu lane) before any component module, and
so triton, is imported.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from batchinv.harness.console import wide_console
from batchinv.harness.lanes import Lane, detect_lane, enter_lane, parse_lane


class UsageError(Exception):
    """A command-line argument the command cannot use; printed without a traceback (exit 2)."""


def _lane(args: argparse.Namespace) -> Lane:
    lane = parse_lane(args.lane) if args.lane else detect_lane()
    if lane.is_gpu:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--lane {lane.value} needs a CUDA GPU and torch sees none; use --lane cpu")
    enter_lane(lane)
    return lane


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _axes(text: str) -> dict[str, object]:
    try:
        axes = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--axes: expected a JSON object, got {text!r} ({exc.msg})") from None
    if not isinstance(axes, dict):
        raise UsageError(f"--axes: expected a JSON object, got {type(axes).__name__}")
    return axes


def _fmt_ulp(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value:g}"


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from batchinv.harness.registry import components

    lane = _lane(args)
    table = Table(title=f"batchinv components (lane {lane.value})")
    for col in ("component", "summary", "agreement", "checks", "baselines", f"cases on {lane.value}"):
        table.add_column(col)
    for comp in components(args.components or None):
        kind = type(comp.agreement).__name__.lower()
        baselines = ", ".join(
            b.name + (" (pin candidate)" if b.is_pin_candidate else "") for b in comp.baselines
        )
        n = len(comp.cases(lane)) if lane in comp.lanes else 0
        table.add_row(comp.name, comp.summary, kind, ", ".join(comp.applicable_checks()), baselines, str(n))
    wide_console().print(table)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from batchinv.harness.checks import CheckResult
    from batchinv.harness.registry import components
    from batchinv.harness.report import JsonlReport, environment
    from batchinv.harness.sweep import plan, run_sweep

    lane = _lane(args)
    console = wide_console()
    comps = components(args.components or None)
    env = environment(lane)
    console.print(
        f"[bold]batchinv sweep[/] lane={lane.value} device={env['device']} torch={env['torch']} "
        f"triton={env['triton']} ftz={env['flushes_subnormal_result']}"
    )
    report_path = (
        Path(args.report)
        if args.report
        else Path("reports") / (f"sweep-{lane.value}-{_dt.datetime.now():%Y%m%d-%H%M%S}.jsonl")
    )
    tasks = plan(comps, lane)
    with (
        JsonlReport(report_path) as report,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=args.no_progress,
        ) as progress,
    ):
        report.write("header", env)
        bar = progress.add_task("sweep", total=len(tasks))

        def on_result(r: CheckResult) -> None:
            report.check(r)
            progress.update(bar, advance=1, description=f"{r.component} {r.subject} {r.check}")
            if r.status in ("fail", "error") and not (r.negative_control or r.pin_candidate):
                progress.console.print(
                    f"[red]{r.status.upper()}[/] {r.component} {r.check} {r.case}: {r.detail}"
                )
                progress.console.print(f"  repro: {r.repro}")

        outcome = run_sweep(
            comps,
            lane,
            on_result=on_result,
            on_skip=lambda n: progress.update(bar, advance=n),
            m_limit=args.max_m,
            include_baselines=not args.no_baselines,
        )
        report.write(
            "summary",
            {
                "ok": outcome.ok,
                "checks": [vars(c) for c in outcome.checks],
                "controls": [vars(c) for c in outcome.controls],
            },
        )

    table = Table(title=f"batchinv sweep — lane {lane.value} — {env['device']}")
    for col in (
        "component",
        "check",
        "fast",
        "rows differing",
        "worst ULP",
        "negative control",
        "cases",
        "seconds",
    ):
        table.add_column(
            col, justify="right" if col in ("rows differing", "worst ULP", "cases", "seconds") else "left"
        )
    style = {"pass": "green", "fail": "red", "error": "red", "skip": "dim", "reference path": "yellow"}
    for c in outcome.checks:
        if c.check == "agreement":
            nc = "n/a"
        elif c.detected_by:
            nc = "[green]fails on " + ", ".join(dict.fromkeys(c.detected_by)) + "[/]"
        else:
            nc = "-"
        status = f"[{style[c.status]}]{c.status}[/]"
        if c.status in ("fail", "error") and c.cases:
            status += f" ({c.failed + c.errors}/{c.cases})"
        if c.reference_path and c.status != "reference path":
            status += f" [yellow]({c.reference_path} reference path)[/]"
        table.add_row(
            c.component,
            c.check,
            status,
            str(c.rows_differing),
            _fmt_ulp(c.worst_ulp),
            nc,
            str(c.cases),
            f"{c.seconds:.1f}",
        )
    console.print(table)
    if outcome.controls:
        ctable = Table(title="negative controls and pin candidates")
        for col in ("component", "baseline", "kind", "verdict", "where", "cases", "seconds"):
            ctable.add_column(col)
        vstyle = {
            "detected": "green",
            "invariant": "cyan",
            "varies": "yellow",
            "inconclusive": "red",
            "error": "red",
        }
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
            else:
                verdict_text = f"[{vstyle.get(verdict, 'white')}]{verdict}[/]"
            ctable.add_row(
                ctrl.component,
                ctrl.baseline,
                kind,
                verdict_text,
                ctrl.where or ctrl.detail[:80],
                str(ctrl.cases),
                f"{ctrl.seconds:.1f}",
            )
        console.print(ctable)
    for ctrl in outcome.controls:
        if ctrl.repro and ctrl.verdict in ("detected", "varies"):
            console.print(
                f"{ctrl.component}/{ctrl.baseline} {ctrl.verdict}; repro: {ctrl.repro}", soft_wrap=True
            )
    for ctrl in outcome.controls:
        if ctrl.is_failure:
            console.print(
                f"[red]INCONCLUSIVE[/] negative control {ctrl.component}/{ctrl.baseline}: no check failed on a "
                f"baseline that must vary on lane {lane.value}; the harness has lost its teeth here."
            )
    console.print(f"report: {report_path}")
    console.print(
        "[green]OK[/]" if outcome.ok else f"[red]FAILED[/] ({len(outcome.failures)} failing fast checks)"
    )
    return 0 if outcome.ok else 1


def cmd_repro(args: argparse.Namespace) -> int:
    from batchinv.harness.checks import run_check
    from batchinv.harness.registry import Case, get

    lane = _lane(args)
    comp = get(args.component)
    case = Case(comp.name, _axes(args.axes), args.seed)
    r = run_check(comp, args.subject, args.check, case, lane, m_limit=args.max_m)
    print(f"{r.component} {r.subject} {r.check} [{r.case}] lane={lane.value}: {r.status.upper()}")
    if r.where:
        print("  where: " + ", ".join(r.where))
    if r.detail:
        print(f"  {r.detail}")
    return 0 if r.status in ("pass", "skip", "reference path") else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from batchinv.harness.bench import main as bench_main

    lane = _lane(args)
    return bench_main(lane, args.components, Path(args.out) if args.out else None, args.reps)


def cmd_audit(args: argparse.Namespace) -> int:
    lane = _lane(args)
    if args.target != "cublas":
        print(f"audit: expected target 'cublas', got {args.target!r}", file=sys.stderr)
        return 2
    if not lane.is_gpu:
        print(
            "batchinv audit cublas needs a GPU lane (cuBLAS); this is the cpu lane: nothing to audit.\n"
            "A dry run of the audit's plumbing on the CPU BLAS, writing nothing: "
            "python -m batchinv.harness.cublas_audit --lane cpu --no-save"
        )
        return 0
    from batchinv.harness.cublas_audit import main as audit_main

    return audit_main(["--lane", lane.value, *args.rest])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchinv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_lane(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lane", choices=[lane.value for lane in Lane], help="force a lane (default: detect)")

    p = sub.add_parser("sweep", help="run every registered component's checks on this lane")
    p.add_argument("components", nargs="*", help="only these components (default: all)")
    add_lane(p)
    p.add_argument("--report", help="JSON-lines report path (default: reports/sweep-<lane>-<time>.jsonl)")
    p.add_argument("--max-m", type=_positive_int, default=None, help="cut the M sweep at this many rows")
    p.add_argument("--no-baselines", action="store_true", help="skip negative controls and pin candidates")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("list", help="list registered components")
    p.add_argument("components", nargs="*")
    add_lane(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("repro", help="re-run exactly one check on exactly one case")
    p.add_argument("component")
    p.add_argument("--check", required=True)
    p.add_argument("--subject", default="fast", help="'fast' or a baseline name")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--axes", required=True, help="the case's axes as JSON")
    p.add_argument("--max-m", type=_positive_int, default=None)
    add_lane(p)
    p.set_defaults(func=cmd_repro)

    p = sub.add_parser("bench", help="CUDA-graph + event timing of fast vs baselines (GPU lanes)")
    p.add_argument("components", nargs="*")
    p.add_argument("--out", help="write JSON and markdown results with this path prefix")
    p.add_argument("--reps", type=int, default=50, help="timed graph replays per point (median)")
    add_lane(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("audit", help="audit library pins (target: cublas)")
    p.add_argument("target")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the audit")
    add_lane(p)
    p.set_defaults(func=cmd_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (KeyError, UsageError) as exc:
        print(f"batchinv: {exc.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
