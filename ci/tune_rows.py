"""Tuning aid for the row kernels' tiles (GPU lanes): mean, rms_norm and fused_add_rms_norm.

Times candidate tiles of ``fast/mean.py``'s and ``fast/rms_norm.py``'s launchers against the
production path (``torch.mean``, ``F.rms_norm``) at a few row counts (CUDA-graph replay,
``batchinv.harness.bench.time_call``, the same number of calls per replay for every
implementation), and says for each candidate whether its bits equal the shipped tile's on the
timed input.  A tile that changes ``block_n`` (mean) or the reduction layout (rms_norm:
``block_n``, ``num_warps``) is another reduction tree: it may ship only as the table entry of its
(arch, dtype, row length) key, for every M, after the sweep's agreement passes with it.

    python ci/tune_rows.py OUTDIR [mean rms_norm fused_add_rms_norm]
                                     # prints the table, writes OUTDIR/tune_rows.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from batchinv.fast import mean as fast_mean
from batchinv.fast import rms_norm as fast_rms_norm
from batchinv.fast.device import arch
from batchinv.fast.row_config import RowConfig
from batchinv.harness.bench import time_call

REPS = 30
ROWS = (1, 64, 1024, 4096)

MEAN_POINTS = [
    (torch.bfloat16, 4096),
    (torch.float32, 4096),
    (torch.bfloat16, 2560),
    (torch.bfloat16, 8192),
    (torch.float32, 8192),
    (torch.bfloat16, 151936),
]
#: Pipeline depths (1: none) tried on the shipped tile of every point (``RowConfig.num_stages``: the same
#: tree, so the same bits).  Run 65 (H100): slower at every depth on the 512-column tile, 4-11%
#: faster with 8 warps at depth 3 on the 151936-column one (docs/DEVICE_RUNS.md).
MEAN_STAGES = (1, 2, 3, 4, 6)
MEAN_TILES = [
    RowConfig(1, 8192, 16),
    RowConfig(1, 4096, 16),
    RowConfig(1, 4096, 8),
    RowConfig(1, 4096, 4),
    RowConfig(1, 2048, 8),
    RowConfig(1, 2048, 4),
    RowConfig(1, 1024, 4),
    RowConfig(1, 1024, 2),
    RowConfig(1, 512, 4),
    RowConfig(2, 2048, 8),
    RowConfig(2, 1024, 4),
    RowConfig(4, 1024, 8),
    RowConfig(4, 512, 4),
    RowConfig(8, 512, 8),
    RowConfig(8, 256, 4),
]

NORM_POINTS = [(torch.bfloat16, 7168), (torch.bfloat16, 4096)]
#: (block_m, block_n, num_warps); block_n None = the shipped config's.
NORM_TILES: list[tuple[int, int | None, int]] = [
    (1, None, 16),
    (1, None, 8),
    (1, None, 4),
    (1, None, 32),
    (2, None, 8),
    (2, None, 16),
    (4, None, 16),
    (1, 4096, 8),
    (1, 2048, 8),
    (1, 2048, 4),
]


def _row(kind: str, dtype: torch.dtype, n: int, rows: int, impl: str, us: float, same: Any) -> dict:
    return {
        "kernel": kind,
        "dtype": str(dtype).removeprefix("torch."),
        "n": n,
        "rows": rows,
        "impl": impl,
        "us": round(us, 2),
        "bits_equal_shipped": same,
    }


def _time(fn: Callable[[], Any]) -> float:
    return time_call(fn, REPS)[0]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _mean_point(out: list[dict], dtype: torch.dtype, n: int, rows: int) -> None:
    shipped_cfg = fast_mean.mean_config(arch(torch.device("cuda")), dtype, n)
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + n)
    x = torch.randn(rows, n, device="cuda", generator=g).to(dtype)
    shipped = fast_mean.launch(x, dtype, False)
    out.append(_row("mean", dtype, n, rows, "torch.mean", _time(lambda: torch.mean(x, dim=-1)), None))
    us = _time(lambda: fast_mean.launch(x, dtype, False))
    out.append(_row("mean", dtype, n, rows, f"shipped {shipped_cfg}", us, True))
    staged = [replace(shipped_cfg, num_stages=st) for st in MEAN_STAGES]
    staged += [replace(shipped_cfg, num_warps=w, num_stages=st) for w in (8, 16) for st in (1, 3)]
    for cfg in [*staged, *MEAN_TILES]:
        if cfg == shipped_cfg:
            continue
        same = bool(torch.equal(_bits(fast_mean.launch(x, dtype, False, config=cfg)), _bits(shipped)))
        us = _time(lambda cfg=cfg: fast_mean.launch(x, dtype, False, config=cfg))
        out.append(_row("mean", dtype, n, rows, str(cfg), us, same))


def tune_mean(out: list[dict]) -> None:
    for dtype, n in MEAN_POINTS:
        for rows in ROWS:
            if rows * n > 2**28:
                continue
            first = len(out)
            _mean_point(out, dtype, n, rows)
            print_rows(out[first:])


def _norm_point(out: list[dict], dtype: torch.dtype, n: int, rows: int, fused: bool) -> None:
    kind = "fused_add_rms_norm" if fused else "rms_norm"
    shipped_cfg = fast_rms_norm.config_for(arch(torch.device("cuda")), dtype, n)
    g = torch.Generator(device="cuda").manual_seed(rows * 11 + n)
    x = torch.randn(rows, n, device="cuda", generator=g).to(dtype)
    w = torch.randn(n, device="cuda", generator=g).to(dtype)
    res = torch.randn(rows, n, device="cuda", generator=g).to(dtype) if fused else None
    eps = 1e-6
    shipped, _ = fast_rms_norm.launch_rows(x, res, w, eps, shipped_cfg)

    def production() -> Any:
        return F.rms_norm(x + res if res is not None else x, (n,), w, eps)

    out.append(
        _row(
            kind, dtype, n, rows, "F.rms_norm" + (" (x + residual)" if fused else ""), _time(production), None
        )
    )
    us = _time(lambda: fast_rms_norm.launch_rows(x, res, w, eps, shipped_cfg))
    out.append(_row(kind, dtype, n, rows, f"shipped {shipped_cfg}", us, True))
    # What the fp64 sum of squares costs: the shipped tile summing fp32 squares (not shippable:
    # the squares overflow past |h| = 2^64; issue 26 names the fp64 sum as rms_norm's cost).
    configs = [
        fast_rms_norm.RmsNormConfig(
            block_m=block_m,
            block_n=block_n or shipped_cfg.block_n,
            num_warps=warps,
            row_align=shipped_cfg.row_align,
        )
        for block_m, block_n, warps in NORM_TILES
    ]
    for cfg in [*configs, replace(shipped_cfg, fp64_sum=False)]:
        if cfg == shipped_cfg:
            continue
        y, _ = fast_rms_norm.launch_rows(x, res, w, eps, cfg)
        same = bool(torch.equal(_bits(y), _bits(shipped)))
        us = _time(lambda cfg=cfg: fast_rms_norm.launch_rows(x, res, w, eps, cfg))
        out.append(_row(kind, dtype, n, rows, str(cfg), us, same))


def tune_rms_norm(out: list[dict], fused: bool = False) -> None:
    for dtype, n in NORM_POINTS:
        for rows in ROWS:
            first = len(out)
            _norm_point(out, dtype, n, rows, fused)
            print_rows(out[first:])


def print_rows(rows: list[dict]) -> None:
    base = next(
        (r["us"] for r in rows if not str(r["impl"]).startswith(("shipped", "RowConfig", "RmsNorm"))), None
    )
    for r in rows:
        ratio = f"{r['us'] / base:5.2f}x" if base else ""
        print(
            f"{r['kernel']:9} {r['dtype']:9} N={r['n']:<7} rows={r['rows']:<5} {r['us']:9.2f} us {ratio} "
            f"same={r['bits_equal_shipped']!s:5} {r['impl']}",
            flush=True,
        )


def main(outdir: Path) -> int:
    outdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    which = sys.argv[2:] or ["mean", "rms_norm", "fused_add_rms_norm"]
    if "mean" in which:
        tune_mean(rows)
    if "rms_norm" in which:
        tune_rms_norm(rows)
    if "fused_add_rms_norm" in which:
        tune_rms_norm(rows, fused=True)
    (outdir / "tune_rows.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
