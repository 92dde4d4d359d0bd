"""The seed's FlashInfer FP8 table (vLLM PR #62192) on this GPU: rows of ``x[:M]`` whose output
differs from the first M rows of the M=2048 output, per backend, with and without autotune.

    python3 ci/flashinfer_table.py OUTDIR [--shapes 4096x4096,...] [--configs cutlass,auto_autotuned]

Static per-tensor FP8 inputs (``x [2048, K]`` and ``weight [N, K]`` quantized with one scale
each), ``bmm_fp8`` through :mod:`batchinv.harness.adapters.flashinfer` (so each configuration runs
with the tuner as if alone in the process: tuned ones once per weight shape at 2048 rows), M in
{1, 2, 7, 16, 64, 128, 512, 2048}, shapes (N, K) 4096x4096, 2688x4096, 4608x2688, 14336x4096.
A configuration FlashInfer refuses on this GPU (``cutlass`` FP8 bmm on SM90) prints its error
text instead of a count.  Prints a markdown table (and the first call's wall time per
configuration: the JIT compile of FlashInfer's module, or cuDNN's graph build) and writes
``OUTDIR/flashinfer_table.json``.  Exit 2 without CUDA or FlashInfer.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

import torch

SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (2688, 4096), (4608, 2688), (14336, 4096))
MS: tuple[int, ...] = (1, 2, 7, 16, 64, 128, 512, 2048)
#: The seed's rows, then the single backends (its diagnostic): adapter subject names.
CONFIGS: tuple[str, ...] = ("auto", "auto_autotuned", "cutlass", "cutlass_autotuned", "cublas",
                            "cublas_autotuned", "cudnn", "cudnn_autotuned")  # fmt: skip
FP8_MAX = 448.0
#: Where the operands are made (a test runs the counting on the CPU against a fake FlashInfer).
DEVICE = "cuda"


def log(*parts: object) -> None:
    print(*parts, flush=True)


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Static per-tensor e4m3 quantization: ``(t / s).to(e4m3)`` and the dequantization scale s."""
    scale = (t.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    q = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.reshape(1)


def run_config(name: str, shapes: list[tuple[int, int]], ms: tuple[int, ...]) -> dict[str, object]:
    """One configuration over every shape: ``{"cells": {shape: {M: rows differing}}, ...}`` or
    ``{"error": text}`` when FlashInfer refuses it (or it crashes)."""
    from batchinv.harness.adapters import flashinfer as fia
    from batchinv.harness.subjects import Unsupported

    declared = getattr(fia, name)
    assert declared.adapter is not None and declared.adapter.inputs is not None
    out: dict[str, object] = {
        "role": declared.role,
        "cells": {},
        "max_abs_diff": {},
        "first_call_by_shape_s": {},
    }
    for n, k in shapes:
        gen = torch.Generator(device=DEVICE).manual_seed(n * 7 + k)
        x, xs = quantize(torch.randn(max(ms), k, device=DEVICE, generator=gen))
        w, ws = quantize(torch.randn(n, k, device=DEVICE, generator=gen) * 0.05)

        def call(rows: int, ops: tuple[torch.Tensor, ...] = (x, w, xs, ws)) -> torch.Tensor:
            kwargs = declared.adapter.inputs(
                x=ops[0][:rows], weight=ops[1], x_scale=ops[2], weight_scale=ops[3]
            )
            return declared.adapter.output(declared.fn(**kwargs))

        t0 = time.perf_counter()
        cells: dict[int, int] = {}
        worst = 0.0
        try:
            full = call(max(ms))  # the first call of a shape: a tuned subject tunes here
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            out["first_call_by_shape_s"][f"{n}x{k}"] = round(time.perf_counter() - t0, 2)  # type: ignore[index]
            for m in ms:
                y = call(m)
                diff = (y != full[:m]).any(dim=1)
                cells[m] = int(diff.sum())
                if cells[m]:
                    worst = max(worst, float((y.float() - full[:m].float()).abs().max()))
        except Unsupported as exc:
            return {**out, "error": f"unsupported: {exc}"}
        except Exception as exc:
            traceback.print_exc()
            return {**out, "error": f"{type(exc).__name__} at {n}x{k}: {exc}"}
        out.setdefault("first_call_s", out["first_call_by_shape_s"][f"{n}x{k}"])  # type: ignore[index]
        out["cells"][f"{n}x{k}"] = cells  # type: ignore[index]
        out["max_abs_diff"][f"{n}x{k}"] = worst  # type: ignore[index]
        log(f"  {name} {n}x{k}: {cells} (first call {out['first_call_by_shape_s'][f'{n}x{k}']} s)")  # type: ignore[index]
    return out


def cell(cells: dict[int, int]) -> str:
    bad = [f"M={m}: {c}" for m, c in cells.items() if c]
    return ", ".join(bad) if bad else "0"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,...")
    p.add_argument("--configs", default=",".join(CONFIGS), help="adapter subject names, comma-separated")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "flashinfer_table.py: needs a CUDA GPU (FlashInfer's bmm_fp8 runs on CUDA only)", file=sys.stderr
        )
        return 2
    try:
        from batchinv.harness.adapters import flashinfer as fia

        fi = fia.load()
    except ImportError as exc:
        print(f"flashinfer_table.py: {exc}", file=sys.stderr)
        return 2
    shapes = [(int(a), int(b)) for a, b in (s.split("x") for s in args.shapes.split(","))]
    configs = args.configs.split(",")
    cc = torch.cuda.get_device_capability()
    env = {"flashinfer": fi.version, "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(), "sm": f"{cc[0]}{cc[1]}"}  # fmt: skip
    log(f"flashinfer_table: {env}")
    results: dict[str, dict[str, object]] = {}
    t_all = time.perf_counter()
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    dump = out / "flashinfer_table.json"  # rewritten after each subject: a time cap keeps what ran
    for name in configs:
        t0 = time.perf_counter()
        log(f"{name} ...")
        results[name] = run_config(name, shapes, MS)
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        dump.write_text(json.dumps({"env": env, "ms": MS, "results": results}, indent=1))
        log(f"{name}: {results[name].get('error', 'done')} in {results[name]['seconds']} s "
            f"(first call {results[name].get('first_call_s', '-')} s)")  # fmt: skip
    labels = [f"{n}x{k}" for n, k in shapes]
    lines = [f"FlashInfer {fi.version} on {env['device']} (sm{env['sm']}), rows differing from the M=2048 output",
             "", "| subject | role | " + " | ".join(labels) + " | first call (s) |",
             "| --- | --- | " + " | ".join("---" for _ in labels) + " | --- |"]  # fmt: skip
    for name, r in results.items():
        if "error" in r:
            cols = [str(r["error"]).replace("|", "/")] + [""] * (len(labels) - 1)
        else:
            cols = [cell(r["cells"][label]) for label in labels]  # type: ignore[index]
        lines.append(f"| {name} | {r['role']} | " + " | ".join(cols) + f" | {r.get('first_call_s', '-')} |")
    table = "\n".join(lines)
    log("\n" + table)
    log(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "flashinfer_table.json").write_text(
        json.dumps({"env": env, "ms": MS, "results": results}, indent=1)
    )
    (out / "flashinfer_table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
