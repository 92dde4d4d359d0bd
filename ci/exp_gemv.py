"""Experiment (not shipped; run 55, docs/BENCHMARKS.md "Issue 26"): a dot-free split-K GEMV for IEEE fp32 at small M.  Does a sequential
fma chain over k give the bits of Triton's FMA-lowered tl.dot (the shipped split-K execution)?  It did, on every candidate, and was slower (17.5-18.6 us at M = 1-2
against 14.3).  GPU only:  python ci/exp_gemv.py"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from batchinv.fast.kernels.matmul import chunk_sum_kernel
from batchinv.fast.matmul import SUM_TILE, matmul
from batchinv.fast.matmul_config import reduction_tree
from batchinv.harness.bench import time_call


@triton.jit
def gemv_chunk_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    M,
    N,
    K,
    chunk_k,
    stride_xm,
    stride_wn,
    stride_ws_c,
    stride_ws_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UNROLL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    chunk = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k0 = chunk * chunk_k
    k1 = tl.minimum(k0 + chunk_k, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_rows = x_ptr + offs_m.to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64) * stride_wn
    for k in range(k0, k1, UNROLL):
        for u in tl.static_range(UNROLL):
            kk = k + u
            ok = kk < k1
            a = tl.load(x_rows + kk, mask=m_ok & ok, other=0.0)
            b = tl.load(w_rows + kk, mask=n_ok & ok, other=0.0)
            acc = tl.fma(a[:, None], b[None, :], acc)
    ws = (
        ws_ptr
        + chunk.to(tl.int64) * stride_ws_c
        + offs_m[:, None].to(tl.int64) * stride_ws_m
        + offs_n[None, :]
    )
    tl.store(ws, acc, mask=m_ok[:, None] & n_ok[None, :])


def gemv(x, w, chunk_k, block_m, block_n, warps, unroll):
    m, k = x.shape
    n = w.shape[0]
    chunks = -(k // -chunk_k)
    ws = torch.empty((chunks, m, n), device=x.device, dtype=torch.float32)
    out = torch.empty((m, n), device=x.device, dtype=torch.float32)
    gemv_chunk_kernel[(-(n // -block_n), chunks, -(m // -block_m))](
        x,
        w,
        ws,
        m,
        n,
        k,
        chunk_k,
        x.stride(0),
        w.stride(0),
        ws.stride(0),
        ws.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UNROLL=unroll,
        num_warps=warps,
    )
    sm, sn = SUM_TILE
    chunk_sum_kernel[(-(m // -sm), -(n // -sn))](
        ws,
        out,
        out,
        m,
        n,
        chunks,
        ws.stride(0),
        ws.stride(1),
        out.stride(0),
        out.stride(1),
        0,
        BLOCK_M=sm,
        BLOCK_N=sn,
        HAS_BIAS=False,
        INTERPRETED=False,
        num_warps=4,
    )
    return out


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    bad = 0
    for n, k in ((256, 4096), (256, 7168)):
        tree = reduction_tree("sm90", torch.float32, n, k)
        w = (torch.randn(n, k, generator=g) / k**0.5).to(dev)
        xa = torch.randn(64, k, generator=g).to(dev)
        # sprinkle magnitudes so order matters
        xa[:, ::7] *= 1e4
        for m in (1, 2, 4, 8, 16, 32):
            x = xa[:m]
            want = matmul(x, w, out_dtype=torch.float32)
            base, _ = time_call(lambda x=x, w=w: torch.nn.functional.linear(x, w), 30)
            ship, _ = time_call(lambda x=x, w=w: matmul(x, w, out_dtype=torch.float32), 30)
            line = f"N={n} K={k} M={m:<3} cublas {base:6.1f}  shipped {ship:6.1f}"
            for bm, bn, wp, un in (
                (1, 128, 4, 8),
                (1, 64, 2, 8),
                (2, 128, 4, 8),
                (4, 128, 4, 8),
                (1, 256, 8, 8),
                (1, 128, 4, 4),
                (8, 128, 4, 8),
                (16, 64, 4, 4),
            ):
                if bm > 2 * m:
                    continue
                got = gemv(x, w, tree.chunk_k, bm, bn, wp, un)
                same = torch.equal(got.view(torch.int32), want.view(torch.int32))
                bad += not same
                us, _ = time_call(
                    lambda x=x, w=w, c=tree.chunk_k, bm=bm, bn=bn, wp=wp, un=un: gemv(
                        x, w, c, bm, bn, wp, un
                    ),
                    30,
                )
                line += f" | {bm}x{bn}w{wp}u{un} {us:6.1f}{'' if same else ' DIFF'}"
            print(line, flush=True)
    print("bits differ in", bad, "candidates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
