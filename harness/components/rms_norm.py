"""Registry entry ``rms_norm`` (and the builders, bound and cases it shares with
``fused_add_rms_norm``).

Inputs are built from a seed with their own CPU ``torch.Generator`` and moved to the device.
Patterns (axis ``pattern``):

* ``gaussian``: normal rows, each with its own scale 2^U(-3, 3).
* ``specials``: that background with a quarter of the rows carrying special values from raw
  bits (+-0, +-inf, quiet/signalling NaNs of both signs, NaN payloads, min/max subnormal, min
  normal; max normal only for fp16, whose square cannot overflow fp32), injected sparsely,
  plus structured rows: all-equal, all-zero, huge (2^56, or 2^12 for fp16), tiny (subnormal),
  one huge element among tiny ones, alternating signs.
* ``magnitudes``: row scales spread over 2^+-56 (2^-20..2^12 for fp16).
* ``cancellation`` (fused only): residual = -x exactly, or -x perturbed in its last bits, on
  many rows, so x + residual cancels to zero or to a few ULPs of x.

Layouts (axis ``layout``): ``contiguous``, or ``strided``: the rows are a column window of a
wider NaN-filled buffer (row stride > hidden, unaligned base).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast import rms_norm as fast
from batchinv.fast import rms_norm_baselines as baselines
from batchinv.harness.bitpatterns import catalogue, inject
from batchinv.harness.invariance import pack_at_offset
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    ALL_LANES,
    GPU_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    Toleranced,
)
from batchinv.reference import rms_norm as reference
from batchinv.reference.errors import ArgumentError, DTypeError

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
EPS = 1e-6

#: fp32 unit roundoff (the accumulation precision).
U32 = 2.0**-24
#: Half the smallest fp32 subnormal: the absolute error of one fp32 rounding that underflows.
FP32_UNDERFLOW = 2.0**-150
#: Per output dtype: (unit roundoff of the final rounding, half its smallest subnormal).  fp32
#: outputs have no extra rounding (the last fp32 product is the final rounding, counted in U32).
FINAL_ROUNDING: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (2.0**-8, 2.0**-134),
    torch.float16: (2.0**-11, 2.0**-25),
    torch.float32: (0.0, 0.0),
}


def _gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


# ---------------------------------------------------------------------------------- tolerance


def out_bound(
    h: torch.Tensor, weight: torch.Tensor, eps: float, ref_out: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The largest allowed |fast - reference| per element of ``out`` (float64, (M, N)).

    Derived for ``out = round(fl(fl(h * r) * w))``, ``r = 1 / sqrt_rn(mean_sq + eps)``:

    * t = mean(h^2) + eps in fp32: the N squares and N - 1 additions (any order), the division
      by N, the rounding of eps to fp32 and the addition give t(1 + theta) with
      ``|theta| <= gamma_(N+3)`` (gamma_k = k u / (1 - k u), u = 2^-24), plus an absolute
      3 * 2^-150 from squares, mean and eps that underflow: eps_t = gamma_(N+3) + 3 * 2^-150 / t.
    * r: sqrt and division are correctly rounded, so r = (1 / sqrt(t)) * (1 + rho) with
      ``1 + rho <= (1 + u) / ((1 - u) * sqrt(1 - eps_t))``.
    * two fp32 products: (1 + u)^2 relative, plus 2^-150 (|w| + 1) absolute when they underflow.
    * the final rounding to bf16 / fp16: (1 + u_out) relative plus half a subnormal.
    * the fp64 reference's own error, gamma_(N+4) in fp64 (negligible, counted anyway).

    h (float64, (M, N)) holds the exact normalized input (x, or residual_out for the fused op).
    """
    n = h.shape[1]
    t = (h * h).sum(dim=1, keepdim=True) / n + eps  # (M, 1), fp64
    eps_t = _gamma(n + 3, U32) + 3.0 * FP32_UNDERFLOW / t
    eps_t = eps_t.clamp(max=0.5)
    one_plus_rho = (1.0 + U32) / ((1.0 - U32) * torch.sqrt(1.0 - eps_t))
    u_out, half_sub = FINAL_ROUNDING[dtype]
    rel = one_plus_rho * (1.0 + U32) ** 2 * (1.0 + u_out) * (1.0 + _gamma(n + 4, 2.0**-53)) - 1.0
    w = weight.to(torch.float64).abs()  # (N,)
    return ref_out.abs() * rel + FP32_UNDERFLOW * (w + 1.0) * (1.0 + rel) + half_sub


