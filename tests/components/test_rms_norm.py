"""Tests of rms_norm / fused_add_rms_norm beyond the generic registry tests.

Expected values here come from hand-derived formulas, integer bit patterns or fp64 math, never
from the code under test.  On the cpu lane the kernels run in the Triton interpreter.
"""

from __future__ import annotations

import inspect
import math
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from launch_recorder import LaunchRecorder

import batchinv.fast.rms_norm as fast_mod
from batchinv.fast.baselines import rms_norm as rms_norm_baselines
from batchinv.fast.rms_norm import CONFIGS, PRODUCTION_HIDDEN, config_for, derive_config
from batchinv.harness.bitpatterns import catalogue, from_bits, near_max_patterns, pattern, to_bits
from batchinv.harness.compare import compare_bitwise, compare_tolerance
from batchinv.harness.components.rms_norm import EXTREME_ROWS, extreme_row, out_bound, special_patterns
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get
from batchinv.reference import rms_norm as ref_mod

CPU = torch.device("cpu")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _f32(value: float) -> float:
    """``value`` rounded to float32 by struct (independent of the code under test)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _rows(dtype: torch.dtype, m: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g).to(dtype)


# ------------------------------------------------------------------------ config never keyed on rows


@pytest.mark.cpu
def test_config_functions_take_no_row_count() -> None:
    for fn in (config_for, derive_config):
        assert list(inspect.signature(fn).parameters) == ["arch_name", "dtype", "n_cols"], fn.__name__
    for key in CONFIGS:
        arch_name, dtype, n_cols = key
        assert isinstance(arch_name, str) and isinstance(dtype, torch.dtype) and isinstance(n_cols, int)
    assert {n for _, _, n in CONFIGS} == set(PRODUCTION_HIDDEN)


@pytest.mark.cpu
@pytest.mark.parametrize("hidden", [96, 127, 4096, 5121, 20000])
def test_every_row_count_launches_one_config(monkeypatch: pytest.MonkeyPatch, hidden: int) -> None:
    rec = LaunchRecorder()
    monkeypatch.setattr(fast_mod, "rms_norm_rows_kernel", rec)
    w = torch.ones(hidden)
    for m in (1, 2, 7, 255, 256, 257, 2048):
        x = torch.zeros(m, hidden)
        fast_mod.rms_norm(x, w)
        fast_mod.fused_add_rms_norm(x, x, w)
    plain = [plan for plan in rec.plans() if not plan["HAS_RESIDUAL"]]
    fused = [plan for plan in rec.plans() if plan["HAS_RESIDUAL"]]
    assert len(plain) == len(fused) == 7
    assert all(launch == plain[0] for launch in plain)
    assert all(launch == fused[0] for launch in fused)


@pytest.mark.cpu
@pytest.mark.negative_control
def test_recorder_sees_the_rows_dependent_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder above can fail: the unpinned baseline's tile changes at 256 rows."""
    rec = LaunchRecorder()

    def record(x: torch.Tensor, r: object, w: object, eps: float, cfg: object) -> tuple[torch.Tensor, None]:
        rec.launches.append({"config": cfg})
        return x, None

    monkeypatch.setattr(rms_norm_baselines, "launch_rows", record)
    for m in (255, 256):
        rms_norm_baselines.rms_norm_rows_block(torch.zeros(m, 320), torch.ones(320))
    assert rec.launches[0] != rec.launches[1]


# ----------------------------------------------------------------------------------- special values


