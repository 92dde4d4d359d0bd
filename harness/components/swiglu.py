"""Registry entry ``swiglu``: the MoE expert's activation ``silu(gate) * (up * scale)``.

Axes of a case: ``dtype`` (bf16 / fp16), ``inter`` (I), ``rows`` (M), ``scale`` (none, weights:
routing weights in (0, 1], routed: weights times DeepSeek-V3's routed scaling factor 2.5, or
specials: weights with 0, NaN, subnormal, 1, -0, +inf, 2.5 and 0.5 injected), ``values``
(normal: N(0, 2^2) gate and N(0, 1) up; specials: the dtype's bit-pattern catalogue injected
sparsely into both halves, plus structured rows: large |g| (+-20, +-90, +-100, +-1e4, +-max:
where exp(|g|) overflows fp32 and exp(-|g|) underflows), subnormal and -0 / +0 gates, huge up
values (0.9 max) whose product overflows or, on the rows of scale 2.5 and 0.5, whose ``u * s``
or ``silu * u`` overflows fp32 where the exact product is finite, and gates below -87 (fp32
exp underflows) and -745 (fp64 exp underflows) paired with infinite up values, with a scale
of +inf, and silu(+inf) with subnormal up values times a subnormal scale).  No pattern is left
out.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from batchinv.fast import swiglu as fast
from batchinv.fast.baselines import swiglu as bl
from batchinv.harness.bitpatterns import catalogue, inject
from batchinv.harness.invariance import pack_at_offset
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    ALL_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    Toleranced,
)
from batchinv.reference import swiglu as reference
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "swiglu"
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------- tolerance


def _operands(batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(gate_up, scale)`` of the batch (``scale`` None without one)."""
    return batch.rows["gate_up"], batch.rows.get("scale")


def bound(batch: Batch, ref: Outputs) -> Outputs:
    """The rigorous bound, :func:`batchinv.reference.swiglu.tolerance_bound`."""
    return (reference.tolerance_bound(*_operands(batch), reference=ref[0]),)


def tight(batch: Batch, ref: Outputs) -> Outputs:
    """The judged bound, :func:`batchinv.reference.swiglu.tight_bound`."""
    return (reference.tight_bound(*_operands(batch), reference=ref[0]),)


def _case(dtype: str, inter: int, rows: int, scale: str, values: str, seed: int) -> Case:
    return Case(NAME, {"dtype": dtype, "inter": inter, "rows": rows, "scale": scale, "values": values}, seed)


def cases(lane: Lane) -> list[Case]:
    """Small I in the interpreter (one not a power of two); the issue's I on GPU lanes."""
    if not lane.is_gpu:
        spec = [
            ("bf16", 96, 65, "weights", "normal"),
            ("bf16", 64, 40, "specials", "specials"),
            ("fp16", 96, 33, "none", "specials"),
            ("fp16", 64, 17, "routed", "normal"),
            ("bf16", 96, 2, "none", "specials"),
        ]
    else:
        spec = [
            ("bf16", 768, 2048, "weights", "normal"),  # Qwen3-30B-A3B-like
            ("bf16", 2048, 1024, "specials", "specials"),  # DeepSeek-V3-like
            ("bf16", 14336, 257, "none", "normal"),  # Mixtral-like
            ("fp16", 768, 512, "specials", "specials"),
        ]
    return [_case(d, i, m, s, v, seed) for seed, (d, i, m, s, v) in enumerate(spec)]


LARGE_GATES = (20.0, 90.0, 100.0, 1e4)
#: DeepSeek-V3's routed_scaling_factor: a routing weight times it exceeds 1.
ROUTED_SCALE = 2.5
#: Gates of the huge-up rows: |silu(g)| < 0.44 (the exact product times 2.5 stays finite, bf16)
#: for the first six, 1.23 and 1.76 for the last two (``silu * u`` overflows fp32, times 0.5 not).
HUGE_UP_GATES = (-4.0, -1.0, -0.25, 0.1, 0.25, 0.4, 1.5, 2.0)
#: Gates whose fp32 exp(-|g|) underflows (below -87), the last three fp64's too (below -745).
FLUSHED_GATES = (-90.0, -100.0, -104.0, -800.0, -1e4, -1e30)
#: Rows of the structured cases: (row, scale of that row in the "specials" scale).
HUGE_UP_ROWS = ((2, ROUTED_SCALE), (4, 0.5))
INF_SCALE_ROW, INF_UP_ROW, SUBNORMAL_SCALE_ROW = 8, 7, 11


