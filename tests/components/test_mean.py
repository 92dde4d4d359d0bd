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
from launch_recorder import LaunchRecorder

from batchinv.fast import mean as fast_module
from batchinv.fast.baselines.mean import rows_heuristic_config
from batchinv.fast.device import arch
from batchinv.fast.mean import MEAN_TABLE, mean_config
from batchinv.fast.row_config import RowConfig
from batchinv.harness import bitpatterns as bp
from batchinv.harness.compare import compare_bitwise, compare_tolerance
from batchinv.harness.components import mean as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Batch, m_sweep
from batchinv.reference.errors import ArgumentError
from batchinv.reference.exact import round_once
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
        RowConfig(3, 128, 4)
    for buckets in MEAN_TABLE.values():
        limits = [b.max_cols for b in buckets]
        assert limits == sorted(limits) and limits[-1] >= 2**40


@pytest.mark.cpu
@pytest.mark.parametrize("n_cols", [100, 333, 1537])
def test_launch_plan_is_the_same_at_every_batch_size(monkeypatch, n_cols):
    """The launcher's constexprs (the order of the additions) never change with M."""
    recorder = LaunchRecorder()
    monkeypatch.setattr(fast_module, "mean_kernel", recorder)
    x = torch.zeros(4096, n_cols)
    sweep = m_sweep(Lane.SM90)
    for m in sweep:
        fast_mean(x[:m], dtype=BF16)
    plans = recorder.plans()
    assert len(plans) == len(sweep) and all(p == plans[0] for p in plans), plans
    block_m = plans[0]["BLOCK_M"]
    assert [launch["grid"] for launch in recorder.launches] == [(-(-m // block_m),) for m in sweep]


def test_the_rows_heuristic_baseline_does_key_on_rows():
    cpu = torch.device("cpu")
    assert (
        rows_heuristic_config(cpu, F32, 1, 333).block_n != rows_heuristic_config(cpu, F32, 4096, 333).block_n
    )


# --- the pinned order, bit for bit ------------------------------------------------------------


def emulate(x: torch.Tensor, block_n: int) -> torch.Tensor:
    """The documented order in torch: lane j adds x[j], x[j + block_n], ... in fp64 in sequence
    (from +0); the lanes go onto a fixed-point grid 2**-(61 - 16 - e), e the exponent of the
    largest |lane|, by truncation; the integers are summed; the total returns to fp64 (one
    rounding), is divided by N in fp64 and rounded to fp32.  (Finite fp32 inputs only.)"""
    rows, n = x.shape
    lanes = torch.zeros(rows, block_n, dtype=torch.float64)
    for start in range(0, n, block_n):
        chunk = torch.zeros(rows, block_n, dtype=torch.float64)
        part = x[:, start : start + block_n].double()  # exact
        chunk[:, : part.shape[1]] = part
        lanes = lanes + chunk
    out = []
    for lane in lanes:
        largest = float(lane.abs().max())
        exponent = max(math.frexp(largest)[1] - 1, -1022) if largest else -1022  # largest < 2**(e + 1)
        scale = 2.0 ** min(61 - 16 - exponent, 1023)
        total = sum(int(float(v) * scale) for v in lane)  # exact Python ints, truncation
        out.append(float(total) / scale / n)  # int -> fp64 (one rounding), exact, correctly rounded
    return torch.tensor(out, dtype=torch.float64).to(F32)


@pytest.mark.cpu
@pytest.mark.parametrize("n_cols", [1, 100, 128, 129, 333, 1024, 1025, 1537])
def test_interpreter_bits_equal_the_documented_order(n_cols):
    """On the interpreter the kernel's bits are exactly those of the documented order (fp64
    arithmetic only, correctly rounded on a GPU too)."""
    gen = torch.Generator().manual_seed(n_cols)
    x = torch.randn(5, n_cols, generator=gen) * 1e3 + torch.randn(5, 1, generator=gen) * 1e6  # cancellation
    expected = emulate(x, mean_config("interp", F32, n_cols).block_n)
    assert compare_bitwise(expected, fast_mean(x)).equal


@any_lane
@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("n_cols", [128, 333, 1025])
def test_a_pipelined_chunk_loop_keeps_the_documented_order(n_cols, num_stages):
    """``RowConfig.num_stages`` (the GPU tables pipeline the chunk loop 3 deep) only issues the
    next chunks' loads early: at every depth the bits are the documented order's, over one chunk,
    three with a masked tail and nine.  The interpreter ignores the depth itself, but runs the
    kernel's ``tl.range`` branch (its table never pipelines: this is that branch's cpu-lane run;
    a pointer step left out there fails it); GPU lanes pipeline for real."""
    gen = torch.Generator().manual_seed(n_cols + num_stages)
    x = torch.randn(3, n_cols, generator=gen) * 1e3 + torch.randn(3, 1, generator=gen) * 1e6  # cancellation
    config = RowConfig(1, 128, 4, num_stages=num_stages)
    out = fast_module.launch(x.to(DEVICE), F32, False, config=config)
    assert compare_bitwise(emulate(x, 128), out.cpu()).equal


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "3d"])
def test_every_gpu_table_tile_pipelined_gives_its_unpipelined_bits(dtype, layout):
    """Each GPU table tile of several chunks at depths 2, 3 and 4 (``ci/tune_rows.py``'s
    candidates) against the same tile at depth 1, bitwise, at a row length inside its bucket
    (several chunks and a masked tail), on contiguous rows, rows of a wider buffer and a 3-D
    input, with special values among normal ones."""
    buckets = MEAN_TABLE[("gpu", dtype)]
    several = [(i, b) for i, b in enumerate(buckets) if b.max_cols > b.config.block_n]
    assert several, "no GPU tile of several chunks"
    for i, bucket in several:
        low = buckets[i - 1].max_cols if i else 0
        n_cols = min(low + 3 * bucket.config.block_n + 77, bucket.max_cols)  # a ragged last chunk
        gen = torch.Generator().manual_seed(n_cols)
        x = torch.randn(6, n_cols + 5, generator=gen) * 1e3 + torch.randn(6, 1, generator=gen) * 1e6
        x[1, 7], x[2, 9], x[3, 11] = NAN, INF, 1e-40  # a NaN, an inf and a subnormal row
        x = x.to(dtype).to(DEVICE)
        rows = {
            "contiguous": x[:, :n_cols].contiguous(),
            "strided": x[:, :n_cols],
            "3d": x[:, :n_cols].reshape(2, 3, n_cols),
        }[layout]
        assert mean_config(arch(DEVICE), dtype, n_cols) == bucket.config
        unpipelined = bits(fast_module.launch(rows, dtype, False, config=bucket.config))
        for depth in (2, 3, 4):
            config = dataclasses.replace(bucket.config, num_stages=depth)
            assert bits(fast_module.launch(rows, dtype, False, config=config)) == unpipelined, (
                config,
                layout,
            )


@pytest.mark.cpu
def test_num_stages_must_be_a_positive_int():
    with pytest.raises(ValueError, match="num_stages"):
        RowConfig(1, 128, 4, num_stages=0)


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
    # an fp32 sum would overflow; the fp64 lanes do not, and the mean is max_normal exactly
    assert fast_mean(t([[big, big]])).item() == big
    assert fast_mean(t([[big, big, -big]] * 2)).tolist() == [big / 3] * 2  # exact: 0xffffff = 3 * 0x555555
    # a mean beyond the output dtype's range is +-inf: here the elements' cast to fp16 overflows
    assert fast_mean(t([[7e4, 7e4], [-7e4, 1.0]]), dtype=F16).tolist() == [INF, -INF]
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


# --- fp64 accumulation: regressions from the H200 run ------------------------------------------


def _huge_rows(device: torch.device) -> torch.Tensor:
    """(40, 1000) fp32: N(0, 9) rows, and in rows 3, 17 and 38 five +-max_normal entries one
    block apart (the same lane at every chunk width <= 128) whose sum, +max_normal, any fp32
    lane sum overflows although the mean, about 3.4e35, is finite."""
    big = bp.pattern(F32, "+max_normal").tensor().item()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(40, 1000, generator=gen) * 3
    for row in (3, 17, 38):
        x[row, [5, 133, 261, 389, 517]] = torch.tensor([big, big, big, -big, -big])
    return x.to(device)


@pytest.mark.cpu
@pytest.mark.gpu
def test_lane_sums_beyond_fp32_range_keep_a_finite_mean(device):
    """The H200 sweep's ``1024x151936 float32 mixed`` rows became -inf: fp32 lanes overflowed
    on a few +-max_normal entries.  With fp64 lanes the mean is finite, within the bound and
    invariant with the row count and the row's slot."""
    x = _huge_rows(device)
    out = fast_mean(x)
    assert torch.isfinite(out).all(), out[~torch.isfinite(out)]
    batch = Batch({"x": x}, {"dim": -1, "keepdim": False, "dtype": None})
    ref = reference_mean(x)
    assert compare_tolerance(ref, out, component.mean_bound(batch, (ref,))[0]).within
    for row in (3, 17, 38):
        assert out[row].item() == pytest.approx(ref[row].item(), rel=2.0**-23)
        for m in (row + 1, 33, 40):
            assert compare_bitwise(out[:m], fast_mean(x[:m])).equal, m
        alone = fast_mean(x[row : row + 1])
        among = fast_mean(torch.cat([x[:7], x[row : row + 1], x[:2]]))[7:8]
        assert compare_bitwise(out[row : row + 1], alone).equal
        assert compare_bitwise(out[row : row + 1], among).equal


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [1, 3, 33, 1000, 1537])
@pytest.mark.parametrize("out_dtype", [F32, BF16, F16])
def test_a_mean_of_equal_values_is_exact(device, n_cols, out_dtype):
    """n copies of v give exactly v: the fp64 lane sums and their fixed-point combine are exact,
    n * v is exact in fp64, and fp64 division is correctly rounded on every lane (fp32 ``/`` on
    a GPU is the approximate ``div.full.f32``, which missed 33 / 33 on the H200)."""
    big = bp.pattern(out_dtype, "+max_normal").tensor().item()
    values = [1.0, -7.0, 0.1, 1.0 / 3.0, 3e-5, big]
    x = torch.tensor(values).to(out_dtype).float()[:, None].expand(len(values), n_cols).to(device)
    expected = x[:, 0].to(out_dtype)
    assert bits(fast_mean(x, dtype=out_dtype)) == bits(expected)
    ones = torch.ones(4, 33, dtype=BF16, device=device)
    assert bits(fast_mean(ones, -1, False, out_dtype)) == bits(torch.ones(4, dtype=out_dtype))


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("out_dtype", "elements", "tie", "expected"),
    [
        # mean 1 + 2**-8 + 2**-30: fp32 would round it to 1 + 2**-8, a bf16 tie, then to 1.0
        (BF16, [2.0, 1.015625, 1.0, 2.0**-28], 1.00390625, 1.0078125),
        # mean 1024.5 + 2**-16: fp32 would round it to 1024.5, an fp16 tie, then to 1024
        (F16, [2048.0, 1025.0, 1025.0, 2.0**-14], 1024.5, 1025.0),
    ],
)
def test_the_output_is_rounded_once_from_fp64(device, out_dtype, elements, tie, expected):
    """A 16-bit output is rounded once from the fp64 mean (through fp32 rounded to odd), not
    twice (fp64 -> fp32 -> 16 bit), which would land on a tie and round it to even."""
    x = torch.tensor([elements], device=device)
    exact = reference_mean(x, dtype=out_dtype)  # fp64, exact here (N = 4)
    assert exact.item() > tie and exact.to(F32).item() == tie
    assert fast_mean(x, dtype=out_dtype).item() == expected