def _inject_row(dtype: torch.dtype, n: int, col: int, name: str) -> torch.Tensor:
    x = _rows(dtype, 1, n, seed=3)
    x[0, col] = pattern(dtype, name).tensor()
    return x


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["+inf", "-inf"])
def test_infinity_zeroes_the_row_and_is_nan_itself(dtype: torch.dtype, name: str) -> None:
    n, col = 40, 17
    x = _inject_row(dtype, n, col, name)
    w = torch.linspace(-1.0, 1.0, n).to(dtype)
    out = fast_mod.rms_norm(x, w)
    assert torch.isnan(out[0, col])
    others = torch.cat([out[0, :col], out[0, col + 1 :]]).float()
    assert bool((others == 0).all())
    # sign of each zero is the sign of x * w (IEEE: finite * +0 * w)
    xs = torch.cat([x[0, :col], x[0, col + 1 :]]).float()
    ws = torch.cat([w[:col], w[col + 1 :]]).float()
    assert torch.equal(torch.signbit(others), torch.signbit(xs) ^ torch.signbit(ws))


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["+quiet_nan", "-signalling_nan", "all_ones_nan"])
def test_nan_makes_the_whole_row_nan_and_leaves_others(dtype: torch.dtype, name: str) -> None:
    x = _rows(dtype, 3, 33, seed=5)
    x[1, 4] = pattern(dtype, name).tensor()
    out = fast_mod.rms_norm(x, torch.ones(33, dtype=dtype))
    assert bool(torch.isnan(out[1]).all())
    assert not bool(torch.isnan(out[[0, 2]]).any())


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_row_gives_signed_zeros(dtype: torch.dtype) -> None:
    n = 24
    x = from_bits([0x8000 if dtype != torch.float32 else 0x80000000] * n, dtype).reshape(1, n)  # all -0
    w = torch.ones(n, dtype=dtype)
    out = fast_mod.rms_norm(x, w)
    assert bool((to_bits(out) == to_bits(x)).all())  # -0 * rstd * 1 = -0, bit for bit


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_equal_row_matches_closed_form(dtype: torch.dtype) -> None:
    n, c, eps = 50, 0.75, 1e-6
    x = torch.full((1, n), c, dtype=dtype)
    w = torch.ones(n, dtype=dtype)
    out = fast_mod.rms_norm(x, w, eps)
    exact = c / math.sqrt(c * c + _f32(eps))  # mean(x^2) = c^2 exactly
    ref = torch.full((1, n), exact, dtype=torch.float64)
    report = compare_tolerance(ref, out, out_bound(n, w, ref, dtype))
    assert report.within, str(report)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_subnormal_inputs_are_not_flushed(dtype: torch.dtype) -> None:
    n, eps = 16, 1e-6
    tiny = pattern(dtype, "+max_subnormal").tensor().item()
    x = torch.full((1, n), tiny, dtype=torch.float64).to(dtype)
    out = fast_mod.rms_norm(x, torch.ones(n, dtype=dtype), eps)
    # mean(x^2) underflows to 0 next to eps, so out = x / sqrt(eps) (about 1e3 x): normal, nonzero.
    expected = torch.full((1, n), tiny / math.sqrt(tiny * tiny + _f32(eps)), dtype=torch.float64)
    report = compare_tolerance(expected, out, out_bound(n, torch.ones(n), expected, dtype))
    assert report.within and bool((out != 0).all()), str(report)


# ------------------------------------------------- no overflow for finite rows; the eps rule


