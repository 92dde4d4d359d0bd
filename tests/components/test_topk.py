"""Tests of the indexer top-k (``topk``): the key map, every special case of the issue, layouts,
int64 bounds, dispatch, the config table, bad input and hypothesis properties.

Expected outputs come from a pure-Python oracle (:func:`oracle`, an unsigned formulation of the
key written independently of both implementations) or are written out by hand; never from the
code under test.  The registry-driven checks (agreement, invariance sweeps, negative controls
over the sweep) live in ``tests/components/test_components.py``.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from launch_recorder import LaunchRecorder

from batchinv.fast import topk as fast_module
from batchinv.fast.baselines.topk import masked_fused_topk, masked_torch_topk
from batchinv.fast.device import arch, interpreting
from batchinv.fast.topk import (
    CONFIGS,
    ENVELOPE_K,
    EXECUTIONS,
    KERNELS,
    MAX_NUM_COLS,
    NUM_COLS_BUCKETS,
    ROW_BUCKETS,
    ROW_CONFIGS,
    SMALL_ROWS,
    TUNED_NUM_COLS_BUCKET,
    TopkConfig,
    in_envelope,
    row_bucket,
    select_config,
)
from batchinv.fast.topk import topk as fast_topk
from batchinv.harness import bitpatterns as bp
from batchinv.harness.components import topk as component_module
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch
from batchinv.reference.errors import ArgumentError, DeviceError
from batchinv.reference.topk import monotone_key
from batchinv.reference.topk import topk as reference_topk

F32 = torch.float32
COMPONENT = component_module.COMPONENT


def any_lane(fn):
    """Markers of a test that runs on every lane (the cpu lane in the interpreter, GPU lanes)."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


# --- the oracle ---------------------------------------------------------------------------------


def _order(bits: int) -> int:
    """Unsigned rank of fp32 ``bits``: -0 -> +0, then sign-magnitude to offset binary."""
    u = bits & 0xFFFFFFFF
    if u == 0x80000000:
        u = 0
    return (u ^ 0xFFFFFFFF) if u & 0x80000000 else (u | 0x80000000)


def oracle_row(bits: list[int], start: int, end: int, k: int) -> list[int]:
    num_cols = len(bits)
    s = min(max(start, 0), num_cols)
    e = min(max(end, s), num_cols)
    ranked = sorted(range(s, e), key=lambda c: (-_order(bits[c]), c))
    chosen = sorted(c - s for c in ranked[:k])
    return chosen + [-1] * (k - len(chosen))


def oracle(scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int) -> torch.Tensor:
    bits = scores.detach().cpu().contiguous().view(torch.int32).tolist()
    starts, ends = row_starts.tolist(), row_ends.tolist()
    rows = [oracle_row(b, s, e, k) for b, s, e in zip(bits, starts, ends, strict=True)]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), k)


def assert_bitwise(expected: torch.Tensor, got: torch.Tensor, what: str = "") -> None:
    assert got.dtype == torch.int32 and expected.dtype == torch.int32
    assert tuple(got.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    )
    got = got.cpu()
    if not torch.equal(expected, got):
        rows = (expected != got).any(dim=1).nonzero().flatten().tolist()
        r = rows[0]
        col = int((expected[r] != got[r]).nonzero()[0])
        raise AssertionError(
            f"{what}: {len(rows)} rows differ; row {r} col {col}: expected {int(expected[r, col])}, got {int(got[r, col])}"
        )


def check_all(scores, row_starts, row_ends, k, expected=None):
    """fast == reference == expected (the oracle's answer when not given); inside the kernel's
    envelope each kernel of :data:`KERNELS` (the "sign" kernel runs many-row launches) too."""
    expected = oracle(scores, row_starts, row_ends, k) if expected is None else expected
    assert_bitwise(expected, reference_topk(scores, row_starts, row_ends, k), "reference vs expected")
    assert_bitwise(expected, fast_topk(scores, row_starts, row_ends, k), "fast vs expected")
    if in_envelope(k, scores.shape[1]):
        ran = select_config(arch(scores.device), k, scores.shape[1], scores.shape[0])
        base = select_config(arch(scores.device), k, scores.shape[1])
        for kernel in KERNELS:
            config = TopkConfig(base.block_n, base.num_warps, kernel)
            if config != ran:
                assert_bitwise(expected, fast_topk(scores, row_starts, row_ends, k, config=config), kernel)
    return expected


def from_bits(bits, device) -> torch.Tensor:
    return bp.from_bits([b & 0xFFFFFFFF for b in bits], F32, device)


