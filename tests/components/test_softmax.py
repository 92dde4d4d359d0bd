"""Tests of ``softmax`` and ``log_softmax`` over the last dim: the config table, half_to_float,
special values, strided rows, docstring promises and hypothesis properties.

Expected outputs are written out by hand from the math (exact powers of two, one-hot rows,
NaN rows), or come from Python's double-precision ``math`` module or the fp64 reference with
the component's derived bound; never from the code under test.  The registry-driven checks
(agreement and invariance over the sweep, negative controls, error inputs) live in
``tests/components/test_components.py``.
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

from batchinv.fast import softmax as fast_module
from batchinv.fast.baselines.softmax import rows_heuristic_config, split_float_partials_log_softmax
from batchinv.fast.device import arch
from batchinv.fast.row_config import RowConfig
from batchinv.fast.softmax import SOFTMAX_TABLE, softmax_config
from batchinv.harness import bitpatterns as bp
from batchinv.harness.checks import FAST as FAST_SUBJECT
from batchinv.harness.checks import run_check
from batchinv.harness.compare import compare_bitwise, compare_tolerance
from batchinv.harness.components import log_softmax as log_component
from batchinv.harness.components import softmax as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Batch, m_sweep
from batchinv.reference.errors import ArgumentError
from batchinv.reference.softmax import log_softmax as reference_log_softmax
from batchinv.reference.softmax import softmax as reference_softmax

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
FAST = {"softmax": fast_module.softmax, "log_softmax": fast_module.log_softmax}
REFERENCE = {"softmax": reference_softmax, "log_softmax": reference_log_softmax}
BOUND = {"softmax": component.softmax_bound, "log_softmax": component.log_softmax_bound}
NAN, INF = float("nan"), float("inf")


def any_lane(fn):
    """A test of kernel behaviour: the cpu lane (interpreter) and every GPU lane."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def t(rows, dtype=F32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype, device=DEVICE)


def bits32(x: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in x.float().cpu().reshape(-1).view(torch.int32).tolist()]


def within_bound(name: str, x: torch.Tensor, out: torch.Tensor, half_to_float: bool = False) -> None:
    batch = Batch({"x": x}, {"dim": -1, "half_to_float": half_to_float})
    ref = REFERENCE[name](x, -1, half_to_float)
    report = compare_tolerance(ref, out, BOUND[name](batch, (ref,))[0])
    assert report.within, str(report)


# --- the config table -------------------------------------------------------------------------


def test_config_is_keyed_on_arch_dtype_and_row_length_only():
    assert list(inspect.signature(softmax_config).parameters) == ["arch_name", "dtype", "n_cols"]
    for key in SOFTMAX_TABLE:
        assert isinstance(key, tuple) and len(key) == 2, key  # (arch family, dtype); length is the bucket


def test_config_table_is_frozen_and_complete():
    with pytest.raises(TypeError):
        SOFTMAX_TABLE[("gpu", F32)] = ()  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        softmax_config("sm90", F32, 151936).block_n = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="block_n"):
        RowConfig(1, 3000, 4)
    for (family, dtype), buckets in SOFTMAX_TABLE.items():
        limits = [b.max_cols for b in buckets]
        assert limits == sorted(limits) and limits[-1] >= 2**40, (family, dtype)
        if family != "gpu":
            continue
        for vocab in (32000, 128256, 151936, 50257):
            config = softmax_config("sm90", dtype, vocab)
            # a vocabulary never fits one register-resident block: one program loops over chunks
            assert config.block_n < vocab and config.block_m == 1, (dtype, vocab, config)


_KERNELS = (
    "softmax_kernel",
    "softmax_split_lanes_kernel",
    "softmax_split_combine_kernel",
    "softmax_split_write_kernel",
)


