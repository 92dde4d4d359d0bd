"""Tuning aid for the matmul's two tables (GPU lanes), one run:

    python ci/tune_matmul.py OUTDIR        # this round's jobs; table on stdout, OUTDIR/tune_matmul.json
    TUNE_SHAPES=256x4096:float32 python ci/tune_matmul.py OUTDIR    # only the shapes named
    TUNE_SMOKE=1 python ci/tune_matmul.py OUTDIR    # cpu lane: the plumbing, tiny shapes (ci/tuning.py)
    TUNE_ROUND=6 python ci/tune_matmul.py OUTDIR    # the IEEE fp32 router's few-row splits

A *job* is one shape (N, K, dtype) with its M values, its candidate trees and its candidate
executions.  For each job it times, against the issue's comparator in the same run (cuBLAS
``F.linear`` in the input dtype, then a cast for fp32 logits; cuBLAS fp32 with TF32 off for the
IEEE router), every candidate execution of every candidate tree: split-K across the grid at the
job's split M values, one program walking the chunks at its walk M values, and each walk again
with a persistent grid of two programs per SM (``grid2``: ``num_sms = 2 x SMs``, which never
changes the bits) at M >= 512.  Within each tree it compares every candidate's bits at M = 64
with the production path's (the table's tree) or the tree's first candidate's: one whose bits differ is marked and may not ship
(``config_equivalence`` re-checks whatever ships, in the sweep).  Per job it prints a SUMMARY
(``ci/tuning.py``, ``summarize``): per tree the best same-bits candidate per M and the
tree's worst ratio over M; the tree to ship (the tree is the bits, so it serves every M) and
its execution per M.  The chosen rows go into ``fast/matmul_config.py``.

Round 5 (issue 26, part 2; the default without ``TUNE_SHAPES``): 2688x4096 and 4096x2048 bf16
at M = 1..4096 with trees of 1, 2, 4 and 8 chunks and narrow column tiles (2688 = 2**7 x
21: every power-of-two BLOCK_N up to 128 divides it, 256 does not; Triton's blocks are powers of
two, so a 192- or 96-wide tile is not an execution of this kernel), then the standard shapes at
M = 512 and 4096 (table tree; walks, grid2, large-tile splits).  ``TUNE_SHAPES`` runs the named
shapes of :data:`SHAPES` (a round-5 shape as its round-5 job; any other at every M of
:data:`MS` with the classic candidate lists, the table's tree).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

if os.environ.get("TUNE_SMOKE") == "1":  # before triton is imported (batchinv.fast)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F
from tuning import SMOKE, Run, ratio, summarize, timer

from batchinv.fast.device import arch, sm_count
from batchinv.fast.matmul import matmul
from batchinv.fast.matmul_config import (
    WHOLE_K,
    Execution,
    MatmulConfig,
    ReductionTree,
    reduction_tree,
)

E = Execution
BF16, F32 = torch.bfloat16, torch.float32
#: (N, K, input dtype, output dtype): the issue's table (4096x2048: vLLM's Hopper-tuned shape,
#: issue 26's side-by-side table).
SHAPES = (
    (4096, 4096, BF16, BF16),
    (14336, 4096, BF16, BF16),
    (4096, 14336, BF16, BF16),
    (2688, 4096, BF16, BF16),
    (4096, 2048, BF16, BF16),
    (256, 7168, BF16, F32),
    (256, 4096, BF16, F32),
    (256, 4096, F32, F32),
    (256, 7168, F32, F32),
)
MS = (1, 8, 32, 64, 128, 256, 512, 1024, 4096)
SPLIT_MS = (1, 8, 32, 64, 128, 256)
WALK_MS = (128, 256, 512, 1024, 4096)
#: The M of the bit comparison within a tree.
BITS_M = 64
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


def S(block_m: int, block_n: int, num_warps: int, num_stages: int) -> Execution:
    """A split-K execution with TMA reads."""
    return E(block_m, block_n, num_warps=num_warps, num_stages=num_stages, split_k=True, tma=True)


def W(block_m: int, block_n: int, num_warps: int, num_stages: int) -> Execution:
    """A walk with TMA reads."""
    return E(block_m, block_n, num_warps=num_warps, num_stages=num_stages, tma=True)


#: Round 5, the narrow shapes (2688x4096, 4096x2048; issue 26: 1.13-1.89x cuBLAS at M <= 128):
#: splits with 32- and 64-column tiles (2688 / 128 = 21 column tiles x 4 chunks = 84 programs
#: at M <= 16 on 132 SMs; 64 columns: 168), and 128x128 for M = 512; walks with every tile
#: that divides 2688 (and 256 rows).  The shipped rows are among them.
NARROW_SPLITS = [
    S(16, 32, 2, 4),
    S(16, 64, 4, 4),
    S(16, 128, 4, 4),
    S(32, 64, 4, 4),
    S(32, 128, 4, 4),
    S(64, 64, 4, 4),
    S(64, 128, 4, 4),
    S(128, 128, 8, 3),
]
NARROW_WALKS = [
    W(64, 64, 4, 4),
    W(64, 128, 4, 4),
    W(128, 64, 4, 4),
    W(128, 128, 8, 3),
    W(128, 128, 8, 4),
    W(128, 256, 8, 3),
    W(256, 128, 8, 3),
]
#: Round 5, the standard shapes at M = 512 and 4096 (issue 26: 1.14-1.75x / 1.17-1.30x):
#: walks whose tile counts quantize differently on 132 SMs, and large-tile splits at 512.
PREFILL_SPLITS = [S(64, 128, 4, 4), S(128, 128, 8, 3), S(128, 256, 8, 3)]
PREFILL_WALKS = NARROW_WALKS


@dataclass(frozen=True)
class Job:
    """One shape's candidates: trees (chunk lengths; the table's first), executions, M values."""

    n: int
    k: int
    dtype: torch.dtype
    out_dtype: torch.dtype
    chunks: tuple[int, ...]  # chunk_k of the candidate trees besides the table's (WHOLE_K: one chunk)
    splits: tuple[Execution, ...]
    walks: tuple[Execution, ...]
    split_ms: tuple[int, ...]
    walk_ms: tuple[int, ...]
    grid2_ms: tuple[int, ...] = (512, 1024, 4096)

    @property
    def ms(self) -> tuple[int, ...]:
        return tuple(sorted({*self.split_ms, *self.walk_ms}))

    @property
    def name(self) -> str:
        return f"{self.n}x{self.k}:{str(self.dtype)[6:]}"


NARROW_MS = (1, 8, 32, 64, 128, 512, 4096)
ROUND = (
    Job(2688, 4096, BF16, BF16, (512, 2048, WHOLE_K), tuple(NARROW_SPLITS), tuple(NARROW_WALKS),
        (1, 8, 32, 64, 128, 512), (64, 128, 512, 4096)),
    Job(4096, 2048, BF16, BF16, (256, 512, WHOLE_K), tuple(NARROW_SPLITS), tuple(NARROW_WALKS),
        (1, 8, 32, 64, 128, 512), (64, 128, 512, 4096)),
    *(
        Job(n, k, BF16, BF16, (), tuple(PREFILL_SPLITS), tuple(PREFILL_WALKS), (512,), (512, 4096))
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))
    ),
)  # fmt: skip
#: Round 6 (``TUNE_ROUND=6``; issue 26: the IEEE fp32 router at 4.19x cuBLAS at M = 1): split
#: executions of 1-8 rows (Triton 3.6's dot accepts them; 16-row tiles multiply 15 padding rows
#: at M = 1), against the shipped 16-row ones, at M = 1..32.  The tree is the table's.
FP32_DECODE_SPLITS = [
    E(16, 32, num_warps=2, num_stages=3, split_k=True),
    E(16, 16, num_warps=1, num_stages=3, split_k=True),
    *(E(1, bn, num_warps=w, num_stages=3, split_k=True)
      for bn, w in ((16, 1), (32, 1), (64, 1), (64, 2), (128, 2), (128, 4), (256, 4))),
    E(1, 64, num_warps=2, num_stages=4, split_k=True),
    E(1, 128, num_warps=4, num_stages=4, split_k=True),
    *(E(bm, bn, num_warps=w, num_stages=3, split_k=True)
      for bm in (2, 4, 8) for bn, w in ((32, 1), (64, 2), (128, 4))),
]  # fmt: skip
ROUND6 = tuple(
    Job(256, k, F32, F32, (), tuple(FP32_DECODE_SPLITS), (), (1, 2, 4, 8, 16, 32), ()) for k in (4096, 7168)
)
#: TUNE_SMOKE=1: one tiny shape under the interpreter (its tree: chunks of 64 in K steps of 32,
#: K = 160: a short last chunk), the neighbours' chunk lengths, two splits and two walks.
SMOKE_JOB = Job(
    96, 160, BF16, BF16, (128, WHOLE_K),
    (E(16, 64, group_m=2, split_k=True), E(16, 32, group_m=2, split_k=True)),
    (E(64, 64, group_m=2, tma=True), E(16, 64, group_m=2)),
    (1, 8), (8,), (8,),
)  # fmt: skip


def classic_job(n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype) -> Job:
    """A shape outside the round: the table's tree, the class's lists, at every M of :data:`MS`
    (split at every M for the router, N <= 512)."""
    cls = "fp32" if dtype == F32 else "half"
    router = n <= 512
    return Job(n, k, dtype, out_dtype, (), tuple(SPLITS[cls]), tuple(WALKS[cls]),
               MS if router else SPLIT_MS, WALK_MS)  # fmt: skip


def jobs(only: str | None) -> list[Job]:
    """The round's jobs, or (``TUNE_SHAPES``) the named shapes' (round 5's job where it has one)."""
    if SMOKE:
        return [SMOKE_JOB]
    if os.environ.get("TUNE_ROUND") == "6":
        return list(ROUND6)
    if not only:
        return list(ROUND)
    names = only.split(",")
    by_name = {j.name: j for j in ROUND}
    unknown = [x for x in names if x not in {f"{n}x{k}:{str(d)[6:]}" for n, k, d, _ in SHAPES}]
    if unknown:
        raise SystemExit(f"TUNE_SHAPES: unknown shape(s) {unknown}; known: NxK:dtype of SHAPES")
    out = []
    for n, k, dtype, out_dtype in SHAPES:
        name = f"{n}x{k}:{str(dtype)[6:]}"
        if name in names:
            out.append(by_name.get(name) or classic_job(n, k, dtype, out_dtype))
    return out


def trees(key: str, job: Job) -> list[ReductionTree]:
    """The table's tree first, then the job's other chunk lengths (same K step), each once;
    a chunk of K or more is one chunk (WHOLE_K)."""
    table = reduction_tree(key, job.dtype, job.n, job.k)
    out = [table, *(ReductionTree(table.block_k, c if c < job.k else WHOLE_K) for c in job.chunks)]
    return list(dict.fromkeys(out))


def tree_name(tree: ReductionTree) -> str:
    chunk = "K" if tree.chunk_k >= WHOLE_K else str(tree.chunk_k)
    return f"k{tree.block_k}/{chunk}"


def comparator(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The issue's speed comparator: cuBLAS in the input dtype (TF32 off), then a cast."""
    return F.linear(x, w).to(out_dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def run_job(run: Run, job: Job, key: str, device: torch.device, g: torch.Generator) -> None:
    n, k, dtype, out_dtype = job.n, job.k, job.dtype, job.out_dtype
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    x_all = torch.randn(max(*job.ms, BITS_M), k, generator=g).to(dtype).to(device)
    shape = f"{str(dtype)[6:]}->{str(out_dtype)[6:]} N={n} K={k}"
    run.log(f"== {shape}: trees {[tree_name(t) for t in trees(key, job)]}, "
            f"{len(job.splits)} splits at M {job.split_ms}, {len(job.walks)} walks at M {job.walk_ms}")  # fmt: skip
    base = {}
    for m in job.ms:
        x = x_all[:m]
        comparator(x, w, out_dtype)
        base[m], _ = timer(lambda x=x, w=w, o=out_dtype: comparator(x, w, o))
    run.log("   cuBLAS " + "  ".join(f"M={m}: {us:.1f}" for m, us in base.items()))
    run.add({"kind": "comparator", "shape": shape, "impl": "cublas", "us": base})
    prod = {}
    for m in job.ms:  # the production path (the shipped tables), what issue 26's figures time
        x = x_all[:m]
        matmul(x, w, out_dtype=out_dtype)
        prod[m], _ = timer(lambda x=x, w=w, o=out_dtype: matmul(x, w, out_dtype=o))
    run.log(
        "   shipped " + "  ".join(f"M={m}: {us:.1f}({ratio(us, base[m]):.2f}x)" for m, us in prod.items())
    )
    run.add({"kind": "production", "shape": shape, "impl": "batchinv (shipped tables)", "us": prod})
    grid2 = 2 * sm_count(device if device.type == "cuda" else None)
    table = reduction_tree(key, dtype, n, k)
    for tree in trees(key, job):
        # the reference bits: the production path's for the table's tree (its shipped execution
        # at BITS_M), else the tree's first candidate's
        want = bits(matmul(x_all[:BITS_M], w, out_dtype=out_dtype)) if tree == table else None
        for ex in (*job.splits, *job.walks):
            if run.over():
                break
            if ex.split_k and tree.num_chunks(k) == 1:
                continue  # one chunk: a split is a walk plus a workspace
            cfg = MatmulConfig(tree, ex)
            # a one-chunk tree has no split: its walks serve every M
            ms = job.split_ms if ex.split_k else (job.ms if tree.num_chunks(k) == 1 else job.walk_ms)
            try:
                got = bits(matmul(x_all[:BITS_M], w, out_dtype=out_dtype, config=cfg))
                want = got if want is None else want
                same = bool(torch.equal(got, want))
                variants = [(ex.name, None, ms)]
                if not ex.split_k:
                    variants.append((ex.name + " grid2", grid2, tuple(m for m in ms if m in job.grid2_ms)))
                for name, num_sms, vms in variants:
                    if num_sms is not None and vms:  # the planned SM count never changes the bits: checked
                        g2 = matmul(x_all[:BITS_M], w, out_dtype=out_dtype, config=cfg, num_sms=num_sms)
                        same = same and bool(torch.equal(bits(g2), want))
                    times = {}
                    for m in vms:
                        x = x_all[:m]

                        def call(x=x, w=w, cfg=cfg, num_sms=num_sms):
                            return matmul(x, w, out_dtype=out_dtype, config=cfg, num_sms=num_sms)

                        call()
                        times[m], _ = timer(call)
                    if not times:
                        continue
                    cells = "  ".join(f"{m}:{us:.1f}({ratio(us, base[m]):.2f}x)" for m, us in times.items())
                    mark = "" if same else "   BITS DIFFER within the tree"
                    run.log(f"   {tree_name(tree)} {name:<32} {cells}{mark}")
                    run.add({"kind": "candidate", "shape": shape, "tree": tree_name(tree), "execution": name,
                             "same_bits": same, "us": times})  # fmt: skip
            except Exception as exc:  # a config that does not compile is a finding, not a stop
                run.log(f"   {tree_name(tree)} {ex.name:<32} error {type(exc).__name__}: {str(exc)[:160]}")
                continue
    summarize(run, shape, base, tree_name(table))
    del w, x_all
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(out_dir: Path) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cpu" if SMOKE else "cuda")
    key = arch(device if device.type == "cuda" else None)
    run = Run("tune_matmul", out_dir)
    todo = jobs(os.environ.get("TUNE_SHAPES"))
    run.log(f"tune_matmul: arch {key}, {len(todo)} jobs: {[j.name for j in todo]}")
    g = torch.Generator().manual_seed(0)
    for job in todo:
        if run.over():
            break
        run_job(run, job, key, device, g)
        run.save()  # after every job: a cut run keeps what it measured
    path = run.save()
    run.log(f"wrote {path} ({len(run.rows)} rows{', cut by the deadline' if run.cut else ''})")
    return 0


if __name__ == "__main__":
    if not SMOKE and not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out")))