def _ref_and_bound(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp64 reference output and its bound (the reference is fp64 math on exact inputs)."""
    ref = ref_mod.rms_norm(x, w, eps)
    return ref, out_bound(x.shape[1], w, ref, x.dtype)


def _within(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    ref, bound = _ref_and_bound(x, w, eps)
    report = compare_tolerance(ref, out, bound)
    assert report.within, str(report)


def _signs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_of_magnitude_1e20_normalize_instead_of_zero(dtype: torch.dtype) -> None:
    """Issue 7.4: |x| ~ 1e20 squared passes fp32's range; an fp32 sum of squares gave 0."""
    x = (_rows(torch.float32, 3, 64, seed=40).double() * 1e20).to(dtype)
    w = _rows(dtype, 1, 64, seed=41)[0]
    out = fast_mod.rms_norm(x, w)
    _within(x, w, 1e-6, out)
    rms = out.double().div(w.double()).pow(2).mean(dim=1).sqrt()  # ~1 (w has no zeros here)
    assert bool((rms - 1).abs().max() < 0.02), rms
    res = torch.zeros_like(x)
    fused, res_out = fast_mod.fused_add_rms_norm(x, res, w)
    assert torch.equal(to_bits(res_out), to_bits(x)) and torch.equal(to_bits(fused), to_bits(out))


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_4096_values_of_3e17_give_ones(dtype: torch.dtype) -> None:
    """Issue 7.4: 4096 * (3e17)^2 = 3.7e38 > fp32 max.  A constant row c normalizes to
    c / sqrt(c^2 + eps32) = 1 - 6e-42: 1.0 after rounding to bf16, within the bound for fp32."""
    n = 4096
    x = torch.full((2, n), 3e17, dtype=torch.float64).to(dtype)
    x[1] = -x[1]
    w = torch.ones(n, dtype=dtype)
    out = fast_mod.rms_norm(x, w)
    c = x[0, 0].double().item()
    expected = torch.full((2, n), c / math.sqrt(c * c + _f32(1e-6)), dtype=torch.float64)
    expected[1] = -expected[1]
    report = compare_tolerance(expected, out, out_bound(n, w, expected, dtype))
    assert report.within, str(report)
    if dtype == torch.bfloat16:
        assert out.double().tolist() == [[1.0] * n, [-1.0] * n]
    _within(x, w, 1e-6, fast_mod.fused_add_rms_norm(x, torch.zeros_like(x), w)[0])


_NEAR_MAX = ["+max_normal", "+near_max", "+max_power_of_two", "+square_overflow"]


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _NEAR_MAX)
def test_rows_of_near_max_values_give_plus_minus_one(dtype: torch.dtype, name: str) -> None:
    """A row of +-c (c = max normal and its neighbours, from raw bits): out = +-c / sqrt(c^2 +
    eps32), which is +-1 in every output dtype (within 2^-24 of 1, fp32 within its bound)."""
    n = 48
    c = pattern(dtype, name).tensor().double().item()
    signs = _signs(n, seed=42)
    x = (signs * c).to(dtype).reshape(1, n)
    w = torch.ones(n, dtype=dtype)
    out = fast_mod.rms_norm(x, w)
    expected = (signs * (c / math.sqrt(c * c + _f32(1e-6)))).reshape(1, n)
    report = compare_tolerance(expected, out, out_bound(n, w, expected, dtype))
    assert report.within, str(report)
    assert bool(((out.double() - signs).abs() <= 2.0**-23).all()), out
    assert torch.equal(torch.signbit(out[0]), signs < 0)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [*_NEAR_MAX, "-max_normal", "-near_max"])
def test_one_near_max_element_dominates_its_row(dtype: torch.dtype, name: str) -> None:
    """One extreme element among N(0, 1) and among subnormals: the extreme one becomes about
    +-sqrt(N), the rest about x / c (tiny, underflowing to 0 next to subnormals)."""
    n, col = 40, 13
    w = _rows(dtype, 1, n, seed=43)[0]
    x = _rows(dtype, 2, n, seed=44)
    x[1] = pattern(dtype, "+min_subnormal").tensor()
    x[:, col] = pattern(dtype, name).tensor()
    out = fast_mod.rms_norm(x, w)
    _within(x, w, 1e-6, out)
    assert bool(torch.isfinite(out).all())


@pytest.mark.cpu
@pytest.mark.parametrize("fused", [False, True])
def test_issue_eps_example_gives_0_26537(fused: bool) -> None:
    """Issue 7.4: x = [5e18] * 4 (fp32), eps = 3.3e38: mean + eps = 3.55e38 passes fp32's max;
    formed in fp64 it is fine: 5e18 / sqrt(2.5e37 + fl32(3.3e38)) = 0.26537."""
    x = torch.full((1, 4), 5e18)
    w = torch.ones(4)
    eps = 3.3e38
    c = x[0, 0].item()
    exact = c / math.sqrt(c * c + _f32(eps))
    assert abs(exact - 0.26537) < 1e-5
    fast_fn, ref_fn = _both_paths(fused)
    args = (x, torch.zeros_like(x), w) if fused else (x, w)
    for fn in (fast_fn, ref_fn):
        out = fast_mod_outputs(fn(*args, eps))[0]
        expected = torch.full((1, 4), exact, dtype=torch.float64)
        report = compare_tolerance(expected, out.to(torch.float32), out_bound(4, w, expected, torch.float32))
        assert report.within, f"{fn.__module__}: {report}"