@pytest.mark.cpu
@pytest.mark.parametrize("n_cols", [100, 333, 1537])
@pytest.mark.parametrize("log", [False, True])
def test_launch_plan_is_the_same_at_every_batch_size(monkeypatch, n_cols, log):
    """The tile (BLOCK_N, the reduction order) never changes with M.  The execution may -- the
    execution table keys on the rows, and the interpreter's entry splits up to 8 rows -- but at
    each M the launches are exactly those of the table's execution, the same plan at every M
    that picks it; only the grids follow M."""
    recorders = {name: LaunchRecorder() for name in _KERNELS}
    for name, recorder in recorders.items():
        monkeypatch.setattr(fast_module, name, recorder)
    x = torch.zeros(4096, n_cols, dtype=BF16)
    fn = fast_module.log_softmax if log else fast_module.softmax
    op = "log_softmax" if log else "softmax"
    tile = softmax_config("interp", BF16, n_cols)
    by_execution: dict[object, list[list[dict]]] = {}
    for m in m_sweep(Lane.SM90):
        before = {name: len(r.launches) for name, r in recorders.items()}
        fn(x[:m], half_to_float=True)
        launches = [(n, r.launches[before[n] :]) for n, r in recorders.items()]
        ex = fast_module.softmax_execution("interp", BF16, n_cols, m, op)
        if isinstance(ex, fast_module.Split):
            expected = [0, 1, int(ex.combine_once), 1]
            tiles = -(-m // ex.block_m)
            assert launches[1][1][0]["grid"] == (tiles, ex.programs)
        else:
            expected = [1, 0, 0, 0]
            assert launches[0][1][0]["grid"] == (-(-m // tile.block_m),)
        assert [len(calls) for _, calls in launches] == expected, (m, ex)
        plan = [[{k: v for k, v in c.items() if k != "grid"} for c in calls] for _, calls in launches]
        assert all(c["BLOCK_N"] == tile.block_n for calls in plan for c in calls), (m, plan)
        by_execution.setdefault(ex, []).append(plan)
    assert set(by_execution) == {fast_module.TILED, fast_module._INTERP_SPLIT}  # the bucket is crossed
    for plans in by_execution.values():
        assert all(p == plans[0] for p in plans), plans


def test_config_equivalence_runs_every_execution_the_table_can_pick(monkeypatch):
    """The execution table may key on the rows only because config_equivalence proves each of
    its executions: the component's configs hold every one the table can pick for a batch's
    (arch, dtype, row length), whatever the batch's row count -- a GPU entry shipped later
    included (planted here) -- and each is valid for the tile (it divides ``block_n``); no
    execution carries a ``block_n`` of its own."""
    shipped = fast_module.GPU_SPLIT_16BIT[2]
    table = dict(fast_module.EXECUTION_TABLE)
    table[("gpu", BF16, "log_softmax")] = (fast_module.ExecutionRule(64, 32000, shipped),)
    monkeypatch.setattr(fast_module, "EXECUTION_TABLE", table)
    for arch_name, n_cols in (("sm90", 129280), ("interp", 333), ("interp", 1537)):
        for op in ("softmax", "log_softmax"):
            for dtype in (F32, BF16, F16):
                found = fast_module.equivalence_executions(arch_name, dtype, n_cols, op)
                for rows in (1, 7, 8, 9, 64, 65, 4096):
                    picked = fast_module.softmax_execution(arch_name, dtype, n_cols, rows, op)
                    assert picked in found, (arch_name, n_cols, op, dtype, rows, picked)
                for ex in found:
                    if isinstance(ex, fast_module.Split):
                        ex.lanes(softmax_config(arch_name, dtype, n_cols))  # divides block_n
                    assert not hasattr(ex, "block_n")
    assert shipped in fast_module.equivalence_executions("sm90", BF16, 129280, "log_softmax")
    assert shipped not in fast_module.equivalence_executions("sm90", BF16, 129280, "softmax")
    # the component's configs are those executions, less the one the batch ran
    x = torch.zeros(3, 333)
    batch = Batch({"x": x}, {"dim": -1, "half_to_float": False})
    names = set(log_component.COMPONENT.configs(batch, Lane.CPU))
    ran = fast_module.softmax_execution("interp", F32, 333, 3, "log_softmax")
    assert names == {
        ex.name for ex in fast_module.equivalence_executions("interp", F32, 333, "log_softmax")
    } - {ran.name}
    assert fast_module.TILED.name in names and isinstance(ran, fast_module.Split)


def test_split_config_validation():
    with pytest.raises(ValueError, match="programs"):
        fast_module.Split(3, 1, 1, 64, 1)
    with pytest.raises(ValueError, match="write_n"):
        fast_module.Split(2, 1, 1, 100, 1)
    with pytest.raises(ValueError, match="write_programs"):
        fast_module.Split(2, 1, 0, 64, 1)
    with pytest.raises(ValueError, match="stages"):
        fast_module.Tiled(stages=0)
    with pytest.raises(ValueError, match="does not divide block_n"):
        fast_module.Split(16, 1, 1, 64, 1).lanes(RowConfig(1, 8, 1))


def _special_rows(n_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows that each end in another class: finite, a NaN, a +inf, all -inf, one finite, a
    +max_normal among -inf, and the finite values' tail in the last, masked chunk."""
    gen = torch.Generator().manual_seed(17)
    x = (torch.randn(7, n_cols, generator=gen) * 4).to(dtype)
    x[1, n_cols // 3] = bp.pattern(dtype, "+quiet_nan").tensor()
    x[2, n_cols - 1] = INF
    x[3] = -INF
    x[4] = -INF
    x[4, n_cols - 2] = 1.5
    x[5, ::2] = -INF
    x[5, 7] = bp.pattern(dtype, "+max_normal").tensor() if dtype != F16 else 2.0**15
    x[6, -5:] = 30.0  # the maximum in the last chunk
    return x


@any_lane
@pytest.mark.parametrize(
    ("name", "dtype", "half_to_float"),
    [("log_softmax", F32, False), ("softmax", BF16, True)],
)
def test_every_execution_gives_the_tiled_bits(name, dtype, half_to_float):
    """A vocabulary-path row (one row per tile) split over 1, 2 or 4 pass-1 programs and 1 to 3
    write programs (GPUs: 16 and 16), with and without the combine kernel, gives the bits of one
    program per row (fp16 shares bf16's tile and kernels: the sweep's cases cover it),
    special rows and a strided, padded view included (config_equivalence runs the same on every
    case of the sweep; this adds the long-row tile, block_n 512 under the interpreter, four
    chunks whose last is partial, and a group of 3 that runs past the row's end)."""
    x = _special_rows(1537, dtype).to(DEVICE)
    log = name == "log_softmax"
    # what config_equivalence runs: on the interpreter every candidate, on GPUs the table's and
    # the first split (ci/tune_log_softmax.py checks the other GPU candidates' bits)
    candidates = fast_module.equivalence_executions(arch(x.device), dtype, 1537, name)
    assert sum(isinstance(ex, fast_module.Split) for ex in candidates) >= (1 if LANE.is_gpu else 3)
    padded = torch.full((7, 1600), NAN, dtype=dtype, device=DEVICE)
    padded[:, :1537] = x
    for view in (x, padded[:, :1537]) if dtype == F32 else (x,):  # the interpreter pays per program
        expected = fast_module.with_execution(view, -1, half_to_float, log=log, execution=fast_module.TILED)
        for ex in candidates:
            got = fast_module.with_execution(view, -1, half_to_float, log=log, execution=ex)
            report = compare_bitwise(expected, got)
            assert report.equal, f"{ex.name}: {report}"
    out = FAST[name](x, -1, half_to_float).float()
    assert torch.isnan(out[1:4]).all() and not torch.isnan(out[[0, 4, 5, 6]]).any()


@pytest.mark.cpu
def test_config_equivalence_names_a_split_with_a_float_sum():
    """The check's teeth on this component: the split whose sum is 4 float partials (the
    ``split_float_partials`` baseline's execution) planted among the declared executions fails
    config_equivalence, named; the declared ones pass."""
    comp = log_component.COMPONENT
    case = comp.cases(Lane.CPU)[0]
    assert run_check(comp, FAST_SUBJECT, "config_equivalence", case, Lane.CPU).status == "pass"
    declared = comp.configs
    assert declared is not None

    def planted(batch, lane):
        return {**declared(batch, lane), "planted float partials": split_float_partials_log_softmax}

    result = run_check(
        dataclasses.replace(comp, configs=planted), FAST_SUBJECT, "config_equivalence", case, Lane.CPU
    )
    assert result.status == "fail"
    assert result.where == ["config planted float partials"], result.where


def test_the_rows_heuristic_baseline_does_key_on_rows():
    """The negative control is what it claims: its chunk width changes with the row count."""
    cpu = torch.device("cpu")
    few, many = (rows_heuristic_config(cpu, F32, rows, 333).block_n for rows in (1, 4096))
    assert few != many


# --- half_to_float ----------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_half_to_float_returns_fp32_not_a_widened_half(name, dtype):
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(5, 300, generator=gen) * 3).to(dtype).to(DEVICE)
    out = FAST[name](x, -1, True)
    assert out.dtype == F32 and out.shape == x.shape
    within_bound(name, x, out, half_to_float=True)
    # computed and stored in fp32: most values carry bits a 16-bit result could not hold
    narrowed = out.to(dtype).to(F32)
    assert (narrowed != out).float().mean() > 0.5
    # and the same input without half_to_float stays in its dtype
    assert FAST[name](x).dtype == dtype


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_half_to_float_with_fp32_input_raises(name):
    for fn in (FAST[name], REFERENCE[name]):
        with pytest.raises(ArgumentError, match="half_to_float"):
            fn(t([[0.0, 1.0]]), -1, True)


# --- special values ---------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_nan_inf_and_all_neg_inf_rows_are_nan(name, dtype):
    rows = torch.zeros(6, 5, dtype=dtype)
    rows[0, 2] = bp.pattern(dtype, "+quiet_nan").tensor()
    rows[1, 0] = bp.pattern(dtype, "-signalling_nan").tensor()
    rows[2, 4] = bp.pattern(dtype, "all_ones_nan").tensor()
    rows[3, 1] = INF
    rows[4] = -INF
    rows[5, 3] = -INF  # a finite row: no NaN
    out = FAST[name](rows.to(DEVICE)).float().cpu()
    assert torch.isnan(out[:5]).all()
    assert not torch.isnan(out[5]).any()


@any_lane
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_neg_inf_entries_give_exact_zero_and_one_hot(dtype):
    x = t([[-INF, 0.0], [-INF, 3.5]], dtype)
    out = fast_module.softmax(x)
    assert out.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert bits32(out[:, 0]) == [0, 0]  # +0, never -0
    y = fast_module.softmax(t([[-INF, -INF, 5.0, -INF]], dtype))
    assert y.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    z = fast_module.log_softmax(t([[-INF, 0.0, -INF]], dtype))
    assert z.tolist() == [[-INF, 0.0, -INF]]
    assert bits32(z[:, 1]) == [0]  # exactly +0 at the maximum


@any_lane
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("n_cols", [1, 128, 256, 1024, 4096])
def test_all_equal_rows_are_exactly_uniform(dtype, n_cols):
    """exp(0) = 1 exactly and a sum of 2**k ones is exact: 1 / 2**k is exact in every dtype."""
    x = torch.full((3, n_cols), 1.25, dtype=dtype, device=DEVICE)
    x[1] = -7.0
    x[2] = bp.pattern(dtype, "+min_subnormal").tensor()
    assert (fast_module.softmax(x) == 1.0 / n_cols).all()
    y = fast_module.log_softmax(x, half_to_float=dtype != F32).float().cpu()
    expected = torch.tensor(-math.log(n_cols), dtype=F32)
    ulp = torch.nextafter(expected, torch.tensor(0.0)) - expected
    assert ((y - expected).abs() <= 4 * ulp.abs() + 2.0**-22).all()


@any_lane
def test_signed_zeros_and_subnormals_are_ordinary_values():
    fmt_sub = bp.pattern(F32, "+max_subnormal").tensor().item()
    x = t([[-0.0, 0.0], [fmt_sub, -fmt_sub], [bp.pattern(F32, "+min_subnormal").tensor().item(), 0.0]])
    assert (fast_module.softmax(x) == 0.5).all()


@any_lane
def test_huge_magnitudes_do_not_overflow():
    big = bp.pattern(F32, "+max_normal").tensor().item()
    out = fast_module.softmax(t([[big, 0.0, -1e30], [1e30, -1e30, 1e29]]))
    assert out.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    y = fast_module.log_softmax(t([[1e30, -1e30], [big, -big]]))
    low = torch.tensor(-1e30, dtype=F32).item()
    assert y[0].tolist() == [0.0, 2 * low] and bits32(y[0, :1]) == [0]
    # documented: x - max below fp32's range is -inf (as torch's fp32 log_softmax)
    assert y[1].tolist() == [0.0, -INF]


@any_lane
@pytest.mark.parametrize("offset", [2.0**20, -(2.0**20), 3.0e4])
def test_cancellation_around_a_large_offset(offset):
    """softmax is shift-invariant: offset + d must give softmax(d) (math.exp in double as the
    oracle), which a kernel that scales x by log2(e) before subtracting the max would miss."""
    d = [0.25 * k for k in (0, -1, -3, -8, -13, 2, 5, -2)]
    x = t([[offset + v for v in d]])
    assert x.cpu().tolist()[0] == [offset + v for v in d]  # representable exactly
    top = max(d)
    total = sum(math.exp(v - top) for v in d)
    expected = torch.tensor([[math.exp(v - top) / total for v in d]], dtype=torch.float64)
    out = fast_module.softmax(x).double().cpu()
    assert ((out - expected).abs() <= 64 * 2.0**-24 * expected).all(), (out, expected)
    log_expected = torch.tensor([[v - top - math.log(total) for v in d]], dtype=torch.float64)
    log_out = fast_module.log_softmax(x).double().cpu()
    assert ((log_out - log_expected).abs() <= 64 * 2.0**-24 * (1 + log_expected.abs())).all()


@any_lane
def test_empty_rows_and_empty_batches():
    for shape in [(0, 17), (3, 0), (2, 0, 5)]:
        x = torch.zeros(shape, device=DEVICE)
        for name in ("softmax", "log_softmax"):
            assert FAST[name](x).shape == x.shape
            assert REFERENCE[name](x).shape == x.shape


# --- strided rows -----------------------------------------------------------------------------


def _layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``x`` (rows, cols) as views of NaN-filled buffers (a stray read poisons the row)."""
    rows, cols = x.shape
    padded = torch.full((rows, cols + 13), NAN, dtype=x.dtype, device=x.device)
    padded[:, :cols] = x
    strided = torch.full((rows, 2 * cols), NAN, dtype=x.dtype, device=x.device)
    strided[:, ::2] = x
    return {
        "padded": padded[:, :cols],
        "column_stride_2": strided[:, ::2],
        "column_major": x.t().contiguous().t(),
    }


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_strided_rows_give_the_contiguous_bits(name, dtype):
    """The pinned order does not depend on strides: any layout gives the contiguous bits."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 333, generator=gen) * 4).to(dtype).to(DEVICE)
    expected = FAST[name](x)
    for label, view in _layouts(x).items():
        out = FAST[name](view)
        report = compare_bitwise(expected, out)
        assert report.equal, f"{label}: {report}"
        assert out.is_contiguous() and out.shape == view.shape
    # 3-D (B, S, V) whose (B, S) cannot merge into one row stride: copied, same bits
    buffer = torch.full((3, 3, 333), NAN, dtype=dtype, device=DEVICE)
    buffer[:, :2] = x.reshape(3, 2, 333)
    out = FAST[name](buffer[:, :2])
    assert out.shape == (3, 2, 333)
    assert compare_bitwise(expected, out.reshape(6, 333)).equal


# --- hypothesis -------------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_property_within_the_derived_bound(name):
    comp = component.COMPONENT if name == "softmax" else log_component.COMPONENT

    @settings(max_examples=12)
    @given(comp.strategy(LANE, DEVICE))
    def check(batch):
        out = comp.fast(**batch.kwargs())
        ref = comp.reference(**batch.kwargs())
        report = compare_tolerance(ref, out, comp.agreement.bound(batch, (ref,))[0])
        assert report.within, str(report)

    check()


@any_lane
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_property_rows_do_not_see_the_batch(name):
    """A prefix and a permutation of the rows give the same bits row by row."""

    @settings(max_examples=10)
    @given(component.strategy_for(name, LANE, DEVICE), st.integers(0, 2**31 - 1))
    def check(batch, seed):
        x = batch.rows["x"]
        full = FAST[name](x, -1, batch.shared["half_to_float"])
        gen = torch.Generator().manual_seed(seed)
        m = int(torch.randint(1, x.shape[0] + 1, (1,), generator=gen))
        perm = torch.randperm(x.shape[0], generator=gen).to(DEVICE)
        prefix = FAST[name](x[:m], -1, batch.shared["half_to_float"])
        shuffled = FAST[name](x[perm], -1, batch.shared["half_to_float"])
        assert compare_bitwise(full[:m], prefix).equal
        assert compare_bitwise(full[perm], shuffled).equal

    check()


# --- the reference's own promises -------------------------------------------------------------


def test_reference_matches_torch_on_special_rows():
    """The reference's non-finite behaviour is aten's (torch's fp64 softmax as the oracle)."""
    x = torch.tensor(
        [[INF, 1.0, 2.0], [-INF, -INF, -INF], [NAN, 0.0, 1.0], [-INF, 3.0, 1.0], [1e30, -1e30, 0.0]],
        dtype=F32,
    )
    for mine, theirs in ((reference_softmax, torch.softmax), (reference_log_softmax, torch.log_softmax)):
        expected = theirs(x.double(), -1)
        got = mine(x)
        assert got.dtype == torch.float64
        assert torch.equal(torch.isnan(got), torch.isnan(expected))
        finite = ~torch.isnan(expected)
        assert torch.allclose(got[finite], expected[finite], rtol=1e-15, atol=0.0)