def _structured(gate: torch.Tensor, up: torch.Tensor, dtype: torch.dtype) -> None:
    """The special rows of ``values="specials"`` (in place; rows past M are left out)."""
    m, i = gate.shape
    top = torch.finfo(dtype).max
    tiny = 1e-40 if dtype == torch.bfloat16 else 1e-7  # a subnormal of the dtype
    if m > 2:  # huge up values: products past the output range (finite gates)
        up[2, : min(i, 8)] = top * 0.9
    for r, _ in HUGE_UP_ROWS:  # u s (old order, s = 2.5) or silu u (s = 0.5) past fp32's max
        if r < m and i > 8:
            n = min(i - 8, 2 * len(HUGE_UP_GATES))
            gate[r, 8 : 8 + n] = torch.tensor(HUGE_UP_GATES * 2)[:n]
            up[r, 8 : 8 + n] = torch.tensor([top * 0.9, -top * 0.9]).repeat(len(HUGE_UP_GATES))[:n]
            gate[r, 8 + n - 1] = FLUSHED_GATES[1]  # flushed silu times a huge u s: finite
    flushed = torch.tensor([*FLUSHED_GATES, 1.5, 0.0, -0.0, -math.inf, math.inf])
    signs = torch.tensor([1.0, -1.0]).repeat(flushed.numel())[: flushed.numel()]
    n = min(i, flushed.numel())
    if INF_UP_ROW < m:  # g < -87 (and < -745) times +-inf: the exact limit +-inf; 0 * inf NaN
        gate[INF_UP_ROW, :n], up[INF_UP_ROW, :n] = flushed[:n], (math.inf * signs)[:n]
    if INF_SCALE_ROW < m:  # the same gates times finite up values and (specials) a scale of +inf
        gate[INF_SCALE_ROW, :n], up[INF_SCALE_ROW, :n] = flushed[:n], (3.0 * signs)[:n]
    if SUBNORMAL_SCALE_ROW < m:  # silu(+inf) times subnormal u (times a subnormal scale: u s underflows)
        k = min(i, 4)
        gate[SUBNORMAL_SCALE_ROW, :k] = math.inf
        up[SUBNORMAL_SCALE_ROW, :k] = torch.tensor([tiny, -tiny, 0.0, 1.0])[:k]


def build(case: Case, device: torch.device) -> Batch:
    a = case.axes
    dtype = DTYPES[a["dtype"]]
    i, m = int(a["inter"]), int(a["rows"])
    gen = torch.Generator().manual_seed(case.seed)
    gate = torch.randn(m, i, generator=gen) * 2.0
    up = torch.randn(m, i, generator=gen)
    if a["values"] == "specials":
        top = torch.finfo(dtype).max
        structured = [
            torch.tensor([s * v for v in (*LARGE_GATES, top) for s in (1.0, -1.0)]),  # exp overflow
            torch.tensor([0.0, -0.0, 1e-40 if dtype == torch.bfloat16 else 1e-6, -3e-40, 1e-7, -1e-7]),
        ]
        for r, row in enumerate(structured):
            if r < m:
                n = min(i, row.numel())
                gate[3 * r % m, :n] = row[:n]
        gate = inject(gate.to(dtype), catalogue(dtype), 0.02, gen).float()
        up = inject(up.to(dtype), catalogue(dtype), 0.02, gen).float()
        _structured(gate, up, dtype)
    gate_up = torch.cat([gate, up], dim=1).to(dtype)
    rows: dict[str, torch.Tensor] = {"gate_up": gate_up.to(device)}
    if a["scale"] != "none":
        scale = torch.rand(m, generator=gen) * 0.9 + 0.1
        if a["scale"] == "routed":
            scale = scale * ROUTED_SCALE
        if a["scale"] == "specials":
            fixed = (*HUGE_UP_ROWS, (INF_SCALE_ROW, math.inf), (SUBNORMAL_SCALE_ROW, 1e-40))
            for r, v in fixed:
                if r < m:
                    scale[r] = v
            for r, v in enumerate((0.0, math.nan, 1e-40, 1.0, -0.0)):
                if r < m:
                    scale[(5 * r + 1) % m] = v
        rows["scale"] = scale.to(device)
    return Batch(rows)


