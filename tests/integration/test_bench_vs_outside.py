"""ci/bench_vs_outside.py: the bench report's fast / production ratios matched with the outside
kit's by kernel and shape (issue 26's "agrees within 10%").  Inputs are written here by hand in
the two tools' formats; the committed run 58 files are read as a second check of the formats."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN58 = ROOT / "docs" / "device-runs" / "2026-12-02-h200-sm90" / "run58"


def _module():
    spec = importlib.util.spec_from_file_location("bench_vs_outside", ROOT / "ci" / "bench_vs_outside.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_vs_outside"] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


def _bench_point(component: str, case: str, impl: str, us: float) -> dict:
    return {"component": component, "case": case, "implementation": impl, "microseconds": us}


MATMUL = "layout=linear-dtype={d}-out={o}-n={n}-k={k}-rows={m}-bias=False-values=normal-seed=0"


def _write(tmp_path: Path, bench_points: list[dict], outside_points: list[dict]) -> tuple[Path, Path]:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"environment": {}, "points": bench_points}))
    outside = tmp_path / "sbs.jsonl.gz"
    with gzip.open(outside, "wt") as f:
        f.write(json.dumps({"kind": "progress", "section": "matmul"}) + "\n")
        for p in outside_points:
            f.write(json.dumps({"kind": "point", **p}) + "\n")
    return bench, outside


@pytest.mark.cpu
def test_ratios_are_matched_by_kernel_and_shape_with_each_ones_production_path(tmp_path, capsys):
    mod = _module()
    bf16 = MATMUL.format(d="bf16", o="bf16", n=4096, k=4096, m=1)
    logits = MATMUL.format(d="bf16", o="fp32", n=256, k=7168, m=8)
    bench, outside = _write(
        tmp_path,
        [
            _bench_point("matmul", bf16, "fast", 10.0),
            _bench_point("matmul", bf16, "torch_default", 10.0),
            _bench_point("matmul", logits, "fast", 6.0),
            _bench_point("matmul", logits, "torch_default", 3.0),  # not the logits' production path
            _bench_point("matmul", logits, "torch_then_cast", 5.0),
            _bench_point(
                "mean",
                "shape=1x4096-dtype=bfloat16-values=normal-layout=contiguous-keepdim=False-out_dtype=None-seed=0",
                "fast",
                3.0,
            ),
            _bench_point(
                "mean",
                "shape=1x4096-dtype=bfloat16-values=normal-layout=contiguous-keepdim=False-out_dtype=None-seed=0",
                "torch_native",
                2.0,
            ),
        ],
        [
            {
                "section": "matmul",
                "op": "linear",
                "dtype": "bfloat16",
                "N": 4096,
                "K": 4096,
                "M": 1,
                "ratio": {"batchinv": 1.05},
            },
            {
                "section": "router",
                "op": "router_fp32_logits",
                "dtype": "bfloat16",
                "N": 256,
                "K": 7168,
                "M": 8,
                "ratio": {"batchinv_fp32_out": 1.2},
            },
            {
                "section": "mean",
                "op": "mean",
                "dtype": "bfloat16",
                "cols": 4096,
                "rows": 1,
                "ratio": {"batchinv": 1.2},
            },
            # topk: bench's production baseline is the masked torch.topk, the kit's plain torch.topk
            {"section": "topk", "op": "topk", "cols": 8192, "k": 512, "rows": 1, "ratio": {"batchinv": 0.5}},
        ],
    )
    assert mod.main([str(bench), str(outside)]) == 0
    out = capsys.readouterr().out
    assert "outside 1.05x  bench 1.00x  diff -4.8%" in out  # bf16 4096^2 at M = 1
    assert "outside 1.20x  bench 1.20x  diff +0.0%" in out  # the logits against bf16 then cast
    assert "outside 1.20x  bench 1.50x  diff +25.0%   <- outside the margin" in out  # mean
    assert out.splitlines()[-1].startswith(
        "2 of 3 matched points agree within 10% (worst 25.0%); bench only: 0, outside only: 0, "
        "outside without a ratio: 0"
    )


@pytest.mark.cpu
def test_only_like_with_like_is_matched_and_what_is_left_out_is_counted(tmp_path, capsys):
    """An fp16 linear, a strided mean case and a point whose baseline errored (ratio null) are not
    compared; a key seen twice is counted; nothing matched is exit status 1."""
    mod = _module()
    mean = "shape=1x4096-dtype=bfloat16-values=normal-layout={layout}-keepdim=False-out_dtype=None-seed=0"
    bench, outside = _write(
        tmp_path,
        [
            _bench_point("mean", mean.format(layout="strided"), "fast", 3.0),
            _bench_point("mean", mean.format(layout="strided"), "torch_native", 1.0),
            _bench_point(
                "mean",
                "shape=2x3x4096-dtype=bfloat16-layout=contiguous-keepdim=False-out_dtype=None",
                "fast",
                1.0,
            ),
            _bench_point(
                "mean",
                "shape=2x3x4096-dtype=bfloat16-layout=contiguous-keepdim=False-out_dtype=None",
                "torch_native",
                1.0,
            ),
        ],
        [
            {
                "section": "matmul",
                "op": "linear",
                "dtype": "float16",
                "N": 64,
                "K": 64,
                "M": 1,
                "ratio": {"batchinv": 2.0},
            },
            {
                "section": "mean",
                "op": "mean",
                "dtype": "bfloat16",
                "cols": 4096,
                "rows": 1,
                "ratio": {"batchinv": None},
            },
            {
                "section": "mean",
                "op": "mean",
                "dtype": "bfloat16",
                "cols": 4096,
                "rows": 7,
                "ratio": {"batchinv": 1.0},
            },
            {
                "section": "mean",
                "op": "mean",
                "dtype": "bfloat16",
                "cols": 4096,
                "rows": 7,
                "ratio": {"batchinv": 1.1},
            },
        ],
    )
    assert mod.main([str(bench), str(outside)]) == 1
    assert capsys.readouterr().out.strip() == (
        "no points matched; bench only: 0, outside only: 1, outside without a ratio: 1, "
        "bench without one: 0, keys seen twice (last kept): bench 0, outside 1"
    )


@pytest.mark.cpu
def test_a_smoke_run_or_a_tf32_run_is_refused(tmp_path, capsys):
    mod = _module()
    for header in ({"smoke": True}, {"allow_tf32": True}):
        bench, outside = _write(tmp_path, [], [])
        with gzip.open(outside, "wt") as f:
            f.write(json.dumps({"kind": "header", **header}) + "\n")
        assert mod.main([str(bench), str(outside)]) == 2
        assert "smoke run or a TF32 run" in capsys.readouterr().err


@pytest.mark.cpu
def test_unreadable_inputs_exit_2(tmp_path, capsys):
    mod = _module()
    assert mod.main([str(tmp_path / "missing.json"), str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read the inputs" in capsys.readouterr().err
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    _, outside = _write(tmp_path, [], [])
    assert mod.main([str(listed), str(outside)]) == 2
    assert "no list of points" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mod.main([str(listed), str(outside), "--within", "10"])  # a fraction, not a percentage


@pytest.mark.cpu
def test_run58s_committed_files_match_as_its_hand_comparison_did(capsys):
    """Run 58's note: 36 matmul / router points matched, 35 within 10%, the worst 11.6%."""
    mod = _module()
    assert mod.main([str(RUN58 / "bench.json"), str(RUN58 / "sbs.jsonl.gz")]) == 0
    lines = capsys.readouterr().out.splitlines()
    gemm = [line for line in lines if line.startswith(("matmul bf16", "router"))]
    assert len(gemm) == 36
    assert sum("<- outside the margin" in line for line in gemm) == 1
    assert any(line.startswith("router bf16->fp32") and "diff +11.6%" in line for line in gemm)


@pytest.mark.cpu
def test_run66s_compressed_files_are_read_as_they_are_committed(capsys):
    """Run 66 (H100) committed both files gzipped: 73 points matched, one outside 10%
    (matmul 4096x4096 at M = 128, 12.4%), as DEVICE_RUNS records."""
    mod = _module()
    run66 = ROOT / "docs" / "device-runs" / "2026-12-07-h100-sm90" / "run66"
    assert mod.main([str(run66 / "bench.json.gz"), str(run66 / "sbs.jsonl.gz")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("72 of 73 matched points agree within 10% (worst 12.4%)")
    assert [line.split()[:4] for line in lines if "<- outside the margin" in line] == [
        ["matmul", "bf16", "4096", "4096"]
    ]
