"""Issue 11's table from a ``batchinv bench matmul --out PREFIX`` JSON: per shape and M, the floor,
the fast kernel's time, the comparator's (``torch_then_cast``: cuBLAS in the input dtype, then a
cast) and their ratio against the issue's target.

    python ci/bench_table.py PREFIX.json      # markdown on stdout
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


#: Issue 11's targets, by (input, output) dtype and M: the ratio fast / comparator must not exceed.
def target(dtype: str, out: str, n: int, m: int) -> float:
    if dtype == "fp32":
        return 1.5 if m >= 512 else 2.0
    if n <= 512:
        return 1.3
    return 1.15 if m >= 512 else 1.3


def main(path: Path) -> int:
    data = json.loads(path.read_text(encoding="utf-8"))
    cells: dict[tuple, dict[str, float]] = {}
    floors: dict[tuple, float] = {}
    for p in data["points"]:
        axes = dict(kv.split("=", 1) for kv in re.sub(r"^\[|\]$", "", p["case"]).split("-") if "=" in kv)
        if p.get("component") != "matmul" or not {"dtype", "out", "n", "k", "rows"} <= axes.keys():
            continue
        key = (axes["dtype"], axes["out"], int(axes["n"]), int(axes["k"]), int(axes["rows"]))
        cells.setdefault(key, {})[p["implementation"]] = p["microseconds"]
        if p["floor_microseconds"] is not None:
            floors[key] = p["floor_microseconds"]
    if not cells:
        sys.exit(f"{path}: no matmul bench points (write them with `batchinv bench matmul --out PREFIX`)")
    print(
        "| shape (N x K) | in -> out | M | floor us | fast us | cuBLAS us | fast / cuBLAS | target | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(cells, key=lambda k: (k[0] == "fp32", k[2] <= 512, k[2], k[3], k[0], k[4])):
        dtype, out, n, k, m = key
        impl = cells[key]
        if "fast" not in impl or "torch_then_cast" not in impl:
            continue
        ratio = impl["fast"] / impl["torch_then_cast"]
        goal = target(dtype, out, n, m)
        verdict = "met" if ratio <= goal else "missed"
        print(
            f"| {n}x{k} | {dtype} -> {out} | {m} | {floors.get(key, float('nan')):.1f} | {impl['fast']:.1f} | "
            f"{impl['torch_then_cast']:.1f} | {ratio:.2f}x | <= {goal}x | {verdict} |"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python ci/bench_table.py PREFIX.json")
    sys.exit(main(Path(sys.argv[1])))