def error_cases(device: torch.device) -> list[ErrorCase]:
    x = torch.randn(4, 8, device=device).to(torch.bfloat16)
    s = torch.rand(4, device=device)
    return [
        ErrorCase("odd_last_dim", {"gate_up": x[:, :7]}, ArgumentError, "argument 'gate_up'"),
        ErrorCase("empty_last_dim", {"gate_up": x[:, :0]}, ArgumentError, "argument 'gate_up'"),
        ErrorCase("gate_up_fp32", {"gate_up": x.float()}, DTypeError, "argument 'gate_up'"),
        ErrorCase("gate_up_int", {"gate_up": x.to(torch.int32)}, DTypeError, "argument 'gate_up'"),
        ErrorCase("gate_up_1d", {"gate_up": x[0]}, ArgumentError, "argument 'gate_up'"),
        ErrorCase(
            "scale_bf16", {"gate_up": x, "scale": s.to(torch.bfloat16)}, DTypeError, "argument 'scale'"
        ),
        ErrorCase("scale_wrong_length", {"gate_up": x, "scale": s[:3]}, ArgumentError, "argument 'scale'"),
        ErrorCase("scale_2d", {"gate_up": x, "scale": s[:, None]}, ArgumentError, "argument 'scale'"),
        ErrorCase("scale_not_tensor", {"gate_up": x, "scale": 0.5}, DTypeError, "argument 'scale'"),
        ErrorCase("gate_up_meta", {"gate_up": x.to("meta")}, DeviceError, "argument 'gate_up'"),
    ]


def _strategy(lane: Lane, device: torch.device) -> Any:
    from hypothesis import strategies as st

    return st.builds(
        lambda d, i, m, s, v, seed: build(_case(d, i, m, s, v, seed), device),
        st.sampled_from(sorted(DTYPES)),
        st.integers(1, 80),
        st.integers(1, 24),
        st.sampled_from(["none", "weights", "routed", "specials"]),
        st.sampled_from(["normal", "specials"]),
        st.integers(0, 2**31 - 1),
    )


JUSTIFICATION = (
    "one fp32 sequence (exp, product, add, division, two products) cannot equal the fp64 value; "
    "bound(): per element |ref| ((1 + r)(1 + u_out) - 1) + |a| (1 + u_out) + half a subnormal, r from "
    "2 ULP ex2.approx with its argument error exp(|g| 2^-23), 2 ULP division, correctly rounded "
    "products and add, a the fp32 underflows (exp flushed below 2^-126); see fp32_error()."
)

COMPONENT = Component(
    name=NAME,
    summary="MoE activation silu(gate) * (up * scale): one fp32 sequence per element, one rounding",
    reference=reference.swiglu,
    fast=fast.swiglu,
    baselines=(
        Baseline(
            "bf16_above_32_rows",
            bl.swiglu_bf16_above_32_rows,
            "a per-M config: above 32 rows silu is rounded to bf16 before the product (batch-dependent "
            "precision)",
            expected_to_vary_on=ALL_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        JUSTIFICATION,
        out_dtypes=lambda batch: (batch.rows["gate_up"].dtype,),
        tight_bound=tight,
        tight_justification=(
            "half an output ULP (of an upper bound of the fp32 value's magnitude) plus the fp32 error "
            "|ref| r + |a|: a bf16 intermediate lands one ULP off on many elements and exceeds it"
        ),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16),
    error_cases=error_cases,
    shift_row_start=pack_at_offset,
    strategy=_strategy,
)