@pytest.mark.cpu
def test_eps_is_rounded_to_float32_in_fast_and_reference() -> None:
    """The eps rule: eps and its float32 rounding are the same argument, bit for bit, in both
    paths; the reference adds exactly fl32(eps) (0.1 != fl32(0.1) in fp64)."""
    x = _rows(torch.float32, 4, 24, seed=45) * 0.3
    w = _rows(torch.float32, 1, 24, seed=46)[0]
    for eps in (0.1, 1e-6, 3e-39):
        e32 = _f32(eps)
        assert e32 != eps
        assert compare_bitwise(fast_mod.rms_norm(x, w, eps), fast_mod.rms_norm(x, w, e32)).equal
        assert torch.equal(ref_mod.rms_norm(x, w, eps), ref_mod.rms_norm(x, w, e32))
    ones = torch.ones(1, 3)
    assert ref_mod.rms_norm(ones, torch.ones(3), 0.1)[0, 0].item() == 1.0 / math.sqrt(1.0 + _f32(0.1))
    assert ref_mod.eps_float32(0.1) == _f32(0.1)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [False, True])
def test_power_of_two_scaling_is_bitwise_invariant(dtype: torch.dtype, fused: bool) -> None:
    """RMSNorm(2^k x) == RMSNorm(x) bit for bit while every value stays normal and eps is below
    half an fp64 ULP of each mean square (eps = 2^-149 here): the fp64 sum, mean, sqrt and
    reciprocal all commute with the power of two, and rstd's fp32 rounding too (including the
    2^-64 split past rms 2^64).  residual_out scales by exactly 2^k."""
    n = 40
    g = torch.Generator().manual_seed(47)
    mags = torch.empty(3, n, dtype=torch.float64).uniform_(0.5, 2.0, generator=g)
    x = (mags * _signs(3 * n, seed=48).reshape(3, n)).to(dtype)  # normal, |x| in [0.5, 2)
    r = (x.double() * 0.25).to(dtype)  # x + r = 1.25 x: no cancellation to subnormals
    w = _rows(dtype, 1, n, seed=49)[0]
    eps = 2.0**-149
    lo, hi = (-10, 14) if dtype == torch.float16 else (-40, 125)
    fn = fast_mod.fused_add_rms_norm if fused else fast_mod.rms_norm
    base = fast_mod_outputs(fn(*((x, r, w) if fused else (x, w)), eps))
    for k in sorted({lo, -7, 0, 3, hi // 2, 63, 64, 65, 100, hi} & set(range(lo, hi + 1))):
        a = 2.0**k
        xs, rs = (x.double() * a).to(dtype), (r.double() * a).to(dtype)
        got = fast_mod_outputs(fn(*((xs, rs, w) if fused else (xs, w)), eps))
        assert compare_bitwise(base[0], got[0]).equal, f"2^{k}"
        if fused:
            assert torch.equal(got[1].double(), base[1].double() * a), f"2^{k}"
        ref = fast_mod_outputs(
            ref_mod.fused_add_rms_norm(xs, rs, w, eps) if fused else ref_mod.rms_norm(xs, w, eps)
        )
        report = compare_tolerance(ref[0], got[0], out_bound(n, w, ref[0], dtype))
        assert report.within, f"2^{k}: {report}"


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_huge_scales_agree_with_each_other_at_the_default_eps(dtype: torch.dtype) -> None:
    """At eps = 1e-6, RMSNorm(2^k x) for k = 30..120 is the same bits (eps is below an fp64 ULP
    of every mean square) and within the bound of the reference."""
    x = _rows(torch.float32, 2, 50, seed=50).clamp(-3, 3)
    w = _rows(dtype, 1, 50, seed=51)[0]
    outs = []
    for k in (30, 64, 100, 120):
        xs = (x.double() * 2.0**k).to(dtype)
        outs.append(fast_mod.rms_norm(xs, w))
        _within(xs, w, 1e-6, outs[-1])
    assert all(compare_bitwise(outs[0], o).equal for o in outs[1:])


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_sum_past_the_range_is_an_infinite_row(dtype: torch.dtype) -> None:
    """The contract: a finite x + residual past the dtype's range rounds to +-inf in
    residual_out (IEEE), so that row is an infinite input to the norm: +-0 for its finite
    elements, NaN for the infinite ones; other rows are unaffected.  A huge but finite sum
    (near-max minus half of itself) normalizes as any finite row."""
    n, col = 32, 5
    big = pattern(dtype, "+near_max").tensor().double().item()
    x = _rows(dtype, 3, n, seed=52)
    r = _rows(dtype, 3, n, seed=53)
    x[0, col], r[0, col] = big, big  # 2 * near_max: +inf
    x[1, col], r[1, col] = -big, -big  # -inf
    x[2] = torch.full((n,), big, dtype=torch.float64).to(dtype)  # x + r = big / 2: finite
    r[2] = torch.full((n,), -big / 2, dtype=torch.float64).to(dtype)
    w = _rows(dtype, 1, n, seed=54)[0]
    out, res = fast_mod.fused_add_rms_norm(x, r, w)
    assert res[0, col].item() == math.inf and res[1, col].item() == -math.inf
    assert bool(torch.isfinite(res[:2, :col]).all()) and bool(torch.isfinite(res[2]).all())
    for row in (0, 1):
        assert bool(torch.isnan(out[row, col]))
        finite = torch.cat([out[row, :col], out[row, col + 1 :]])
        assert bool((finite == 0).all())
        h = torch.cat([res[row, :col], res[row, col + 1 :]])
        ws = torch.cat([w[:col], w[col + 1 :]])
        assert torch.equal(torch.signbit(finite), torch.signbit(h) ^ torch.signbit(ws))
    ref_out, ref_res = ref_mod.fused_add_rms_norm(x, r, w)
    assert compare_tolerance(ref_res, res, torch.zeros(())).within
    report = compare_tolerance(ref_out, out, out_bound(n, w, ref_out, dtype))
    assert report.within, str(report)
    assert bool(((out[2].double() / w.double()).abs() - 1).abs().max() < 2.0**-7)


@pytest.mark.cpu
def test_fp32_sum_of_squares_fails_the_bound() -> None:
    """The cases and the bound have teeth: the kernel with the production fp32 sum of squares
    (the baselines' config) gives 0 on the ``extremes`` rows and misses the bound."""
    from dataclasses import replace

    component = get("rms_norm")
    case = next(c for c in component.cases(Lane.CPU) if c.axes["pattern"] == "extremes")
    batch = component.build(case, CPU)
    x, w = batch.rows["x"], batch.shared["weight"]
    cfg = replace(config_for("interp", x.dtype, x.shape[1]), fp64_sum=False)
    out, _res = fast_mod.launch_rows(x, None, w, batch.shared["eps"], cfg)
    ref, bound = _ref_and_bound(x, w, batch.shared["eps"])
    assert not compare_tolerance(ref, out, bound).within
    assert compare_tolerance(ref, fast_mod.rms_norm(x, w), bound).within


@pytest.mark.cpu
def test_bound_is_about_three_fp32_roundings() -> None:
    """No N * u term survives the fp64 sum: the fp32 bound is under 3.01 * 2^-24 relative up
    to N = 2^20, so it rejects an output 4 ULP off (and any fp32-accumulation error it shows)."""
    for n in (1, 4096, 2**20):
        rel = out_bound(n, torch.zeros(n), torch.ones(1, n, dtype=torch.float64), torch.float32)
        assert float(rel.max()) < 3.01 * 2.0**-24 + 2.0**-149, n
    rel_bf16 = float(
        out_bound(8, torch.zeros(8), torch.ones(1, 8, dtype=torch.float64), torch.bfloat16).max()
    )
    assert 2.0**-8 < rel_bf16 < 2.0**-8 + 3.02 * 2.0**-24 + 2.0**-133
    one = torch.ones(1, 1, dtype=torch.float64)
    four_ulp = torch.tensor([[1.0 + 4 * 2.0**-23]], dtype=torch.float32)
    assert not compare_tolerance(one, four_ulp, out_bound(1, torch.ones(1), one, torch.float32)).within


# ------------------------------------------------------- the generator covers the extreme rows


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float8_e4m3fn])
def test_near_max_patterns_match_finfo(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    top_pow2 = 2.0 ** math.floor(math.log2(info.max))
    ulp_at_top = top_pow2 * info.eps
    values = {p.name: p.tensor().double().item() for p in near_max_patterns(dtype)}
    assert values["+near_max"] == info.max - ulp_at_top == -values["-near_max"]
    assert values["+max_power_of_two"] == top_pow2 == -values["-max_power_of_two"]
    p = values["+square_overflow"]
    assert p * p > info.max >= (p / 2) ** 2 and p == 2.0 ** round(math.log2(p))
    if dtype != torch.float8_e4m3fn:  # no infinity to overflow to in e4m3fn
        t = pattern(dtype, "+square_overflow").tensor()
        below = from_bits([pattern(dtype, "+square_overflow").bits - 1], dtype)[0]  # one ULP less
        assert bool(torch.isinf(t * t)) and bool(torch.isfinite(below * below))  # squared in dtype
    names = {q.name for q in catalogue(dtype, near_max=True)}
    assert names == {q.name for q in catalogue(dtype)} | set(values)
    assert all(pattern(dtype, name).name == name for name in values)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_specials_inject_the_whole_catalogue_with_near_max(dtype: torch.dtype) -> None:
    """The generator must not leave out what a kernel gets wrong: no pattern is filtered."""
    injected = {p.name for p in special_patterns(dtype)}
    assert injected == {p.name for p in catalogue(dtype, near_max=True)}
    assert {"+max_normal", "-max_normal", "+near_max", "+square_overflow"} <= injected


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["rms_norm", "fused_add_rms_norm"])
@pytest.mark.parametrize("lane", [Lane.CPU, Lane.SM90])
def test_cases_hold_finite_rows_whose_fp32_sum_of_squares_overflows(name: str, lane: Lane) -> None:
    """Every lane's cases include ``extremes`` for every dtype, and for bf16/fp32 those rows are
    finite with an fp32 sum of squares of inf (the class the old kernel returned 0 for)."""
    component = get(name)
    extremes = [c for c in component.cases(lane) if c.axes["pattern"] == "extremes"]
    assert {c.axes["dtype"] for c in extremes} == {"bf16", "fp16", "fp32"}
    assert any(c.axes["hidden"] > 8192 for c in extremes)  # the chunked path
    if lane is not Lane.CPU:
        return
    for case in extremes:
        x = component.build(case, CPU).rows["x"]
        assert bool(torch.isfinite(x).all())
        if case.axes["dtype"] != "fp16":
            sums = (x.float() * x.float()).sum(dim=1)
            assert bool(torch.isinf(sums).any()), case.id
    specials = next(
        c for c in component.cases(lane) if c.axes["pattern"] == "specials" and c.axes["num_rows"] > 100
    )
    x = component.build(specials, CPU).rows["x"].float()
    assert bool((torch.isfinite(x).all(dim=1) & torch.isinf((x * x).sum(dim=1))).any())


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", EXTREME_ROWS)
def test_each_extreme_row_agrees_alone(dtype: torch.dtype, row: str) -> None:
    n = 64
    x = extreme_row(dtype, n, row, torch.Generator().manual_seed(55)).reshape(1, n)
    w = _rows(dtype, 1, n, seed=56)[0]
    _within(x, w, 1e-6, fast_mod.rms_norm(x, w))


