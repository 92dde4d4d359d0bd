"""One line from a sweep's JSON-lines report, for ci/compat.sh's table.

    python ci/compat_summary.py REPORT.jsonl

Prints the fast checks' case counts by status (summed over components and checks) and the
baselines' controls by verdict (those not required to vary on the lane marked so), from the
report's closing ``summary`` record; "no summary" when the sweep crashed before writing one.
"""

from __future__ import annotations

import collections
import json
import sys


def summarize(path: str) -> str:
    """The table cell for the sweep report at ``path``."""
    with open(path) as f:
        summaries = [r for r in map(json.loads, f) if r.get("kind") == "summary"]
    if not summaries:
        return "no summary"
    summary = summaries[-1]
    cases: collections.Counter[str] = collections.Counter()
    for row in summary["checks"]:
        for key in ("passed", "failed", "errors", "skipped", "reference_path"):
            cases[key.replace("_", " ")] += row[key]
    controls = collections.Counter(
        c["verdict"] if c["expected_to_vary"] else f"{c['verdict']} (not required on this lane)"
        for c in summary["controls"]
    )
    fast = ", ".join(f"{n} {k}" for k, n in cases.items() if n)
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(controls.items())) or "none"
    return f"{len(summary['checks'])} checks ({fast}); controls: {verdicts}"


if __name__ == "__main__":
    print(summarize(sys.argv[1]))
