"""``batchinv audit cublas``: which cuBLAS environment recipes make ``F.linear`` batch-invariant.

A matrix of shape x dtype x bias x pin -> ``invariant``, ``varies`` (at which M) or ``error``,
printed as a table and saved as JSON and markdown.  Each pin runs in its own subprocess, since
cuBLAS / cuBLASLt read ``CUBLAS_WORKSPACE_CONFIG`` and ``CUBLASLT_WORKSPACE_SIZE`` when a handle
is created; ``BATCHINV_PREFERRED_BLAS`` makes the child call
``torch.backends.cuda.preferred_blas_library`` (see :mod:`batchinv.fast.baselines.matmul`).

For every (shape, dtype, bias) the child computes ``full = F.linear(x, w, b)`` at the largest M
and ``F.linear(x[:M], w, b)`` for each M of the sweep, and compares the M rows bitwise.

Without a GPU: the default lane prints "no GPU: nothing to audit" and exits 0; ``--lane cpu``
is a dry run of the whole machinery (one subprocess per pin, table, files) over one tiny shape
on the CPU BLAS, where the cuBLAS variables mean nothing.

Usage::

    python -m batchinv.harness.cublas_audit [--lane auto|cpu|sm90|sm100] [--out-dir docs]
        [--pins default,pin_lt_ws1,...] [--shapes 256x4096,...] [--dtypes bf16,fp16,fp32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Pins: name -> environment.  "default" is the library as shipped (the variables cleared).
PINS: dict[str, dict[str, str]] = {
    "default": {},
    "pin_lt_ws1": {
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "CUBLASLT_WORKSPACE_SIZE": "1",
        "BATCHINV_PREFERRED_BLAS": "cublaslt",
    },
    "pin_ws1": {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"},
    "pin_lt_ws0": {"CUBLAS_WORKSPACE_CONFIG": ":0:0", "BATCHINV_PREFERRED_BLAS": "cublaslt"},
}
#: Variables a pin may set; all are cleared from the inherited environment first.
PIN_VARIABLES = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "BATCHINV_PREFERRED_BLAS")

#: (N, K) of the issue: router 4096 -> 256, the dense GEMMs, and the odd shape.
GPU_SHAPES: tuple[tuple[int, int], ...] = (
    (256, 4096),
    (4096, 4096),
    (14336, 4096),
    (2688, 4096),
    (4608, 2688),
    (257, 1000),
)
CPU_SHAPES: tuple[tuple[int, int], ...] = ((24, 40),)
DTYPES = ("bf16", "fp16", "fp32")


@dataclass
class AuditRow:
    """One cell of the matrix."""

    pin: str
    n: int
    k: int
    dtype: str
    bias: bool
    status: str  # invariant | varies | error
    varies_at: list[int] = field(default_factory=list)
    ms: list[int] = field(default_factory=list)
    rows_differing: int = 0
    worst_ulp: float | None = None
    detail: str = ""

    @property
    def shape(self) -> str:
        return f"{self.n}x{self.k}"

    def cell(self) -> str:
        if self.status == "varies":
            at = self.varies_at
            where = ",".join(map(str, at)) if len(at) <= 4 else f"{at[0]}..{at[-1]}"
            return f"varies at M={where} ({len(at)}/{len(self.ms) - 1} M)"
        if self.status == "error":
            return f"error: {self.detail[:60]}"
        return "invariant"


# --- the child: one pin, every shape -------------------------------------------------------------


def _child(spec: dict[str, Any]) -> int:
    import torch

    from batchinv.fast.baselines.matmul import torch_default
    from batchinv.harness.compare import compare_bitwise

    device = torch.device("cuda" if spec["lane"] != "cpu" else "cpu")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    ms = sorted(spec["ms"])
    for n, k in spec["shapes"]:
        for dname in spec["dtypes"]:
            for bias in spec["bias"]:
                row = AuditRow(spec["pin"], n, k, dname, bias, "invariant", ms=ms)
                try:
                    gen = torch.Generator().manual_seed(spec["seed"])
                    dtype = dtypes[dname]
                    x = torch.randn(ms[-1], k, generator=gen).to(dtype).to(device)  # [M, K]
                    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)  # [N, K]
                    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
                    full = torch_default(x, w, b)  # [M, N]
                    for m in ms[:-1]:
                        report = compare_bitwise(full[:m], torch_default(x[:m], w, b))
                        if not report.equal:
                            row.status = "varies"
                            row.varies_at.append(m)
                            row.rows_differing = max(row.rows_differing, report.rows_differing)
                            if report.worst_ulp is not None:
                                row.worst_ulp = max(row.worst_ulp or 0.0, report.worst_ulp)
                            row.detail = row.detail or f"M={m}: {report}"
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                except Exception as exc:  # an error cell; the audit goes on
                    row.status, row.detail = (
                        "error",
                        f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}",
                    )
                print(json.dumps(asdict(row)), flush=True)
    return 0


# --- the parent ----------------------------------------------------------------------------------


def _run_pin(pin: str, spec: dict[str, Any], timeout: float) -> list[AuditRow]:
    env = {key: value for key, value in os.environ.items() if key not in PIN_VARIABLES}
    env.update(PINS[pin])
    child_spec = {**spec, "pin": pin}
    cmd = [sys.executable, "-m", "batchinv.harness.cublas_audit", "--child", json.dumps(child_spec)]
    expected = [(n, k, d, b) for n, k in spec["shapes"] for d in spec["dtypes"] for b in spec["bias"]]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, code, tail = (
            proc.stdout,
            proc.returncode,
            (proc.stderr.strip().splitlines() or ["no output"])[-1],
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout
        stdout = out.decode() if isinstance(out, bytes) else (out or "")
        code, tail = -1, f"timed out after {timeout:.0f}s"
    rows = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            rows.append(AuditRow(**data))
    done = {(r.n, r.k, r.dtype, r.bias) for r in rows}
    for n, k, d, b in expected:  # cells the child never reached: it crashed or timed out
        if (n, k, d, b) not in done:
            rows.append(
                AuditRow(pin, n, k, d, b, "error", ms=spec["ms"], detail=f"child exited {code}: {tail}")
            )
    return rows


def _table_rows(rows: Sequence[AuditRow], pins: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    header = ["shape (NxK)", "dtype", "bias", *pins]
    keys = sorted(
        {(r.n, r.k, r.dtype, r.bias) for r in rows}, key=lambda t: (t[0] * 100000 + t[1], t[2], t[3])
    )
    cells = {(r.n, r.k, r.dtype, r.bias, r.pin): r.cell() for r in rows}
    body = [
        [f"{n}x{k}", d, "yes" if b else "no", *(cells.get((n, k, d, b, p), "-") for p in pins)]
        for n, k, d, b in keys
    ]
    return header, body


def to_markdown(rows: Sequence[AuditRow], pins: Sequence[str], meta: dict[str, Any]) -> str:
    """The matrix as a markdown document."""
    header, body = _table_rows(rows, pins)
    lines = [
        "# cuBLAS pin audit",
        "",
        f"Lane `{meta['lane']}`, device `{meta['device']}`, torch `{meta['torch']}`; M sweep {meta['ms']}.",
        "Each cell: `F.linear(x[:M], w, b)` against rows `[:M]` of the largest-M call, bitwise.",
        "",
        "Pins:",
        *[
            f"- `{p}`: {' '.join(f'{k}={v}' for k, v in PINS[p].items()) or '(library defaults)'}"
            for p in pins
        ],
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(r) + " |" for r in body],
        "",
    ]
    return "\n".join(lines)


def _print_table(rows: Sequence[AuditRow], pins: Sequence[str], title: str) -> None:
    from rich.table import Table

    from batchinv.harness.console import wide_console

    header, body = _table_rows(rows, pins)
    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for r in body:
        styled = [*r[:3], *(_style(c) for c in r[3:])]
        table.add_row(*styled)
    wide_console().print(table)


def _style(cell: str) -> str:
    color = "green" if cell == "invariant" else "red" if cell.startswith("varies") else "yellow"
    return f"[{color}]{cell}[/{color}]"


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(","):
        n, _, k = part.strip().partition("x")
        if not n.isdigit() or not k.isdigit():
            raise argparse.ArgumentTypeError(f"--shapes: expected NxK[,NxK...] with integers, got {part!r}")
        shapes.append((int(n), int(k)))
    return shapes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchinv audit cublas", description=__doc__.splitlines()[0])
    p.add_argument("--lane", default="auto", help="auto (detect), cpu (dry run on the CPU BLAS), sm90, sm100")
    p.add_argument("--out-dir", default="docs", help="where cublas_audit.json and cublas_audit.md go")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--pins", default=",".join(PINS), help=f"comma-separated subset of {','.join(PINS)}")
    p.add_argument("--shapes", type=_parse_shapes, default=None, help="NxK[,NxK...] (default: the issue's)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of bf16,fp16,fp32")
    p.add_argument("--ms", default=None, help="comma-separated M values (default: the lane's M sweep)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pin subprocess")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    """Run the audit; returns the exit code (0 also when there is no GPU to audit)."""
    args = _parser().parse_args(argv)
    if args.child is not None:
        return _child(json.loads(args.child))

    from batchinv.harness.lanes import detect_lane, parse_lane
    from batchinv.harness.registry import m_sweep

    if args.lane == "auto":
        lane = detect_lane()
        if not lane.is_gpu:
            print("no GPU: nothing to audit (use --lane cpu for a dry run on the CPU BLAS)")
            return 0
    else:
        lane = parse_lane(args.lane)
    pins = [p.strip() for p in args.pins.split(",") if p.strip()]
    unknown = [p for p in pins if p not in PINS]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad_dtypes = [d for d in dtypes if d not in DTYPES]
    if unknown or bad_dtypes:
        print(
            f"--pins: expected a subset of {list(PINS)}, got {unknown}"
            if unknown
            else f"--dtypes: expected a subset of {list(DTYPES)}, got {bad_dtypes}",
            file=sys.stderr,
        )
        return 2
    if lane.is_gpu:
        import torch

        if not torch.cuda.is_available():
            print(f"no GPU: nothing to audit (lane {lane.value} asked for, but CUDA is unavailable)")
            return 0
    shapes = args.shapes or (list(GPU_SHAPES) if lane.is_gpu else list(CPU_SHAPES))
    ms = [int(m) for m in args.ms.split(",")] if args.ms else list(m_sweep(lane, None if lane.is_gpu else 64))
    spec = {
        "lane": lane.value,
        "shapes": shapes,
        "dtypes": dtypes,
        "bias": [False, True],
        "ms": sorted(ms),
        "seed": args.seed,
    }

    rows: list[AuditRow] = []
    start = time.perf_counter()
    for pin in pins:
        t = time.perf_counter()
        pin_rows = _run_pin(pin, spec, args.timeout)
        rows.extend(pin_rows)
        counts = {s: sum(r.status == s for r in pin_rows) for s in ("invariant", "varies", "error")}
        print(f"{pin}: {counts} ({time.perf_counter() - t:.1f}s)", flush=True)
    meta = _meta(lane.value, ms, time.perf_counter() - start)
    _print_table(rows, pins, f"cuBLAS pin audit ({lane.value}, {meta['device']})")
    if not args.no_save:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cublas_audit.json").write_text(
            json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1)
        )
        (out / "cublas_audit.md").write_text(to_markdown(rows, pins, meta))
        print(f"wrote {out / 'cublas_audit.json'} and {out / 'cublas_audit.md'}")
    return 0


def _meta(lane: str, ms: Sequence[int], seconds: float) -> dict[str, Any]:
    import torch

    device = torch.cuda.get_device_name(0) if lane != "cpu" and torch.cuda.is_available() else "cpu"
    return {
        "lane": lane,
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ms": sorted(ms),
        "seconds": round(seconds, 1),
        "pins": {p: PINS[p] for p in PINS},
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