# ------------------------------------------------------------------------------------- cancellation


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_cancellation_gives_positive_zero_residual(dtype: torch.dtype) -> None:
    x = _rows(dtype, 5, 48, seed=11) * 1000
    out, res = fast_mod.fused_add_rms_norm(x, -x, torch.ones(48, dtype=dtype))
    assert bool((to_bits(res) == 0).all())  # x + (-x) = +0 under round-to-nearest
    assert bool((to_bits(out) == 0).all())


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_near_cancellation_residual_is_the_exact_difference(dtype: torch.dtype) -> None:
    x = _rows(dtype, 4, 64, seed=12)
    ints = {torch.float32: torch.int32}.get(dtype, torch.int16)
    r = ((-x).view(ints) + 1).view(dtype)  # -x moved one ULP towards -inf / +inf
    out, res = fast_mod.fused_add_rms_norm(x, r, torch.ones(64, dtype=dtype))
    exact = x.double() + r.double()  # exact in fp64 and representable in dtype (Sterbenz)
    assert torch.equal(res.double(), exact)
    assert bool((res != 0).all())
    ref = exact / torch.sqrt((exact * exact).mean(dim=1, keepdim=True) + _f32(1e-6))
    report = compare_tolerance(ref, out, out_bound(64, torch.ones(64), ref, dtype))
    assert report.within, str(report)