# --- the exact envelope --------------------------------------------------------------------------


def test_the_reference_is_the_exact_mean():
    """1e30 + 1 - 1e30 is 1: an fp64 sum in this order gives 0, the exact reference 1 / 3."""
    x = t([[1e30, 1.0, -1e30]])
    assert reference_mean(x).item() == 1.0 / 3.0
    assert reference_mean(t([[-0.0, -0.0]])).item() == 0.0 and bits(reference_mean(t([[-0.0]])).float()) == [
        0
    ]


@any_lane
def test_bf16_subnormal_elements_are_widened_exactly():
    """Triton 3.6's interpreter converts bf16 2**-133 to 0; the kernel widens by the bits, so a
    mean of bf16 subnormals is one rounding of the exact mean (it gave 13 for 13.83 * 2**-133)."""
    units = [14.0, 3.0, 1.0, 27.0, 5.0, 133.0, -2.0]  # in 2**-133: bf16 subnormals
    x = t([[u * 2.0**-133 for u in units]])
    expected = round_once(reference_mean(x, dtype=BF16), BF16)
    assert bits(fast_mean(x, dtype=BF16)) == bits(expected)
    assert bits(fast_mean(x.to(BF16))) == bits(expected)


@any_lane
def test_the_exact_envelope():
    """lane_cancel rows are in it (and computed bit for bit); an fp32 row spanning more than
    fp64's 53 bits is out; NaN rows are in (their class is exact)."""
    num_cols = 1536  # 3 chunks on the cpu lane; a GPU's block_n may be wider: take 3 of its chunks
    config = mean_config(arch(DEVICE), F32, num_cols)
    if config.block_n > num_cols:
        num_cols = 3 * config.block_n
        config = mean_config(arch(DEVICE), F32, num_cols)
    gen = torch.Generator().manual_seed(0)
    x = component.lane_cancel_rows(3, num_cols, F32, config.block_n, gen)
    x[1, 7] = 2.0**-60  # 2**-60 beside values near 1: the lanes need 60+ bits
    x[2, 9] = NAN
    x = x.to(DEVICE)
    batch = Batch({"x": x}, {"dim": -1, "keepdim": False, "dtype": None})
    ref = reference_mean(x)
    assert component.mean_exact(batch, (ref,))[0].tolist() == [True, False, True]
    out = fast_mean(x)
    assert bits(out[:1]) == bits(round_once(ref[:1], F32))
    assert compare_tolerance(ref, out, component.mean_bound(batch, (ref,))[0]).within
