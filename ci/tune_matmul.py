"""Tuning aid for the persistent matmul (GPU lanes): times candidate tile configs for each
config-table row against cuBLAS (the torch_default baseline) in one run, at decode and prefill batch sizes.

    python ci/tune_matmul.py            # prints a table per (dtype, N, K)

One config must serve every M (the table is never keyed on M), so a candidate is judged by its
worst ratio to cuBLAS over the M values.  The chosen rows go into fast/matmul_config.py and the
run into docs/BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import sys

import torch

from batchinv.fast.matmul import matmul
from batchinv.fast.matmul_baselines import torch_default
from batchinv.fast.matmul_config import MatmulConfig, select_config
from batchinv.harness.bench import time_call

C = MatmulConfig
#: (input dtype, out dtype, N, K) -> candidates (the shipped config is added first).
CANDIDATES: dict[tuple[torch.dtype, torch.dtype, int, int], list[MatmulConfig]] = {
    (torch.bfloat16, torch.bfloat16, 4096, 4096): [
        C(64, 128, 64, num_warps=4, num_stages=4),
        C(128, 64, 64, num_warps=4, num_stages=4),
        C(64, 64, 64, num_warps=4, num_stages=4),
        C(128, 256, 64, num_warps=8, num_stages=3),
        C(64, 256, 64, num_warps=8, num_stages=3),
    ],
    (torch.bfloat16, torch.bfloat16, 14336, 4096): [
        C(64, 128, 64, num_warps=4, num_stages=4),
        C(128, 256, 64, num_warps=8, num_stages=3),
        C(64, 256, 64, num_warps=8, num_stages=3),
    ],
    (torch.bfloat16, torch.float32, 256, 4096): [
        C(16, 32, 256, num_warps=4, num_stages=3),
        C(64, 32, 128, num_warps=4, num_stages=4),
        C(64, 128, 64, num_warps=4, num_stages=4),
    ],
    (torch.float32, torch.float32, 256, 4096): [
        C(16, 16, 128, num_warps=4, num_stages=3),
        C(32, 32, 32, num_warps=4, num_stages=3),
        C(16, 64, 32, num_warps=4, num_stages=3),
        C(64, 64, 32, num_warps=8, num_stages=3),
    ],
}
MS = (1, 32, 512, 4096)


def main() -> int:
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    for (dtype, out_dtype, n, k), candidates in CANDIDATES.items():
        w = torch.randn(n, k, generator=g).to(dtype).to(device)
        x_all = torch.randn(max(MS), k, generator=g).to(dtype).to(device)
        shipped = select_config("sm90", dtype, n, k)
        cublas = {}
        for m in MS:
            call = functools.partial(torch_default, x_all[:m], w, None, layout="linear", out_dtype=out_dtype)
            cublas[m], _ = time_call(call, 30)
        print(
            f"\n{str(dtype).removeprefix('torch.')} -> {str(out_dtype).removeprefix('torch.')} N={n} K={k}: "
            + "  ".join(f"cuBLAS M={m}: {cublas[m]:.1f} us" for m in MS)
        )
        for cfg in [shipped, *candidates]:
            label = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
            try:
                ratios = []
                cells = []
                for m in MS:
                    call = functools.partial(matmul, x_all[:m], w, out_dtype=out_dtype, config=cfg)
                    us, _ = time_call(call, 30)
                    ratios.append(us / cublas[m])
                    cells.append(f"{us:8.1f} ({us / cublas[m]:.2f}x)")
                star = "*" if cfg == shipped else " "
                print(f" {star} {label:<22} " + " ".join(cells) + f"   worst {max(ratios):.2f}x")
            except Exception as exc:  # a config that does not compile is a finding, not a stop
                print(f"   {label:<22} error {type(exc).__name__}: {str(exc)[:120]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