def _bound_rms_norm(batch: Batch, ref: Outputs) -> Outputs:
    x = batch.rows["x"]
    h = x.to(torch.float64)
    return (out_bound(h, batch.shared["weight"], batch.shared["eps"], ref[0], x.dtype),)


JUSTIFICATION = (
    "fp32 accumulation of N squares in a fixed but non-fp64 order: the sum, mean, eps add, sqrt_rn "
    "and div_rn give rstd a relative error <= gamma_(N+3)/2 + 2u (u = 2^-24, from the fp64 "
    "reference's own mean square), the two fp32 products 2u, and the one final rounding u_out "
    "(2^-8 bf16, 2^-11 fp16, none for fp32) plus half a subnormal; underflowing fp32 steps add "
    "2^-150 absolute each.  Bound = |ref| * rel + floor, per element, from the fp64 run."
)


# ------------------------------------------------------------------------------------ builders


def _background(m: int, n: int, g: torch.Generator) -> torch.Tensor:
    scale = torch.exp2(torch.empty(m, 1).uniform_(-3.0, 3.0, generator=g))
    return torch.randn(m, n, generator=g) * scale  # (M, N) fp32


def _weight(n: int, dtype: torch.dtype) -> torch.Tensor:
    """The weight of hidden size ``n``: a shared operand, so a function of (n, dtype) alone and
    never of the case's seed (the position check mixes rows of two seeds under one weight)."""
    g = torch.Generator().manual_seed(7_000_003 * n + sorted(DTYPES).index(DTYPE_NAMES[dtype]))
    w = 1.0 + 0.25 * torch.randn(n, generator=g)
    w[torch.rand(n, generator=g) < 0.02] = 0.0
    return w.to(dtype)


def special_patterns(dtype: torch.dtype) -> list[Any]:
    """The catalogue entries injected by ``specials``: all but max normal for bf16/fp32 (whose
    square overflows the fp32 sum of squares, a documented departure from the reference)."""
    keep = [p for p in catalogue(dtype) if not p.name.endswith("max_normal") or dtype == torch.float16]
    return keep


