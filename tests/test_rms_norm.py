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
from batchinv.fast import rms_norm_baselines
from batchinv.fast.rms_norm import CONFIGS, PRODUCTION_HIDDEN, config_for, derive_config
from batchinv.harness.bitpatterns import from_bits, pattern, to_bits
from batchinv.harness.compare import compare_bitwise, compare_tolerance
from batchinv.harness.components.rms_norm import out_bound
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get

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
