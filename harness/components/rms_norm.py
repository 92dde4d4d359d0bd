"""Registry entry ``rms_norm`` (and the builders, bound and cases it shares with
``fused_add_rms_norm``).

Inputs are built from a seed with their own CPU ``torch.Generator`` and moved to the device.
Patterns (axis ``pattern``):

* ``gaussian``: normal rows, each with its own scale 2^U(-3, 3).
* ``specials``: that background with a quarter of the rows carrying special values from raw
  bits (the whole catalogue with its near-max values: +-0, +-inf, quiet/signalling NaNs of
  both signs, NaN payloads, min/max subnormal, min/max normal, max normal - 1 ULP, the largest
  power of two, the first power of two whose square overflows), injected sparsely, plus
  structured rows: all-equal, all-zero, huge (2^56, or 2^12 for fp16), tiny (subnormal), one
  huge element among tiny ones, alternating signs, and the :data:`EXTREME_ROWS`.
* ``extremes``: every row one of :data:`EXTREME_ROWS` in turn (finite rows whose fp32 sum of
  squares overflows: the issue's |x| ~ 1e20 and N x 3e17 rows, near-max and max-normal rows);
  for the fused op the residual is small noise, or x itself on every third row, so that
  x + residual overflows to inf there (an infinite row for the norm).
* ``magnitudes``: row scales spread over 2^-100..2^124 (2^-20..2^13 for fp16).
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
from batchinv.fast.baselines import rms_norm as baselines
from batchinv.fast.enable import ops
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
from batchinv.reference.rms_norm import out_bound

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
EPS = 1e-6

# ---------------------------------------------------------------------------------- tolerance


def _bound_rms_norm(batch: Batch, ref: Outputs) -> Outputs:
    """:func:`batchinv.reference.rms_norm.out_bound` on the batch's rows, weight and reference."""
    x = batch.rows["x"]
    return (out_bound(x.shape[1], batch.shared["weight"], ref[0], x.dtype),)


