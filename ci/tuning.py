"""Plumbing shared by the matmul tuners (``ci/tune_matmul.py``, ``ci/tune_fp8_gemm.py``): the
smoke mode, timestamped progress, a deadline, the timer, the JSON written as the run goes, and
the summary that says which rows to ship.

* ``TUNE_SMOKE=1``: the cpu lane's plumbing test.  The script that imports this module first
  sets ``TRITON_INTERPRET=1`` (before triton is imported), runs tiny shapes on CPU tensors, and
  times one call by the wall clock (no CUDA graphs): the numbers mean nothing, the rows, the
  bit comparisons and the JSON are the real code paths.
* ``TUNE_DEADLINE_S`` (default 300): no new candidate starts after that many seconds from the
  start; the summary and the JSON of what ran are still written (a cut run still gives data).
* Timing on a GPU: :func:`batchinv.harness.bench.time_call` (a CUDA graph of 10 calls
  replayed ``TUNE_REPS`` times, default 20, median per call), for every implementation alike.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMOKE = os.environ.get("TUNE_SMOKE") == "1"
REPS = int(os.environ.get("TUNE_REPS", "20"))
DEADLINE_S = float(os.environ.get("TUNE_DEADLINE_S", "300"))


class Run:
    """One tuning run: elapsed-time progress lines, the deadline, the rows and their JSON."""

    def __init__(self, name: str, out_dir: Path) -> None:
        self.name = name
        self.out_dir = out_dir
        self.start = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.cut = False
        out_dir.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def log(self, msg: str) -> None:
        """``[  12.3s 14:05:07] msg``: elapsed seconds and UTC time, then the message."""
        print(f"[{self.elapsed():7.1f}s {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)

    def over(self) -> bool:
        """Whether the deadline has passed (said once)."""
        if not self.cut and self.elapsed() > DEADLINE_S:
            self.cut = True
            self.log(f"DEADLINE: {DEADLINE_S:.0f} s passed; no new candidate starts (TUNE_DEADLINE_S)")
        return self.cut

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def save(self) -> Path:
        """``OUT_DIR/<name>.json``: every row so far, and whether the deadline cut the run."""
        path = self.out_dir / f"{self.name}.json"
        doc = {
            "smoke": SMOKE,
            "cut_by_deadline": self.cut,
            "elapsed_s": round(self.elapsed(), 1),
            "rows": self.rows,
        }
        path.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
        return path


def timer(fn: Callable[[], Any]) -> tuple[float, str]:
    """``(microseconds per call, mode)`` of ``fn``: ``time_call`` on a GPU (graph replays,
    median); in smoke mode one wall-clock call after the caller's first."""
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, "smoke-wall"
    from batchinv.harness.bench import time_call

    return time_call(fn, REPS)


def ratio(us: float, base: float) -> float:
    return us / base if base and base == base else float("nan")


def summarize(run: Run, shape: str, base: dict[int, float], table_tree: str) -> list[str]:
    """What decides the rows to ship, for one shape, from the candidate rows of ``shape``.

    Per tree: the fastest candidate at each M among those whose bits equal the tree's reference
    (``same_bits``), and the tree's *worst* ratio to the comparator over the M values (the tree
    is the bits, so it must serve every M: the tree to ship is the one with the smallest worst
    ratio; the table's tree when no other is strictly better).  Then, for that tree, the
    execution per M (the M buckets of the execution table).  Returns the printed lines (also
    added to the rows as ``kind: summary``)."""
    cands = [r for r in run.rows if r.get("shape") == shape and r.get("kind") == "candidate"]
    trees: dict[str, dict[int, tuple[float, str]]] = {}
    for r in cands:
        if not r["same_bits"]:
            continue
        best = trees.setdefault(r["tree"], {})
        for m, us in r["us"].items():
            if m not in best or us < best[m][0]:
                best[m] = (us, r["execution"])
    lines = [f"SUMMARY {shape} (comparator: {' '.join(f'M={m}:{us:.1f}' for m, us in base.items())})"]
    ms = sorted(base)
    scores = {}
    for tree, best in trees.items():
        worst = max((ratio(best[m][0], base[m]) for m in ms if m in best), default=float("nan"))
        missing = [m for m in ms if m not in best]
        scores[tree] = worst if not missing else float("inf")
        cells = "  ".join(f"{m}:{ratio(best[m][0], base[m]):.2f}x" if m in best else f"{m}:-" for m in ms)
        table = " (table)" if tree == table_tree else ""
        lines.append(f"  tree {tree}{table}: worst {worst:.2f}x  {cells}")
    if scores:
        pick = min(scores, key=lambda t: (scores[t], t != table_tree))
        if table_tree in scores and not scores[pick] < scores[table_tree]:
            pick = table_tree
        lines.append(f"  SHIP tree {pick}:")
        for m in ms:
            if m in trees[pick]:
                us, ex = trees[pick][m]
                note = "  (grid2: needs a programs-per-SM field in Execution)" if ex.endswith("grid2") else ""
                lines.append(f"    M={m:<5} {us:8.1f} us  {ratio(us, base[m]):.2f}x  {ex}{note}")
        run.add({"kind": "summary", "shape": shape, "tree": pick, "worst_ratio": scores[pick],
                 "per_m": {m: trees[pick][m] for m in ms if m in trees[pick]}, "tree_scores": scores})  # fmt: skip
    for line in lines:
        run.log(line)
    return lines
