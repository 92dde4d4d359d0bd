"""Tuning aid for the FP8 rows of the matmul tables (GPU lanes), one run:

    python ci/tune_fp8_gemm.py OUTDIR        # this round's shapes; OUTDIR/tune_fp8_gemm.json
    TUNE_SHAPES=4096x4096:tensor,7168x2048:block python ci/tune_fp8_gemm.py OUTDIR   # the shapes named
    TUNE_SMOKE=1 python ci/tune_fp8_gemm.py OUTDIR   # cpu lane: the plumbing, tiny shapes (ci/tuning.py)
    TUNE_PROBE=1 ...                           # also the tensor-core probe of run 35 (below)

For each shape it times, against ``torch._scaled_mm`` (cuBLASLt, no fast accumulation, bf16
output) in the same run and called as ``batchinv bench``'s ``torch_scaled_mm`` baseline and
the side-by-side script call it (per-tensor: scalar fp32 scales; per-token: ``x_scale [M, 1]``,
``weight_scale [1, N]``; where cuBLASLt refuses the row count, the rows padded with zeros to a
multiple of 16 inside the timed call, as the baseline does), candidate executions (walks only,
as issue 12 asks; 64- and 128-row tiles: wgmma, which implements the promotion) of the table's
tree and of its other K step (128 / 256: the same 128-product groups), at the M values of each
candidate's kind, and each prefill walk again with a persistent grid of two programs per SM
(``grid2``, ``num_sms = 2 x SMs``, which never changes the bits) at M >= 512.  Every
candidate's bits at M = 64 are compared with the shipped config's: one that differs is marked
and may not ship (``config_equivalence`` re-checks whatever ships).  Per shape a SUMMARY
(``ci/tuning.py``) gives per tree the best same-bits candidate per M and the tree's worst
ratio over M, then the tree to ship and its execution per M.

Round 3 (issue 26, part 2; the default): 4096x4096 and 14336x4096 with per-tensor and
per-token scales at M = 1, 8, 32, 128, 512, 4096 (issue 26: 1.17-2.32x and 0.99-1.81x
``torch._scaled_mm``).  The probe (``TUNE_PROBE=1``): one group of 32 products whose exact sum
needs more than 14 bits, summed with a promotion every 32 and every 128 products (run 35: the
tensor core keeps 13 fraction bits, truncated).  Round 1 (run 35) also timed a promotion every
32 products (15-40% slower; not shipped).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

if os.environ.get("TUNE_SMOKE") == "1":  # before triton is imported (batchinv.fast)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from tuning import SMOKE, Run, ratio, summarize, timer

from batchinv.fast.device import arch, sm_count
from batchinv.fast.fp8_gemm import fp8_gemm
from batchinv.fast.matmul_config import WHOLE_K, Execution, MatmulConfig, ReductionTree, reduction_tree
from batchinv.reference.fp8_gemm import fp8_gemm as reference_fp8_gemm

E = Execution
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
#: (N, K, scale layout): issue 12's table and issue 26's (TUNE_SHAPES names them as NxK:layout).
SHAPES = (
    (4096, 4096, "tensor"),
    (14336, 4096, "tensor"),
    (4096, 4096, "token"),
    (14336, 4096, "token"),
    (2688, 4096, "tensor"),
    (4608, 2688, "tensor"),
    (7168, 2048, "block"),
)
#: Round 3's shapes (the default).
ROUND = SHAPES[:4]
MS = (1, 8, 32, 128, 512, 4096)
#: The M of the bit comparison.
BITS_M = 64


def W(block_m: int, block_n: int, num_warps: int, num_stages: int, group_m: int = 8) -> Execution:
    """A walk with TMA reads."""
    return E(block_m, block_n, group_m=group_m, num_warps=num_warps, num_stages=num_stages, tma=True)


#: Round 3.  Decode (M <= 128): the shipped 64x64, 32 and 128 columns (4096 / 64 = 64 tiles on
#: 132 SMs; 14336 / 64 = 224 tiles: 1.7 waves, / 128 = 112: one), 6 stages, two warpgroups.
DECODE = [
    W(64, 64, 4, 4),
    W(64, 32, 4, 4),
    W(64, 128, 4, 4),
    W(64, 64, 4, 6),
    W(64, 64, 8, 4),
    W(64, 128, 8, 4),
]
#: Prefill (M >= 32): the shipped 128x128 w8 s3, 4 stages, 128x64 / 64x128, a wider L2 group,
#: 64x256 (128x256 was 1.4-2x slower in run 35: the promotion doubles the accumulator).
PREFILL = [
    W(128, 128, 8, 3),
    W(128, 128, 8, 4),
    W(128, 128, 8, 3, group_m=16),
    W(128, 64, 4, 4),
    W(64, 128, 4, 4),
    W(64, 256, 4, 3),
]
DECODE_MS = (1, 8, 32, 128)
PREFILL_MS = (32, 128, 512, 4096)
GRID2_MS = (512, 4096)
#: TUNE_SMOKE=1: one tiny shape per layout under the interpreter, two walks, two M.
SMOKE_SHAPES = ((96, 160, "tensor"), (96, 160, "token"))
SMOKE_MS = (1, 8)
SMOKE_DECODE = [E(16, 64, group_m=2), E(64, 64, group_m=2, tma=True)]
SMOKE_PREFILL = [E(64, 64, group_m=2, tma=True)]


def shapes(only: str | None) -> list[tuple[int, int, str]]:
    if SMOKE:
        return list(SMOKE_SHAPES)
    if not only:
        return list(ROUND)
    names = only.split(",")
    known = {f"{n}x{k}:{layout}" for n, k, layout in SHAPES}
    unknown = [x for x in names if x not in known]
    if unknown:
        raise SystemExit(f"TUNE_SHAPES: unknown shape(s) {unknown}; known: {sorted(known)}")
    return [s for s in SHAPES if f"{s[0]}x{s[1]}:{s[2]}" in names]


def operands(n: int, k: int, layout: str, m: int, g: torch.Generator, device: torch.device) -> dict:
    """The side-by-side script's operands: e4m3 of N(0, 1); per-tensor scales 0.02 (x) and 0.01
    (weight); per-token U[0.01, 0.03) per row and U[0.005, 0.015) per channel; block scales
    U[0.5, 1.5) / 16 and / 1024 (issue 12's tuner)."""
    from batchinv.reference.fp8_gemm import scale_shapes

    ops = {
        "x": torch.randn(m, k, generator=g).to(FP8).to(device),
        "weight": torch.randn(n, k, generator=g).to(FP8).to(device),
        "scale_layout": layout,
    }
    if layout == "tensor":
        ops["x_scale"] = torch.full((1,), 0.02, device=device)
        ops["weight_scale"] = torch.full((1,), 0.01, device=device)
    elif layout == "token":
        ops["x_scale"] = (torch.rand(m, 1, generator=g) * 0.02 + 0.01).to(device)
        ops["weight_scale"] = (torch.rand(n, 1, generator=g) * 0.01 + 0.005).to(device)
    else:
        xs_shape, ws_shape = scale_shapes(layout, m, n, k)
        ops["x_scale"] = ((torch.rand(xs_shape, generator=g) + 0.5) / 16).to(device)
        ops["weight_scale"] = ((torch.rand(ws_shape, generator=g) + 0.5) / 1024).to(device)
    return ops


def slice_rows(ops: dict, m: int) -> dict:
    out = dict(ops)
    out["x"] = ops["x"][:m]
    if ops["scale_layout"] != "tensor":
        out["x_scale"] = ops["x_scale"][:m]
    return out


def scaled_mm(ops: dict) -> tuple:
    """``(call, how)``: ``torch._scaled_mm`` as the side-by-side script calls it (per-tensor:
    ``reshape(())`` scalars; per-token: ``x_scale [M, 1]``, ``weight_scale.reshape(1, N)``), tried
    once eagerly; where cuBLASLt refuses the row count (``CUBLAS_STATUS_NOT_SUPPORTED``) the
    baseline's padding inside the call (``fast/baselines/fp8_gemm.py``: zero rows, scale 1, up
    to a multiple of 16, cut off again).  Block scales: that baseline itself."""
    x, b, layout = ops["x"], ops["weight"].t(), ops["scale_layout"]
    if layout == "block":
        from batchinv.fast.baselines.fp8_gemm import torch_scaled_mm

        return (lambda: torch_scaled_mm(**ops)), "baseline torch_scaled_mm (block-wise)"
    if layout == "tensor":
        xs, ws = ops["x_scale"].reshape(()), ops["weight_scale"].reshape(())
    else:
        xs, ws = ops["x_scale"], ops["weight_scale"].reshape(1, -1)

    def plain():
        return torch._scaled_mm(x, b, xs, ws, out_dtype=BF16)

    try:
        plain()
        return plain, "plain"
    except RuntimeError as exc:
        if "CUBLAS_STATUS_NOT_SUPPORTED" not in str(exc) or layout != "token":
            raise
    rows = x.shape[0]
    pad = -rows % 16

    def padded():
        x_p = torch.cat([x, x.new_zeros((pad, x.shape[1]))])
        xs_p = torch.cat([xs.reshape(rows, 1), xs.new_ones((pad, 1))])
        return torch._scaled_mm(x_p, b, xs_p, ws, out_dtype=BF16)[:rows]

    padded()
    return padded, f"rows padded {rows} -> {rows + pad}"


def probe(device: torch.device) -> list[str]:
    """One output whose 32 products (each 2**8 * odd) sum exactly to more than 2**14 units of
    the smallest: bits the 13-bit accumulator must drop unless promoted; and 128 of them."""
    lines = []
    for k in (32, 128):
        x = torch.full((64, k), 15.0).to(FP8)  # 15 = 1.875 * 8: 4 significant bits
        w = torch.full((16, k), 15.0).to(FP8)
        x[:, 0] = 0.015625  # a tiny product (2**-6 * 15) far below the others
        ones = torch.ones(1, device=device)
        x, w = x.to(device), w.to(device)
        exact = float(reference_fp8_gemm(x, w, ones, ones, out_dtype=torch.float32)[0, 0])
        for promote in (32, 128):
            if promote > k:
                continue
            tree = replace(reduction_tree(arch(device), FP8, 16, k, "tensor"), promote_k=promote)
            cfg = MatmulConfig(tree, E(64, 16, num_warps=4, num_stages=2))
            got = float(fp8_gemm(x, w, ones, ones, out_dtype=torch.float32, config=cfg)[0, 0])
            lines.append(f"probe K={k} promote_k={promote}: exact {exact!r} got {got!r} diff {got - exact!r}")
    return lines


def tree_name(tree: ReductionTree) -> str:
    chunk = "K" if tree.chunk_k >= WHOLE_K else str(tree.chunk_k)
    return f"k{tree.block_k}/{chunk}p{tree.promote_k}"


def trees(key: str, n: int, k: int, layout: str) -> list[ReductionTree]:
    """The table's tree, then (whole-K layouts) its other K step with the same promotion."""
    table = reduction_tree(key, FP8, n, k, layout)
    out = [table]
    if layout != "block" and table.promote_k:
        other = 128 if table.block_k == 256 else 256
        out.append(replace(table, block_k=other, chunk_k=WHOLE_K))
    elif layout != "block":  # the interpreter's tree (no promotion): the other K step
        out.append(replace(table, block_k=table.block_k * 2, chunk_k=WHOLE_K))
    return list(dict.fromkeys(out))


def run_shape(
    run: Run, n: int, k: int, layout: str, key: str, device: torch.device, g: torch.Generator
) -> None:
    ms = SMOKE_MS if SMOKE else MS
    decode, prefill = (SMOKE_DECODE, SMOKE_PREFILL) if SMOKE else (DECODE, PREFILL)
    decode_ms, prefill_ms, grid2_ms = (SMOKE_MS, SMOKE_MS[-1:], SMOKE_MS[-1:]) if SMOKE else (
        DECODE_MS, PREFILL_MS, GRID2_MS)  # fmt: skip
    ops = operands(n, k, layout, max(*ms, BITS_M), g, device)
    shape = f"N={n} K={k} {layout}"
    run.log(f"== {shape}: trees {[tree_name(t) for t in trees(key, n, k, layout)]}")
    base, how = {}, {}
    for m in ms:
        try:
            call, how[m] = scaled_mm(slice_rows(ops, m))
            base[m], _ = timer(call)
        except Exception as exc:
            run.log(f"   _scaled_mm M={m} error {type(exc).__name__}: {str(exc)[:200]}")
            base[m], how[m] = float("nan"), f"error {type(exc).__name__}"
    run.log("   _scaled_mm " + "  ".join(f"M={m}: {us:.1f}" for m, us in base.items()))
    padded = {m: h for m, h in how.items() if h != "plain"}
    if padded:
        run.log(f"   _scaled_mm not plain: {padded}")
    run.add({"kind": "comparator", "shape": shape, "impl": "torch._scaled_mm", "us": base, "how": how})
    prod = {}
    for m in ms:  # the production path (the shipped tables), what issue 26's figures time
        sliced = slice_rows(ops, m)
        fp8_gemm(**sliced)
        prod[m], _ = timer(lambda o=sliced: fp8_gemm(**o))
    run.log(
        "   shipped " + "  ".join(f"M={m}: {us:.1f}({ratio(us, base[m]):.2f}x)" for m, us in prod.items())
    )
    run.add({"kind": "production", "shape": shape, "impl": "batchinv (shipped tables)", "us": prod})
    grid2 = 2 * sm_count(device if device.type == "cuda" else None)
    want = fp8_gemm(**slice_rows(ops, BITS_M)).view(torch.int16)  # the shipped config's bits
    table = reduction_tree(key, FP8, n, k, layout)
    for tree in trees(key, n, k, layout):
        for ex in dict.fromkeys([*decode, *prefill]):
            if run.over():
                break
            cfg = MatmulConfig(tree, ex)
            cms = tuple(
                sorted({*(decode_ms if ex in decode else ()), *(prefill_ms if ex in prefill else ())})
            )
            try:
                bits = fp8_gemm(**slice_rows(ops, BITS_M), config=cfg).view(torch.int16)
                same = bool(torch.equal(bits, want))
                variants = [(ex.name, None, cms)]
                if ex in prefill:
                    variants.append((ex.name + " grid2", grid2, tuple(m for m in cms if m in grid2_ms)))
                for name, num_sms, vms in variants:
                    if num_sms is not None and vms:  # the planned SM count never changes the bits: checked
                        g2 = fp8_gemm(**slice_rows(ops, BITS_M), config=cfg, num_sms=num_sms)
                        same = same and bool(torch.equal(g2.view(torch.int16), want))
                    times = {}
                    for m in vms:
                        sliced = slice_rows(ops, m)

                        def call(o=sliced, cfg=cfg, num_sms=num_sms):
                            return fp8_gemm(**o, config=cfg, num_sms=num_sms)

                        call()
                        times[m], _ = timer(call)
                    if not times:
                        continue
                    cells = "  ".join(f"{m}:{us:.1f}({ratio(us, base[m]):.2f}x)" for m, us in times.items())
                    mark = "" if same else "   BITS DIFFER from the shipped config"
                    run.log(f"   {tree_name(tree)} {name:<32} {cells}{mark}")
                    run.add({"kind": "candidate", "shape": shape, "tree": tree_name(tree), "execution": name,
                             "same_bits": same, "us": times})  # fmt: skip
            except Exception as exc:  # a config that does not compile is a finding, not a stop
                run.log(f"   {tree_name(tree)} {ex.name:<32} error {type(exc).__name__}: {str(exc)[:160]}")
                continue
    summarize(run, shape, base, tree_name(table))
    del ops
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(out_dir: Path) -> int:
    device = torch.device("cpu" if SMOKE else "cuda")
    key = arch(device)
    run = Run("tune_fp8_gemm", out_dir)
    todo = shapes(os.environ.get("TUNE_SHAPES"))
    run.log(f"tune_fp8_gemm: arch {key}, shapes {[f'{n}x{k}:{layout}' for n, k, layout in todo]}")
    if os.environ.get("TUNE_PROBE") == "1" and not SMOKE:
        for line in probe(device):
            run.log(line)
            run.add({"kind": "probe", "line": line})
    g = torch.Generator().manual_seed(0)
    for n, k, layout in todo:
        if run.over():
            break
        run_shape(run, n, k, layout, key, device, g)
        run.save()  # after every shape: a cut run keeps what it measured
    path = run.save()
    run.log(f"wrote {path} ({len(run.rows)} rows{', cut by the deadline' if run.cut else ''})")
    return 0


if __name__ == "__main__":
    if not SMOKE and not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out")))
