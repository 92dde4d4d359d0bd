"""Where a few-microsecond point's time goes (GPU lanes): each implementation's CUDA kernels
and their device time per call, from ``torch.profiler``, beside the CUDA-graph replay time of
``batchinv.harness.bench.time_call``.  For the misses of issue 26 whose reason is latency (one
program's dependent chain, a second kernel, a launch): the kernels say which.

    python ci/kernel_times.py OUT_DIR   # writes OUT_DIR/kernel_times.{txt,json}

Points: the IEEE fp32 router 256x4096 at M = 1 and 8 (cuBLAS fp32, TF32 off), topk fp32 8192
columns k 512 / 2048 at 1 and 64 rows (torch.topk), log_softmax bf16 32000 at 16 and 64 rows,
mean bf16 4096 and 151936 columns at 1 row, rms_norm bf16 7168 at 1024 rows, fp8_gemm
per-tensor 4096^2 at M = 1 (torch._scaled_mm), matmul bf16 4096x2048 at M = 1 (cuBLAS); and the
three misses of BENCHMARKS that had no measured reason (2026-12-07): the bf16 router's fp32
logits 256x7168 at M = 4096 (cuBLAS bf16 then cast; cuBLAS writing fp32), fp8_gemm per-token
scales at prefill (4096^2 at M = 4096, 14336x4096 at M = 512; torch._scaled_mm), decode
attention Hq 32 Hkv 8 D 128 page 16 at R = 1 / 1k and R = 8 / 8k (the batch-planned split),
each point built as the outside kit builds it (decode attention's pool too: 34 GB of K and V).
Every point's operands are built before the selection below applies.

    python ci/kernel_times.py OUT_DIR [NAME_PREFIX ...]   # only the points whose name starts so
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from batchinv.harness.bench import time_call

CALLS = 20
DEVICE = "cuda"


def _randn(*shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    if (
        dtype.is_floating_point and dtype.itemsize >= 2
    ):  # drawn in its own dtype: no fp32 copy of a 17 GB pool
        return torch.randn(*shape, device=DEVICE, dtype=dtype).mul_(scale)
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def _points() -> list[tuple[str, dict[str, Callable[[], Any]]]]:
    from batchinv.fast.fp8_gemm import fp8_gemm
    from batchinv.fast.matmul import matmul
    from batchinv.fast.mean import mean
    from batchinv.fast.rms_norm import rms_norm
    from batchinv.fast.softmax import log_softmax
    from batchinv.fast.topk import topk

    points: list[tuple[str, dict[str, Callable[[], Any]]]] = []
    w32 = _randn(256, 4096, dtype=torch.float32, scale=0.02)
    for m in (1, 8):
        x = _randn(m, 4096, dtype=torch.float32)
        points.append(
            (
                f"router fp32 256x4096 M={m}",
                {"batchinv": lambda x=x: matmul(x, w32), "cublas": lambda x=x: F.linear(x, w32)},
            )
        )
    for rows in (1, 64):
        for k in (512, 2048):
            sc = _randn(rows, 8192, dtype=torch.float32)
            st = torch.zeros(rows, dtype=torch.int32, device=DEVICE)
            en = torch.full((rows,), 8192, dtype=torch.int32, device=DEVICE)
            points.append(
                (
                    f"topk 8192 k={k} rows={rows}",
                    {
                        "batchinv": lambda sc=sc, st=st, en=en, k=k: topk(sc, st, en, k),
                        "torch.topk": lambda sc=sc, k=k: torch.topk(sc, k, dim=-1),
                    },
                )
            )
    for rows in (16, 64):
        x = _randn(rows, 32000, scale=2.0)
        points.append(
            (
                f"log_softmax bf16 32000 rows={rows}",
                {"batchinv": lambda x=x: log_softmax(x, -1), "torch": lambda x=x: torch.log_softmax(x, -1)},
            )
        )
    for cols in (4096, 151936):
        x = _randn(1, cols)
        points.append(
            (
                f"mean bf16 {cols} rows=1",
                {"batchinv": lambda x=x: mean(x, -1), "torch": lambda x=x: torch.mean(x, -1)},
            )
        )
    x = _randn(1024, 7168)
    wn = _randn(7168)
    points.append(
        (
            "rms_norm bf16 7168 rows=1024",
            {"batchinv": lambda: rms_norm(x, wn, 1e-6), "torch": lambda: F.rms_norm(x, (7168,), wn, 1e-6)},
        )
    )
    a = _randn(1, 4096).to(torch.float8_e4m3fn)
    b = _randn(4096, 4096, scale=0.05).to(torch.float8_e4m3fn)
    sa = torch.full((1,), 0.5, device=DEVICE)
    sb = torch.full((1,), 0.25, device=DEVICE)
    points.append(
        (
            "fp8_gemm per-tensor 4096^2 M=1",
            {
                "batchinv": lambda: fp8_gemm(a, b, sa, sb, scale_layout="tensor"),
                "torch._scaled_mm": lambda: torch._scaled_mm(
                    a, b.t(), sa.reshape(()), sb.reshape(()), out_dtype=torch.bfloat16
                ),
            },
        )
    )
    points += _unexplained_misses()
    wb = _randn(4096, 2048, scale=0.02)
    xb = _randn(1, 2048)
    points.append(
        (
            "matmul bf16 4096x2048 M=1",
            {"batchinv": lambda: matmul(xb, wb), "cublas": lambda: F.linear(xb, wb)},
        )
    )
    return points


def _unexplained_misses() -> list[tuple[str, dict[str, Callable[[], Any]]]]:
    """The router's fp32 logits at M = 4096, FP8 per-token prefill, decode attention at R = 1 and 8."""
    import math

    from batchinv.fast.baselines.decode_attention import batch_planned_splits
    from batchinv.fast.decode_attention import decode_attention
    from batchinv.fast.fp8_gemm import fp8_gemm
    from batchinv.fast.matmul import matmul

    points: list[tuple[str, dict[str, Callable[[], Any]]]] = []
    wr = _randn(256, 7168, scale=0.02)
    xr = _randn(4096, 7168)
    points.append(
        (
            "router bf16 -> fp32 logits 256x7168 M=4096",
            {
                "batchinv": lambda: matmul(xr, wr, out_dtype=torch.float32),
                "cublas_then_cast": lambda: F.linear(xr, wr).float(),
                "cublas_mm_out_fp32": lambda: torch.mm(xr, wr.t(), out_dtype=torch.float32),
            },
        )
    )
    f8 = torch.float8_e4m3fn
    for n, k, m in ((4096, 4096, 4096), (14336, 4096, 512)):
        w8 = _randn(n, k, dtype=torch.float32).to(f8)
        x8 = _randn(m, k, dtype=torch.float32).to(f8)
        ws = torch.rand(n, 1, device=DEVICE) * 0.01 + 0.005
        xs = torch.rand(m, 1, device=DEVICE) * 0.02 + 0.01
        points.append(
            (
                f"fp8_gemm per-token {n}x{k} M={m}",
                {
                    "batchinv": lambda x8=x8, w8=w8, xs=xs, ws=ws: fp8_gemm(
                        x8, w8, xs, ws, scale_layout="token"
                    ),
                    "torch._scaled_mm": lambda x8=x8, w8=w8, xs=xs, ws=ws: torch._scaled_mm(
                        x8, w8.t(), xs, ws.reshape(1, -1), out_dtype=torch.bfloat16
                    ),
                },
            )
        )
    hq, hkv, d, page = 32, 8, 128, 16
    # the kit's one pool for every decode point: its largest point's pages (R 256 x 32k) + 1, so
    # each request's pages are scattered over 17 GB of K (and of V) as there: 34 GB in all
    pool_pages = 256 * -(-32768 // page) + 1
    k_cache = _randn(pool_pages, page, hkv, d)
    v_cache = _randn(pool_pages, page, hkv, d)
    for r, ctx_len in ((1, 1024), (8, 8192)):
        need = -(-ctx_len // page)
        table = torch.full((r, need + 1), -1, dtype=torch.int32)
        table[:, :need] = torch.randperm(pool_pages)[: r * need].view(r, need).to(torch.int32)
        table = table.to(DEVICE)
        lens = torch.full((r,), ctx_len, dtype=torch.int32, device=DEVICE)
        q = _randn(r, 1, hq, d)
        scale = 1.0 / math.sqrt(d)
        args = (q, k_cache, v_cache, table, lens, scale)
        points.append(
            (
                f"decode_attention Hq32 Hkv8 D128 page16 R={r} ctx={ctx_len}",
                {
                    "batchinv": lambda args=args: decode_attention(*args),
                    "batch_planned_splits": lambda args=args: batch_planned_splits(*args),
                },
            )
        )
    return points


def _kernels(fn: Callable[[], Any]) -> list[tuple[str, float]]:
    """(kernel name, device us per call) of ``fn``, from the profiler."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    found: list[tuple[str, float]] = []
    for avg in prof.key_averages():
        us = getattr(avg, "self_device_time_total", None)
        if us is None:
            us = getattr(avg, "self_cuda_time_total", 0.0)
        if us and avg.count:
            found.append((avg.key, us / CALLS))
    return sorted(found, key=lambda kv: -kv[1])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    prefixes = tuple(argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    lines = [f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}"]
    rows: list[dict[str, Any]] = []
    for name, impls in _points():
        if prefixes and not name.startswith(prefixes):
            continue
        lines.append(f"\n{name}")
        for impl, fn in impls.items():
            try:
                replay_us, mode = time_call(fn, 30)
                kernels = _kernels(fn)
            except Exception as exc:  # report and go on
                lines.append(f"  {impl}: error {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            total = sum(us for _, us in kernels)
            lines.append(f"  {impl}: replay {replay_us:.2f} us ({mode}); kernels {total:.2f} us")
            lines += [f"    {us:7.2f} us  {kernel[:110]}" for kernel, us in kernels]
            rows.append({"point": name, "impl": impl, "replay_us": replay_us, "kernels": kernels})
    text = "\n".join(lines)
    print(text)
    (out / "kernel_times.txt").write_text(text + "\n")
    (out / "kernel_times.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
