"""Tuning aid for the log_softmax executions (GPU lanes): times every execution the launcher may be
given for vocabulary rows -- today's (one program per row), the tiled variants and the split-row
candidates of ``batchinv.fast.softmax.execution_candidates`` -- against ``torch.log_softmax`` and
the shipped launcher, at rows {1, 16, 64, 256, 1024} x vocab {32000, 129280} bf16 and 1 row fp32
(CUDA-graph replay, ``batchinv.harness.bench.time_call``), and checks that every candidate's
bits equal the shipped launcher's (on the timed logits and on rows of special values).

    python ci/tune_log_softmax.py OUTDIR   # prints the table, writes OUTDIR/tune_log_softmax.{txt,json};
                                           # exit 1 if any candidate's bits differ

The execution table (``EXECUTION_TABLE`` in ``fast/softmax.py``) may key on the number of rows only
because every execution gives the same bits; an entry ships only after this script has timed it
on the GPU and found its bits equal.  The script ends with the entry it would ship per dtype: the
fastest split over the few-row buckets where one beats the shipped execution (a one-line edit).
About a minute on an H200, most of it compiling (about 40 kernels).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from batchinv.fast import softmax as fast_softmax
from batchinv.fast.device import arch
from batchinv.harness.bench import time_call
from batchinv.harness.compare import compare_bitwise
from batchinv.harness.components.softmax import build, make_case

ROWS = (1, 16, 64, 256, 1024)
VOCABS = (32000, 129280)
#: (rows, vocab, dtype) points: the bf16 grid, and fp32 at 1 row.
POINTS = [(r, v, torch.bfloat16) for v in VOCABS for r in ROWS] + [(1, v, torch.float32) for v in VOCABS]
#: Rows at or below which a split may ship (the few-row buckets of the issue).
FEW_ROWS = 64
REPS = 15
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, vocab, device="cuda", generator=gen) * 3.0).to(dtype)


def _specials(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """16 rows of the sweep's special values (NaN, +-inf, all -inf, subnormal... rows)."""
    case = make_case(
        "log_softmax", (16, vocab), "bfloat16" if dtype == torch.bfloat16 else "float32", "specials"
    )
    return build(case, torch.device("cuda")).rows["x"]


