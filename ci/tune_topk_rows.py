"""Row-bucket tuning of the topk launcher (GPU lanes): times every execution the many-row table
may name (``batchinv.fast.topk.EXECUTIONS``), the shipped launch and ``torch.topk`` at
num_rows in {1, 16, 64, 256, 1024, 2048, 4096} x num_cols 8192 x k in {512, 1024, 2048}, checks
that every execution gives the shipped launch's bits (on the timed rows and on rows of every
bit class and window kind), and prints the table and the line to paste into
``fast/topk.py`` (``SM90_8192_BY_ROW_BUCKET``).

    python ci/tune_topk_rows.py OUT_DIR   # writes OUT_DIR/tune_topk_rows.{txt,json}; exit 1 if bits differ

Timing is ``batchinv.harness.bench.time_call`` (CUDA-graph replay, median).  The choice per row
bucket is the execution with the smallest geometric mean over k of its time at that bucket's
row count; the launches of at most 64 rows keep their config whatever is measured there (their
rows are shown for reference).  About 14 Triton specializations compile (the "compare" kernel
once per k, the "sign" kernel once per execution): 60-90 s of the < 150 s this takes on an H200.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

import batchinv.fast.topk as fast_topk
from batchinv.harness.bench import time_call
from batchinv.harness.components import topk as topk_component

ROWS = (1, 16, 64, 256, 1024, 2048, 4096)
NUM_COLS = fast_topk.TUNED_NUM_COLS_BUCKET
KS = fast_topk.ENVELOPE_K
REPS = 20
#: Rows of every bit class and window kind (ties at the cutoff, NaNs, narrow and offset windows),
#: enough of them to take a many-row bucket: each execution's bits are checked there too.
MIXED_ROWS = 300
DEVICE = "cuda"


def _executions(k: int) -> dict[str, fast_topk.TopkConfig]:
    base = fast_topk.CONFIGS[("sm90", k, NUM_COLS)]
    return {name: execution.config(base) for name, execution in fast_topk.EXECUTIONS.items()}


def _compile_all(out: list[str]) -> dict[str, float]:
    """Compile every execution for every k (one call on a small batch); seconds per execution."""
    seconds: dict[str, float] = {}
    scores = torch.randn(2, NUM_COLS, device=DEVICE)
    starts = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    ends = torch.full((2,), NUM_COLS, dtype=torch.int32, device=DEVICE)
    for k in KS:
        for name, config in _executions(k).items():
            start = time.perf_counter()
            fast_topk.topk(scores, starts, ends, k, config=config)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
    total = sum(seconds.values())
    out.append(f"compile: {total:.1f} s ({', '.join(f'{n} {s:.1f}' for n, s in seconds.items())})")
    return seconds


def _check_mixed(k: int, bad: list[str]) -> None:
    """Every execution's bits equal the shipped launch's on rows of every kind and window."""
    case = topk_component.make_case(MIXED_ROWS, NUM_COLS, k, seed=k + 1)
    kw = topk_component.build(case, torch.device(DEVICE)).kwargs()
    expected = fast_topk.topk(**kw)
    for name, config in _executions(k).items():
        if not torch.equal(fast_topk.topk(**kw, config=config), expected):
            bad.append(f"{name} k={k} on {case.id}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    assert set(fast_topk.ROW_BUCKETS) <= set(ROWS), "every row bucket is timed at its own row count"
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    begin = time.perf_counter()
    lines = [
        f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else DEVICE}; torch {torch.__version__}; "
        f"shipped line: {fast_topk.SM90_8192_BY_ROW_BUCKET}"
    ]
    _compile_all(lines)
    bad: list[str] = []
    names = list(fast_topk.EXECUTIONS)
    results: list[dict[str, Any]] = []
    for k in KS:
        _check_mixed(k, bad)
        case = topk_component.make_case(max(ROWS), NUM_COLS, k, rows="normal", seed=k)
        full = topk_component.build(case, torch.device(DEVICE)).kwargs()
        for num_rows in ROWS:
            kw = {**{n: full[n][:num_rows] for n in ("scores", "row_starts", "row_ends")}, "k": k}
            shipped_config = fast_topk.select_config("sm90", k, NUM_COLS, num_rows)
            expected = fast_topk.topk(**kw)
            row: dict[str, Any] = {"num_rows": num_rows, "k": k}
            row["torch_topk"] = time_call(lambda kw=kw: torch.topk(kw["scores"], kw["k"], dim=1), REPS)[0]
            row["shipped"] = time_call(lambda kw=kw: fast_topk.topk(**kw), REPS)[0]
            row["shipped_is"] = next(n for n, c in _executions(k).items() if c == shipped_config)
            for name, config in _executions(k).items():
                if not torch.equal(fast_topk.topk(**kw, config=config), expected):
                    bad.append(f"{name} k={k} num_rows={num_rows}")
                row[name] = time_call(lambda kw=kw, c=config: fast_topk.topk(**kw, config=c), REPS)[0]
            results.append(row)
        del full
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    header = f"{'rows':>5} {'k':>5} {'torch':>8} {'shipped':>8} " + " ".join(f"{n:>15}" for n in names)
    lines += [
        "",
        "us per call (ratio to torch.topk); * = fastest execution, s = the shipped launch's",
        header,
    ]
    for row in results:
        times = {n: float(row[n]) for n in names}
        best = min(times, key=times.__getitem__)
        torch_us = float(row["torch_topk"])
        cells = []
        for n in names:
            mark = ("*" if n == best else "") + ("s" if n == row["shipped_is"] else "")
            cells.append(f"{times[n]:7.1f}({times[n] / torch_us:.2f}){mark:<2}")
        lines.append(
            f"{row['num_rows']:>5} {row['k']:>5} {torch_us:8.1f} {float(row['shipped']):8.1f} "
            + " ".join(f"{c:>15}" for c in cells)
        )

    choice = []
    lines += ["", "row bucket: geometric mean over k of us (ratio to torch.topk), best first"]
    for bucket in fast_topk.ROW_BUCKETS:
        at = [r for r in results if r["num_rows"] == bucket]
        score = {n: math.exp(sum(math.log(float(r[n])) for r in at) / len(at)) for n in names}
        torch_gm = math.exp(sum(math.log(float(r["torch_topk"])) for r in at) / len(at))
        ranked = sorted(names, key=score.__getitem__)
        choice.append(ranked[0])
        worst = max(float(r[ranked[0]]) / float(r["torch_topk"]) for r in at)
        lines.append(
            f"  row bucket {bucket:>4}: "
            + ", ".join(f"{n} {score[n]:.1f} ({score[n] / torch_gm:.2f})" for n in ranked[:4])
            + f"; {ranked[0]} worst over k {worst:.2f}x torch.topk (target <= 0.5: "
            + ("met)" if worst <= 0.5 else "missed)")
        )
    small = [r for r in results if int(r["num_rows"]) <= fast_topk.SMALL_ROWS]
    worst_small = max(float(r["shipped"]) for r in small)
    lines += [
        f"<= {fast_topk.SMALL_ROWS} rows (config kept): shipped worst {worst_small:.1f} us (target <= 15)",
        "",
        "line for fast/topk.py (every name is an execution config_equivalence runs):",
        f"SM90_8192_BY_ROW_BUCKET: Final[tuple[str, ...]] = {tuple(choice)!r}",
        "",
        f"bits: {'every execution equals the shipped launch' if not bad else 'DIFFER: ' + '; '.join(bad)}",
        f"wall: {time.perf_counter() - begin:.0f} s",
    ]
    text = "\n".join(lines)
    print(text)
    (out_dir / "tune_topk_rows.txt").write_text(text + "\n")
    (out_dir / "tune_topk_rows.json").write_text(
        json.dumps({"rows": results, "choice": choice, "bad": bad}) + "\n"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main(sys.argv[1:]))
