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

U32 = 2.0**-24  # fp32 unit roundoff (correctly rounded products, 1 + e)
DIV = 2.0**-22  # the fp32 division: 2 ULP allowed (Triton's default div.full.f32 on GPUs)
EXP_ULP = 2.0**-21  # ex2.approx.f32 (tl.exp on GPUs): 2 ULP allowed, plus the argument error
FTZ = 2.0**-126  # exp(-|g|) may be flushed to zero below the smallest normal (ex2.approx.ftz)
UNDER = 2.0**-150  # half the smallest fp32 subnormal: one underflowing fp32 rounding
U64 = 2.0**-53
#: Per output dtype: (unit roundoff, half the smallest subnormal, precision p, smallest exponent).
OUT: dict[torch.dtype, tuple[float, float, int, int]] = {
    torch.bfloat16: (2.0**-8, 2.0**-134, 8, -126),
    torch.float16: (2.0**-11, 2.0**-25, 11, -14),
}


def _parts(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(g, v = u s, silu64(g), |s| per row as a column (1 without a scale), has_scale), fp64."""
    x = batch.rows["gate_up"].to(torch.float64)
    i = x.shape[1] // 2
    g, v = x[:, :i], x[:, i:]
    scale = batch.rows.get("scale")
    s_abs = torch.ones((x.shape[0], 1), dtype=torch.float64, device=x.device)
    if scale is not None:
        s64 = scale.to(x.device, torch.float64)[:, None]
        v = v * s64
        s_abs = s64.abs()
    return g, v, reference.silu64(g), s_abs, scale is not None


def fp32_error(batch: Batch, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative, absolute) error of the kernel's fp32 value before the final rounding.

    The kernel (fast/kernels/swiglu.py) computes, in fp32 from exact fp32 inputs g, u, s:
    ``e = exp(-|g|)``, ``num = g * e`` (g < 0) or g, ``d = 1 + e``, ``silu = num / d``, then
    ``y = silu * (u * s)`` for |s| <= 1 or ``y = (silu * u) * s`` for |s| > 1 (``y = silu * u``
    without a scale); the output is ``fl_out(y)``.  Write v = u s (exact).  Neither product
    order overflows unless the exact |y| is past the output range (the reference is then
    infinite too); a NaN of ``0 * inf`` with no zero exact factor is replaced by the exact
    signed infinity, so infinities agree exactly and the errors below concern finite values.

    * e: tl.exp is ``ex2.approx(x * log2e)`` on GPUs: the product x * fl(log2 e) errs by at most
      2^-23 + 2^-48 relatively (two roundings), i.e. a factor exp(|g| (2^-23 + 2^-48)) on e,
      times (1 + 2^-21) for ex2 itself (2 ULP); numpy's exp in the interpreter is within 1 ULP.
      So e = E (1 + eta), |eta| <= eta(g) = (1 + 2^-21) exp(|g| (2^-23 + 2^-48)) - 1, plus an
      absolute min(2^-126, E) where e is flushed to zero (E < 2^-126, |g| > 87.3); past
      |g| = 104 (E < 2^-150) only that absolute error is counted (eta taken at |g| = 104).
    * num = g e (g < 0): (1 + eta)(1 + u) and |g| min(2^-126, E) absolute; g >= 0: exact.
    * d = 1 + e, e in [0, 1]: relative error <= (1 + eta e / (1 + e) + 2^-126)(1 + u) - 1
      (no cancellation: both terms are >= 0).
    * silu = num / d: (1 + 2^-22) (div.full.f32 is 2 ULP; the interpreter divides correctly),
      plus 2^-150 absolute if it underflows.
    * the two products (one without a scale), each (1 + u) plus 2^-150 absolute: for |s| <= 1,
      ``u s`` then ``silu (u s)``, whose absolute errors reach y times |silu| and 1; for |s| > 1,
      ``silu u`` then ``(silu u) s``, times |s| and 1.  silu's absolute error reaches y times
      |u s| = |v| in either order.

    Hence y = silu(g) v (1 + r) + a with
    ``1 + r <= (1 + eta)(1 + u)(1 + 2^-22)(1 + u)^(1 + has_scale) / (1 - (eta + 2^-126)(1 + u) - u)``
    and ``|a| <= 2 (|g| min(2^-126, E) |v| + 2^-150 (|v| + |silu| + |s| + 1))`` (s = 1 without a
    scale; the factor 2 covers the later relative factors, all below 2).  The fp64 reference
    errs by at most 8 fp64 ULPs (exp, a product, an add, a division, two products), added to r,
    plus an absolute 2^-1074 |g| |v| where its exp(-|g|) is subnormal (below 2^-790: nil here).
    """
    g, v, silu, s_abs, has_scale = _parts(batch)
    # Past |g| = 104, E = exp(-|g|) < 2^-150: e is 0 or flushed, an absolute error counted below.
    mag = torch.nan_to_num(g.abs(), nan=0.0).clamp(max=104.0)
    eta = (1.0 + EXP_ULP) * torch.exp(mag * (2.0**-23 + 2.0**-48)) - 1.0
    d_err = (eta + FTZ) * (1.0 + U32) + U32
    rel = (1.0 + eta) * (1.0 + U32) * (1.0 + DIV) * (1.0 + U32) ** (2 if has_scale else 1) / (
        1.0 - d_err
    ) - 1.0
    rel = rel + 8 * U64
    flushed = torch.minimum(torch.full_like(g, FTZ), torch.exp(-g.abs()) + 2.0**-1074)  # e's abs error
    absolute = 2.0 * (g.abs() * flushed * v.abs() + UNDER * (v.abs() + silu.abs() + s_abs + 1.0))
    return rel, torch.nan_to_num(absolute, nan=0.0, posinf=math.inf)


def bound(batch: Batch, ref: Outputs) -> Outputs:
    """The rigorous bound: the fp32 error of :func:`fp32_error`, then the final rounding to the
    output dtype, relative u_out plus half its smallest subnormal:
    ``|fast - ref| <= |ref| ((1 + r)(1 + u_out) - 1) + |a| (1 + u_out) + half_sub``."""
    rel, absolute = fp32_error(batch, ref[0])
    u_out, half_sub, _, _ = OUT[batch.rows["gate_up"].dtype]
    return (ref[0].abs() * ((1.0 + rel) * (1.0 + u_out) - 1.0) + absolute * (1.0 + u_out) + half_sub,)


def tight(batch: Batch, ref: Outputs) -> Outputs:
    """The judged bound: the final rounding is at most half an output ULP of the fp32 value y,
    so ``|fast - ref| <= |y - ref| + ulp_out(Y) / 2`` with ``|y - ref| <= |ref| r + |a|`` and
    ``Y = |ref| (1 + r) + |a| >= |y|`` (the ULP of Y's binade is at least y's; below the
    normal range the subnormal quantum).  r is a few 2^-24 for |g| < 100, so a 16-bit
    intermediate (silu rounded to bf16 before the product, as the unfused ``F.silu(g) * u``
    does) lands a ULP away from the correctly rounded value on many elements: error ~ 1 ULP,
    over this bound's 1/2 ULP + r."""
    rel, absolute = fp32_error(batch, ref[0])
    _, _, p, emin = OUT[batch.rows["gate_up"].dtype]
    err32 = ref[0].abs() * rel + absolute
    big = ref[0].abs() + err32
    exponent = torch.floor(torch.log2(torch.where(big > 0, big, torch.ones_like(big))))
    exponent = torch.clamp(torch.nan_to_num(exponent, nan=0.0, posinf=0.0), min=emin)
    half_ulp = torch.exp2(exponent - p)
    return (err32 + half_ulp,)


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