def _huge_tiny(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.float16:
        return 2.0**12, 2.0**-20
    return 2.0**56, 2.0**-130


def make_rows(dtype: torch.dtype, m: int, n: int, kind: str, g: torch.Generator) -> torch.Tensor:
    """One (M, N) input tensor of ``dtype`` on the CPU for pattern ``kind``."""
    huge, tiny = _huge_tiny(dtype)
    if kind == "magnitudes":
        lo, hi = (-20.0, 12.0) if dtype == torch.float16 else (-56.0, 56.0)
        scale = torch.exp2(torch.empty(m, 1).uniform_(lo, hi, generator=g))
        return (torch.randn(m, n, generator=g) * scale).to(dtype)
    x = _background(m, n, g).to(dtype)
    if kind != "specials":
        return x
    chosen = torch.rand(m, generator=g) < 0.25
    if bool(chosen.any()):
        x[chosen] = inject(x[chosen], special_patterns(dtype), min(1.0, 1.5 / n), g)
    structured = [
        torch.full((n,), 0.75),  # all-equal
        torch.zeros(n),  # all-zero
        torch.randn(n, generator=g) * huge,  # huge
        torch.randn(n, generator=g) * tiny,  # tiny (subnormal for bf16/fp32)
        torch.cat([torch.tensor([huge]), torch.randn(n - 1, generator=g) * tiny])
        if n > 1
        else torch.tensor([huge]),
        torch.where(torch.arange(n) % 2 == 0, 1.5, -1.5),  # alternating signs
    ]
    for i, row in enumerate(structured):
        if m > 1 and i < m:
            x[(1 + 3 * i) % m] = row.to(dtype)
    return x


def make_residual(x: torch.Tensor, kind: str, g: torch.Generator) -> torch.Tensor:
    """The residual operand for ``x`` (fused op): ``cancellation`` makes x + residual cancel."""
    m, n = x.shape
    r = make_rows(x.dtype, m, n, "gaussian" if kind == "cancellation" else kind, g)
    if kind == "cancellation":
        which = torch.randint(3, (m,), generator=g)
        exact = which == 0
        r[exact] = -x[exact]  # h == 0 exactly
        near = which == 1
        # -x nudged by one ULP on a third of the elements: h is a few ULPs of x.
        bits = (-x[near]).view(torch.int16 if x.element_size() == 2 else torch.int32)
        nudge = (torch.rand(bits.shape, generator=g) < 0.33).to(bits.dtype)
        r[near] = (bits + nudge).view(x.dtype)
    return r


def _place(t: torch.Tensor, device: torch.device, layout: str, g: torch.Generator) -> torch.Tensor:
    """``t`` on ``device``; ``strided``: a column window (offset 3) of a wider NaN-filled buffer."""
    if layout == "contiguous":
        return t.to(device)
    if layout != "strided":
        raise ValueError(f"layout: expected contiguous or strided, got {layout!r}")
    m, n = t.shape
    pad = 3 + int(torch.randint(0, 9, (1,), generator=g))
    wide = torch.full((m, n + pad), math.nan, dtype=t.dtype)
    wide[:, 3 : 3 + n] = t
    return wide.to(device)[:, 3 : 3 + n]


def make_builder(fused: bool) -> Callable[[Case, torch.device], Batch]:
    def build(case: Case, device: torch.device) -> Batch:
        axes = case.axes
        dtype = DTYPES[axes["dtype"]]
        m, n = int(axes["num_rows"]), int(axes["hidden"])
        kind = axes["pattern"]
        layout = axes.get("layout", "contiguous")
        g = torch.Generator().manual_seed(case.seed)
        x = make_rows(dtype, m, n, "gaussian" if kind == "cancellation" else kind, g)
        weight = _weight(n, dtype).to(device)
        rows = {"x": _place(x, device, layout, g)}
        if fused:
            rows["residual"] = _place(make_residual(x, kind, g), device, layout, g)
        return Batch(rows, {"weight": weight, "eps": float(axes.get("eps", EPS))})

    return build


# --------------------------------------------------------------------------------------- cases


def make_cases(name: str, fused: bool) -> Callable[[Lane], Sequence[Case]]:
    def cases(lane: Lane) -> list[Case]:
        extra = "cancellation" if fused else "magnitudes"
        if lane is Lane.CPU:
            # Small hidden sizes (one odd) and 1..300 rows: the interpreter runs up to 128 rows
            # per program; 255/256/257/300 straddle the baseline's 256-row switch.
            spec = [
                ("fp32", 320, 300, "gaussian", "contiguous"),
                ("bf16", 256, 257, "specials", "contiguous"),
                ("fp16", 127, 256, extra, "contiguous"),
                ("bf16", 96, 255, "specials", "strided"),
                ("fp32", 127, 1, "specials", "contiguous"),
            ]
        else:
            spec = [
                ("bf16", 4096, 4096, "gaussian", "contiguous"),
                ("bf16", 8192, 300, "specials", "contiguous"),
                ("fp16", 2048, 257, "specials", "contiguous"),
                ("fp32", 7168, 256, "gaussian", "contiguous"),
                ("bf16", 5121, 255, extra, "contiguous"),
                ("fp32", 4096, 1, "specials", "contiguous"),
                ("bf16", 4096, 2048, "specials", "strided"),
                ("fp16", 8192, 1024, extra, "contiguous"),
                ("fp32", 2048, 4096, "specials", "contiguous"),
                ("bf16", 7168, 512, extra, "contiguous"),
                ("fp16", 5121, 300, "gaussian", "strided"),
            ]
        return [
            Case(name, {"dtype": d, "hidden": n, "num_rows": m, "pattern": p, "layout": lay}, seed=i)
            for i, (d, n, m, p, lay) in enumerate(spec)
        ]

    return cases


def make_bench_cases(name: str) -> Callable[[Lane], Sequence[Case]]:
    def bench_cases(lane: Lane) -> list[Case]:
        if lane is Lane.CPU:
            points = [("fp32", 320, m) for m in (1, 256)]
        else:
            points = [("bf16", n, m) for n in (4096, 8192) for m in (1, 16, 128, 256, 1024, 4096)]
        return [
            Case(
                name,
                {"dtype": d, "hidden": n, "num_rows": m, "pattern": "gaussian", "layout": "contiguous"},
                seed=0,
            )
            for d, n, m in points
        ]

    return bench_cases


def make_strategy(name: str, fused: bool) -> Callable[[Lane, torch.device], Any]:
    build = make_builder(fused)
    patterns = ["gaussian", "specials", "magnitudes", *(["cancellation"] if fused else [])]

    def strategy(lane: Lane, device: torch.device) -> Any:
        from hypothesis import strategies as st

        max_rows, max_hidden = (40, 160) if lane is Lane.CPU else (600, 9000)
        return st.builds(
            lambda d, n, m, p, lay, seed: build(
                Case(name, {"dtype": d, "hidden": n, "num_rows": m, "pattern": p, "layout": lay}, seed),
                device,
            ),
            st.sampled_from(sorted(DTYPES)),
            st.integers(1, max_hidden),
            st.integers(1, max_rows),
            st.sampled_from(patterns),
            st.sampled_from(["contiguous", "strided"]),
            st.integers(0, 2**31 - 1),
        )

    return strategy


# ---------------------------------------------------------------------------------- bad input


def make_error_cases(fused: bool) -> Callable[[torch.device], list[ErrorCase]]:
    def error_cases(device: torch.device) -> list[ErrorCase]:
        x = torch.randn(4, 8, device=device)
        w = torch.ones(8, device=device)

        def kw(**over: Any) -> dict[str, Any]:
            base: dict[str, Any] = {"x": x, "weight": w, "eps": EPS}
            if fused:
                base["residual"] = torch.randn(4, 8, device=device)
            base.update(over)
            return base

        cases = [
            ErrorCase(
                "weight_wrong_length",
                kw(weight=torch.ones(9, device=device)),
                ArgumentError,
                "argument 'weight'",
            ),
            ErrorCase(
                "weight_2d", kw(weight=torch.ones(1, 8, device=device)), ArgumentError, "argument 'weight'"
            ),
            ErrorCase("weight_other_dtype", kw(weight=w.half()), DTypeError, "argument 'weight'"),
            ErrorCase("eps_zero", kw(eps=0.0), ArgumentError, "argument 'eps'"),
            ErrorCase("eps_negative", kw(eps=-1e-6), ArgumentError, "argument 'eps'"),
            ErrorCase("eps_nan", kw(eps=math.nan), ArgumentError, "argument 'eps'"),
            ErrorCase("eps_inf", kw(eps=math.inf), ArgumentError, "argument 'eps'"),
            ErrorCase("eps_not_a_number", kw(eps="1e-6"), ArgumentError, "argument 'eps'"),
            ErrorCase("dim_out_of_range", kw(dim=2), ArgumentError, "argument 'dim'"),
            ErrorCase("dim_negative_out_of_range", kw(dim=-3), ArgumentError, "argument 'dim'"),
            ErrorCase("dim_not_last", kw(dim=0), ArgumentError, "argument 'dim'"),
            ErrorCase("x_float64", kw(x=x.double(), weight=w.double()), DTypeError, "argument 'x'"),
            ErrorCase("x_int32", kw(x=x.to(torch.int32)), DTypeError, "argument 'x'"),
            ErrorCase("x_1d", kw(x=x[0]), ArgumentError, "argument 'x'"),
            ErrorCase("x_3d", kw(x=x.reshape(2, 2, 8)), ArgumentError, "argument 'x'"),
            ErrorCase("x_empty_hidden", kw(x=x[:, :0], weight=w[:0]), ArgumentError, "argument 'x'"),
        ]
        if fused:
            cases += [
                ErrorCase(
                    "residual_wrong_shape",
                    kw(residual=torch.randn(4, 9, device=device)),
                    ArgumentError,
                    "argument 'residual'",
                ),
                ErrorCase(
                    "residual_other_dtype",
                    kw(residual=torch.randn(4, 8, device=device).half()),
                    DTypeError,
                    "argument 'residual'",
                ),
            ]
        from batchinv.reference.errors import DeviceError  # here: this hunk stays inside error_cases

        on_meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw().items()}
        cases.append(ErrorCase("all_on_meta", on_meta, DeviceError, r"argument 'x'.*meta"))
        return cases

    return error_cases


