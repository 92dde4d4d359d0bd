"""Registry entry ``fp8_quant``: dynamic FP8 (e4m3fn) quantization per token or per 1 x G group.

Axes of a case: ``dtype`` (bf16 / fp16 / fp32), ``k`` (K), ``rows`` (M), ``group`` (None: one
scale per token; G: 1 x G groups, the last one short when G does not divide K), ``values``,
``layout``.  Inputs are built from the seed with their own CPU generator.

Values (every row's magnitude is drawn per row across many powers of two -- 2^U(-40, 40), fp16
2^U(-10, 10) -- and, with groups, each G-column block gets a factor 2^U(-6, 6) more: a scale
taken over the batch, or over the row, changes the bits of most rows and groups):

* ``normal``: N(0, 1) times those factors.
* ``specials``: that background, a third of its rows with the dtype's whole bit-pattern
  catalogue (near-max values included) injected sparsely (+-0, +-inf, quiet and signalling NaNs
  of both signs, NaN payloads, min/max subnormal, min/max normal...), plus structured rows
  (rows past M left out): all +0; all -0; all NaN of both signs; +-inf with one 0 (amax 0:
  scale fl32(2^-64 / 448), q +-448); subnormals of the dtype only (fp16: exact e4m3 values
  after the scale; bf16/fp32: +-0 by the MIN_AMAX rule); +-max normal among gaussians; one
  +-max normal among tiny values (e4m3 subnormal and zero q); +-inf among values 2^-20.
* ``ties``: half the rows (alternating) are tie rows: every 16th column (the first of every
  group, G >= 16) holds +-448 * 2^j, so the scale is exactly 2^j and x / scale is exact; the
  other columns are 2^j times e4m3 grid values, midpoints between adjacent e4m3 values (ties:
  to the even code), the subnormal-range midpoints (k + 1/2) 2^-9, and each midpoint one ULP
  of the input dtype above and below, random signs.  The other rows are ``normal``.

A row's amax over 448 * scale (fl32 rounding the scale down, so amax / scale > 448 and q is
448 by rounding) happens on about half of the normal rows; ``tests/components/test_fp8_quant.py`` asserts
the cpu cases hold some.

Layouts: ``contiguous``; ``strided`` (a column window of a wider NaN-filled buffer);
``transposed`` (column-major: row stride 1).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from batchinv.fast import fp8_quant as fast
from batchinv.fast.baselines import fp8_quant as baselines
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
    Exact,
)
from batchinv.reference import fp8_quant as reference
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "fp8_quant"
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
}
#: Per-row magnitude exponents 2^U(lo, hi), per dtype (fp16 keeps 4 sigma times 2^10 finite).
ROW_EXPONENTS: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (-40.0, 40.0),
    torch.float16: (-10.0, 10.0),
    torch.float32: (-40.0, 40.0),
}
#: The tie rows' scale exponents j (the scale is exactly 2^j), per dtype.
TIE_EXPONENTS: dict[torch.dtype, tuple[int, int]] = {
    torch.bfloat16: (-40, 40),
    torch.float16: (-4, 4),
    torch.float32: (-40, 40),
}
#: Every this many columns of a tie row holds +-448 * 2^j (the first column of every group).
TIE_ANCHOR_STRIDE = reference.MIN_GROUP_SIZE


def _case(dtype: str, k: int, rows: int, group: int | None, values: str, layout: str, seed: int) -> Case:
    return Case(
        NAME,
        {"dtype": dtype, "k": k, "rows": rows, "group": group, "values": values, "layout": layout},
        seed,
    )


def e4m3_grid() -> torch.Tensor:
    """The 127 nonnegative finite float8_e4m3fn values, ascending (float64)."""
    codes = torch.arange(0x7F, dtype=torch.uint8)  # 0x00 .. 0x7E
    return codes.view(torch.float8_e4m3fn).to(torch.float64)


def _neighbours(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next below, next above) of positive values of a float dtype, by their integer bits."""
    bits = values.view(INT_VIEW[values.dtype])
    return (bits - 1).view(values.dtype), (bits + 1).view(values.dtype)


