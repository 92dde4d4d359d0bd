"""The HTML report's figures (:mod:`batchinv.harness.html_report`): matplotlib drawn to inline
SVG, each with its ids salted apart (one page holds many SVGs, and their ids share its space).

Each function takes rows as the JSON-lines report holds them (dicts) and returns an ``<svg>``
element as text; matplotlib is imported when a figure is drawn (the ``report`` extra).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

#: Distinct row ids a heatmap draws one by one; more are binned.
MAX_HEATMAP_ROWS = 400


def _expand(runs: Sequence[Sequence[int]]) -> list[int]:
    return [i for start, stop in runs for i in range(int(start), int(stop))]


def heatmap_matrix(points: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[list[int]]]:
    """The heatmap's rows (distinct row ids, ascending) and its cells ``[row][point]``: 0 not
    compared at that point, 1 compared and bitwise equal, 2 bits differ."""
    compared = [set(_expand(p.get("compared", []))) for p in points]
    differing = [set(p.get("differing", [])) for p in points]
    ids = sorted(set().union(*compared, *differing)) if points else []
    cells = [
        [2 if i in differing[k] else (1 if i in compared[k] else 0) for k in range(len(points))] for i in ids
    ]
    return ids, cells


_FIGURES = [0]


def _svg(fig: Any) -> str:
    """``fig`` as inline SVG (ids salted per figure: several SVGs share one page's id space)."""
    import matplotlib

    _FIGURES[0] += 1
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"batchinv-{_FIGURES[0]}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.find("<svg") :]


def heatmap_svg(points: Sequence[Mapping[str, Any]], check: str = "") -> str:
    """An SVG heatmap: row ids (requests) against the sweep points, red where the bits changed."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ids, cells = heatmap_matrix(points)
    if not ids:
        return '<p class="small">no rows compared</p>'
    labels = []
    for p in points:
        label = str(p.get("label", ""))
        extra = int(p.get("rows_differing", 0)) - len(p.get("differing", []))
        labels.append(label + (f" (+{extra} rows)" if extra > 0 else ""))
    y_labels: list[str]
    if len(ids) > MAX_HEATMAP_ROWS:  # bin the rows: a bin shows its worst cell
        size = -(-len(ids) // MAX_HEATMAP_ROWS)
        binned = []
        y_labels = []
        for start in range(0, len(ids), size):
            chunk = cells[start : start + size]
            binned.append([max(col) for col in zip(*chunk, strict=True)])
            y_labels.append(f"{ids[start]}..{ids[min(start + size, len(ids)) - 1]}")
        cells = binned
    else:
        y_labels = [str(i) for i in ids]
    width = min(14.0, 2.5 + 0.28 * len(points))
    height = min(9.0, 1.8 + 0.16 * len(cells))
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    cmap = ListedColormap(["#f0f0f0", "#a5d6a7", "#d32f2f"])
    ax.imshow(cells, cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    step = max(1, len(y_labels) // 24)
    ax.set_yticks(range(0, len(y_labels), step))
    ax.set_yticklabels(y_labels[::step], fontsize=7)
    unit = "request" if check in ("co_batch", "slot", "placement", "padding", "phase") else "row"
    ax.set_ylabel(f"{unit} id")
    ax.set_xlabel("sweep point")
    ax.legend(
        handles=[
            Patch(color="#d32f2f", label="bits changed"),
            Patch(color="#a5d6a7", label="bitwise equal"),
            Patch(color="#f0f0f0", label="not compared"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
    )
    return _svg(fig)


def bound_ratio_svg(found: Sequence[Mapping[str, Any]]) -> str:
    """A bar per case: the toleranced agreement's worst error / bound (``bound_ratio``), red
    where the case failed or passed its bound, the bound (1) as a dashed line; log-scaled when
    the ratios span more than 50x."""
    from matplotlib.figure import Figure

    ratios = [float(r["bound_ratio"]) for r in found]
    fig = Figure(figsize=(8.5, 0.8 + 0.28 * len(found)))
    ax = fig.add_subplot()
    colours = [
        "#d32f2f" if x > 1 or r.get("status") != "pass" else "#388e3c"
        for x, r in zip(ratios, found, strict=True)
    ]
    positive = [x for x in ratios if x > 0]
    log = bool(positive) and max(positive) / min(positive) > 50
    floor = min(positive) / 10 if positive else 1e-3
    ax.barh(range(len(found)), [max(x, floor) for x in ratios] if log else ratios, color=colours)
    if log:  # a zero (exact) ratio is drawn at a tenth of the smallest other one
        ax.set_xscale("log")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(found)))
    ax.set_yticklabels([f"case {i} ({r.get('status')})" for i, r in enumerate(found)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("worst |fast - reference| / bound (1: the bound; < 1 passes)")
    return _svg(fig)


def bench_svg(found: Sequence[Mapping[str, Any]], cases: Sequence[str]) -> str:
    """One component's bench: microseconds per call per case (log scale) of each
    implementation with the floor as a dashed black line, and below it fast / baseline per
    case with the parity line at 1.  ``cases``: the x axis order (case ids)."""
    from matplotlib.figure import Figure

    cases = list(cases)
    impls = list(dict.fromkeys(str(p.get("implementation")) for p in found))
    fig = Figure(figsize=(9, 5.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for impl in impls:
        xs = [cases.index(str(p["case"])) for p in found if p.get("implementation") == impl]
        ys = [p.get("microseconds") for p in found if p.get("implementation") == impl]
        top.plot(xs, ys, marker="o", linestyle="-", label=impl)
        ratios = [
            (cases.index(str(p["case"])), p.get("ratio_to_fast"))
            for p in found
            if p.get("implementation") == impl
        ]
        ratios = [(x, y) for x, y in ratios if y is not None]
        if ratios:
            bottom.plot([x for x, _ in ratios], [y for _, y in ratios], marker="o", label=f"fast / {impl}")
    floors = {}
    for p in found:
        if p.get("floor_microseconds") is not None:
            floors[cases.index(str(p["case"]))] = p["floor_microseconds"]
    if floors:
        xs = sorted(floors)
        top.plot(xs, [floors[x] for x in xs], color="black", linestyle="--", marker="_", label="floor")
    top.set_yscale("log")
    top.set_ylabel("us / call")
    top.legend(fontsize=7)
    bottom.axhline(1.0, color="black", linewidth=1)
    bottom.set_ylabel("fast / baseline")
    bottom.set_xlabel("case #")
    bottom.set_xticks(range(len(cases)))
    if bottom.lines:
        bottom.legend(fontsize=7)
    return _svg(fig)
