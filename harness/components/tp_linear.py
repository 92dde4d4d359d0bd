"""Registry entry ``tp_linear``: the row-parallel linear at tensor-parallel degrees 1, 2, 4, 8,
emulated in one process (issue 27, section 5).

Why a component and not a check: the TP degree is a partition of the reduction (K across ranks),
and the registry already has the axis for that -- ``tp_degrees`` and the ``tp_degree`` check, as
for the ``all_reduce`` collective (every degree of :func:`tp_degrees` compared bitwise with
``tp_degree=1``, the single-rank pinned matmul), with baselines that take the keyword as
negative controls.  What is under test is the TP
decomposition -- which K slices each rank holds, what the all-reduce carries, in what order it
adds them -- which only an implementation with its own reference, fast path and unpinned
baselines can be; a check would have to impose one reduction of its own on every subject.

The inputs, the reference, the bound and the error inputs are the matmul's (the same ``Batch``
keys, ``harness/components/matmul.py``): ``fast`` at any degree has the single-rank matmul's
bits.  Its checks are narrowed to agreement, tp_degree and cross_process: at its default degree ``tp_linear``
*is* the pinned matmul, whose row checks and repeat (batch_prefix, position, repeat,
neighbours, config_equivalence, modes) the ``matmul`` component runs; the TP degree is what
this entry adds (the cpu lane pays seconds per interpreted K = 512 matmul).

Cases: K = 512 on the cpu lane (the interpreter's tree has chunks of 64: 8 chunks, so every
degree 1, 2, 4, 8 holds whole chunks); on GPU lanes K = 8192 for 16-bit inputs (sm90's 16-bit
tree: chunks of 1024) and K = 2048 for fp32 (chunks of 256).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.fast import tp_linear as fast
from batchinv.fast.baselines import tp_linear as baselines
from batchinv.harness.components import matmul as mm
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import ALL_LANES, Baseline, Batch, Case, Component, ErrorCase
from batchinv.reference import matmul as reference
from batchinv.reference.errors import ArgumentError

NAME = "tp_linear"
#: The emulated tensor-parallel degrees (the ``tp_degree`` axis of this component).
TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)


def tp_degrees(batch: Batch) -> tuple[int, ...]:
    """The TP degrees the ``tp_degree`` check compares with the single-rank call (every case's
    K holds a multiple of 8 chunks of the lane's tree, so every degree holds whole chunks)."""
    del batch
    return TP_DEGREES


def _case(n: int, k: int, rows: int, seed: int, **kw: Any) -> Case:
    return Case(NAME, dict(mm._case(n, k, rows, seed=seed, **kw).axes), seed)


def cases(lane: Lane) -> list[Case]:
    """Row-parallel shapes whose K has a multiple of 8 chunks on the lane's tree."""
    if not lane.is_gpu:
        return [
            _case(48, 512, 17, 0, dtype="bf16", bias=True),  # bf16 out, bias after the reduction
            # W [K, N] sliced by rows; NaN payloads, infinities, subnormals through the all-reduce
            _case(32, 512, 5, 1, layout="mm", dtype="fp32", values="special"),
        ]
    return [
        _case(4096, 8192, 64, 0, dtype="bf16", bias=True),  # o_proj / down_proj-like, 8 chunks
        _case(4096, 8192, 512, 1, dtype="bf16"),
        _case(2048, 8192, 7, 2, dtype="fp16", values="special"),
        _case(1024, 2048, 33, 3, dtype="fp32"),  # IEEE fp32: chunks of 256
    ]


def error_cases(device: torch.device) -> list[ErrorCase]:
    """The matmul's bad inputs, and TP degrees that split a chunk or are not positive ints."""
    x = torch.zeros(4, 512, dtype=torch.bfloat16, device=device)
    w = torch.zeros(16, 512, dtype=torch.bfloat16, device=device)
    fast_only = ("fast",)
    # the matmul's, but those of keywords the row-parallel linear does not take (precision, out)
    shared = [e for e in mm.error_cases(device) if not {"precision", "out", "num_sms"} & set(e.kwargs)]
    return [
        *shared,
        ErrorCase(
            "tp_degree_splits_a_chunk",
            {"x": x, "weight": w, "tp_degree": 3},
            ArgumentError,
            r"argument 'tp_degree'.*divisor",
            fast_only,
        ),
        ErrorCase(
            "tp_degree_zero", {"x": x, "weight": w, "tp_degree": 0}, ArgumentError, "'tp_degree'", fast_only
        ),
        ErrorCase(
            "tp_degree_bool",
            {"x": x, "weight": w, "tp_degree": True},
            ArgumentError,
            "'tp_degree'",
            fast_only,
        ),
    ]


COMPONENT = Component(
    name=NAME,
    summary="row-parallel linear over 1/2/4/8 emulated TP ranks: whole chunks per rank, fp32 chunk sums all-reduced in chunk order",
    reference=reference.matmul,
    fast=fast.tp_linear,
    baselines=(
        Baseline(
            name="bf16_rank_order",
            fn=baselines.tp_linear_bf16_rank_order,
            why=(
                "the naive row-parallel linear: each rank's output rounded to the activation dtype and the "
                "outputs summed in rank order in it (a 16-bit all-reduce), then the bias"
            ),
            timed=False,
        ),
        Baseline(
            name="ring_order",
            fn=baselines.tp_linear_ring_order,
            why=(
                "fp32 rank partials reduced in NCCL's ring order (segment s accumulated from rank s + 1 "
                "around the ring): another association of the partials per degree and per segment"
            ),
            timed=False,
        ),
    ),
    cases=cases,
    build=mm.build,
    agreement=mm.COMPONENT.agreement,
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=error_cases,
    tp_degrees=tp_degrees,
    checks=("agreement", "tp_degree", "cross_process"),
)
