"""``batchinv report``: one self-contained HTML page from a JSON-lines report.

The input is what ``batchinv sweep --report PATH`` writes (:mod:`batchinv.harness.report`: a
header, one ``check`` row per check, a closing summary) or what a pytest run writes with
``--batchinv-report PATH`` (the same rows, each with the test's node id); optionally a bench
report (the ``.json`` that ``batchinv bench --out PREFIX`` writes).  The page needs no server and
no network: the plots are matplotlib SVG inlined in the page, the styles and the one small
script (the repro lines' copy buttons) are in it too.

Sections: the run (lane, device, versions, flush-to-zero probe, date, git revision); the
component x check matrix, each cell coloured by its verdict and linking to its cases (failing
ones first, each with its detail, first difference and repro line); per failing invariance
check, a heatmap of the rows (or requests) whose bits changed at each sweep point (M, co-batch
size, offset...) with the first differing (row, col) and both values in hex; per toleranced
agreement, the worst error over the bound per case; the negative controls with their verdict
and the check that caught them; the bench's fast / baseline ratios with the floor.  The
figures are drawn by :mod:`batchinv.harness.report_plots`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchinv.harness.report_plots import bench_svg, bound_ratio_svg, heatmap_svg

#: Verdict order of a matrix cell: the first status any of its cases has wins.
STATUS_ORDER = ("error", "timeout", "fail", "pass", "reference path", "skip")
#: Failing cases drawn per matrix cell (the others are listed, not drawn).
MAX_HEATMAPS_PER_CELL = 6


class ReportError(ValueError):
    """A file that is not a batchinv JSON-lines report (or bench report); the message says why."""


@dataclass
class Report:
    """A JSON-lines report, read: its header, its check rows, its summary (None: the run did not
    finish, or a pytest run's)."""

    header: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    source: str = ""
    bench: dict[str, Any] | None = None
    extra: list[str] = field(default_factory=list)


def load(path: Path, bench: Path | None = None) -> Report:
    """Read ``path`` (and the bench report ``bench``) into a :class:`Report`; a ``.gz`` path
    is read decompressed.

    Raises:
        ReportError: ``path`` holds no header nor check row (not a batchinv report), or
            ``bench`` is not a bench report (no ``points`` list).
    """
    from batchinv.harness.report import read_report

    try:
        if path.suffix == ".gz":  # a committed device run's report (docs/device-runs/)
            import gzip

            lines = gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()
            records = []
            for line in lines:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a truncated last line, as read_report
                    break
        else:
            records = read_report(path)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ReportError(f"report: cannot read {str(path)!r} ({exc})") from None
    header = next((r for r in records if isinstance(r, dict) and r.get("kind") == "header"), None)
    rows = [r for r in records if isinstance(r, dict) and r.get("kind") == "check"]
    summary = next((r for r in records if isinstance(r, dict) and r.get("kind") == "summary"), None)
    if header is None and not rows:
        raise ReportError(
            f"report: expected a batchinv JSON-lines report (a header line, check rows), "
            f"got {len(records)} record(s) of neither kind in {str(path)!r}"
        )
    report = Report(header or {}, rows, summary, source=str(path))
    if bench is not None:
        try:
            data = json.loads(bench.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ReportError(f"--bench: cannot read {str(bench)!r} as JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            raise ReportError(
                f"--bench: expected the JSON `batchinv bench --out PREFIX` writes "
                f"({{'environment': ..., 'points': [...]}}), got {type(data).__name__} in {str(bench)!r}"
            )
        report.bench = data
    return report


def write(path: Path, out: Path | None = None, bench: Path | None = None) -> Path:
    """Render the report at ``path`` (and ``bench``) to ``out`` (default: ``path`` with the
    suffix ``.html``); returns the path written.  Raises :class:`ReportError` (see :func:`load`)."""
    report = load(path, bench)
    target = out if out is not None else path.with_suffix(".html")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(report), encoding="utf-8")
    return target


# --- the page ---------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _slug(*parts: str) -> str:
    text = "-".join(parts)
    return "c-" + "".join(ch if ch.isalnum() else "-" for ch in text)


def _num(value: Any, fmt: str = "{:.3g}") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        return value
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _properties() -> tuple[Sequence[str], Any]:
    """The property names and their judge (:mod:`batchinv.harness.properties`; none without the
    registry, which imports torch)."""
    try:
        from batchinv.harness.properties import PROPERTIES, verdicts
    except Exception:  # pragma: no cover - as _check_order
        return (), lambda statuses: {}
    return tuple(PROPERTIES), verdicts


def _check_order() -> tuple[str, ...]:
    try:
        from batchinv.harness.registry import CHECKS
    except Exception:  # pragma: no cover - the registry imports torch; a report needs no kernel
        return ()
    return CHECKS


def _is_control(row: Mapping[str, Any]) -> bool:
    return bool(row.get("negative_control") or row.get("pin_candidate"))


def _who(row: Mapping[str, Any]) -> str:
    subject = row.get("subject", "fast")
    return row["component"] if subject == "fast" else f"{row['component']}/{subject}"


def cell_status(rows: Sequence[Mapping[str, Any]]) -> str:
    """The verdict of one matrix cell: the first of :data:`STATUS_ORDER` any row has."""
    statuses = {r.get("status") for r in rows}
    return next((s for s in STATUS_ORDER if s in statuses), "skip")


def _cell_text(rows: Sequence[Mapping[str, Any]]) -> str:
    status = cell_status(rows)
    judged = [r for r in rows if r.get("status") != "skip"]
    if status in ("fail", "error", "timeout"):
        bad = sum(r.get("status") == status for r in rows)
        return f"{status} {bad}/{len(judged)}"
    if status == "skip":
        return f"skip {len(rows)}"
    return f"{status} {len(judged)}"


CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-bottom: .3em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.cell a { color: inherit; text-decoration: none; display: block; }
.property.yes { background: #c8e6c9; } .property.no { background: #ffcdd2; } .property.unknown { color: #777; }
.pass { background: #c8e6c9; } .fail { background: #ffcdd2; } .error { background: #ff8a80; }
.timeout { background: #ffe0b2; } .skip { background: #eeeeee; color: #666; }
.reference-path { background: #bbdefb; } .na { background: #fff; color: #bbb; }
.detected, .invariant { background: #c8e6c9; } .inconclusive, .varies { background: #fff9c4; }
.banner { padding: .6em 1em; font-size: 1.2em; font-weight: bold; display: inline-block; }
.repro { display: flex; gap: .4em; align-items: flex-start; margin: .2em 0 .6em 0; }
.repro pre { margin: 0; padding: 3px 6px; background: #f6f6f6; border: 1px solid #ddd;
  white-space: pre-wrap; word-break: break-all; user-select: all; flex: 1; font-size: 12px; }
button.copy { font-size: 12px; }
.hex { font-family: ui-monospace, monospace; }
.case { border-left: 4px solid #ccc; padding-left: .6em; margin: .6em 0; }
.case.fail, .case.error, .case.timeout { border-left-color: #d32f2f; background: none; }
.figure svg { max-width: 100%; height: auto; }
.small { color: #666; font-size: 12px; }
"""

SCRIPT = """
(function () {
  function select(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest ? ev.target.closest("button.copy") : null;
    if (!button) { return; }
    var pre = button.parentNode.querySelector("pre");
    select(pre);
    var done = function () {
      button.textContent = "copied";
      setTimeout(function () { button.textContent = "copy"; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(pre.textContent).then(done, function () {});
    }
  });
  document.documentElement.setAttribute("data-ready", "1");
})();
"""


def _repro(line: str) -> str:
    if not line:
        return ""
    return f'<div class="repro"><pre>{_e(line)}</pre><button class="copy" type="button">copy</button></div>'


def render(report: Report) -> str:
    """The whole page, as one HTML string (nothing it refers to lives outside it)."""
    rows = report.rows
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>batchinv report — {_e(report.header.get('lane', '?'))}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>batchinv report</h1>",
        _banner(report),
        _run_section(report),
        _matrix_section(rows),
        _invariance_section(rows),
        _agreement_section(rows),
        _controls_section(report),
    ]
    if report.bench is not None:
        parts.append(_bench_section(report.bench))
    parts.append(_cases_section(rows))
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(p for p in parts if p)


def _banner(report: Report) -> str:
    rows = report.rows
    fast = [r for r in rows if not _is_control(r)]
    failed = [r for r in fast if r.get("status") in ("fail", "error", "timeout")]
    counts: dict[str, int] = {}
    for r in fast:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    ok: bool | None
    if report.summary is not None and "ok" in report.summary:
        ok = bool(report.summary["ok"])
    else:
        ok = None if not fast else not failed
    if ok is None:
        text, css = "INCOMPLETE (no summary: the run did not finish)", "timeout"
    else:
        text, css = ("OK", "pass") if ok else ("FAILED", "fail")
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return (
        f'<div class="banner {css}" id="verdict">{_e(text)}</div>'
        f"<p>{len(fast)} checks of subjects ({_e(tally) or 'none'}); "
        f"{sum(_is_control(r) for r in rows)} rows of negative controls and pin candidates.</p>"
    )


def _run_section(report: Report) -> str:
    h = report.header
    s = report.summary or {}
    ftz = (
        f"operand {_e(h.get('flushes_subnormal_operand', '?'))}, result {_e(h.get('flushes_subnormal_result', '?'))}"
        if "flushes_subnormal_result" in h or "flushes_subnormal_operand" in h
        else "not recorded"
    )
    items = [
        ("source", h.get("source") or ("pytest run" if s.get("source") == "pytest" else "batchinv sweep")),
        ("report", report.source),
        ("lane", h.get("lane")),
        ("device", h.get("device")),
        ("SMs", h.get("sm_count")),
        ("capability", h.get("capability")),
        ("python", h.get("python")),
        ("torch", h.get("torch")),
        ("triton", h.get("triton")),
        ("CUDA", h.get("cuda")),
        ("flush-to-zero probe", None),
        ("date", h.get("date")),
        ("git revision", h.get("git_revision") or "not recorded"),
        ("git tree", h.get("git_tree") or "not recorded"),
        ("jobs", h.get("jobs")),
        ("--max-m", h.get("max_m")),
        ("timeout (s)", h.get("timeout")),
        ("wall seconds", _num(s.get("wall_seconds"), "{:.1f}") if s else None),
    ]
    out = ['<h2 id="run">The run</h2><table>']
    for key, value in items:
        if key == "flush-to-zero probe":
            out.append(f"<tr><th>{key}</th><td>{ftz}</td></tr>")
        elif value not in (None, ""):
            out.append(f"<tr><th>{_e(key)}</th><td>{_e(value)}</td></tr>")
    out.append("</table>")
    not_on_lane = s.get("not_on_lane") or []
    if not_on_lane:
        names = ", ".join(f"{x['component']} ({', '.join(x['lanes'])})" for x in not_on_lane)
        out.append(f"<p>Not run on this lane: {_e(names)}.</p>")
    return "\n".join(out)


def _group(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]]:
    """Subject rows (not controls) by (component, subject) then check, in first-seen order."""
    out: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = {}
    for r in rows:
        if _is_control(r):
            continue
        out.setdefault((r["component"], r.get("subject", "fast")), {}).setdefault(r["check"], []).append(r)
    return out


def _columns(groups: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    seen = {c for checks in groups.values() for c in checks}
    order = [c for c in _check_order() if c in seen]
    return order + sorted(seen - set(order))


def _matrix_section(rows: Sequence[Mapping[str, Any]]) -> str:
    groups = _group(rows)
    if not groups:
        return '<h2 id="matrix">Component x check</h2><p>No check of a subject in this report.</p>'
    properties, property_verdicts = _properties()
    cols = _columns(groups)
    out = [
        '<h2 id="matrix">Component x check</h2>',
        '<p class="small">Each cell: the verdict over the cases (failing / judged); click it for its cases and repro lines. '
        "The last two columns judge the two properties apart: batch-invariant (every batch-invariance check "
        "passed) and deterministic at fixed shape (cross_process passed); unknown: not every one of their "
        "checks ran and passed.</p>",
        '<table id="matrix-table"><tr><th>component</th>'
        + "".join(f"<th>{_e(c)}</th>" for c in cols)
        + "".join(f'<th class="property">{_e(p)}</th>' for p in properties)
        + "</tr>",
    ]
    for (comp, subject), checks in groups.items():
        name = comp if subject == "fast" else f"{comp}/{subject}"
        cells = [f"<th>{_e(name)}</th>"]
        for c in cols:
            found = checks.get(c)
            if not found:
                cells.append('<td class="na">-</td>')
                continue
            status = cell_status(found)
            cells.append(
                f'<td class="cell {status.replace(" ", "-")}" data-status="{_e(status)}">'
                f'<a href="#{_slug(comp, subject, c)}">{_e(_cell_text(found))}</a></td>'
            )
        verdicts = property_verdicts({c: cell_status(found) for c, found in checks.items()})
        for name, verdict in verdicts.items():
            cells.append(f'<td class="property {_e(verdict)}" data-property="{_e(name)}">{_e(verdict)}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _first_text(first: Mapping[str, Any] | None, fallback: str = "") -> str:
    if not first:
        return _e(fallback) if fallback else ""
    where = f"(row {first.get('row')}, col {first.get('col')})"
    if "request" in first:
        where = f"request {first['request']}, " + where
    return (
        f"first difference at {_e(first.get('point', ''))}: {_e(where)}, output {_e(first.get('output', 0))}: "
        f'expected <span class="hex">{_e(first.get("expected_bits"))}</span> ({_e(first.get("expected_value"))}), '
        f'got <span class="hex">{_e(first.get("actual_bits"))}</span> ({_e(first.get("actual_value"))})'
    )


def _failing(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("status") in ("fail", "error", "timeout")]


def _invariance_section(rows: Sequence[Mapping[str, Any]]) -> str:
    groups = _group(rows)
    out = ['<h2 id="invariance">Failing invariance checks</h2>']
    any_failing = False
    for (comp, subject), checks in groups.items():
        for check, found in checks.items():
            if check == "agreement":
                continue
            bad = [r for r in _failing(found) if r.get("status") == "fail"]
            if not bad:
                continue
            any_failing = True
            name = comp if subject == "fast" else f"{comp}/{subject}"
            out.append(
                f'<h3 id="inv-{_slug(comp, subject, check)[2:]}">{_e(name)} · {_e(check)}: {len(bad)} failing case(s)</h3>'
            )
            for r in bad[:MAX_HEATMAPS_PER_CELL]:
                out.append(_heatmap_block(r))
            if len(bad) > MAX_HEATMAPS_PER_CELL:
                out.append(
                    f"<p>{len(bad) - MAX_HEATMAPS_PER_CELL} more failing case(s): see the case list.</p>"
                )
    if not any_failing:
        out.append("<p>No invariance check of a subject failed.</p>")
    return "\n".join(out)


def _heatmap_block(r: Mapping[str, Any]) -> str:
    out = [
        f'<div class="case fail"><div><b>{_e(r.get("case"))}</b> ({_e(r.get("rows_differing"))} row(s) differ'
        f"{', worst ' + _num(r.get('worst_ulp'), '{:g}') + ' ULP' if r.get('worst_ulp') is not None else ''})</div>"
    ]
    out.append(f"<div>{_first_text(r.get('first'), r.get('first_difference', ''))}</div>")
    points = r.get("points") or []
    if points:
        out.append(f'<div class="figure">{heatmap_svg(points, r.get("check", ""))}</div>')
    else:
        out.append(
            '<p class="small">No per-point data in this row (a report written before batchinv recorded sweep points).</p>'
        )
    out.append(_repro(r.get("repro", "")))
    out.append("</div>")
    return "\n".join(out)


def _agreement_section(rows: Sequence[Mapping[str, Any]]) -> str:
    out = ['<h2 id="agreement">Toleranced agreement: worst error / bound per case</h2>']
    groups = _group(rows)
    drawn = False
    for (comp, subject), checks in groups.items():
        found = [r for r in checks.get("agreement", []) if r.get("bound_ratio") is not None]
        if not found:
            continue
        drawn = True
        name = comp if subject == "fast" else f"{comp}/{subject}"
        out.append(f'<h3>{_e(name)}</h3><div class="figure">{bound_ratio_svg(found)}</div>')
        out.append(
            "<table><tr><th>#</th><th>case</th><th>status</th><th>error / bound</th><th>headroom</th><th>worst ULP</th><th>worst abs</th></tr>"
        )
        for i, r in enumerate(found):
            ratio = float(r["bound_ratio"])
            headroom = f"{1 / ratio:.3g}x" if ratio > 0 else "exact"
            out.append(
                f'<tr><td>{i}</td><td>{_e(r.get("case"))}</td><td class="{_e(r.get("status"))}">{_e(r.get("status"))}</td>'
                f"<td>{_num(ratio)}</td><td>{headroom}</td><td>{_num(r.get('worst_ulp'), '{:g}')}</td>"
                f"<td>{_num(r.get('worst_abs'))}</td></tr>"
            )
        out.append("</table>")
    if not drawn:
        out.append(
            "<p>No toleranced agreement in this report (exact agreement is judged bitwise: see the matrix).</p>"
        )
    return "\n".join(out)


def control_verdicts(report: Report) -> list[dict[str, Any]]:
    """One entry per baseline (negative control or pin candidate): component, baseline, kind,
    required (whether it must vary on the lane; None: not known), verdict, and the row that
    caught it (its first failing row; None if none).  From the sweep's summary when there is
    one, else from the rows (a pytest run)."""
    by: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in report.rows:
        if _is_control(r):
            by.setdefault((r["component"], r.get("subject", "")), []).append(r)
    out: list[dict[str, Any]] = []
    summary_controls = (report.summary or {}).get("controls")
    if summary_controls is not None:
        for c in summary_controls:
            found = by.get((c["component"], c["baseline"]), [])
            out.append(
                {
                    "component": c["component"],
                    "baseline": c["baseline"],
                    "kind": "pin candidate" if c.get("pin_candidate") else "negative control",
                    "required": c.get("expected_to_vary"),
                    "verdict": c.get("verdict", "?"),
                    "caught_by": next((r for r in found if r.get("status") == "fail"), None),
                    "problem": next((r for r in found if r.get("status") in ("error", "timeout")), None),
                    "failure": bool(c.get("is_failure")),
                    "cases": c.get("cases", len(found)),
                }
            )
        return out
    for (comp, name), found in by.items():
        caught = next((r for r in found if r.get("status") == "fail"), None)
        problem = next((r for r in found if r.get("status") in ("error", "timeout")), None)
        pin = any(r.get("pin_candidate") for r in found)
        if problem is not None:
            verdict = str(problem.get("status"))
        elif caught is not None:
            verdict = "varies" if pin else "detected"
        else:
            verdict = "invariant" if pin else "inconclusive"
        out.append(
            {
                "component": comp,
                "baseline": name,
                "kind": "pin candidate" if pin else "negative control",
                "required": None,
                "verdict": verdict,
                "caught_by": caught,
                "problem": problem,
                "failure": problem is not None,
                "cases": len(found),
            }
        )
    return out


def _controls_section(report: Report) -> str:
    controls = control_verdicts(report)
    out = ['<h2 id="controls">Negative controls and pin candidates</h2>']
    if not controls:
        out.append("<p>No negative control in this report (run without --no-baselines to include them).</p>")
        return "\n".join(out)
    out.append(
        '<table id="controls-table"><tr><th>component</th><th>baseline</th><th>kind</th><th>must vary here</th>'
        "<th>verdict</th><th>caught by</th><th>checks run</th></tr>"
    )
    for c in controls:
        caught = c["caught_by"] or c["problem"]
        where = (
            f"{_e(caught.get('check'))} [{_e(caught.get('case'))}] {_e(', '.join((caught.get('where') or [])[:3]))}"
            if caught
            else "-"
        )
        required = {True: "yes", False: "no", None: "-"}[c["required"]]
        css = "fail" if c["failure"] else c["verdict"].split(" ")[0]
        out.append(
            f"<tr><td>{_e(c['component'])}</td><td>{_e(c['baseline'])}</td><td>{_e(c['kind'])}</td>"
            f'<td>{required}</td><td class="{_e(css)}">{_e(c["verdict"])}</td><td>{where}</td><td>{_e(c["cases"])}</td></tr>'
        )
    out.append("</table>")
    for c in controls:
        r = c["caught_by"] or c["problem"]
        if r is None:
            continue
        out.append(
            f"<h3>{_e(c['component'])}/{_e(c['baseline'])}: {_e(c['verdict'])} by {_e(r.get('check'))}</h3>"
        )
        if r.get("status") == "fail" and r.get("check") != "agreement":
            out.append(_heatmap_block(r))
        else:
            out.append(f"<p>{_e(r.get('detail'))}</p>{_repro(r.get('repro', ''))}")
    return "\n".join(out)


def _bench_section(bench: Mapping[str, Any]) -> str:
    env = bench.get("environment") or {}
    points: list[Mapping[str, Any]] = [p for p in bench.get("points", []) if isinstance(p, dict)]
    out = [
        '<h2 id="bench">Bench: fast / baseline</h2>',
        f"<p>{_e(env.get('device', '?'))}, torch {_e(env.get('torch', '?'))}, triton {_e(env.get('triton', '?'))}, "
        f"{_e(env.get('date', ''))}. Time per call: the median CUDA-graph replay; ratio = fast / baseline "
        "(below 1 the fast kernel is quicker); floor: bytes at the copy bandwidth or bf16 flops at the "
        "tensor-core peak, whichever is larger.</p>",
    ]
    by_comp: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        by_comp.setdefault(str(p.get("component")), []).append(p)
    for comp, found in by_comp.items():
        cases = list(dict.fromkeys(str(p.get("case")) for p in found))
        out.append(f'<h3>{_e(comp)}</h3><div class="figure">{bench_svg(found, cases)}</div>')
        out.append(
            '<table class="bench"><tr><th>#</th><th>case</th><th>implementation</th><th>us/call</th>'
            "<th>fast / baseline</th><th>floor us</th><th>of floor</th><th>calls / replay</th><th>mode</th></tr>"
        )
        for p in found:
            us, floor = p.get("microseconds"), p.get("floor_microseconds")
            share = f"{100 * floor / us:.0f}%" if floor is not None and us else "-"
            ratio = p.get("ratio_to_fast")
            out.append(
                f"<tr><td>{cases.index(str(p.get('case')))}</td><td>{_e(p.get('case'))}</td><td>{_e(p.get('implementation'))}</td>"
                f"<td>{_num(us, '{:.1f}')}</td><td>{'-' if ratio is None else f'{ratio:.2f}x'}</td>"
                f"<td>{_num(floor, '{:.1f}')}</td><td>{share}</td>"
                f"<td>{_e(p.get('calls_per_replay', '-'))}</td><td>{_e(p.get('mode'))}</td></tr>"
            )
        out.append("</table>")
    if not by_comp:
        out.append("<p>The bench report has no points.</p>")
    return "\n".join(out)


def _cases_section(rows: Sequence[Mapping[str, Any]]) -> str:
    groups = _group(rows)
    out = ['<h2 id="cases">Cases per cell</h2>']
    for (comp, subject), checks in groups.items():
        name = comp if subject == "fast" else f"{comp}/{subject}"
        for check, found in checks.items():
            bad = _failing(found)
            rest = [r for r in found if r not in bad]
            out.append(
                f'<div id="{_slug(comp, subject, check)}"><h3>{_e(name)} · {_e(check)}: {_e(_cell_text(found))}</h3>'
            )
            for r in bad:
                out.append(_case_block(r))
            if rest:
                out.append(f"<details><summary>{len(rest)} case(s) passing or skipped</summary>")
                out.extend(_case_block(r) for r in rest)
                out.append("</details>")
            out.append("</div>")
    return "\n".join(out)


def _case_block(r: Mapping[str, Any]) -> str:
    status = str(r.get("status"))
    figures = []
    if r.get("worst_ulp") is not None:
        figures.append(f"worst {_num(r['worst_ulp'], '{:g}')} ULP")
    if r.get("bound_ratio") is not None:
        figures.append(f"error / bound {_num(r['bound_ratio'])}")
    if r.get("rows_differing"):
        figures.append(f"{r['rows_differing']}/{r.get('rows_total', '?')} rows differ")
    test = f'<div class="small">test: {_e(r["test"])}</div>' if r.get("test") else ""
    where = f"<div>where: {_e(', '.join(r.get('where') or []))}</div>" if r.get("where") else ""
    first = _first_text(r.get("first"), r.get("first_difference", "")) if status == "fail" else ""
    return (
        f'<div class="case {status.replace(" ", "-")}"><div><b>{_e(status)}</b> {_e(r.get("case"))} '
        f'<span class="small">{_e("; ".join(figures))}</span></div>{test}'
        f"<div>{_e(r.get('detail'))}</div>{where}{f'<div>{first}</div>' if first else ''}"
        f"{_launches(r)}{_repro(r.get('repro', ''))}</div>"
    )


def _launches(r: Mapping[str, Any]) -> str:
    """The row's launch provenance (``launches``), folded: what the subject ran, by sweep point."""
    from batchinv.harness.provenance import lines

    found = lines(r.get("launches") or [])
    if not found:
        return ""
    items = "".join(f"<li><code>{_e(line)}</code></li>" for line in found)
    return f'<details class="small"><summary>launched: {len(found)} execution(s)</summary><ul>{items}</ul></details>'
