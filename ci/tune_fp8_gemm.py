"""Tuning aid for the FP8 rows of the matmul tables (GPU lanes), one run:

    python ci/tune_fp8_gemm.py OUTDIR        # table on stdout, OUTDIR/tune_fp8_gemm.json

For each shape of issue 12's speed table it times, against ``torch._scaled_mm`` (cuBLASLt, no
fast accumulation, bf16 output) in the same run, candidate executions (walks only, 64- and
128-row tiles: wgmma) of the table's tree with a promotion every 128 products, in K steps of 128
and (whole-K layouts) 256, at M in {1, 8, 32, 128, 512, 2048}, and prints the best per M.  Every
candidate's bits at M = 64 are compared with the shipped config's: one that differs is marked
and may not ship (``config_equivalence`` re-checks whatever ships).  It also probes the tensor
core: one group of 32 products whose exact sum needs more than 14 bits, summed with a promotion
every 32 and every 128 products (run 35: 13 fraction bits, truncated).  Round 1 (run 35) also
timed a promotion every 32 products (15-40% slower; not shipped).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from batchinv.fast.device import arch
from batchinv.fast.fp8_gemm import fp8_gemm
from batchinv.fast.matmul_config import Execution, MatmulConfig, reduction_tree
from batchinv.harness.bench import time_call
from batchinv.reference.fp8_gemm import fp8_gemm as reference_fp8_gemm
from batchinv.reference.fp8_gemm import scale_shapes

E = Execution
FP8 = torch.float8_e4m3fn
#: (N, K, scale layout): the issue's table.
SHAPES = (
    (4096, 4096, "tensor"),
    (2688, 4096, "tensor"),
    (4608, 2688, "tensor"),
    (14336, 4096, "tensor"),
    (4096, 4096, "token"),
    (7168, 2048, "block"),
)
MS = (1, 8, 32, 128, 512, 2048)
#: Round 2 (run 2): promote_k = 128 (run 1: 32 was 15-40% slower everywhere), BLOCK_K 128 or
#: 256 (the same 128-product groups, so the same bits), narrow tiles for decode.
DECODE = [
    E(64, 16, num_warps=4, num_stages=4, tma=True),
    E(64, 16, num_warps=4, num_stages=6, tma=True),
    E(64, 32, num_warps=4, num_stages=4, tma=True),
    E(64, 32, num_warps=4, num_stages=6, tma=True),
    E(64, 64, num_warps=4, num_stages=4, tma=True),
]
PREFILL = [
    E(64, 128, num_warps=4, num_stages=4, tma=True),
    E(128, 128, num_warps=8, num_stages=3, tma=True),
    E(128, 128, num_warps=8, num_stages=4, tma=True),
    E(128, 64, num_warps=4, num_stages=4, tma=True),
    E(128, 256, num_warps=8, num_stages=3, tma=True),
    E(64, 256, num_warps=4, num_stages=3, tma=True),
]
CANDIDATES = DECODE + PREFILL
DECODE_MS = (1, 8, 32, 128)
PREFILL_MS = (128, 512, 2048)


def operands(n: int, k: int, layout: str, m: int, g: torch.Generator, device: torch.device) -> dict:
    xs_shape, ws_shape = scale_shapes(layout, m, n, k)
    return {
        "x": (torch.randn(m, k, generator=g) * 8).to(FP8).to(device),
        "weight": (torch.randn(n, k, generator=g) * 8).to(FP8).to(device),
        "x_scale": (torch.rand(xs_shape or (1,), generator=g) + 0.5).to(device) / 16,
        "weight_scale": (torch.rand(ws_shape or (1,), generator=g) + 0.5).to(device) / 1024,
        "scale_layout": layout,
    }


def scaled_mm(ops: dict) -> torch.Tensor:
    """``torch._scaled_mm`` for the tensor and token layouts; block-wise via F.scaled_mm."""
    x, w = ops["x"], ops["weight"]
    if ops["scale_layout"] == "tensor":
        return torch._scaled_mm(
            x, w.t(), ops["x_scale"].reshape(()), ops["weight_scale"].reshape(()), out_dtype=torch.bfloat16
        )
    if ops["scale_layout"] == "token":
        return torch._scaled_mm(
            x, w.t(), ops["x_scale"], ops["weight_scale"].reshape(1, -1), out_dtype=torch.bfloat16
        )
    st = torch.nn.functional.ScalingType
    return torch.nn.functional.scaled_mm(
        x, w.t(), ops["x_scale"].t().contiguous().t(), st.BlockWise1x128, ops["weight_scale"].t(), st.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )  # fmt: skip


def slice_rows(ops: dict, m: int) -> dict:
    out = dict(ops)
    out["x"] = ops["x"][:m]
    if ops["scale_layout"] != "tensor":
        out["x_scale"] = ops["x_scale"][:m]
    return out


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


def main(out_dir: Path) -> int:
    device = torch.device("cuda")
    key = arch(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for line in probe(device):
        print(line, flush=True)
        rows.append({"probe": line})
    g = torch.Generator().manual_seed(0)
    for n, k, layout in SHAPES:
        ops = operands(n, k, layout, max(MS), g, device)
        shape = f"N={n} K={k} {layout}"
        print(f"\n== {shape}", flush=True)
        base = {}
        try:
            for m in MS:
                sliced = slice_rows(ops, m)
                base[m], _ = time_call(lambda o=sliced: scaled_mm(o), 20)
        except Exception as exc:
            print(f"   _scaled_mm error {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            base = {m: float("nan") for m in MS}
        print("   _scaled_mm " + "  ".join(f"M={m}: {us:.1f}" for m, us in base.items()), flush=True)
        rows.append({"shape": shape, "impl": "torch._scaled_mm", "us": base})
        table_tree = reduction_tree(key, FP8, n, k, layout)
        want = fp8_gemm(**slice_rows(ops, 64)).view(torch.int16)  # the shipped config's bits
        trees = [replace(table_tree, promote_k=128)]
        if layout != "block":
            trees.append(replace(table_tree, block_k=256, promote_k=128))
        for tree in trees:
            best: dict[int, tuple[float, str]] = {}
            for ex in CANDIDATES:
                cfg = MatmulConfig(tree, ex)
                ms = DECODE_MS if ex in DECODE else PREFILL_MS
                try:
                    same = torch.equal(fp8_gemm(**slice_rows(ops, 64), config=cfg).view(torch.int16), want)
                    times = {}
                    for m in ms:
                        sliced = slice_rows(ops, m)
                        times[m], _ = time_call(lambda o=sliced, cfg=cfg: fp8_gemm(**o, config=cfg), 20)
                except Exception as exc:  # a config that does not compile is a finding, not a stop
                    print(f"   {cfg.name:<44} error {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    continue
                for m, us in times.items():
                    if m not in best or us < best[m][0]:
                        best[m] = (us, ex.name)
                cells = "  ".join(f"{m}:{us:.1f}({us / base[m]:.2f}x)" for m, us in times.items())
                mark = "" if same else "   BITS DIFFER from the shipped config"
                print(f"   {cfg.name:<44} {cells}{mark}", flush=True)
                rows.append({"shape": shape, "impl": cfg.name, "same_bits": same, "us": times})
            print(f"   best of {MatmulConfig(tree, CANDIDATES[0]).name.split()[0]}:", flush=True)
            for m in sorted(best):
                us, name = best[m]
                print(f"      M={m:<5} {us:8.1f} us  {us / base[m]:.2f}x  {name}", flush=True)
        del ops
        torch.cuda.empty_cache()
    (out_dir / "tune_fp8_gemm.json").write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out")))