COMPONENT = Component(
    name="rms_norm",
    summary="out = x * w / sqrt(mean(x^2) + eps) per row; fp32 accumulation in an order fixed by the hidden size",
    reference=reference.rms_norm,
    fast=fast.rms_norm,
    baselines=(
        Baseline(
            name="rows_block",
            fn=baselines.rms_norm_rows_block,
            why="the column tile (hence the order of the sum of squares) switches at 256 rows",
        ),
        Baseline(
            name="torch",
            fn=baselines.rms_norm_torch,
            why=(
                "torch.nn.functional.rms_norm: on CUDA the vectorized kernel runs only for 16-byte "
                "aligned pointers, another tiling otherwise (row_start); CPU kernels are row-local"
            ),
            expected_to_vary_on=GPU_LANES,
        ),
    ),
    cases=make_cases("rms_norm", fused=False),
    build=make_builder(fused=False),
    agreement=Toleranced(
        bound=_bound_rms_norm, justification=JUSTIFICATION, out_dtypes=lambda batch: (batch.rows["x"].dtype,)
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=make_error_cases(fused=False),
    shift_row_start=pack_at_offset,
    partition_arg=None,
    strategy=make_strategy("rms_norm", fused=False),
    bench_cases=make_bench_cases("rms_norm"),
)