def main(out_dir: str) -> int:
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch_name = arch(torch.device("cuda"))
    rows_out: list[dict[str, Any]] = []
    bad: list[str] = []
    for rows, vocab, dtype in POINTS:
        x = _logits(rows, vocab, dtype, seed=rows * 7 + vocab)
        shipped = fast_softmax.softmax_execution(arch_name, dtype, vocab, rows, "log_softmax")
        expected = fast_softmax.log_softmax(x)
        specials = _specials(vocab, dtype) if rows == ROWS[0] else None
        expected_specials = fast_softmax.log_softmax(specials) if specials is not None else None
        torch_us, _ = time_call(lambda x=x: torch.log_softmax(x, dim=-1), REPS)
        shipped_us, _ = time_call(lambda x=x: fast_softmax.log_softmax(x), REPS)
        point = {
            "rows": rows,
            "vocab": vocab,
            "dtype": DTYPE_NAMES[dtype],
            "torch_us": torch_us,
            "shipped": shipped.name,
            "shipped_us": shipped_us,
            "executions": {},
        }
        for ex in fast_softmax.execution_candidates(arch_name, dtype, vocab):

            def run(t: torch.Tensor, ex: fast_softmax.Execution = ex) -> torch.Tensor:
                return fast_softmax.with_execution(t, log=True, execution=ex)

            same = compare_bitwise(expected, run(x)).equal
            if specials is not None:
                same = same and compare_bitwise(expected_specials, run(specials)).equal
            if not same:
                bad.append(f"{rows}x{vocab} {DTYPE_NAMES[dtype]}: {ex.name}")
            us, _ = time_call(lambda x=x, run=run: run(x), REPS)
            point["executions"][ex.name] = {"us": us, "bits_equal": same, "repr": repr(ex)}
        rows_out.append(point)
        del x, expected
        torch.cuda.empty_cache()

    lines = _table(rows_out)
    lines += _suggestions(rows_out)
    lines.append(f"bits: {'all equal to the shipped launcher' if not bad else 'DIFFER: ' + '; '.join(bad)}")
    lines.append(f"wall: {time.perf_counter() - start:.0f} s on {torch.cuda.get_device_name()}")
    text = "\n".join(lines)
    print(text)
    (out / "tune_log_softmax.txt").write_text(text + "\n")
    (out / "tune_log_softmax.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    return 1 if bad else 0


def _table(points: list[dict[str, Any]]) -> list[str]:
    """One line per (point, execution): microseconds, ratio to torch, bits, '*' = shipped."""
    lines = ["rows  vocab   dtype | execution | us | /torch | bits", ""]
    for p in points:
        head = f"{p['rows']:<5} {p['vocab']:<7} {p['dtype']:<5}"
        lines.append(f"{head} | torch.log_softmax | {p['torch_us']:.1f} | 1.00 |")
        lines.append(
            f"{head} | shipped ({p['shipped']}) | {p['shipped_us']:.1f} | {p['shipped_us'] / p['torch_us']:.2f} |"
        )
        for name, e in sorted(p["executions"].items(), key=lambda kv: kv[1]["us"]):
            mark = " *" if name == p["shipped"] else ""
            bits = "equal" if e["bits_equal"] else "DIFFER"
            lines.append(f"{head} | {name}{mark} | {e['us']:.1f} | {e['us'] / p['torch_us']:.2f} | {bits}")
        lines.append("")
    return lines


def _suggestions(points: list[dict[str, Any]]) -> list[str]:
    """Per (dtype, vocab): the fastest bit-equal split over the few-row points, and the
    EXECUTION_TABLE entry that would ship it where it beats the shipped execution at each of them."""
    lines = ["suggested EXECUTION_TABLE entries (one line per dtype in fast/softmax.py):"]
    for dtype in ("bf16", "fp32"):
        few = [p for p in points if p["dtype"] == dtype and p["rows"] <= FEW_ROWS]
        if not few:
            continue
        names = [n for n in few[0]["executions"] if n.startswith("split")]
        ok = [n for n in names if all(p["executions"][n]["bits_equal"] for p in few)]
        if not ok:
            lines.append(f"  {dtype}: no bit-equal split")
            continue
        # the split with the least summed time over the few-row points (every vocab)
        best = min(ok, key=lambda n: sum(p["executions"][n]["us"] for p in few))
        wins = all(p["executions"][best]["us"] < p["shipped_us"] for p in few)
        worst = max(p["executions"][best]["us"] / p["torch_us"] for p in few)
        key = "torch.bfloat16" if dtype == "bf16" else "torch.float32"
        table = "GPU_SPLIT_16BIT" if dtype == "bf16" else "GPU_SPLIT_32BIT"
        ex_repr = few[0]["executions"][best]["repr"]
        index = [fast_softmax.GPU_SPLIT_16BIT, fast_softmax.GPU_SPLIT_32BIT][dtype == "fp32"]
        position = next(i for i, ex in enumerate(index) if repr(ex) == ex_repr)
        measured = sorted({(p["rows"], p["vocab"]) for p in few})
        lines.append(
            f"  {dtype}: {best} -- worst {worst:.2f}x torch over the few-row points (rows, vocab) {measured}, "
            f"{'faster than the shipped execution at each' if wins else 'NOT faster than the shipped one everywhere'}"
        )
        lines.append(
            f'    ("gpu", {key}, "log_softmax"): (ExecutionRule({FEW_ROWS}, {min(VOCABS)}, {table}[{position}]),),'
        )
    return lines


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    if len(sys.argv) != 2:
        sys.exit("usage: python ci/tune_log_softmax.py OUTDIR")
    sys.exit(main(sys.argv[1]))
