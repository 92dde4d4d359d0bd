"""Tuning aid for the matmul's two tables (GPU lanes), one run:

    python ci/tune_matmul.py OUTDIR        # table on stdout, OUTDIR/tune_matmul.json
    TUNE_SHAPES=256x4096:float32 python ci/tune_matmul.py OUTDIR    # only the shapes named

For each production shape of issue 11 it times, against the issue's comparator in the same run
(cuBLAS ``F.linear`` in the input dtype, then a cast for fp32 logits; cuBLAS fp32 with TF32 off
for the IEEE router), every candidate execution of the table's reduction tree at the M values of
its kind (split-K across the grid: small M, every M for the router; one program walking the
chunks: mid and prefill M), for the table's tree and its neighbours, and prints the best per M.
Within each tree it compares every candidate's bits at M = 64 with the first's: a candidate
whose bits differ is marked and may not ship (``config_equivalence`` re-checks whatever ships,
in the sweep).  The chosen rows go into ``fast/matmul_config.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from batchinv.fast.device import arch
from batchinv.fast.matmul import matmul
from batchinv.fast.matmul_config import Execution, MatmulConfig, ReductionTree, reduction_tree
from batchinv.harness.bench import time_call

E = Execution
BF16, F32 = torch.bfloat16, torch.float32
#: (N, K, input dtype, output dtype): the issue's table.
SHAPES = (
    (4096, 4096, BF16, BF16),
    (14336, 4096, BF16, BF16),
    (4096, 14336, BF16, BF16),
    (2688, 4096, BF16, BF16),
    (256, 7168, BF16, F32),
    (256, 4096, BF16, F32),
    (256, 4096, F32, F32),
    (256, 7168, F32, F32),
)
MS = (1, 8, 32, 64, 128, 256, 512, 1024, 4096)
SPLIT_MS = (1, 8, 32, 64, 128, 256)
WALK_MS = (128, 256, 512, 1024, 4096)
#: Candidates per dtype class: split executions (timed at SPLIT_MS, at every M for the router)
#: and walks (timed at WALK_MS).  Round 3 (run 31): TMA reads, and the shipped rows.
SPLITS = {
    "half": [
        E(16, 128, num_warps=4, num_stages=4, split_k=True),
        E(16, 128, num_warps=4, num_stages=4, split_k=True, tma=True),
        E(32, 128, num_warps=4, num_stages=3, split_k=True),
        E(32, 128, num_warps=4, num_stages=4, split_k=True, tma=True),
        E(64, 128, num_warps=4, num_stages=3, split_k=True),
        E(64, 128, num_warps=4, num_stages=4, split_k=True, tma=True),
        E(128, 128, num_warps=8, num_stages=3, split_k=True, tma=True),
        E(64, 64, num_warps=4, num_stages=3, split_k=True),
        E(16, 64, num_warps=2, num_stages=4, split_k=True),
    ],
    "fp32": [
        E(16, 32, num_warps=2, num_stages=3, split_k=True),
        E(32, 64, num_warps=4, num_stages=3, split_k=True),
        E(64, 64, num_warps=4, num_stages=3, split_k=True),
        # round 4 (issue 26: the IEEE router at 1.75-3.48x cuBLAS from M = 32)
        E(16, 64, num_warps=4, num_stages=3, split_k=True),
        E(16, 16, num_warps=1, num_stages=3, split_k=True),
        E(32, 32, num_warps=2, num_stages=3, split_k=True),
        E(64, 128, num_warps=8, num_stages=3, split_k=True),
        E(128, 64, num_warps=8, num_stages=3, split_k=True),
        E(128, 128, num_warps=8, num_stages=2, split_k=True),
    ],
}
WALKS = {
    "half": [
        E(64, 128, num_warps=4, num_stages=4),
        E(64, 128, num_warps=4, num_stages=4, tma=True),
        E(128, 128, num_warps=8, num_stages=3),
        E(128, 128, num_warps=8, num_stages=4, tma=True),
        E(128, 256, num_warps=8, num_stages=3),
        E(128, 256, num_warps=8, num_stages=3, tma=True),
        E(128, 256, num_warps=8, num_stages=4, tma=True),
        E(128, 128, num_warps=4, num_stages=4, tma=True),
        E(64, 256, num_warps=4, num_stages=4, tma=True),
    ],
    "fp32": [
        E(64, 64, num_warps=4, num_stages=3),
        E(128, 64, num_warps=8, num_stages=3),
        E(64, 128, num_warps=8, num_stages=3),
        E(128, 128, num_warps=8, num_stages=2),
        E(128, 128, num_warps=16, num_stages=2),
        E(32, 64, num_warps=4, num_stages=3),
    ],
}


def trees(key: str, dtype: torch.dtype, n: int, k: int) -> list[ReductionTree]:
    """The table's tree, or it and its neighbours (chunks twice and four times as long)."""
    tree = reduction_tree(key, dtype, n, k)
    out = (
        [tree]
        if ONLY_TABLE_TREE
        else [tree, *(ReductionTree(tree.block_k, tree.chunk_k * f) for f in (2, 4))]
    )
    return [t for t in dict.fromkeys(out) if t.chunk_k < 2 * k]


