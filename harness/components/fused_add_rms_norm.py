"""Registry entry ``fused_add_rms_norm``: ``residual_out = round(x + residual)``, ``out =
rms_norm(residual_out)``.  Builders, bound and cases are shared with ``rms_norm``
(:mod:`batchinv.harness.components.rms_norm`); the ``cancellation`` pattern is this entry's own.
"""

from __future__ import annotations

import torch

from batchinv.fast import rms_norm as fast
from batchinv.fast.baselines import rms_norm as baselines
from batchinv.fast.enable import ops
from batchinv.harness.components.rms_norm import (
    JUSTIFICATION,
    make_bench_cases,
    make_builder,
    make_cases,
    make_error_cases,
    make_strategy,
)
from batchinv.harness.invariance import pack_at_offset
from batchinv.harness.registry import ALL_LANES, Baseline, Batch, Component, Outputs, Toleranced
from batchinv.reference import rms_norm as reference


def _bound(batch: Batch, ref: Outputs) -> Outputs:
    """``out``: the rms_norm bound (:func:`batchinv.reference.rms_norm.out_bound`) of the exact
    residual_out (``ref[1]``, fp64 holding values of x's dtype); ``residual_out``: 0, since one
    rounding of x + residual is exact to compute."""
    x = batch.rows["x"]
    out = reference.out_bound(x.shape[1], batch.shared["weight"], ref[0], x.dtype)
    return out, torch.zeros((), dtype=torch.float64)


COMPONENT = Component(
    name="fused_add_rms_norm",
    summary="(rms_norm(x + residual), x + residual) in one pass; residual_out rounded once to x's dtype",
    reference=reference.fused_add_rms_norm,
    fast=fast.fused_add_rms_norm,
    baselines=(
        Baseline(
            name="rows_block",
            fn=baselines.fused_add_rms_norm_rows_block,
            why="the column tile (hence the order of its fp32 sum of squares) switches at 256 rows",
        ),
        Baseline(
            name="torch",
            fn=baselines.fused_add_rms_norm_torch,
            why=(
                "torch.add + torch.nn.functional.rms_norm, the unfused production path; the add "
                "writes a fresh, aligned tensor, so the norm always takes its vectorized kernel: "
                "no variance was seen on the H200 (2026-11-29), so it is reported, not required; "
                "also run by modes (torch.compile fuses the add into Inductor's own reduction)"
            ),
            expected_to_vary_on=frozenset(),
            modes=baselines.fused_add_rms_norm_torch_unchecked,
        ),
    ),
    cases=make_cases("fused_add_rms_norm", fused=True),
    build=make_builder(fused=True),
    agreement=Toleranced(
        bound=_bound,
        justification="residual_out: exact (one rounding of an fp32 sum that is exact for the "
        "input dtypes); out: " + JUSTIFICATION,
        out_dtypes=lambda batch: (batch.rows["x"].dtype, batch.rows["x"].dtype),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=make_error_cases(fused=True),
    shift_row_start=pack_at_offset,
    partition_arg=None,
    strategy=make_strategy("fused_add_rms_norm", fused=True),
    bench_cases=make_bench_cases("fused_add_rms_norm"),
    torch_op=ops.fused_add_rms_norm_subject,
)