def tie_values(dtype: torch.dtype) -> torch.Tensor:
    """The tie rows' magnitudes in units of the scale: the e4m3 grid, every midpoint between
    adjacent grid values (subnormal range included), and each midpoint one ULP of ``dtype``
    below and above; all exact in ``dtype`` (a midpoint has at most 5 significant bits)."""
    grid = e4m3_grid()
    mids = ((grid[1:] + grid[:-1]) / 2).to(dtype)
    below, above = _neighbours(mids)
    return torch.cat([grid.to(dtype), mids, below, above])


def _background(dtype: torch.dtype, m: int, k: int, group: int | None, g: torch.Generator) -> torch.Tensor:
    lo, hi = ROW_EXPONENTS[dtype]
    row = torch.exp2(torch.empty(m, 1, dtype=torch.float64).uniform_(lo, hi, generator=g))
    x = torch.randn(m, k, generator=g, dtype=torch.float64) * row
    if group is not None:
        blocks = -(k // -group)
        factor = torch.exp2(torch.empty(m, blocks, dtype=torch.float64).uniform_(-6.0, 6.0, generator=g))
        x = x * factor.repeat_interleave(group, dim=1)[:, :k]
    return x.to(dtype)


def _tie_row(dtype: torch.dtype, k: int, g: torch.Generator) -> torch.Tensor:
    lo, hi = TIE_EXPONENTS[dtype]
    j = int(torch.randint(lo, hi + 1, (1,), generator=g))
    pool = tie_values(dtype).to(torch.float64)
    row = pool[torch.randint(pool.numel(), (k,), generator=g)]
    row[::TIE_ANCHOR_STRIDE] = reference.E4M3_MAX
    signs = torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (row * signs * 2.0**j).to(dtype)


def _subnormals(dtype: torch.dtype, k: int, g: torch.Generator) -> torch.Tensor:
    mant_bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    width = 32 if dtype == torch.float32 else 16
    bits = torch.randint(1, 1 << mant_bits, (k,), generator=g, dtype=torch.int64)
    bits = bits | torch.where(torch.rand(k, generator=g) < 0.5, 1 << (width - 1), 0)
    bits = torch.where(bits >= 1 << (width - 1), bits - (1 << width), bits)
    return bits.to(INT_VIEW[dtype]).view(dtype)


def _structured_rows(dtype: torch.dtype, k: int, g: torch.Generator) -> list[torch.Tensor]:
    top = torch.finfo(dtype).max
    tiny = 2.0**-20 if dtype == torch.float16 else 2.0**-100
    signs = torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    nan_row = torch.full((k,), math.nan, dtype=torch.float64).to(dtype)
    nan_bits = nan_row.view(INT_VIEW[dtype]).clone()
    nan_bits[::2] = nan_bits[::2] | torch.tensor(-1, dtype=INT_VIEW[dtype]) << (
        nan_bits.element_size() * 8 - 1
    )
    inf_row = signs * math.inf
    inf_row[k // 2] = 0.0
    max_gauss = torch.randn(k, generator=g, dtype=torch.float64)
    max_gauss[int(torch.randint(k, (1,), generator=g))] = top
    huge_tiny = torch.randn(k, generator=g, dtype=torch.float64) * tiny
    huge_tiny[0] = -top
    inf_small = torch.randn(k, generator=g, dtype=torch.float64) * 2.0**-20
    inf_small[:: max(1, k // 3)] = math.inf
    return [
        torch.zeros(k, dtype=dtype),
        torch.full((k,), -0.0, dtype=dtype),
        nan_bits.view(dtype),
        inf_row.to(dtype),
        _subnormals(dtype, k, g),
        (signs * top).to(dtype),
        max_gauss.to(dtype),
        huge_tiny.to(dtype),
        inf_small.to(dtype),
    ]


def make_rows(
    dtype: torch.dtype, m: int, k: int, group: int | None, values: str, g: torch.Generator
) -> torch.Tensor:
    """One (M, K) input of ``dtype`` on the CPU for ``values`` (module docstring)."""
    x = _background(dtype, m, k, group, g)
    if values == "normal":
        return x
    if values == "ties":
        for r in range(0, m, 2):
            x[r] = _tie_row(dtype, k, g)
        return x
    if values != "specials":
        raise ValueError(f"values: expected normal, specials or ties, got {values!r}")
    chosen = torch.rand(m, generator=g) < 1.0 / 3.0
    if bool(chosen.any()):
        x[chosen] = inject(x[chosen], catalogue(dtype, near_max=True), min(1.0, 3.0 / k), g)
    for i, row in enumerate(_structured_rows(dtype, k, g)):
        if m > 1 and i < m:
            x[(1 + 3 * i) % m] = row
    return x


def _place(t: torch.Tensor, device: torch.device, layout: str, g: torch.Generator) -> torch.Tensor:
    if layout == "contiguous":
        return t.to(device)
    if layout == "transposed":
        return t.to(device).t().contiguous().t()  # column-major: strides (1, M)
    if layout != "strided":
        raise ValueError(f"layout: expected contiguous, strided or transposed, got {layout!r}")
    m, k = t.shape
    pad = 3 + int(torch.randint(0, 9, (1,), generator=g))
    wide = torch.full((m, k + pad), math.nan, dtype=t.dtype)
    wide[:, 3 : 3 + k] = t
    return wide.to(device)[:, 3 : 3 + k]


def build(case: Case, device: torch.device) -> Batch:
    a = case.axes
    dtype = DTYPES[a["dtype"]]
    k, m = int(a["k"]), int(a["rows"])
    group = a["group"]
    g = torch.Generator().manual_seed(case.seed)
    x = make_rows(dtype, m, k, group, a["values"], g)
    return Batch({"x": _place(x, device, a.get("layout", "contiguous"), g)}, {"group_size": group})


def cases(lane: Lane) -> list[Case]:
    """Small shapes in the interpreter (K not a multiple of 128, K past the interpreter's
    512-column chunk, groups of 16, 64 and 128); production K (4096, 7168, 2048) on GPU lanes,
    and 16384 (past the 8192-column chunk) and 5121 (a short last group)."""
    if not lane.is_gpu:
        spec: list[tuple[str, int, int, int | None, str, str]] = [
            ("fp32", 300, 65, None, "normal", "contiguous"),
            ("bf16", 300, 40, 128, "specials", "contiguous"),
            ("fp16", 256, 33, 128, "ties", "strided"),
            ("bf16", 600, 17, None, "specials", "strided"),
            ("fp32", 192, 24, 64, "ties", "transposed"),
            ("fp16", 130, 20, None, "specials", "contiguous"),
            ("fp32", 96, 12, 16, "specials", "contiguous"),
            ("bf16", 160, 1, 128, "ties", "contiguous"),
        ]
    else:
        spec = [
            ("bf16", 4096, 4096, None, "normal", "contiguous"),
            ("bf16", 7168, 4096, 128, "normal", "contiguous"),
            ("bf16", 7168, 512, None, "specials", "contiguous"),
            ("bf16", 2048, 2048, 128, "specials", "contiguous"),
            ("fp16", 4096, 1024, 128, "ties", "contiguous"),
            ("fp32", 7168, 256, None, "ties", "contiguous"),
            ("fp32", 2048, 300, 128, "specials", "strided"),
            ("bf16", 5121, 257, 128, "specials", "contiguous"),
            ("bf16", 16384, 64, None, "specials", "contiguous"),
            ("fp16", 7168, 33, None, "specials", "strided"),
            ("bf16", 4096, 65, None, "ties", "transposed"),
        ]
    return [_case(d, k, m, grp, v, lay, seed) for seed, (d, k, m, grp, v, lay) in enumerate(spec)]


def bench_cases(lane: Lane) -> list[Case]:
    """GPU: M in (1, 32, 512, 4096) x K in (4096, 7168), per token and 1 x 128, bf16."""
    if not lane.is_gpu:
        return [_case("bf16", 256, m, grp, "normal", "contiguous", 0) for m in (1, 64) for grp in (None, 128)]
    return [
        _case("bf16", k, m, grp, "normal", "contiguous", 0)
        for grp in (None, 128)
        for k in (4096, 7168)
        for m in (1, 32, 512, 4096)
    ]


def bench_bytes(batch: Batch) -> int:
    """x read once, q (1 byte per element) and the fp32 scales written once."""
    x = batch.rows["x"]
    m, k = x.shape
    return x.numel() * x.element_size() + m * k + 4 * m * reference.num_groups(k, batch.shared["group_size"])


def error_cases(device: torch.device) -> list[ErrorCase]:
    x = torch.randn(4, 256, device=device).to(torch.bfloat16)

    def kw(**over: Any) -> dict[str, Any]:
        return {"x": x, "group_size": None, **over}

    return [
        ErrorCase("x_float64", kw(x=x.double()), DTypeError, "argument 'x'"),
        ErrorCase("x_int32", kw(x=x.to(torch.int32)), DTypeError, "argument 'x'"),
        ErrorCase("x_fp8", kw(x=x.to(torch.float8_e4m3fn)), DTypeError, "argument 'x'"),
        ErrorCase("x_not_a_tensor", kw(x=[[1.0, 2.0]]), DTypeError, "argument 'x'"),
        ErrorCase("x_1d", kw(x=x[0]), ArgumentError, "argument 'x'"),
        ErrorCase("x_3d", kw(x=x.reshape(2, 2, 256)), ArgumentError, "argument 'x'"),
        ErrorCase("x_empty_k", kw(x=x[:, :0]), ArgumentError, "argument 'x'"),
        ErrorCase("x_meta", kw(x=x.to("meta")), DeviceError, r"argument 'x'.*meta"),
        ErrorCase("group_not_power_of_two", kw(group_size=100), ArgumentError, "argument 'group_size'"),
        ErrorCase("group_below_16", kw(group_size=8), ArgumentError, "argument 'group_size'"),
        ErrorCase("group_zero", kw(group_size=0), ArgumentError, "argument 'group_size'"),
        ErrorCase("group_negative", kw(group_size=-128), ArgumentError, "argument 'group_size'"),
        ErrorCase("group_float", kw(group_size=128.0), DTypeError, "argument 'group_size'"),
        ErrorCase("group_bool", kw(group_size=True), DTypeError, "argument 'group_size'"),
        ErrorCase("group_str", kw(group_size="128"), DTypeError, "argument 'group_size'"),
    ]


def strategy(lane: Lane, device: torch.device) -> Any:
    from hypothesis import strategies as st

    max_k, max_m = (200, 24) if not lane.is_gpu else (9000, 600)
    return st.builds(
        lambda d, k, m, grp, v, lay, seed: build(_case(d, k, m, grp, v, lay, seed), device),
        st.sampled_from(sorted(DTYPES)),
        st.integers(1, max_k),
        st.integers(1, max_m),
        st.sampled_from([None, 16, 32, 128]),
        st.sampled_from(["normal", "specials", "ties"]),
        st.sampled_from(["contiguous", "strided", "transposed"]),
        st.integers(0, 2**31 - 1),
    )


JUSTIFICATION = (
    "one fixed sequence of exact or correctly rounded steps: amax is a max (exact, any order), the "
    "scale and the quotient are one IEEE fp32 division each (div_rn; the reference divides in fp64 "
    "and rounds once to fp32, which is the same value since 53 >= 2 * 24 + 2), and the e4m3 "
    "rounding is round-to-nearest-even with saturation, integer ops in the kernel and an fp64 grid "
    "rounding in the reference"
)

COMPONENT = Component(
    name=NAME,
    summary=(
        "dynamic fp8 e4m3fn quantization per token or 1 x G group: scale = fl32(max(amax, 2^-64) / 448), "
        "q = e4m3_rne_satfinite(fl32(x / scale))"
    ),
    reference=reference.fp8_quant,
    fast=fast.fp8_quant,
    baselines=(
        Baseline(
            name="per_tensor_dynamic",
            fn=baselines.fp8_quant_per_tensor_dynamic,
            why=(
                "per-tensor dynamic quantization (vLLM's scaled_fp8_quant without a scale): one scale "
                "from the amax of the whole batch, so a token's scale and q depend on the other tokens"
            ),
            expected_to_vary_on=ALL_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact(JUSTIFICATION),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=error_cases,
    shift_row_start=pack_at_offset,
    strategy=strategy,
    bench_cases=bench_cases,
    bench_bytes=bench_bytes,
)