#: Round 3 times the table's trees only (rounds 1-2, runs 28-29, chose them).
ONLY_TABLE_TREE = True


def comparator(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The issue's speed comparator: cuBLAS in the input dtype (TF32 off), then a cast."""
    return F.linear(x, w).to(out_dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def main(out_dir: Path) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    key = arch(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    g = torch.Generator().manual_seed(0)
    only = os.environ.get("TUNE_SHAPES")  # e.g. "256x4096:float32,4096x4096:bfloat16"
    for n, k, dtype, out_dtype in SHAPES:
        if only and f"{n}x{k}:{str(dtype)[6:]}" not in only.split(","):
            continue
        w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
        x_all = torch.randn(max(MS), k, generator=g).to(dtype).to(device)
        shape = f"{str(dtype)[6:]}->{str(out_dtype)[6:]} N={n} K={k}"
        print(f"\n== {shape}", flush=True)
        base = {}
        for m in MS:
            base[m], _ = time_call(lambda x=x_all[:m], w=w, o=out_dtype: comparator(x, w, o), 20)
        print("   cuBLAS " + "  ".join(f"M={m}: {us:.1f}" for m, us in base.items()), flush=True)
        rows.append({"shape": shape, "impl": "cublas", "us": base})
        cls = "fp32" if dtype == F32 else "half"
        router = n <= 512
        for tree in trees(key, dtype, n, k):
            best: dict[int, tuple[float, str]] = {}
            want = None
            for ex in SPLITS[cls] + WALKS[cls]:
                cfg = MatmulConfig(tree, ex)
                ms = MS if (router and ex.split_k) else (SPLIT_MS if ex.split_k else WALK_MS)
                try:
                    got = bits(matmul(x_all[:64], w, out_dtype=out_dtype, config=cfg))
                    want = got if want is None else want
                    same = torch.equal(got, want)
                    times = {}
                    for m in ms:
                        times[m], _ = time_call(
                            lambda x=x_all[:m], w=w, o=out_dtype, cfg=cfg: matmul(
                                x, w, out_dtype=o, config=cfg
                            ),
                            20,
                        )
                except Exception as exc:  # a config that does not compile is a finding, not a stop
                    print(f"   {cfg.name:<40} error {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                for m, us in times.items():
                    if m not in best or us < best[m][0]:
                        best[m] = (us, ex.name)
                cells = "  ".join(f"{m}:{us:.1f}({us / base[m]:.2f}x)" for m, us in times.items())
                mark = "" if same else "   BITS DIFFER within the tree"
                print(f"   {cfg.name:<40} {cells}{mark}", flush=True)
                rows.append({"shape": shape, "impl": cfg.name, "same_bits": same, "us": times})
            print(f"   best of k{tree.block_k}/{tree.chunk_k}:", flush=True)
            for m in sorted(best):
                us, name = best[m]
                print(f"      M={m:<5} {us:8.1f} us  {us / base[m]:.2f}x  {name}", flush=True)
        del w, x_all
        torch.cuda.empty_cache()
    (out_dir / "tune_matmul.json").write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out")))