def bounds(values, device, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


# --- the key map --------------------------------------------------------------------------------

# Hand-derived: non-negative bits keep their value; negative bits b give b ^ 0x7fffffff (signed).
HAND_KEYS = {
    "+0": 0,
    "-0": 0,  # canonicalized to +0 first
    "+min_subnormal": 1,
    "-min_subnormal": -2,  # 0x80000001 ^ 0x7fffffff = 0xfffffffe
    "+max_subnormal": 0x007FFFFF,
    "-max_subnormal": -0x00800000,  # 0x807fffff ^ 0x7fffffff = 0xff800000
    "+min_normal": 0x00800000,
    "-min_normal": -0x00800001,  # 0x80800000 -> 0xff7fffff
    "+max_normal": 0x7F7FFFFF,
    "-max_normal": -0x7F800000,  # 0xff7fffff -> 0x80800000
    "+inf": 0x7F800000,
    "-inf": -0x7F800001,  # 0xff800000 -> 0x807fffff
    "+quiet_nan": 0x7FC00000,
    "-quiet_nan": -0x7FC00001,  # 0xffc00000 -> 0x803fffff
    "+signalling_nan": 0x7F800001,
    "-signalling_nan": -0x7F800002,  # 0xff800001 -> 0x807ffffe
    "all_ones_nan": -(2**31),  # 0xffffffff -> 0x80000000
    "all_ones_minus_one_nan": -(2**31) + 1,  # 0xfffffffe -> 0x80000001
}

# Descending rank of the catalogue (ties: +0 == -0).
HAND_ORDER = [
    "+quiet_nan",
    "+signalling_nan",
    "+inf",
    "+max_normal",
    "+min_normal",
    "+max_subnormal",
    "+min_subnormal",
    "+0",  # == -0
    "-min_subnormal",
    "-max_subnormal",
    "-min_normal",
    "-max_normal",
    "-inf",
    "-signalling_nan",
    "-quiet_nan",
    "all_ones_minus_one_nan",
    "all_ones_nan",
]


@any_lane
def test_monotone_key_of_every_bit_class():
    catalogue = bp.catalogue(F32)
    assert {p.name for p in catalogue} == set(HAND_KEYS)
    for p in catalogue:
        got = int(monotone_key(p.tensor().reshape(1))[0])
        assert got == HAND_KEYS[p.name], f"{p.name} (0x{p.bits:08x}): key {got}, expected {HAND_KEYS[p.name]}"


@any_lane
def test_monotone_key_ranks_the_catalogue_in_the_documented_order():
    keys = {p.name: int(monotone_key(p.tensor().reshape(1))[0]) for p in bp.catalogue(F32)}
    ranked = [keys[name] for name in HAND_ORDER]
    assert ranked == sorted(ranked, reverse=True) and len(set(ranked)) == len(ranked)
    assert keys["-0"] == keys["+0"]


@any_lane
def test_monotone_key_follows_value_order_on_non_nan_values():
    gen = torch.Generator().manual_seed(11)
    values = torch.randn(2000, generator=gen) * 10.0 ** torch.randint(-44, 39, (2000,), generator=gen)
    values = bp.inject(values, [p for p in bp.catalogue(F32) if not p.is_nan], 0.2, gen)
    keys = monotone_key(values)
    i, j = torch.randint(0, values.numel(), (2, 20000), generator=gen)
    assert torch.equal(keys[i] < keys[j], values[i] < values[j])
    assert torch.equal(keys[i] == keys[j], values[i] == values[j])


# --- special cases, with hand-written expectations ----------------------------------------------


def _arange_then_pad(n: int, k: int) -> torch.Tensor:
    return torch.tensor([list(range(n)) + [-1] * (k - n)], dtype=torch.int32)


@any_lane
@pytest.mark.parametrize(
    "value_bits",
    [0x3FC00000, 0xFF800000, 0x00000000, 0x80000000, 0xFFFFFFFF],
    ids=["1.5", "-inf", "+0", "-0", "0xffffffff"],
)
@pytest.mark.parametrize("k", [512, 1024])
def test_plateau_rows_select_the_first_k_window_columns(device, value_bits, k):
    # An all-equal row (more ties than slots): the first k window columns, whatever the value.
    num_cols = k + 300
    scores = from_bits([value_bits] * num_cols, device)[None, :]
    for start, end, n in ((0, num_cols, k), (37, num_cols, k), (5, 5 + k // 3, k // 3)):
        check_all(scores, bounds([start], device), bounds([end], device), k, _arange_then_pad(n, k))


@any_lane
def test_empty_windows_are_all_padding(device):
    k = 512
    scores = from_bits([0x7FC00000] * 700, device).repeat(4, 1)  # +NaN everywhere: the top key
    starts, ends = bounds([0, 350, 700, 900], device), bounds([0, 350, 700, 950], device)
    check_all(scores, starts, ends, k, torch.full((4, k), -1, dtype=torch.int32))


@any_lane
def test_signed_zero_plateau_ties_by_column(device):
    # 10 positives, then a +0/-0 plateau (-0 ranks as +0): the positives plus the first 502 zeros.
    k, num_cols, start = 512, 900, 3
    gen = torch.Generator().manual_seed(5)
    positives = sorted(torch.randperm(num_cols - start, generator=gen)[:10].tolist())
    bits = [0x80000000 if (torch.rand(1, generator=gen).item() < 0.5) else 0 for _ in range(num_cols)]
    for p in positives:
        bits[start + p] = 0x3F800000  # 1.0
    bits[0] = bits[1] = bits[2] = 0x7F800000  # +inf outside the window: never selected
    zeros = [c for c in range(num_cols - start) if c not in positives][: k - 10]
    expected = torch.tensor([sorted(positives + zeros)], dtype=torch.int32)
    check_all(
        from_bits(bits, device)[None, :], bounds([start], device), bounds([num_cols], device), k, expected
    )


@any_lane
def test_subnormals_rank_between_zero_and_the_normals(device):
    k, num_cols = 512, 800
    plus_sub, minus_sub, min_normal = 0x00000001, 0x80000001, 0x00800000
    bits = [minus_sub] * num_cols
    layout = {3: min_normal, 450: min_normal}
    layout.update({c: plus_sub for c in range(100, 400)})  # 300 +min_subnormal
    layout.update({c: 0x80000000 for c in range(500, 800, 2)})  # 150 -0 (ranks as +0)
    for c, b in layout.items():
        bits[c] = b
    chosen = [3, 450, *range(100, 400), *range(500, 800, 2)]  # 452 lanes above -min_subnormal
    rest = [c for c in range(num_cols) if c not in set(chosen)][: k - len(chosen)]
    expected = torch.tensor([sorted(chosen + rest)], dtype=torch.int32)
    check_all(from_bits(bits, device)[None, :], bounds([0], device), bounds([num_cols], device), k, expected)


@any_lane
def test_negative_nan_plateau_after_row_start(device):
    # Seed 003, defect 2: 600 in-window 0xffffffff lanes at row_start = 1 give 512 indices.
    k = 512
    bits = [0x7F800000] + [0xFFFFFFFF] * 600 + [0x7FC00000] * 99
    scores = from_bits(bits, device)[None, :]
    check_all(scores, bounds([1], device), bounds([601], device), k, _arange_then_pad(k, k))


@any_lane
def test_both_sentinel_adjacent_nans_keep_their_order(device):
    # Seed 003, defect 3: 0xfffffffe ranks strictly above 0xffffffff (no key may merge them).
    k, num_cols = 512, 700
    bits = [0xFFFFFFFF if c % 7 < 4 else 0xFFFFFFFE for c in range(num_cols)]
    above = [c for c in range(num_cols) if bits[c] == 0xFFFFFFFE]  # 300 lanes
    last = [c for c in range(num_cols) if bits[c] == 0xFFFFFFFF][: k - len(above)]
    expected = torch.tensor([sorted(above + last)], dtype=torch.int32)
    check_all(from_bits(bits, device)[None, :], bounds([0], device), bounds([num_cols], device), k, expected)


@any_lane
def test_masked_lanes_never_spend_the_tie_budget(device):
    # Seed 003, defect 1: the same -inf plateau row at every row_start gives the same indices.
    k, width = 512, 640
    gen = torch.Generator().manual_seed(3)
    logical = component_module.build_row("neg_inf_plateau", width, gen)
    results = []
    for offset in (0, 1, 7, 31, 32, 33, 211):
        garbage = bp.inject(torch.randn(offset + width + 5, generator=gen), bp.catalogue(F32), 0.5, gen)
        garbage[offset : offset + width] = logical
        out = fast_topk(
            garbage[None, :].to(device), bounds([offset], device), bounds([offset + width], device), k
        )
        results.append(out.cpu())
        assert int((out >= 0).sum()) == k, (
            f"row_start={offset}: {int((out >= 0).sum())} indices, expected {k}"
        )
    for offset, out in zip((1, 7, 31, 32, 33, 211), results[1:], strict=True):
        assert_bitwise(results[0], out, f"row_start={offset} vs 0")
    assert_bitwise(
        oracle(logical[None, :], bounds([0], "cpu"), bounds([width], "cpu"), k), results[0], "oracle"
    )


@any_lane
def test_window_narrower_than_k_inside_a_wider_row(device):
    k = 512
    gen = torch.Generator().manual_seed(8)
    rows = torch.stack(
        [component_module.build_row(kind, 630, gen) for kind in ("negative_nans", "normal", "all_neg_inf")]
    )
    starts, ends = bounds([100, 0, 600], device), bounds([130, 511, 630], device)
    out = check_all(rows.to(device), starts, ends, k)
    assert [int((r >= 0).sum()) for r in out] == [30, 511, 30]


@any_lane
def test_k_larger_than_num_cols_pads(device):
    k = 512
    scores = torch.randn(2, 300, generator=torch.Generator().manual_seed(1)).to(device)
    check_all(
        scores,
        bounds([0, -50], device),
        bounds([300, 1000], device),
        k,
        _arange_then_pad(300, k).repeat(2, 1),
    )


@any_lane
@pytest.mark.parametrize("k", [512, 100])
def test_zero_rows(device, k):
    scores = torch.empty(0, 1000, device=device)
    empty = bounds([], device)
    for fn in (fast_topk, reference_topk):
        out = fn(scores, empty, empty, k)
        assert out.shape == (0, k) and out.dtype == torch.int32 and out.device == scores.device


@any_lane
def test_zero_columns(device):
    scores = torch.empty(2, 0, device=device)
    check_all(
        scores,
        bounds([0, 3], device),
        bounds([0, 9], device),
        512,
        torch.full((2, 512), -1, dtype=torch.int32),
    )


# --- every row kind and window kind against the oracle ------------------------------------------


@any_lane
@pytest.mark.parametrize("kind", component_module.ROW_KINDS)
def test_every_row_kind_and_window_matches_the_oracle(device, kind):
    k, num_cols = 512, 1100
    gen = torch.Generator().manual_seed(sum(map(ord, kind)))
    windows = component_module.WINDOW_KINDS
    rows = torch.stack([component_module.build_row(kind, num_cols, gen) for _ in windows])
    spans = [component_module.build_window(w, num_cols, k, True, gen) for w in windows]
    check_all(
        rows.to(device),
        bounds([s for s, _ in spans], device, torch.int64),
        bounds([e for _, e in spans], device, torch.int64),
        k,
    )


@any_lane
def test_every_bit_class_at_the_cutoff(device):
    # Row r: 256 copies of catalogue pattern r among lanes drawn from the whole catalogue.
    k, num_cols = 512, 1024
    gen = torch.Generator().manual_seed(17)
    catalogue = bp.catalogue(F32)
    rows = []
    for p in catalogue:
        background = bp.inject(torch.randn(num_cols, generator=gen), catalogue, 1.0, gen)
        rows.append(bp.inject(background, [p], 0.25, gen))
    scores = torch.stack(rows).to(device)
    n = len(catalogue)
    check_all(scores, bounds([0] * n, device), bounds([num_cols] * n, device), k)


@any_lane
@pytest.mark.parametrize(
    ("num_cols", "k"),
    [
        (511, 512),
        (512, 512),
        (513, 512),
        (1023, 1024),
        (1024, 1024),
        (1025, 1024),
        (2047, 2048),
        (2048, 2048),
        (2049, 2048),
        (2047, 512),
        (2049, 512),
        (8191, 2048),
        (8192, 2048),
        (8192, 512),
        (8193, 2048),
    ],
)
def test_num_cols_edges(device, num_cols, k):
    gen = torch.Generator().manual_seed(num_cols + k)
    rows = torch.stack(
        [component_module.build_row(kind, num_cols, gen) for kind in ("tie_plateau", "nan_classes")]
    )
    check_all(rows.to(device), bounds([0, 33], device), bounds([num_cols, num_cols - 1], device), k)


# --- layouts and bounds ---------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("layout", component_module.LAYOUTS)
def test_layouts_agree_with_the_contiguous_rows(device, layout):
    k, num_cols = 512, 777
    gen = torch.Generator().manual_seed(21)
    rows = torch.stack(
        [
            component_module.build_row(kind, num_cols, gen)
            for kind in ("quantized", "signed_zeros", "nan_classes")
        ]
    )
    scores = component_module.apply_layout(rows, layout, gen, torch.device(device))
    assert torch.equal(scores.cpu().view(torch.int32), rows.view(torch.int32))
    # Bounds as strided views too (every other element of a wider buffer).
    starts = bounds([0, 99, 5, 0, 12, 0], device, torch.int64)[::2]
    ends = bounds([777, 0, 700, 0, 120, 0], device, torch.int64)[::2]
    assert starts.stride(0) == 2
    check_all(scores, starts, ends, k, oracle(rows, starts.cpu(), ends.cpu(), k))


@any_lane
def test_int64_bounds_past_the_int32_range(device):
    # Each row would go wrong if its bounds were narrowed to int32 before clamping.
    k, num_cols = 512, 700
    scores = torch.randn(4, num_cols, generator=torch.Generator().manual_seed(4)).to(device)
    starts = bounds([2**32 + 5, -(2**40), 3, 2**31], device, torch.int64)  # 2**31 narrows to -2**31
    ends = bounds([2**32 + 600, 2**40, 2**32 + 3, 2**31 + 9], device, torch.int64)
    expected = oracle(scores, torch.tensor([700, 0, 3, 700]), torch.tensor([700, 700, 700, 700]), k)
    out = check_all(scores, starts, ends, k, expected)
    assert [int((r >= 0).sum()) for r in out] == [0, 512, 512, 0]


@any_lane
def test_output_is_relative_to_the_clamped_row_start(device):
    k = 512
    scores = torch.arange(600, dtype=F32).flip(0)[None, :].to(device)  # column c scores 599 - c
    out = check_all(scores, bounds([-40], device), bounds([600], device), k)
    assert out[0, :k].tolist() == list(range(k))


# --- dispatch and the config table ----------------------------------------------------------------


@pytest.fixture
def recorder(monkeypatch):
    rec = LaunchRecorder(fast_module.topk_kernel)
    monkeypatch.setattr(fast_module, "topk_kernel", rec)
    return rec


@any_lane
@pytest.mark.parametrize(
    ("num_cols", "k", "launched"),
    [(8192, 512, True), (8193, 512, False), (700, 100, False), (700, 4096, False), (700, 1024, True)],
)
def test_fallback_dispatch(device, recorder, num_cols, k, launched):
    gen = torch.Generator().manual_seed(num_cols)
    scores = torch.stack([component_module.build_row("quantized", num_cols, gen)]).to(device)
    out = check_all(scores, bounds([3], device), bounds([num_cols], device), k)
    assert out.shape == (1, k)
    assert bool(recorder.launches) == launched
    assert fast_topk(scores, bounds([3], device), bounds([num_cols], device), k).device == scores.device


@any_lane
def test_small_launches_keep_the_pinned_config():
    """Up to SMALL_ROWS rows the config is the one table keyed on (arch, k, num_cols bucket),
    unchanged: a power-of-two register tile, 4 warps up to 2048 columns and 8 above, no
    register cap, the "compare" kernel except sm90's tuned bucket, which takes the "sign" kernel
    (11-14 us at 1-64 rows on the H200 against compare's ~20, run 64)."""
    assert isinstance(CONFIGS, MappingProxyType) and isinstance(ROW_CONFIGS, MappingProxyType)
    for key, config in CONFIGS.items():
        arch_key, k, bucket = key
        assert isinstance(arch_key, str) and k in ENVELOPE_K and bucket in NUM_COLS_BUCKETS
        kernel = "sign" if (arch_key, bucket) == ("sm90", TUNED_NUM_COLS_BUCKET) else "compare"
        assert config == TopkConfig(block_n=bucket, num_warps=4 if bucket <= 2048 else 8, kernel=kernel)
        assert config.maxnreg is None
    for arch_key in ("sm90", "sm100", "interp", "sm120"):
        for k in ENVELOPE_K:
            for num_cols in (0, 1, 511, 512, 513, 2049, 4096, 8191, MAX_NUM_COLS):
                small = select_config(arch_key, k, num_cols)
                assert small.block_n >= num_cols
                for num_rows in (1, 17, SMALL_ROWS):
                    assert select_config(arch_key, k, num_cols, num_rows) == small


@any_lane
def test_row_buckets():
    assert [row_bucket(m) for m in (1, SMALL_ROWS, SMALL_ROWS + 1, 256, 257, 1024, 2049, 4096, 10**6)] == [
        None,
        None,
        256,
        256,
        1024,
        1024,
        4096,
        4096,
        4096,
    ]
    assert ROW_BUCKETS == tuple(sorted(ROW_BUCKETS)) and ROW_BUCKETS[0] > SMALL_ROWS


def _executions_at(base):
    return {name: execution.config(base) for name, execution in EXECUTIONS.items()}


@any_lane
def test_row_configs_are_executions_config_equivalence_runs():
    """Every config a many-row launch may take is an execution of EXECUTIONS, and the
    component's ``configs`` hands every execution of the tuned bucket to config_equivalence
    on GPU lanes (so a table naming any of them is proven bit-identical before it ships)."""
    for (arch_key, k, bucket, rows), config in ROW_CONFIGS.items():
        base = CONFIGS[(arch_key, k, bucket)]
        assert rows in ROW_BUCKETS
        assert config in _executions_at(base).values(), (arch_key, k, bucket, rows, config)
        if bucket != TUNED_NUM_COLS_BUCKET or arch_key != "sm90":
            assert config == base
    assert {e.kernel for e in EXECUTIONS.values()} == set(KERNELS)
    for k in ENVELOPE_K:
        for num_rows in (3, 300):
            scores = torch.zeros(num_rows, TUNED_NUM_COLS_BUCKET)
            ends = torch.full((num_rows,), TUNED_NUM_COLS_BUCKET, dtype=torch.int32)
            batch = Batch({"scores": scores, "row_starts": ends * 0, "row_ends": ends}, {"k": k})
            base = select_config(arch(scores.device), k, TUNED_NUM_COLS_BUCKET)
            ran = select_config(arch(scores.device), k, TUNED_NUM_COLS_BUCKET, num_rows)
            declared = {fn.keywords["config"] for fn in COMPONENT.configs(batch, Lane.SM90).values()}
            assert declared | {ran} == set(_executions_at(base).values())
            assert ran not in declared
            cpu = {fn.keywords["config"] for fn in COMPONENT.configs(batch, Lane.CPU).values()}
            assert {c.kernel for c in cpu | {ran}} == set(KERNELS)  # the interpreter: one per kernel


@any_lane
def test_the_tuned_line_sets_every_k_of_the_tuned_bucket(monkeypatch):
    """The one-line edit: SM90_8192_BY_ROW_BUCKET names an execution per row bucket, and the
    table built from it gives sm90 at the tuned bucket that execution for every k."""
    line = ("sign_r128", "compare_r128", "sign_w16_r64", "sign_r80")
    monkeypatch.setattr(fast_module, "SM90_8192_BY_ROW_BUCKET", line)
    table = fast_module._row_table()
    for k in ENVELOPE_K:
        base = CONFIGS[("sm90", k, TUNED_NUM_COLS_BUCKET)]
        for rows, name in zip(ROW_BUCKETS, line, strict=True):
            assert table[("sm90", k, TUNED_NUM_COLS_BUCKET, rows)] == EXECUTIONS[name].config(base)
            assert (
                table[("sm100", k, TUNED_NUM_COLS_BUCKET, rows)]
                == CONFIGS[("sm100", k, TUNED_NUM_COLS_BUCKET)]
            )
    monkeypatch.setattr(fast_module, "SM90_8192_BY_ROW_BUCKET", ("sign_r128",))  # too short
    with pytest.raises(ValueError):
        fast_module._row_table()
    monkeypatch.setattr(fast_module, "SM90_8192_BY_ROW_BUCKET", ("sign_r96",) * len(ROW_BUCKETS))
    with pytest.raises(KeyError):
        fast_module._row_table()  # an execution config_equivalence does not run


@any_lane
def test_launch_config_does_not_depend_on_num_rows_up_to_small_rows(device, recorder):
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(SMALL_ROWS, 500, generator=gen).to(device)
    starts, ends = bounds([0] * SMALL_ROWS, device), bounds([500] * SMALL_ROWS, device)
    fast_topk(scores[:1], starts[:1], ends[:1], 512)
    fast_topk(scores, starts, ends, 512)
    first, second = recorder.launches
    assert first["grid"] == (1,) and second["grid"] == (SMALL_ROWS,)
    assert {k: v for k, v in first.items() if k != "grid"} == {k: v for k, v in second.items() if k != "grid"}


@any_lane
def test_a_many_row_launch_runs_the_row_buckets_execution(device, monkeypatch):
    """Above SMALL_ROWS rows the launcher takes ROW_CONFIGS' entry (here one naming the "sign"
    kernel for every arch), with the oracle's bits."""
    num_rows, num_cols, k = SMALL_ROWS + 1, 500, 512
    gen = torch.Generator().manual_seed(4)
    kinds = component_module.ROW_KINDS
    scores = torch.stack(
        [component_module.build_row(kinds[i % len(kinds)], num_cols, gen) for i in range(num_rows)]
    )
    starts = torch.randint(-3, 40, (num_rows,), generator=gen)
    ends = starts + torch.randint(0, num_cols, (num_rows,), generator=gen)
    scores, starts, ends = scores.to(device), starts.to(device), ends.to(device)
    sign = {key: _executions_at(CONFIGS[key[:3]])["sign"] for key in ROW_CONFIGS}
    monkeypatch.setattr(fast_module, "ROW_CONFIGS", MappingProxyType(sign))
    compare, signed = (
        LaunchRecorder(fast_module.topk_kernel),
        LaunchRecorder(fast_module.topk_sign_count_kernel),
    )
    monkeypatch.setattr(fast_module, "topk_kernel", compare)
    monkeypatch.setattr(fast_module, "topk_sign_count_kernel", signed)
    many = fast_topk(scores, starts, ends, k)
    assert not compare.launches and [launch["grid"] for launch in signed.launches] == [(num_rows,)]
    assert_bitwise(oracle(scores.cpu(), starts.cpu(), ends.cpu(), k), many, "oracle")


@any_lane
def test_an_explicit_config_must_hold_the_row(device):
    scores = torch.zeros(2, 600, device=device)
    starts, ends = bounds([0, 0], device), bounds([600, 600], device)
    for bad in (TopkConfig(512, 4), TopkConfig(768, 4), TopkConfig(1024, 4, kernel="radix")):
        with pytest.raises(ArgumentError, match="'config'"):
            fast_topk(scores, starts, ends, 512, config=bad)


# --- bad input ------------------------------------------------------------------------------------


@any_lane
def test_error_cases_cover_the_issue_list(device):
    names = {e.name for e in COMPONENT.error_cases(device)}
    for needed in (
        "scores_float16",
        "scores_rank_1",
        "row_starts_float32",
        "row_starts_rank_2",
        "row_ends_length_3",
        "k_zero",
        "row_end_before_row_start",
        "row_ends_on_meta",
        "all_on_meta",
    ):
        assert needed in names


@any_lane
def test_bad_inputs_raise_typed_errors_from_every_path(device):
    for err in COMPONENT.error_cases(device):
        fns = {"fast": fast_topk, "reference": reference_topk}
        for name in err.applies_to:
            with pytest.raises(err.error, match=err.match):
                fns[name](**err.kwargs)
        for baseline in (masked_torch_topk, masked_fused_topk):  # the baselines validate alike
            if "reference" in err.applies_to:
                with pytest.raises(err.error, match=err.match):
                    baseline(**err.kwargs)


@pytest.mark.cpu
def test_host_tensors_are_refused_without_the_interpreter(monkeypatch):
    scores = torch.zeros(2, 600)
    starts, ends = torch.zeros(2, dtype=torch.int32), torch.full((2,), 600, dtype=torch.int32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not interpreting()
    with pytest.raises(DeviceError, match=r"'scores'.*CUDA.*cpu"):
        fast_topk(scores, starts, ends, 512)
    with pytest.raises(DeviceError, match=r"'scores'.*CUDA.*cpu"):
        fast_topk(scores, starts, ends, 100)  # also outside the envelope: the GPU path is the contract
    assert reference_topk(scores, starts, ends, 100).shape == (2, 100)


@any_lane
def test_inverted_window_names_the_row(device):
    scores = torch.zeros(3, 600, device=device)
    with pytest.raises(ArgumentError, match=r"'row_ends'.*row 1 has row_start 9.*8"):
        fast_topk(scores, bounds([0, 9, 0], device), bounds([5, 8, 5], device), 512)


# --- negative controls: the baselines show the production defect ---------------------------------


def _plateau_at(offset: int, width: int, device, gen: torch.Generator):
    logical = component_module.build_row("neg_inf_plateau", width, gen)
    row = torch.full((offset + width + 3,), float("-inf"))
    row[offset : offset + width] = logical
    return row[None, :].to(device), bounds([offset], device), bounds([offset + width], device)


@any_lane
@pytest.mark.negative_control
def test_masked_fused_baseline_loses_indices_to_lanes_before_row_start(device):
    k, width = 512, 640
    for offset in (1, 7, 33):
        scores, starts, ends = _plateau_at(offset, width, device, torch.Generator().manual_seed(3))
        emitted = int((masked_fused_topk(scores, starts, ends, k) >= 0).sum())
        assert emitted == k - offset, (
            f"row_start={offset}: {emitted} indices (the masked lanes took {k - emitted})"
        )
        assert int((fast_topk(scores, starts, ends, k) >= 0).sum()) == k


@any_lane
@pytest.mark.negative_control
def test_masked_torch_baseline_lets_masked_lanes_take_slots(device):
    k, width = 512, 600
    counts = []
    for offset in (1, 7, 31, 32, 33, 150):
        scores = torch.full((1, offset + width + 40), float("-inf"), device=device)  # an all -inf row
        counts.append(
            int(
                (
                    masked_torch_topk(scores, bounds([offset], device), bounds([offset + width], device), k)
                    >= 0
                ).sum()
            )
        )
    assert min(counts) < k, f"torch.topk picked only in-window lanes at every offset: {counts}"


# --- hypothesis properties ------------------------------------------------------------------------


def _known_bug_examples() -> list[Batch]:
    out = []
    nan_plateau = from_bits([0x7F800000] + [0xFFFFFFFF] * 600 + [0] * 9, "cpu")[None, :]
    out.append(
        Batch(
            {"scores": nan_plateau, "row_starts": bounds([1], "cpu"), "row_ends": bounds([601], "cpu")},
            {"k": 512},
        )
    )
    sentinels = from_bits([0xFFFFFFFE, 0xFFFFFFFF] * 300, "cpu")[None, :]
    out.append(
        Batch(
            {"scores": sentinels, "row_starts": bounds([0], "cpu"), "row_ends": bounds([600], "cpu")},
            {"k": 512},
        )
    )
    return out


def _on(batch: Batch, device) -> Batch:
    return Batch({name: t.to(device) for name, t in batch.rows.items()}, batch.shared)


_DEVICE = torch.device("cpu" if interpreting() or not torch.cuda.is_available() else "cuda")
_LANE = Lane.CPU if _DEVICE.type == "cpu" else Lane.SM90
_EXAMPLES = 25 if _LANE is Lane.CPU else 200


@any_lane
@settings(max_examples=_EXAMPLES)
@given(batch=COMPONENT.strategy(_LANE, torch.device("cpu")))
@example(batch=_known_bug_examples()[0])
@example(batch=_known_bug_examples()[1])
def test_property_fast_equals_reference_equals_oracle(batch):
    batch = _on(batch, _DEVICE)
    check_all(**batch.kwargs())  # the reference, fast and each kernel against the oracle


@any_lane
@settings(max_examples=max(5, _EXAMPLES // 3))
@given(
    batch=COMPONENT.strategy(_LANE, torch.device("cpu")),
    offset=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
def test_property_row_start_offset_and_row_alone(batch, offset, seed):
    batch = _on(batch, _DEVICE)
    together = fast_topk(**batch.kwargs())
    shifted = component_module.shift_row_start(batch, offset, torch.Generator().manual_seed(seed))
    assert_bitwise(together.cpu(), fast_topk(**shifted.kwargs()), f"row_start={offset}")
    last = batch.num_rows - 1
    assert_bitwise(together[last:].cpu(), fast_topk(**batch.take([last]).kwargs()), "last row alone")


# --- GPU only ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_capture_replays_bitwise():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    case = component_module.make_case(64, 8192, 2048, seed=3)
    batch = COMPONENT.build(case, device)
    eager = fast_topk(**batch.kwargs())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fast_topk(**batch.kwargs())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fast_topk(**batch.kwargs())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, captured)


@pytest.mark.gpu
@pytest.mark.slow
def test_large_batch_every_row_matches_the_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    for k in ENVELOPE_K:
        batch = COMPONENT.build(component_module.make_case(4096, 8192, k, seed=k), device)
        assert torch.equal(reference_topk(**batch.kwargs()), fast_topk(**batch.kwargs()))


# --- regressions (adversarial review) -----------------------------------------------------------


@pytest.mark.cpu
@pytest.mark.gpu
def test_negative_bit_scores_rank_by_their_values(device):
    gen = torch.Generator().manual_seed(50)
    z = torch.randn(2, 600, dtype=torch.complex64, generator=gen).to(device)
    s = z.conj().imag  # s == -z.imag, the negation only a flag
    assert s.is_neg()
    plain = s.resolve_neg()
    starts, ends = bounds([0, 37], device), bounds([600, 580], device)
    expected = oracle(plain, starts, ends, 512)
    assert_bitwise(expected, reference_topk(s, starts, ends, 512), "reference")
    assert_bitwise(expected, fast_topk(s, starts, ends, 512), "fast")
    assert_bitwise(oracle(plain, starts, ends, 100), fast_topk(s, starts, ends, 100), "fast (fallback)")
    assert torch.equal(monotone_key(s), monotone_key(plain))
    assert_bitwise(masked_fused_topk(plain, starts, ends, 512).cpu(), masked_fused_topk(s, starts, ends, 512))


@pytest.mark.cpu
@pytest.mark.gpu
def test_k_accepts_any_integral_and_bounds_its_size(device):
    import numpy as np

    from batchinv.reference.errors import DTypeError

    scores = torch.randn(2, 600, generator=torch.Generator().manual_seed(51)).to(device)
    starts, ends = bounds([0, 3], device), bounds([600, 590], device)
    expected = oracle(scores, starts, ends, 512)
    for fn in (fast_topk, reference_topk):
        assert_bitwise(expected, fn(scores, starts, ends, np.int64(512)), fn.__module__)
        with pytest.raises(ArgumentError, match=r"'k'.*2147483647"):
            fn(scores, starts, ends, 2**40)
        for flag in (True, np.True_, torch.tensor(True)):
            with pytest.raises(DTypeError, match=r"'k'"):
                fn(scores, starts, ends, flag)


# --- the kernel's envelope: fast_path, the oracle and the case lists -----------------------------

_CHECK_LANES = (Lane.CPU, Lane.SM90)


def _small(case):
    """``case`` with at most 2 rows: the same num_cols and k, so the same dispatch, built fast."""
    return component_module.make_case(
        min(int(case.axes["num_rows"]), 2),
        int(case.axes["num_cols"]),
        int(case.axes["k"]),
        rows=case.axes["rows"],
        layout=case.axes["layout"],
        bounds=case.axes["bounds"],
        seed=case.seed,
    )


def _widest_row_start(batch):
    """The batch the row_start check widens most (its largest offset)."""
    from batchinv.harness.registry import ROW_OFFSET_RANDOM

    return component_module.shift_row_start(batch, ROW_OFFSET_RANDOM[1] - 1, torch.Generator().manual_seed(0))


@any_lane
@pytest.mark.parametrize("case_lane", _CHECK_LANES, ids=lambda lane: lane.value)
def test_fast_path_is_the_launchers_dispatch(device, monkeypatch, case_lane):
    """``fast_path`` says True exactly where the launcher launches the kernel (a recorder in its
    place: both kernels, "compare" and "sign", the GPU's few-row execution), on every case of the
    cpu and GPU lists (2-row versions: the same dispatch)."""
    for case in COMPONENT.cases(case_lane):
        rec = LaunchRecorder()
        monkeypatch.setattr(fast_module, "topk_kernel", rec)
        monkeypatch.setattr(fast_module, "topk_sign_count_kernel", rec)
        batch = COMPONENT.build(_small(case), device)
        fast_topk(**batch.kwargs())
        assert component_module.fast_path(batch) == bool(rec.launches), case.id


def _stub_fast(scores, row_starts, row_ends, k):
    return torch.zeros(scores.shape[0], k, dtype=torch.int32, device=scores.device)


def test_every_check_of_the_cpu_cases_runs_the_kernel_somewhere():
    """On the cpu list every applicable check has a case whose every launch runs the kernel (the
    real drivers, with a stub in place of the launcher: a check's status is then ``pass`` only
    when fast_path held for every batch it ran); out-of-envelope cases stay, as reference path."""
    from dataclasses import replace

    from batchinv.harness.checks import REFERENCE_PATH, run_check

    def stub_configs(batch, lane):  # the executions the component declares, each a stub as well
        return {name: _stub_fast for name in COMPONENT.configs(batch, lane)}

    stub = replace(COMPONENT, fast=_stub_fast, configs=stub_configs, torch_op=_stub_fast)
    cases = COMPONENT.cases(Lane.CPU)
    on_kernel = [component_module.fast_path(COMPONENT.build(c, torch.device("cpu"))) for c in cases]
    assert any(on_kernel) and not all(on_kernel), "the cpu list must hold kernel and reference-path cases"
    for check in COMPONENT.applicable_checks():
        if check == "agreement":
            continue  # the stub does not agree; agreement runs one batch, the case's own
        if check == "cross_process":
            continue  # its fresh process rebuilds the registered component, never this stub
        if check == "modes":
            # modes also wants the torch.ops operator's run-time call count (issue 25), which a
            # plain stub cannot give: its kernel cases are the sweep's, with the real operator
            continue
        statuses = {run_check(stub, "fast", check, c, Lane.CPU).status for c in cases}
        assert "pass" in statuses, f"{check}: no cpu case runs the kernel on every launch ({statuses})"
        assert statuses <= {"pass", REFERENCE_PATH, "skip"}, f"{check}: {statuses}"  # skip: one-row cases


def test_every_check_of_the_gpu_cases_runs_the_kernel_somewhere():
    """The GPU list, at the level of dispatch: every check has kernel cases, the top bucket
    (num_cols > 4096) keeps a row_start case on the kernel at the largest offset, and the cases
    whose row_start crosses 8192 columns are exactly those wider than ROW_START_MAX_NUM_COLS."""
    cpu = torch.device("cpu")
    kernel, row_start_kernel, crossing = [], [], []
    for case in COMPONENT.cases(Lane.SM90):
        batch = COMPONENT.build(_small(case), cpu)
        if not component_module.fast_path(batch):
            continue
        kernel.append(case)
        num_cols = int(case.axes["num_cols"])
        if component_module.fast_path(_widest_row_start(batch)):
            row_start_kernel.append(num_cols)
        else:
            crossing.append(num_cols)
    assert kernel and any(int(c.axes["num_rows"]) >= 2048 for c in kernel)
    assert {int(c.axes["k"]) for c in kernel} == set(ENVELOPE_K)
    assert any(n > 4096 for n in row_start_kernel), row_start_kernel
    assert max(row_start_kernel) == component_module.ROW_START_MAX_NUM_COLS
    assert all(n > component_module.ROW_START_MAX_NUM_COLS for n in crossing), crossing


@pytest.mark.parametrize("case_lane", _CHECK_LANES, ids=lambda lane: lane.value)
def test_reference_equals_the_oracle_on_every_case(case_lane):
    """The reference against the independent oracle on every case of both lists (2-row versions)
    and on each case widened for row_start: a reference bug cannot hide on the reference path."""
    cpu = torch.device("cpu")
    for case in COMPONENT.cases(case_lane):
        batch = COMPONENT.build(_small(case) if case_lane is not Lane.CPU else case, cpu)
        for b in (batch, _widest_row_start(batch)):
            expected = component_module.oracle(**b.kwargs())
            assert_bitwise(expected, reference_topk(**b.kwargs()), f"{case.id}: reference vs oracle")
            assert_bitwise(oracle(**b.kwargs()), expected, f"{case.id}: component oracle vs test oracle")


@settings(max_examples=_EXAMPLES)
@given(batch=COMPONENT.strategy(Lane.CPU, torch.device("cpu")))
def test_property_reference_equals_the_oracle(batch):
    assert_bitwise(component_module.oracle(**batch.kwargs()), reference_topk(**batch.kwargs()), "reference")