JUSTIFICATION = (
    "fp64 sum of the exact squares (any order: gamma_(N+1) in fp64 with mean and eps), rstd "
    "correctly rounded in fp64 then rounded once to a normal fp32 (u = 2^-24), two fp32 products "
    "(2u), one final rounding u_out (2^-8 bf16, 2^-11 fp16, none for fp32); underflowing fp32 "
    "steps add 2^-150 absolute each, the final rounding half a subnormal; the fp64 reference's "
    "own gamma_(N+5) is counted.  Bound = |ref| * ~(3u + u_out) + floor per element (1.5 to 3 "
    "ULP for fp32): an fp32 sum of squares fails it (by overflow on the extremes rows, by "
    "rounding alone on some fp32 gaussian rows), and so would any bf16 step."
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
    """The catalogue entries injected by ``specials``: all of them, near-max values included
    (the fp64 sum of squares has no overflow to leave out)."""
    return list(catalogue(dtype, near_max=True))


def _huge_tiny(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.float16:
        return 2.0**12, 2.0**-20
    return 2.0**56, 2.0**-130


#: Finite rows whose squares or sum of squares overflow fp32 (bf16/fp32) or fp16 (fp16 rows),
#: built by :func:`extreme_row`; the ``extremes`` pattern cycles through them and ``specials``
#: places one of each.  An fp32 sum of squares returns 0 for all but the fp16 rows.
EXTREME_ROWS: tuple[str, ...] = (
    "rms_1e20",  # N(0, 1e20^2) (fp16: N(0, 2^13^2)), the issue's |x| ~ 1e20 row
    "constant_3e17",  # N x 3e17 (fp16: N x 6e4): sum 4096 * 9e34 > 3.4e38
    "square_overflow",  # +-2^64 (fp16: +-256), the smallest power of two whose square overflows
    "near_max",  # +-U[max / 2, max), random signs
    "max_normal",  # +-max normal, random signs
    "max_among_gaussian",  # one +-max normal in an N(0, 1) row
    "max_among_subnormals",  # one +-max normal among subnormals (their outputs underflow)
)


def extreme_row(dtype: torch.dtype, n: int, name: str, g: torch.Generator) -> torch.Tensor:
    """Row ``name`` of :data:`EXTREME_ROWS`: (n,) of ``dtype``, every element finite."""
    fp16 = dtype == torch.float16
    top = torch.finfo(dtype).max
    signs = torch.where(torch.rand(n, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    col = int(torch.randint(n, (1,), generator=g))
    if name == "rms_1e20":
        row = torch.randn(n, generator=g, dtype=torch.float64) * (2.0**13 if fp16 else 1e20)
    elif name == "constant_3e17":
        row = torch.full((n,), 6e4 if fp16 else 3e17, dtype=torch.float64)
    elif name == "square_overflow":
        row = signs * (2.0**8 if fp16 else 2.0**64)
    elif name == "near_max":
        row = signs * top * torch.empty(n, dtype=torch.float64).uniform_(0.5, 1.0, generator=g)
    elif name == "max_normal":
        row = signs * top
    elif name in ("max_among_gaussian", "max_among_subnormals"):
        scale = 1.0 if name == "max_among_gaussian" else _huge_tiny(dtype)[1]
        row = torch.randn(n, generator=g, dtype=torch.float64) * scale
        row[col] = float(signs[col]) * top
    else:
        raise ValueError(f"extreme row: expected one of {EXTREME_ROWS}, got {name!r}")
    out = row.to(dtype)
    assert bool(torch.isfinite(out).all()), name
    return out


def make_rows(dtype: torch.dtype, m: int, n: int, kind: str, g: torch.Generator) -> torch.Tensor:
    """One (M, N) input tensor of ``dtype`` on the CPU for pattern ``kind``."""
    huge, tiny = _huge_tiny(dtype)
    if kind == "magnitudes":
        lo, hi = (-20.0, 13.0) if dtype == torch.float16 else (-100.0, 124.0)
        scale = torch.exp2(torch.empty(m, 1).uniform_(lo, hi, generator=g))
        return (torch.randn(m, n, generator=g) * scale).to(dtype)
    if kind == "extremes":
        first = int(torch.randint(len(EXTREME_ROWS), (1,), generator=g))
        names = [EXTREME_ROWS[(first + i) % len(EXTREME_ROWS)] for i in range(m)]
        return torch.stack([extreme_row(dtype, n, name, g) for name in names]).reshape(m, n)
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
        *(extreme_row(dtype, n, name, g) for name in EXTREME_ROWS),
    ]
    for i, row in enumerate(structured):
        if m > 1 and i < m:
            x[(1 + 3 * i) % m] = row.to(dtype)
    return x


def make_residual(x: torch.Tensor, kind: str, g: torch.Generator) -> torch.Tensor:
    """The residual operand for ``x`` (fused op): ``cancellation`` makes x + residual cancel;
    ``extremes``: small noise (h = x, up to rounding: finite extreme rows), and x itself on every
    third row (h = 2x: near-max rows overflow to +-inf in residual_out)."""
    m, n = x.shape
    r = make_rows(x.dtype, m, n, "gaussian" if kind in ("cancellation", "extremes") else kind, g)
    if kind == "extremes":
        r[2::3] = x[2::3]
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
            # per program; 255/256/257/300 straddle the baseline's 256-row switch.  The
            # ``extremes`` rows: the N = 4096 (fp32, bf16), fp16, and 9000 columns (the
            # chunked path: three 4096-column chunks).
            spec = [
                ("fp32", 320, 300, "gaussian", "contiguous"),
                ("bf16", 256, 257, "specials", "contiguous"),
                ("fp16", 127, 256, extra, "contiguous"),
                ("bf16", 96, 255, "specials", "strided"),
                ("fp32", 127, 1, "specials", "contiguous"),
                ("fp32", 4096, 2, "extremes", "contiguous"),
                ("bf16", 4096, 2, "extremes", "strided"),
                ("fp16", 200, 21, "extremes", "contiguous"),
                ("fp32", 9000, 3, "extremes", "contiguous"),
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
                ("bf16", 4096, 64, "extremes", "contiguous"),
                ("fp32", 4096, 33, "extremes", "strided"),
                ("fp16", 8192, 17, "extremes", "contiguous"),
                ("fp32", 16384, 7, "extremes", "contiguous"),
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
    patterns = ["gaussian", "specials", "magnitudes", "extremes", *(["cancellation"] if fused else [])]

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
    summary="out = x * w / sqrt(mean(x^2) + eps) per row; fp64 sum of squares in an order fixed by the hidden size",
    reference=reference.rms_norm,
    fast=fast.rms_norm,
    baselines=(
        Baseline(
            name="rows_block",
            fn=baselines.rms_norm_rows_block,
            why="the column tile (hence the order of its fp32 sum of squares) switches at 256 rows",
        ),
        Baseline(
            name="torch",
            fn=baselines.rms_norm_torch,
            why=(
                "torch.nn.functional.rms_norm: on CUDA the vectorized kernel runs only for 16-byte "
                "aligned pointers, another tiling otherwise (row_start); CPU kernels are row-local; also "
                "the negative control of modes: torch.compile lowers it to Inductor's own reduction"
            ),
            expected_to_vary_on=GPU_LANES,
            modes=baselines.rms_norm_torch_unchecked,
        ),
        Baseline(
            name="eps_by_batch_max",
            fn=baselines.rms_norm_eps_by_batch_max,
            why=(
                "eps scaled by the launch's largest finite |x|: a row's rstd follows its neighbours' "
                "values -- the negative control of neighbours"
            ),
            timed=False,
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
    torch_op=ops.rms_norm_subject,
)