@pytest.mark.cpu
def test_fp16_residual_overflow_is_infinite() -> None:
    x = torch.full((1, 8), 60000.0, dtype=torch.float16)
    out, res = fast_mod.fused_add_rms_norm(x, x, torch.ones(8, dtype=torch.float16))
    assert bool(torch.isposinf(res).all())
    assert bool(torch.isnan(out).all())  # inf * (1 / sqrt(inf)) = inf * 0


# ---------------------------------------------------------------------------------- strided rows


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3, 8])
def test_strided_rows_match_contiguous_bitwise(dtype: torch.dtype, offset: int) -> None:
    m, n = 9, 40
    x = _rows(dtype, m, n, seed=13)
    r = _rows(dtype, m, n, seed=14)
    w = _rows(dtype, 1, n, seed=15)[0]
    wide_x = torch.full((m, n + offset + 5), math.nan, dtype=dtype)
    wide_r = torch.full((m, n + offset + 2), math.nan, dtype=dtype)
    wide_x[:, offset : offset + n] = x
    wide_r[:, offset : offset + n] = r
    sx, sr = wide_x[:, offset : offset + n], wide_r[:, offset : offset + n]
    assert compare_bitwise(fast_mod.rms_norm(x, w), fast_mod.rms_norm(sx, w)).equal
    for a, b in zip(
        fast_mod.fused_add_rms_norm(x, r, w), fast_mod.fused_add_rms_norm(sx, sr, w), strict=True
    ):
        assert compare_bitwise(a, b).equal


