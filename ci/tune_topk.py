"""Tuning aid for the topk kernel (GPU lanes): times the pinned kernel at the bench points
under several ``num_warps`` and checks every variant's bits against the shipped config.

    python ci/tune_topk.py            # prints a table; exit 1 if any variant's bits differ

Configs are keyed on (arch, k, num_cols bucket) only; this script is how the table's entries
were chosen (docs/BENCHMARKS.md records the run).
"""

from __future__ import annotations

import sys

import torch

import batchinv.fast.topk as fast_topk
from batchinv.harness.bench import time_call
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get


def main() -> int:
    component = get("topk")
    shipped = fast_topk.select_config
    bad = 0
    rows = []
    for case in component.bench_cases(Lane.SM90):
        batch = component.build(case, torch.device("cuda"))
        kw = batch.kwargs()
        expected = fast_topk.topk(**kw)
        for warps in (2, 4, 8, 16, 32):
            base = shipped("sm90", kw["k"], kw["scores"].shape[1])
            fast_topk.select_config = lambda a, k, n, w=warps, b=base: fast_topk.TopkConfig(b.block_n, w)
            try:
                got = fast_topk.topk(**kw)
                same = torch.equal(got, expected)
                bad += not same
                us, _ = time_call(lambda kw=kw: fast_topk.topk(**kw), 30)
            finally:
                fast_topk.select_config = shipped
            rows.append((case.axes["num_rows"], case.axes["k"], warps, us, same, base.num_warps == warps))
    print("num_rows  k     warps  us/call  bits-equal  shipped")
    for r in rows:
        print(f"{r[0]:<9} {r[1]:<5} {r[2]:<6} {r[3]:<8.1f} {r[4]!s:<11} {'*' if r[5] else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
