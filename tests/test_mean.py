"""Tests of ``mean`` over the last dim: the config table, the pinned order (bit-exact against a
torch emulation on the interpreter), keepdim and dtype, special values, strided rows,
docstring promises and hypothesis properties.

Expected outputs are written out by hand (exact sums, NaN/inf classes, round-to-nearest-even
ties), or come from an independent torch emulation of the documented order, or from the fp64
reference with the component's derived bound; never from the code under test.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinv.fast import mean as fast_module
from batchinv.fast.mean import MEAN_TABLE, MeanConfig, mean_config
from batchinv.fast.mean_baselines import rows_heuristic_config
from batchinv.harness import bitpatterns as bp
from batchinv.harness.compare import compare_bitwise, compare_tolerance
from batchinv.harness.components import mean as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Batch, m_sweep
from batchinv.reference.errors import ArgumentError
from batchinv.reference.mean import mean as reference_mean

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NAN, INF = float("nan"), float("inf")
fast_mean = fast_module.mean


def any_lane(fn):
    """A test of kernel behaviour: the cpu lane (interpreter) and every GPU lane."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def t(rows, dtype=F32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype, device=DEVICE)


def bits(x: torch.Tensor) -> list[int]:
    width = x.element_size() * 8
    ints = x.cpu().reshape(-1).view({4: torch.int32, 2: torch.int16}[x.element_size()]).tolist()
    return [v & ((1 << width) - 1) for v in ints]


# --- the config table -------------------------------------------------------------------------


def test_config_is_keyed_on_arch_dtype_and_row_length_only():
    assert list(inspect.signature(mean_config).parameters) == ["arch_name", "dtype", "n_cols"]
    with pytest.raises(TypeError):
        MEAN_TABLE[("gpu", F32)] = ()  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mean_config("sm90", F32, 4096).block_n = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="block_m"):
        MeanConfig(3, 128, 4)
    for buckets in MEAN_TABLE.values():
        limits = [b.max_cols for b in buckets]
        assert limits == sorted(limits) and limits[-1] >= 2**40


class _Recorder:
    """Stands in for the jitted kernel: records each launch's grid and constexprs."""

    def __init__(self):
        self.launches: list[tuple[tuple[int, ...], dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, dict(kwargs)))

        return launch


