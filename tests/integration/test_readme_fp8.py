"""The README's "FP8 from Python" example runs as written: fp8_quant's scales feed fp8_gemm in
the token and block layouts, and its 128 x 128 weight recipe quantizes the weight it claims to."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import torch

from batchinv.reference import fp8_gemm as ref

pytestmark = pytest.mark.cpu
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    text = README.read_text()
    section = text.split("### FP8 from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under 'FP8 from Python'"
    return match.group(1)


def test_readme_fp8_example_runs_and_composes() -> None:
    ns: dict[str, Any] = {}
    exec(compile(_snippet(), str(README), "exec"), ns)
    x, w, xq, xs, wq, ws, y = (ns[name] for name in ("x", "w", "xq", "xs", "wq", "ws", "y"))
    m, k = x.shape
    n = w.shape[0]
    assert xs.shape == (m, ref.blocks(k)) and ws.shape == (ref.blocks(n), ref.blocks(k))
    assert wq.dtype == torch.float8_e4m3fn and ws.dtype == torch.float32
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    # the recipe's weight blocks dequantize to w: e4m3's half ulp (2**-4 relative, 2**-10 of the
    # scale in the subnormals), and some element of every block reaches 448 (its amax)
    wd = wq.double() * ref.weight_scales(ws, "block", n, k)
    err = (wd - w.double()).abs()
    assert bool((err <= w.double().abs() * 2.0**-4 + ref.weight_scales(ws, "block", n, k) * 2.0**-10).all())
    assert float(wq.float().abs().max()) == 448.0
    # the block GEMM's output is within the kernel's bound around the fp64 reference
    ops = {"x": xq, "weight": wq, "x_scale": xs, "weight_scale": ws, "bias": None}
    r = ref.fp8_gemm(**ops, scale_layout="block")
    bound = ref.tolerance_bound(**ops, scale_layout="block", out_dtype=torch.bfloat16, reference=r)
    assert bool(((y.double() - r).abs() <= bound).all())
