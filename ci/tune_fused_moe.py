"""Tuning aid for the fused MoE layer's align-block schedule (GPU lanes).

For every bench shape and token count of ``harness/components/fused_moe.py`` it times the pinned
layer with each ``block_m`` of the grouped GEMM's tile table forced (every one gives the same
bits: the grouped GEMM's ``config_equivalence``; this script also compares the outputs and prints
any difference), next to the shipped schedule and the unpinned ``token_count_configs`` baseline.

    python ci/tune_fused_moe.py [--shapes 0,1,2] [--tokens 1,8,...]    # prints one line a point

``fast/grouped_gemm.py``'s ``SCHEDULE`` is how the layer picks among them (docs/BENCHMARKS.md
records the run the table came from).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import torch

from batchinv.fast import fused_moe as fast_moe
from batchinv.fast.baselines import fused_moe as bl
from batchinv.fast.grouped_gemm import TILES, Tile, arch_key
from batchinv.harness.bench import time_call
from batchinv.harness.components import fused_moe as component


def _forced(bm: int) -> Any:
    return lambda device, t, k, e: bm


def main() -> int:
    parser = argparse.ArgumentParser(description="GPU only: " + (__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--shapes",
        default="0,1,2",
        help="indices into BENCH_SHAPES: 0 Qwen3-30B-A3B, 1 DeepSeek-V3, 2 Mixtral",
    )
    parser.add_argument("--tokens", default=",".join(map(str, component.BENCH_TOKENS)), help="token counts T")
    parser.add_argument("--reps", type=int, default=10, help="CUDA-graph replays per timing (median)")
    parser.add_argument(
        "--tile", action="append", default=[], help="BM:BN,WARPS,STAGES: try another tile for a block_m"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("ci/tune_fused_moe.py needs a CUDA GPU (it times CUDA graphs); none here.")
        return 3
    device = torch.device("cuda")
    key = arch_key(device)
    for spec in args.tile:  # a tuning experiment: the tile table of this process only
        bm, rest = spec.split(":")
        TILES[key][int(bm)] = Tile(*(int(v) for v in rest.split(",")))
    print("tiles:", TILES[key], flush=True)
    shapes = [component.BENCH_SHAPES[int(i)] for i in args.shapes.split(",")]
    for e, k, h, i, scoring, g, tg in shapes:
        for t in (int(x) for x in args.tokens.split(",")):
            case = component._case(e, k, h, i, t, scoring, True, False, n_group=g, topk_group=tg, seed=t)
            kw = component.build(case, device).kwargs()
            want = fast_moe.fused_moe(**kw)
            cells = []
            for bm in sorted(TILES[key]):
                fn = functools.partial(fast_moe.compose, **kw, align_block=_forced(bm))
                same = torch.equal(fn(), want)
                us, _ = time_call(fn, args.reps)
                cells.append(f"bm{bm} {us:8.1f}{'' if same else ' DIFFERENT BITS'}")
            shipped, _ = time_call(functools.partial(fast_moe.fused_moe, **kw), args.reps)
            unpinned, _ = time_call(functools.partial(bl.token_count_configs, **kw), args.reps)
            print(
                f"E{e} k{k} H{h} I{i} T{t:5d}: shipped {shipped:8.1f} us, unpinned {unpinned:8.1f} us "
                f"(ratio {unpinned / shipped:.2f}) | " + " | ".join(cells),
                flush=True,
            )
            del kw, want
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