@pytest.mark.cpu
@pytest.mark.parametrize("n_cols", [100, 333, 1537])
def test_launch_plan_is_the_same_at_every_batch_size(monkeypatch, n_cols):
    """The launcher's constexprs (the order of the additions) never change with M."""
    recorder = _Recorder()
    monkeypatch.setattr(fast_module, "mean_kernel", recorder)
    x = torch.zeros(4096, n_cols)
    sweep = m_sweep(Lane.SM90)
    for m in sweep:
        fast_mean(x[:m], dtype=BF16)
    plans = [kwargs for _, kwargs in recorder.launches]
    assert len(plans) == len(sweep) and all(p == plans[0] for p in plans), plans
    block_m = plans[0]["BLOCK_M"]
    assert [grid for grid, _ in recorder.launches] == [(-(-m // block_m),) for m in sweep]


def test_the_rows_heuristic_baseline_does_key_on_rows():
    cpu = torch.device("cpu")
    assert (
        rows_heuristic_config(cpu, F32, 1, 333).block_n != rows_heuristic_config(cpu, F32, 4096, 333).block_n
    )


# --- the pinned order, bit for bit ------------------------------------------------------------


def emulate(x: torch.Tensor, block_n: int) -> torch.Tensor:
    """The documented order in torch: lane j adds x[j], x[j + block_n], ... in fp32 in sequence
    (from +0); the lanes go onto a fixed-point grid 2**-(61 - 16 - e), e the exponent of the
    largest |lane|, by truncation; the integers are summed; the total returns through fp64 to
    fp32 and is divided by N in fp32.  (Finite inputs only.)"""
    rows, n = x.shape
    lanes = torch.zeros(rows, block_n, dtype=F32)
    for start in range(0, n, block_n):
        chunk = torch.zeros(rows, block_n, dtype=F32)
        part = x[:, start : start + block_n]
        chunk[:, : part.shape[1]] = part
        lanes = lanes + chunk
    out = []
    for lane in lanes:
        largest = float(lane.abs().max())
        exponent = max(math.frexp(largest)[1] - 1, -126) if largest else -126  # largest < 2**(e + 1)
        scale = 2.0 ** (61 - 16 - exponent)
        total = sum(int(float(v) * scale) for v in lane.double())  # exact Python ints, truncation
        out.append(float(total) / scale)  # int -> fp64 (one rounding), exact division
    return torch.tensor(out, dtype=torch.float64).to(F32) / torch.tensor(float(n), dtype=F32)


@pytest.mark.cpu
@pytest.mark.parametrize("n_cols", [1, 100, 128, 129, 333, 1024, 1025, 1537])
def test_interpreter_bits_equal_the_documented_order(n_cols):
    """On the interpreter (IEEE fp32, correctly rounded division) the kernel's bits are exactly
    those of the documented order; a GPU's division is the approximate div.full.f32."""
    gen = torch.Generator().manual_seed(n_cols)
    x = torch.randn(5, n_cols, generator=gen) * 1e3 + torch.randn(5, 1, generator=gen) * 1e6  # cancellation
    expected = emulate(x, mean_config("interp", F32, n_cols).block_n)
    assert compare_bitwise(expected, fast_mean(x)).equal


# --- keepdim and dtype ------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("shape", [(4, 33), (2, 3, 33)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", [None, F32, BF16, F16])
def test_keepdim_and_dtype_set_shape_and_dtype(shape, keepdim, dtype):
    x = torch.ones(shape, dtype=BF16, device=DEVICE)
    out = fast_mean(x, -1, keepdim, dtype)
    expected_shape = (*shape[:-1], 1) if keepdim else shape[:-1]
    assert out.shape == expected_shape and out.dtype == (dtype or BF16) and out.is_contiguous()
    assert (out == 1).all()
    assert fast_mean(x, len(shape) - 1, keepdim, dtype).shape == expected_shape  # dim as ndim - 1


@any_lane
def test_dtype_casts_before_reducing():
    """As documented for torch.mean: each element is rounded to ``dtype`` first.  In fp16,
    2049 rounds to 2048 and 2051 to 2052 (ties to even), so the mean is 8196 / 4 = 2049, which
    rounds to 2048; the mean of the uncast values, 2049.5, would round to 2050."""
    x = t([[2049.0, 2049.0, 2049.0, 2051.0]])
    assert fast_mean(x, dtype=F16).tolist() == [2048.0]
    assert reference_mean(x, dtype=F16).tolist() == [2049.0]  # fp64: the mean before its rounding
    # and a cast that overflows gives +inf and -inf, hence NaN
    assert math.isnan(fast_mean(t([[70000.0, -70000.0, 1.0]]), dtype=F16).item())


@any_lane
def test_fp32_dtype_keeps_more_than_the_input_precision():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 257, generator=gen).to(BF16).to(DEVICE)
    out = fast_mean(x, dtype=F32)
    assert out.dtype == F32
    assert (out.to(BF16).to(F32) != out).float().mean() > 0.5  # not a widened bf16 result
    batch = Batch({"x": x}, {"dim": -1, "keepdim": False, "dtype": F32})
    ref = reference_mean(x, dtype=F32)
    assert compare_tolerance(ref, out, component.mean_bound(batch, (ref,))[0]).within


# --- special values ---------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_nan_and_inf_classes(dtype):
    rows = torch.ones(6, 7, dtype=dtype)
    rows[0, 3] = bp.pattern(dtype, "+quiet_nan").tensor()
    rows[1, 0] = bp.pattern(dtype, "-signalling_nan").tensor()
    rows[2, 6] = INF
    rows[3, 1] = -INF
    rows[4, 2], rows[4, 5] = INF, -INF
    rows[5] = -INF
    out = fast_mean(rows.to(DEVICE)).float().cpu()
    assert math.isnan(out[0]) and math.isnan(out[1]) and math.isnan(out[4])
    assert out[2:4].tolist() == [INF, -INF] and out[5].item() == -INF


@any_lane
def test_signed_zeros_give_plus_zero():
    out = fast_mean(t([[-0.0, -0.0, -0.0], [0.0, -0.0, 0.0]]))
    assert bits(out) == [0, 0]


@pytest.mark.cpu
def test_subnormals_are_summed_exactly_on_the_interpreter():
    """Sums of subnormals are exact in IEEE fp32; a GPU may flush them (documented)."""
    tiny = bp.pattern(F32, "+min_subnormal").tensor().item()
    top = bp.pattern(F32, "+max_subnormal").tensor().item()
    assert fast_mean(t([[tiny] * 4])).tolist() == [tiny]
    assert fast_mean(t([[top, top, -top, -top, tiny, tiny]])).tolist() == [0.0]  # 2 tiny / 6 rounds to 0
    assert fast_mean(t([[tiny] * 2, [3 * tiny, tiny]])).tolist() == [tiny, 2 * tiny]


@any_lane
def test_overflow_and_empty_rows():
    big = bp.pattern(F32, "+max_normal").tensor().item()
    assert fast_mean(t([[big, big]])).item() == INF  # the fp32 partial sum overflows (documented)
    # the lane combine is exact on the grid of the largest lane: 2**60 survives beside 2**100
    assert fast_mean(t([[2.0**100, -(2.0**100), 2.0**60, 2.0**60]])).item() == 2.0**59
    empty = torch.zeros(3, 0, device=DEVICE)
    assert torch.isnan(fast_mean(empty)).all() and torch.isnan(reference_mean(empty)).all()
    assert fast_mean(torch.zeros(0, 5, device=DEVICE)).shape == (0,)


# --- strided rows -----------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_strided_rows_give_the_contiguous_bits(dtype):
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(6, 333, generator=gen) * 100).to(dtype).to(DEVICE)
    expected = fast_mean(x)
    padded = torch.full((6, 346), NAN, dtype=dtype, device=DEVICE)
    padded[:, :333] = x
    strided = torch.full((6, 666), NAN, dtype=dtype, device=DEVICE)
    strided[:, ::2] = x
    for label, view in {
        "padded": padded[:, :333],
        "column_stride_2": strided[:, ::2],
        "column_major": x.t().contiguous().t(),
    }.items():
        assert compare_bitwise(expected, fast_mean(view)).equal, label
    buffer = torch.full((3, 3, 333), NAN, dtype=dtype, device=DEVICE)
    buffer[:, :2] = x.reshape(3, 2, 333)
    assert compare_bitwise(expected, fast_mean(buffer[:, :2]).reshape(6)).equal


@any_lane
def test_only_the_last_dim_is_supported():
    x = torch.zeros(2, 3, 8, device=DEVICE)
    for fn in (fast_mean, reference_mean):
        for dim in (0, 1, -2, -3):
            with pytest.raises(ArgumentError, match="'dim'"):
                fn(x, dim)


# --- hypothesis -------------------------------------------------------------------------------


@any_lane
def test_property_within_the_derived_bound():
    comp = component.COMPONENT

    @settings(max_examples=15)
    @given(comp.strategy(LANE, DEVICE))
    def check(batch):
        out = comp.fast(**batch.kwargs())
        ref = comp.reference(**batch.kwargs())
        assert out.shape == ref.shape
        report = compare_tolerance(ref, out, comp.agreement.bound(batch, (ref,))[0])
        assert report.within, str(report)

    check()


@any_lane
def test_property_rows_do_not_see_the_batch():
    @settings(max_examples=10)
    @given(component.strategy(LANE, DEVICE), st.integers(0, 2**31 - 1))
    def check(batch, seed):
        x, shared = batch.rows["x"], batch.shared
        full = fast_mean(x, -1, shared["keepdim"], shared["dtype"])
        gen = torch.Generator().manual_seed(seed)
        m = int(torch.randint(1, x.shape[0] + 1, (1,), generator=gen))
        perm = torch.randperm(x.shape[0], generator=gen).to(DEVICE)
        assert compare_bitwise(full[:m], fast_mean(x[:m], -1, shared["keepdim"], shared["dtype"])).equal
        assert compare_bitwise(full[perm], fast_mean(x[perm], -1, shared["keepdim"], shared["dtype"])).equal

    check()