@pytest.mark.cpu
def test_broadcast_rows_and_column_strides() -> None:
    n = 30
    row = _rows(torch.float32, 1, n, seed=16)
    w = torch.ones(n)
    single = fast_mod.rms_norm(row, w)
    expanded = fast_mod.rms_norm(row.expand(6, n), w)  # row stride 0
    assert compare_bitwise(single.expand(6, n).contiguous(), expanded).equal
    transposed = _rows(torch.float32, n, 4, seed=17).t()  # column stride != 1: staged
    assert compare_bitwise(
        fast_mod.rms_norm(transposed.contiguous(), w), fast_mod.rms_norm(transposed, w)
    ).equal


# ------------------------------------------------------------------------------ docstring promises


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_dtype_shape_and_inputs_untouched(dtype: torch.dtype) -> None:
    x, r = _rows(dtype, 3, 20, seed=18), _rows(dtype, 3, 20, seed=19)
    w = torch.ones(20, dtype=dtype)
    x0, r0 = x.clone(), r.clone()
    out, res = fast_mod.fused_add_rms_norm(x, r, w)
    assert out.dtype == res.dtype == dtype and out.shape == res.shape == (3, 20)
    assert out.is_contiguous() and res.is_contiguous()
    assert torch.equal(to_bits(x), to_bits(x0)) and torch.equal(to_bits(r), to_bits(r0))
    assert fast_mod.rms_norm(x[:0], w).shape == (0, 20)


@pytest.mark.cpu
def test_bf16_rounding_is_to_nearest_even() -> None:
    """Ties: fp32 sums exactly halfway between two bf16 values round to the even mantissa."""
    one = torch.ones(1, 2, dtype=torch.bfloat16)
    half_ulp = torch.tensor([[2.0**-8, 3 * 2.0**-8]], dtype=torch.bfloat16)  # 1 + 2^-8: tie -> 1.0
    _out, res = fast_mod.fused_add_rms_norm(one, half_ulp, torch.ones(2, dtype=torch.bfloat16))
    # 1 + 2^-8 ties to 1.0 (even); 1 + 3 * 2^-8 ties between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even)
    assert res.float().tolist() == [[1.0, 1.0 + 2.0**-6]]


# ---------------------------------------------------------------------------- hypothesis properties


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["rms_norm", "fused_add_rms_norm"])
def test_property_agreement_and_row_locality(name: str) -> None:
    component = get(name)
    assert component.strategy is not None

    @settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(component.strategy(Lane.CPU, CPU))
    def prop(batch) -> None:
        fast_out = fast_mod_outputs(component.fast(**batch.kwargs()))
        ref_out = fast_mod_outputs(component.reference(**batch.kwargs()))
        bounds = component.agreement.bound(batch, ref_out)
        for ref, got, bound in zip(ref_out, fast_out, bounds, strict=True):
            report = compare_tolerance(ref, got, bound)
            assert report.within, str(report)
        i = batch.num_rows // 2
        alone = fast_mod_outputs(component.fast(**batch.take([i]).kwargs()))
        for full, one in zip(fast_out, alone, strict=True):
            assert compare_bitwise(full[i : i + 1], one).equal

    prop()


def fast_mod_outputs(result: object) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple) else (result,)  # type: ignore[arg-type]


