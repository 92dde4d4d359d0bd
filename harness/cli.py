"""The ``batchinv`` command: ``sweep``, ``list``, ``repro``, ``bench``, ``audit``, ``report``.

The lane is entered (``TRITON_INTERPRET=1`` on the cpu lane) before any component module, and
so triton, is imported.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from batchinv.fast.versions import UnsupportedVersionError, check_versions
from batchinv.harness.console import wide_console
from batchinv.harness.lanes import Lane, detect_lane, enter_lane, parse_lane
from batchinv.harness.subjects import SubjectError


class UsageError(Exception):
    """A command-line argument the command cannot use; printed without a traceback (exit 2)."""


def _lane(args: argparse.Namespace) -> Lane:
    lane = parse_lane(args.lane) if args.lane else detect_lane()
    if lane.is_gpu:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--lane {lane.value} needs a CUDA GPU and torch sees none; use --lane cpu")
    enter_lane(lane)
    # Before any component (and so triton's kernels) loads: an untested torch or Triton is one
    # clear message, not an error in every check.
    check_versions(interpreter=lane is Lane.CPU)
    return lane


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


MAX_JOBS = 256


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise UsageError(f"--axes: duplicate key(s) {duplicates}")
    return dict(pairs)


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text}")
    return value


def _axes(text: str) -> dict[str, object]:
    try:
        axes = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--axes: expected a JSON object, got {text!r} ({exc.msg})") from None
    if not isinstance(axes, dict):
        raise UsageError(f"--axes: expected a JSON object, got {type(axes).__name__}")
    return axes


def cmd_list(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from batchinv.harness.registry import components

    lane = _lane(args)
    table = Table(title=f"batchinv components (lane {lane.value})")
    from batchinv.harness.sweep import lane_names

    for col in (
        "component",
        "summary",
        "lanes",
        "agreement",
        "checks",
        "baselines",
        f"cases on {lane.value}",
        *(("fast launches (first case)",) if args.launches else ()),
    ):
        table.add_column(col)
    for comp in components(args.components or None):
        kind = type(comp.agreement).__name__.lower()
        baselines = ", ".join(
            b.name + (" (pin candidate)" if b.is_pin_candidate else "") for b in comp.baselines
        )
        n = str(len(comp.cases(lane))) if lane in comp.lanes else "not run on this lane"
        lanes = ", ".join(lane_names(comp.lanes))
        extra = (escape(_first_case_launches(comp, lane)),) if args.launches else ()  # "[name]" is no markup
        table.add_row(
            comp.name, comp.summary, lanes, kind, ", ".join(comp.applicable_checks()), baselines, n, *extra
        )
    console = wide_console()
    console.print(table)
    if not args.no_entry_points:
        _print_entry_points(console, args.components or None)
    return 0


def _first_case_launches(comp: Any, lane: Any) -> str:
    """What ``comp.fast`` launches on its first case of ``lane`` (one real call, recorded by
    :func:`batchinv.harness.provenance.recording`: a dry replay would feed a launcher that reads
    its kernels' outputs on the host unwritten memory)."""
    import torch

    from batchinv.harness import provenance
    from batchinv.harness.build_cache import built
    from batchinv.harness.lanes import lane_device

    cases = comp.cases(lane) if lane in comp.lanes else []
    if not cases:
        return "-"
    try:
        batch = built(comp, cases[0], torch.device(lane_device(lane)))
        with torch.no_grad(), provenance.recording() as rec:
            if comp.fast_path is not None and not comp.fast_path(batch):
                provenance.note(provenance.REFERENCE)
            comp.fast(**batch.kwargs())
    except Exception as exc:  # said, not guessed
        return f"error: {type(exc).__name__}: {exc}"[:200]
    return rec.calls().describe()


def _print_entry_points(console: Any, names: list[str] | None) -> None:
    """The outside subjects packages declare (entry-point group ``batchinv.subjects``)."""
    from rich.markup import escape
    from rich.table import Table

    from batchinv.harness.subjects import ENTRY_POINT_GROUP, entry_point_subjects, resolve_role

    found = entry_point_subjects(names)
    if not found:
        console.print(f"no outside subjects (entry-point group {ENTRY_POINT_GROUP})")
        return
    table = Table(title=f"outside subjects (entry-point group {ENTRY_POINT_GROUP})")
    for col in ("component", "subject", "import path", "role", "package"):
        table.add_column(col)
    for ep in found:
        try:
            role = resolve_role(ep.subject).role
        except SubjectError as exc:
            role = f"[red]cannot import: {escape(str(exc))}[/]"
        table.add_row(ep.component, ep.subject.name, escape(ep.subject.target or ""), role, ep.dist)
    console.print(table)


def _importable_cwd() -> None:
    """Put the working directory on ``sys.path`` (as ``python -m`` does), so that ``--subject
    mymod:fn`` finds a module next to the user; the ``batchinv`` script's own ``sys.path[0]`` is
    its bin directory."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _outside_subjects(args: argparse.Namespace, names: list[str]) -> tuple[list[str], dict[str, list[Any]]]:
    """The sweep's components and outside subjects per component: the ``--subject`` ones (then
    only those), else every entry-point subject of the swept components (unless
    ``--no-entry-points``).  Each is imported and its signature checked against its component's
    before anything runs (a usage error otherwise)."""
    from dataclasses import replace

    from batchinv.harness.registry import get
    from batchinv.harness.subjects import check_signature, entry_point_subjects, parse_spec, resolve_role

    subjects: dict[str, list[Any]] = {}
    if args.subject:
        _importable_cwd()
        declared: dict[str, Any] = {}
        for spec in args.subject:
            if "=" in spec or ":" in spec:
                subject = resolve_role(parse_spec(spec))
                component = subject.component or (names[0] if len(names) == 1 else None)
                if component is None:
                    raise UsageError(
                        f"--subject {spec}: name its component, one of them "
                        f"(batchinv sweep <component> --subject {spec}); got {names or 'none'}"
                    )
                subject = replace(subject, component=component)
            else:
                if not declared:
                    declared = {(e.subject.name): e for e in entry_point_subjects(names or None)}
                if spec not in declared:
                    raise UsageError(
                        f"--subject: expected 'name=pkg.mod:attr' or an entry-point subject "
                        f"({', '.join(sorted(declared)) or 'none declared'}), got {spec!r}"
                    )
                subject = resolve_role(declared[spec].subject)
            subjects.setdefault(subject.component, []).append(subject)
    elif not args.no_entry_points:
        for ep in entry_point_subjects(names or None):
            subjects.setdefault(ep.component, []).append(resolve_role(ep.subject))
    for component, found in subjects.items():
        for i, subject in enumerate(found):
            if args.as_role is not None:
                found[i] = subject = replace(subject, role=args.as_role)
            check_signature(get(component), subject)
    swept = names or (list(subjects) if args.subject else [])
    return swept, subjects


def _report_path(args: argparse.Namespace, lane: Lane) -> Path:
    """The report path, checked writable before anything runs (a usage error otherwise)."""
    path = (
        Path(args.report)
        if args.report
        else Path("reports") / (f"sweep-{lane.value}-{_dt.datetime.now():%Y%m%d-%H%M%S}.jsonl")
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--report: cannot write {str(path)!r} ({exc.strerror or exc})") from None
    if (
        path.is_dir()
        or not os.access(path.parent, os.W_OK)
        or (path.exists() and not os.access(path, os.W_OK))
    ):
        raise UsageError(f"--report: cannot write {str(path)!r} (not a writable file path)")
    return path


def _jobs(args: argparse.Namespace, lane: Lane) -> int:
    from batchinv.harness.sweep import default_jobs

    if args.jobs == "auto":
        return default_jobs()
    try:
        jobs = int(args.jobs)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= MAX_JOBS:
        raise UsageError(f"--jobs: expected 'auto' or an integer in [1, {MAX_JOBS}], got {args.jobs!r}")
    return jobs


def _timeout(args: argparse.Namespace, lane: Lane) -> float | None:
    """The limit on one subject call the run uses (``--timeout``, else the lane's default; None: none)."""
    from batchinv.harness.isolation import default_timeout

    if args.timeout is None:
        return default_timeout(lane)
    return args.timeout if args.timeout > 0 else None


def _seconds(text: str) -> float:
    """``--timeout``: seconds, >= 0 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0 (0: no limit), got {text!r}")
    return value


def add_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help=(
            "limit on one call of a subject (fast, a baseline, --subject); a call past it is a "
            "'timeout' row, a failure, and the run goes on (default: 600 on the cpu lane, 120 on "
            "GPU lanes; 0: no limit)"
        ),
    )


def _selection(args: argparse.Namespace) -> Any:
    """The sweep's profile and checks (``--profile``, ``--checks``, ``--invariance-only``)."""
    from batchinv.harness.profiles import ProfileError, Selection, parse_checks
    from batchinv.harness.registry import INVARIANCE_CHECKS

    if args.checks and args.invariance_only:
        raise UsageError("--checks and --invariance-only: give one of them")
    try:
        checks = parse_checks(args.checks) if args.checks is not None else None
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    if args.invariance_only:
        checks = frozenset(INVARIANCE_CHECKS)
    return Selection(args.profile, checks)


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from batchinv.harness.checks import CheckResult
    from batchinv.harness.registry import CHECKS, components
    from batchinv.harness.report import JsonlReport, environment
    from batchinv.harness.sweep import plan, run_sweep
    from batchinv.harness.sweep_table import component_line

    selection = _selection(args)
    lane = _lane(args)
    console = wide_console()
    if args.as_role is not None and not args.subject:
        raise UsageError("--as: applies to --subject; give one")
    names, subjects = _outside_subjects(args, list(args.components))
    comps = components(names or None)
    if selection.checks is not None and not any(
        set(selection.fast_checks(c)) for c in comps if lane in c.lanes
    ):
        raise UsageError(
            f"--checks {','.join(sorted(selection.checks))}: none of them applies to "
            f"{', '.join(c.name for c in comps)} (`batchinv list` shows each component's checks)"
        )
    only_outside = bool(args.subject)  # --subject: the named subjects alone
    jobs = _jobs(args, lane)
    if lane.is_gpu and jobs > 1:  # the workers read it (harness/cuda_wait.py): refused here first
        from batchinv.harness.cuda_wait import wait_mode

        try:
            wait_mode()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    report_path = _report_path(args, lane)
    env = environment(lane)
    console.print(
        f"[bold]batchinv sweep[/] lane={lane.value} device={env['device']} torch={env['torch']} "
        f"triton={env['triton']} ftz={env['flushes_subnormal_result']} jobs={jobs} "
        f"profile={selection.profile}"
        + (f" checks={','.join(c for c in CHECKS if c in selection.checks)}" if selection.checks else "")
    )
    for comp_name, found in subjects.items():
        for subject in found:
            console.print(
                f"subject {comp_name}/{subject.name} = {subject.target} (as {subject.role})",
                markup=False,
                highlight=False,
            )
    include_baselines = not args.no_baselines and not only_outside
    tasks = plan(
        comps,
        lane,
        subjects=subjects,
        include_fast=not only_outside,
        include_baselines=include_baselines,
        selection=selection,
    )
    swept = [c.name for c in comps if lane in c.lanes]
    try:
        with (
            JsonlReport(report_path) as report,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
                disable=args.no_progress,
            ) as progress,
        ):
            report.write(
                "header",
                {
                    **env,
                    "jobs": jobs,
                    "max_m": args.max_m,
                    "timeout": _timeout(args, lane),
                    "profile": selection.profile,
                    "checks": sorted(selection.checks) if selection.checks else None,
                    "subjects": {c: [s.spec for s in found] for c, found in subjects.items()},
                },
            )
            bar = progress.add_task("sweep", total=len(tasks))
            finished: list[str] = []

            def on_result(r: CheckResult) -> None:
                report.check(r)
                at = f"[{len(finished) + 1}/{len(swept)}]"
                progress.update(bar, advance=1, description=f"{at} {r.component}: {r.subject} {r.check}")
                if r.status in ("fail", "error", "timeout") and not (r.negative_control or r.pin_candidate):
                    who = r.component if r.subject == "fast" else f"{r.component}/{r.subject}"
                    progress.console.print(
                        f"{r.status.upper()} {who} {r.check} {r.case}: {r.detail}",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
                    _print_repro(progress.console, "  repro: " + r.repro)

            def on_component(name: str, checks: Any, controls: Any) -> None:
                finished.append(name)
                _print_repro(progress.console, component_line(name, checks, controls, lane))

            outcome = run_sweep(
                comps,
                lane,
                on_result=on_result,
                on_skip=lambda n: progress.update(bar, advance=n),
                on_component=on_component,
                selection=selection,
                m_limit=args.max_m,
                include_baselines=include_baselines,
                jobs=jobs,
                subjects=subjects,
                include_fast=not only_outside,
                timeout=args.timeout,
            )
            report.write("summary", outcome.summary())
    except KeyboardInterrupt:
        print(f"\ninterrupted; the partial report is {report_path}", file=sys.stderr)
        return 130
    from batchinv.harness.sweep_table import print_outcome

    return print_outcome(console, outcome, lane, env, report_path)


def _print_repro(console: object, line: str) -> None:
    """A repro line on one physical line, whatever the width, with no markup interpretation."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)  # type: ignore[attr-defined]


def _validated_case(comp: Any, lane: Lane, axes: dict[str, Any], seed: int, check: str) -> Any:
    """The repro's case, or a usage error naming the bad key: the axis keys must be exactly
    those of the component's cases, each value of the type those cases use, and the case must
    build; the check must be one that applies to the component."""
    from batchinv.harness.lanes import lane_device
    from batchinv.harness.registry import CHECKS, Case

    if check not in CHECKS:
        raise UsageError(f"--check: expected one of {', '.join(CHECKS)}; got {check!r}")
    if check not in comp.applicable_checks():
        raise UsageError(
            f"--check: {check!r} does not apply to {comp.name} (its checks: {', '.join(comp.applicable_checks())})"
        )
    known: dict[str, set[type]] = {}
    seen: dict[str, list[Any]] = {}
    for some_lane in Lane:
        for case in comp.cases(some_lane):
            for key, value in case.axes.items():
                known.setdefault(key, set()).add(type(value))
                seen.setdefault(key, []).append(value)
    unknown = sorted(set(axes) - set(known))
    missing = sorted(set(known) - set(axes))
    if unknown:
        raise UsageError(f"--axes: unknown key(s) {unknown} for {comp.name}; its keys: {sorted(known)}")
    if missing:
        raise UsageError(f"--axes: missing key(s) {missing} for {comp.name}; its keys: {sorted(known)}")
    for key, value in axes.items():
        if type(value) not in known[key]:
            wanted = " or ".join(sorted(t.__name__ for t in known[key]))
            raise UsageError(f"--axes: key {key!r} expects {wanted}, got {type(value).__name__} {value!r}")
        _check_axis_value(key, value, seen[key])
    case = Case(comp.name, axes, seed)
    import torch

    try:
        comp.build(case, torch.device(lane_device(lane)))
    except Exception as exc:  # the builder's own message names the axis and the accepted range
        raise UsageError(f"--axes: {comp.name} cannot build this case: {exc}") from None
    return case


def _leaves(value: Any) -> list[Any]:
    return [x for v in value for x in _leaves(v)] if isinstance(value, list) else [value]


def _check_axis_value(key: str, value: Any, seen: list[Any]) -> None:
    """The value of ``key`` against the registered cases' values: a string must be one of theirs
    (a builder may read an unknown one as its default), list items of their types, and numbers
    in their sign range (positive where every registered value is; sizes, k, counts)."""
    if isinstance(value, str):
        names = sorted({v for v in seen if isinstance(v, str)})
        if value not in names:
            raise UsageError(f"--axes: key {key!r} expects one of {names}, got {value!r}")
        return
    leaves, seen_leaves = _leaves(value), [x for v in seen for x in _leaves(v)]
    types = {type(x) for x in seen_leaves}
    for item in leaves:
        if type(item) not in types:
            wanted = " or ".join(sorted(t.__name__ for t in types))
            raise UsageError(f"--axes: key {key!r} expects items of {wanted}, got {item!r}")
        numbers = [x for x in seen_leaves if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if isinstance(item, (int, float)) and not isinstance(item, bool) and numbers:
            if min(numbers) > 0 and not item > 0:
                raise UsageError(f"--axes: key {key!r} expects a value > 0, got {item!r}")
            if min(numbers) >= 0 and not item >= 0:
                raise UsageError(f"--axes: key {key!r} expects a value >= 0, got {item!r}")


def cmd_repro(args: argparse.Namespace) -> int:
    from batchinv.harness.checks import FAST, run_check
    from batchinv.harness.registry import get

    lane = _lane(args)
    comp = get(args.component)
    subject: Any = args.subject
    if "=" in args.subject or ":" in args.subject:  # an outside subject, re-imported
        from dataclasses import replace

        from batchinv.harness.subjects import check_signature, parse_spec, resolve_role

        _importable_cwd()
        subject = resolve_role(parse_spec(args.subject, component=comp.name))
        if args.as_role is not None:
            subject = replace(subject, role=args.as_role)
        check_signature(comp, subject)
    elif args.subject != FAST:
        try:
            comp.baseline(args.subject)
        except KeyError:
            names = [FAST, *(b.name for b in comp.baselines)]
            raise UsageError(
                f"--subject: expected one of {names} or 'name=pkg.mod:attr', got {args.subject!r}"
            ) from None
    case = _validated_case(comp, lane, _axes(args.axes), args.seed, args.check)
    r = run_check(comp, subject, args.check, case, lane, m_limit=args.max_m, timeout=args.timeout)
    print(f"{r.component} {r.subject} {r.check} [{r.case}] lane={lane.value}: {r.status.upper()}")
    if r.where:
        print("  where: " + ", ".join(r.where))
    if r.first_difference:
        print(f"  first difference: {r.first_difference}")
    if r.detail:
        print(f"  {r.detail}")
    if r.launches:
        from batchinv.harness.provenance import lines

        print("  launched:")
        for line in lines(r.launches):
            print(f"    {line}")
    return 0 if r.status in ("pass", "skip", "reference path") else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from batchinv.harness.bench import main as bench_main
    from batchinv.harness.registry import components

    lane = _lane(args)
    components(args.components or None)  # unknown names: a usage error before anything runs
    if not lane.is_gpu:
        print(
            "batchinv bench needs a GPU lane (CUDA graphs and events); this is the cpu lane: nothing timed.",
            file=sys.stderr,
        )
        return 3
    return bench_main(lane, args.components, Path(args.out) if args.out else None, args.reps)


def cmd_audit(args: argparse.Namespace) -> int:
    lane = _lane(args)
    if args.target != "cublas":
        raise UsageError(f"audit: expected target 'cublas', got {args.target!r}")
    if not lane.is_gpu:
        print(
            "batchinv audit cublas needs a GPU lane (cuBLAS); this is the cpu lane: nothing audited.\n"
            "A dry run of the audit's plumbing on the CPU BLAS, writing nothing: "
            f"{sys.executable} -m batchinv.harness.cublas_audit --lane cpu --no-save",
            file=sys.stderr,
        )
        return 3
    from batchinv.harness.cublas_audit import main as audit_main

    return audit_main(["--lane", lane.value, *args.rest])


def _latest_report(folder: Path = Path("reports")) -> Path:
    """The newest ``sweep-*.jsonl`` in ``folder`` (where ``batchinv sweep`` writes by default)."""
    found = sorted(folder.glob("sweep-*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if not found:
        raise UsageError(
            f"report: no report given and no {folder}/sweep-*.jsonl to take (run `batchinv sweep` "
            "first, or name a JSON-lines report)"
        )
    return found[-1]


def cmd_report(args: argparse.Namespace) -> int:
    """Render a JSON-lines report (a sweep's or a pytest run's) as one self-contained HTML page."""
    import importlib.util

    from batchinv.harness.html_report import ReportError, write

    if importlib.util.find_spec("matplotlib") is None:
        print(
            "batchinv report draws its plots with matplotlib, which is not installed: "
            "pip install 'batchinv[report]' (or matplotlib)",
            file=sys.stderr,
        )
        return 3
    path = Path(args.jsonl) if args.jsonl else _latest_report()
    if not path.is_file():
        raise UsageError(f"report: expected a JSON-lines report file, got {str(path)!r} (no such file)")
    bench = Path(args.bench) if args.bench else None
    if bench is not None and not bench.is_file():
        raise UsageError(f"--bench: expected a bench report (.json) file, got {str(bench)!r} (no such file)")
    try:
        out = write(path, Path(args.out) if args.out else None, bench)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(
            f"--out: cannot write {args.out or path.with_suffix('.html')!s} ({exc.strerror or exc})"
        ) from None
    print(f"report: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from batchinv.harness.profiles import DEFAULT_PROFILE, PROFILES
    from batchinv.harness.registry import CHECKS

    parser = argparse.ArgumentParser(prog="batchinv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_lane(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lane", choices=[lane.value for lane in Lane], help="force a lane (default: detect)")

    def add_subject_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--subject",
            action="append",
            default=[],
            metavar="NAME=PKG.MOD:ATTR",
            help=(
                "sweep your own kernel: a callable with the component's signature (or a "
                "batchinv.harness.subjects.declare(...) with an Adapter), or the name of an "
                "entry-point subject; repeatable; then only the named subjects run"
            ),
        )
        p.add_argument(
            "--as",
            dest="as_role",
            choices=["fast", "baseline"],
            default=None,
            help=(
                "run the --subject(s) as 'fast' (agreement and every invariance check) or as a "
                "'baseline' (a negative control: it must vary); default: the declared role, else fast"
            ),
        )

    p = sub.add_parser("sweep", help="run every registered component's checks on this lane")
    p.add_argument("components", nargs="*", help="only these components (default: all)")
    add_lane(p)
    p.add_argument("--report", help="JSON-lines report path (default: reports/sweep-<lane>-<time>.jsonl)")
    p.add_argument("--max-m", type=_positive_int, default=None, help="cut the M sweep at this many rows")
    p.add_argument("--no-baselines", action="store_true", help="skip negative controls and pin candidates")
    p.add_argument(
        "--profile",
        choices=list(PROFILES),
        default=DEFAULT_PROFILE,
        help=(
            "which cases: 'quick' (default; on the cpu lane the fast kernel runs every check on the "
            "component's quick cases; on every lane every required negative control runs as in full "
            "and the baselines that decide nothing there run on the quick cases without "
            "cross_process; GPU lanes keep every case of the fast kernel), or 'full' (every case of "
            "every subject)"
        ),
    )
    p.add_argument(
        "--checks",
        default=None,
        metavar="CHECK,CHECK",
        help=f"only these checks, comma-separated ({', '.join(CHECKS)})",
    )
    p.add_argument(
        "--invariance-only",
        action="store_true",
        help="every invariance check, no agreement (a kernel knowingly not correctly rounded)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_timeout(p)
    p.add_argument(
        "--jobs",
        default="auto",
        help="worker processes ('auto': one per core, at most 12; 1: run in this process)",
    )
    add_subject_options(p)
    p.add_argument(
        "--no-entry-points",
        action="store_true",
        help="leave out the subjects packages declare in the entry-point group batchinv.subjects",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("list", help="list registered components and outside subjects (entry points)")
    p.add_argument("components", nargs="*")
    p.add_argument("--no-entry-points", action="store_true", help="leave out the entry-point subjects")
    p.add_argument(
        "--launches",
        action="store_true",
        help="add what fast launches on its first case (kernels, execution names, constexprs): one call each",
    )
    add_lane(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("repro", help="re-run exactly one check on exactly one case")
    p.add_argument("component")
    p.add_argument("--check", required=True)
    p.add_argument(
        "--subject", default="fast", help="'fast', a baseline name, or an outside subject 'name=pkg.mod:attr'"
    )
    p.add_argument(
        "--as",
        dest="as_role",
        choices=["fast", "baseline"],
        default=None,
        help="an outside subject's role (its declared one, else fast)",
    )
    p.add_argument("--seed", type=_seed, required=True)
    p.add_argument("--axes", required=True, help="the case's axes as JSON")
    p.add_argument("--max-m", type=_positive_int, default=None)
    add_timeout(p)
    add_lane(p)
    p.set_defaults(func=cmd_repro)

    p = sub.add_parser("bench", help="CUDA-graph + event timing of fast vs baselines (GPU lanes)")
    p.add_argument("components", nargs="*")
    p.add_argument("--out", help="write JSON and markdown results with this path prefix")
    p.add_argument("--reps", type=_positive_int, default=50, help="timed graph replays per point (median)")
    add_lane(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "report", help="render a JSON-lines report (sweep or pytest --batchinv-report) as one HTML page"
    )
    p.add_argument(
        "jsonl", nargs="?", help="the JSON-lines report (default: the newest reports/sweep-*.jsonl)"
    )
    p.add_argument("--bench", help="a bench report to add (the .json of `batchinv bench --out PREFIX`)")
    p.add_argument("-o", "--out", help="the HTML file to write (default: the report's path with .html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("audit", help="audit library pins (target: cublas)")
    p.add_argument("target")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="AUDIT_ARGS", help="arguments for the audit")
    add_lane(p)
    p.set_defaults(func=cmd_audit)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 ok; 1 a check failed; 2 a usage error (the message names the option or
    key); 3 the command cannot run on this lane, or with the installed torch / Triton (/ numpy
    on the cpu lane): the message names the version found and the tested range; 130
    interrupted (Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (KeyError, UsageError) as exc:
        print(f"batchinv: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except SubjectError as exc:
        print(f"batchinv: {exc}", file=sys.stderr)
        return 2
    except UnsupportedVersionError as exc:
        print(f"batchinv: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("\nbatchinv: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
