"""Registry entry ``log_softmax``: over the last dim, with ``half_to_float``.

It shares the kernel, the inputs, the error inputs and the error model with ``softmax``
(:mod:`batchinv.harness.components.softmax`); only the output formula, the bound and the
baselines' formulas differ.  The cpu lane runs fewer cases: the reduction is softmax's.
"""

from __future__ import annotations

from batchinv.fast.baselines.softmax import (
    split_float_partials_log_softmax,
    torch_log_softmax_unchecked,
    torch_native_log_softmax,
    torch_sum_log_softmax,
    triton_rows_heuristic_log_softmax,
)
from batchinv.fast.enable import ops
from batchinv.fast.softmax import log_softmax as fast_log_softmax
from batchinv.harness.components.softmax import (
    DTYPES,
    baselines_for,
    bench_cases_for,
    build,
    cases_for,
    configs_for,
    error_cases_for,
    justification,
    log_softmax_bound,
    out_dtypes,
    strategy_for,
)
from batchinv.harness.invariance import pack_at_offset
from batchinv.harness.registry import ALL_LANES, Component, Toleranced
from batchinv.reference.log_softmax import log_softmax as reference_log_softmax

NAME = "log_softmax"

COMPONENT = Component(
    name=NAME,
    summary="log_softmax over the last dim (fp32 math, bf16/fp16/fp32 in, half_to_float), vocab-sized rows",
    reference=reference_log_softmax,
    fast=fast_log_softmax,
    baselines=baselines_for(
        "log_softmax",
        torch_native_log_softmax,
        torch_sum_log_softmax,
        triton_rows_heuristic_log_softmax,
        torch_log_softmax_unchecked,
        split_float_partials_log_softmax,
    ),
    cases=lambda lane: cases_for(NAME, lane, short=True),
    build=build,
    agreement=Toleranced(log_softmax_bound, justification("log_softmax"), out_dtypes),
    shift_row_start=pack_at_offset,
    lanes=ALL_LANES,
    dtypes=DTYPES,
    error_cases=error_cases_for,
    strategy=lambda lane, device: strategy_for(NAME, lane, device),
    bench_cases=lambda lane: bench_cases_for(
        NAME, lane, vocabs=(32000, 129280, 151936), rows=(1, 16, 64, 256, 1024)
    ),
    torch_op=ops.log_softmax_subject,
    configs=configs_for(NAME),
)