# ------------------------------------------------------------------ regressions (adversarial review)


def _neg_view(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor equal to ``t`` whose values are stored negated behind the negative bit."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg()
    return view


def _both_paths(fused: bool):
    from batchinv.reference import rms_norm as ref_mod

    if fused:
        return (fast_mod.fused_add_rms_norm, ref_mod.fused_add_rms_norm)
    return (fast_mod.rms_norm, ref_mod.rms_norm)


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    "eps", [1e-50, 1e-46, 1e39, 10**400, -(10**400)], ids=["1e-50", "1e-46", "1e39", "1e400", "-1e400"]
)
def test_eps_outside_the_fp32_range_is_refused(device: torch.device, fused: bool, eps: object) -> None:
    from batchinv.reference.errors import ArgumentError

    x, w = torch.ones(2, 8, device=device), torch.ones(8, device=device)
    args = (x, torch.ones(2, 8, device=device), w) if fused else (x, w)
    baseline = (
        rms_norm_baselines.fused_add_rms_norm_rows_block if fused else rms_norm_baselines.rms_norm_rows_block
    )
    for fn in (*_both_paths(fused), baseline):
        with pytest.raises(ArgumentError, match=r"argument 'eps'.*float32"):
            fn(*args, eps)


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_eps_at_the_fp32_edges_is_accepted(device: torch.device, fused: bool) -> None:
    x, w = torch.ones(2, 8, device=device), torch.ones(8, device=device)
    args = (x, torch.ones(2, 8, device=device), w) if fused else (x, w)
    for eps in (1e-30, 3e38):
        for fn in _both_paths(fused):
            out = fast_mod_outputs(fn(*args, eps))[0]
            assert bool(torch.isfinite(out).all())


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_weight_and_residual_on_another_device_raise_device_error(device: torch.device, fused: bool) -> None:
    from batchinv.reference.errors import DeviceError

    x, w, r = torch.ones(2, 8, device=device), torch.ones(8, device=device), torch.ones(2, 8, device=device)
    meta_w, meta_r = w.to("meta"), r.to("meta")
    for fn in _both_paths(fused):
        with pytest.raises(DeviceError, match=r"'weight'.*meta"):
            fn(*((x, r, meta_w) if fused else (x, meta_w)))
        if fused:
            with pytest.raises(DeviceError, match=r"'residual'.*meta"):
                fn(x, meta_r, w)


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_zero_dim_x_names_x_and_its_rank(device: torch.device, fused: bool) -> None:
    from batchinv.reference.errors import ArgumentError

    x, w = torch.tensor(1.0, device=device), torch.ones(1, device=device)
    for fn in _both_paths(fused):
        with pytest.raises(ArgumentError, match=r"argument 'x'.*2-D.*0-D"):
            fn(*((x, x, w) if fused else (x, w)))


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 40])
def test_negative_bit_operands_are_resolved_before_the_launch(device: torch.device, n: int) -> None:
    """A ``conj().imag`` view has column stride 2 and an odd word offset, so it is staged anyway
    unless its rows are one element wide (N = 1, row_align 1: read in place).  ``torch._neg_view``
    of an aligned, contiguous tensor is read in place at any N.  Either view equals its argument."""
    x, r, w = (_rows(torch.float32, 3, n, seed=s).to(device) for s in (60, 61, 62))
    w = w[0]

    def neg(t: torch.Tensor) -> torch.Tensor:
        view = _neg_view(t) if n == 1 else torch._neg_view(-t)
        assert view.is_neg() and torch.equal(view, t)
        return view

    plain = fast_mod.rms_norm(x, w)
    assert compare_bitwise(plain, fast_mod.rms_norm(neg(x), w)).equal
    assert compare_bitwise(plain, fast_mod.rms_norm(x, neg(w))).equal
    assert compare_bitwise(plain, rms_norm_baselines.rms_norm_rows_block(neg(x), w)).equal
    fused = fast_mod.fused_add_rms_norm(x, r, w)
    for got in (
        fast_mod.fused_add_rms_norm(neg(x), r, w),
        fast_mod.fused_add_rms_norm(x, neg(r), w),
        fast_mod.fused_add_rms_norm(x, r, neg(w)),
    ):
        for a, b in zip(fused, got, strict=True):
            assert compare_bitwise(a, b).equal
