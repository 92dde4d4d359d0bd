"""fp8_quant beyond the generic registry tests: the e4m3 rounding (reference and kernel) against
an independent enumeration of the e4m3fn grid, the scale formula, the NaN / inf / -0 rules,
every launch config of a segment giving the shipped bits, the negative control's mechanism,
and a property test."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from batchinv.fast import fp8_quant as fast
from batchinv.fast.baselines.fp8_quant import fp8_quant_per_tensor_dynamic
from batchinv.harness.components import fp8_quant as component
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, get
from batchinv.reference import fp8_quant as reference

pytestmark = pytest.mark.cpu
COMP = get("fp8_quant")


# --- an independent e4m3fn model: decode every code from its bits, round by nearest search ----


def decode_e4m3fn(code: int) -> float:
    """The value of e4m3fn ``code`` from the OCP spec: S.EEEE.MMM, bias 7, no infinities, only
    S.1111.111 is NaN, exponent field 0 subnormal (m / 8 * 2^-6)."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * m / 8 * 2.0**-6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


#: (value, code) of the 127 nonnegative finite codes, ascending.
GRID = [(decode_e4m3fn(c), c) for c in range(0x7F)]


def nearest_code(v: float) -> int:
    """e4m3fn bits of ``v`` by exhaustive nearest search over :data:`GRID` (ties: the even
    code), saturating at 448, NaN -> 0x7F, the sign bit kept."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    if math.isnan(v):
        return sign | 0x7F
    a = abs(v)
    if a >= 448.0:
        return sign | 0x7E
    best = min(GRID, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return sign | best[1]


def probe_values() -> torch.Tensor:
    """fp32 values probing every rounding boundary: each grid value, each midpoint between
    adjacent grid values and the fp32 values just below and above it, both signs, values past
    448 (464, the midpoint to the would-be 480, and beyond), the subnormal range's edges, and
    random values over the whole range."""
    grid = torch.tensor([v for v, _ in GRID], dtype=torch.float64)
    mids = ((grid[1:] + grid[:-1]) / 2).to(torch.float32)
    below = torch.nextafter(mids, torch.zeros_like(mids))
    above = torch.nextafter(mids, torch.full_like(mids, math.inf))
    extra = torch.tensor(
        [
            448.0,
            449.0,
            463.99,
            464.0,
            464.01,
            479.0,
            480.0,
            500.0,
            1e30,
            3.0e38,
            2.0**-10,
            2.0**-11,
            1e-30,
            1e-45,
        ]
    )
    g = torch.Generator().manual_seed(11)
    rand = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-14, 9, (4000,), generator=g).float())
    rand = rand[rand.abs() < 448]
    pos = torch.cat([grid.to(torch.float32), mids, below, above, extra, rand.abs()])
    return torch.cat([pos, -pos])


def test_the_independent_decoding_matches_torch():
    codes = torch.arange(256, dtype=torch.uint8)
    torch_values = codes.view(torch.float8_e4m3fn).to(torch.float64).tolist()
    for c, tv in enumerate(torch_values):
        mine = decode_e4m3fn(c)
        assert (math.isnan(mine) and math.isnan(tv)) or (
            mine == tv and math.copysign(1, mine) == math.copysign(1, tv)
        )


def test_torch_round_is_half_to_even():
    """The reference's rounding relies on it."""
    assert torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5], dtype=torch.float64)).tolist() == [
        0.0,
        2.0,
        2.0,
        -0.0,
        -2.0,
    ]


def test_reference_rounding_matches_the_enumeration_on_every_boundary():
    v = probe_values()
    got = reference.e4m3_rne_satfinite(v).tolist()
    want = [nearest_code(x) for x in v.tolist()]
    bad = [(x, g, w) for x, g, w in zip(v.tolist(), got, want, strict=True) if g != w]
    assert not bad, bad[:10]


def test_reference_rounding_fixed_points():
    """Each of the 256 codes' values rounds to itself (0x7F / 0xFF NaNs to the NaN of their
    sign); ties go to the even code; 464 and beyond saturate; the edges of the subnormal range."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(reference.e4m3_rne_satfinite(values), codes)
    r = reference.e4m3_rne_satfinite
    cases = {
        2.0**-10: 0x00,  # half the smallest subnormal: the tie between 0 and 2^-9 goes to 0
        float(np.nextafter(np.float32(2.0**-10), np.float32(1))): 0x01,
        3 * 2.0**-10: 0x02,  # between codes 1 and 2: even
        15 * 2.0**-10: 0x08,  # between 7 * 2^-9 and 2^-6 (code 8, the smallest normal): even
        1.0625: 0x38,  # between 1.0 (0x38) and 1.125 (0x39): even
        1.1875: 0x3A,  # between 1.125 (0x39) and 1.25 (0x3A): even
        432.0: 0x7E,  # between 416 (0x7D) and 448 (0x7E): even
        464.0: 0x7E,  # between 448 and the would-be 480: even (and saturated anyway)
        464.01: 0x7E,  # past it: saturated, not NaN
        math.inf: 0x7E,
        -math.inf: 0xFE,
        -0.0: 0x80,
        -1e-30: 0x80,  # negative values rounding to zero keep the sign
        math.nan: 0x7F,
    }
    for value, code in cases.items():
        assert int(r(torch.tensor([value], dtype=torch.float64))[0]) == code, value
    neg_nan = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32)  # sign bit set, quiet
    assert int(r(neg_nan)[0]) == 0xFF


def test_reference_rounding_agrees_with_torch_in_range():
    """torch's own fp32 -> e4m3fn cast agrees below 448.  (Past it torch 2.13 saturates too;
    earlier releases returned NaN from 480 on and for +-inf: the reference does not use the cast.)"""
    v = probe_values()
    v = v[v.abs() < 448]
    assert torch.equal(reference.e4m3_rne_satfinite(v), v.to(torch.float8_e4m3fn).view(torch.uint8))


def _unit_scale_rows(values: torch.Tensor) -> torch.Tensor:
    """fp32 rows each led by 448: the scale is exactly 1 and x / scale = x, so q is the kernel's
    e4m3 rounding of x itself."""
    n = values.numel()
    width = 256
    rows = -(n // -(width - 1))
    x = torch.zeros(rows * (width - 1), dtype=torch.float32)
    x[:n] = values
    x = x.reshape(rows, width - 1)
    return torch.cat([torch.full((rows, 1), 448.0), x], dim=1)


def test_kernel_rounding_matches_the_enumeration():
    v = probe_values()
    v = v[v.abs() <= 448]  # a finite value past 448 would raise the row's amax
    specials = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0])
    payloads = torch.tensor([0x7F800001, 0x7FFFFFFF, -1, -0x7FFFFF], dtype=torch.int32).view(torch.float32)
    v = torch.cat([v, specials, payloads])
    x = _unit_scale_rows(v)
    q, scale = fast.fp8_quant(x)
    assert bool((scale == 1.0).all())
    got = q.view(torch.uint8)[:, 1:].reshape(-1)[: v.numel()].tolist()
    want = [nearest_code(t) for t in v.tolist()]
    bad = [(t, g, w) for t, g, w in zip(v.tolist(), got, want, strict=True) if g != w]
    assert not bad, bad[:10]


def test_scale_formula():
    """scale = fl32(max(amax, 2^-64) / 448) with amax over the finite elements, against numpy's
    fp32 division; an all-zero row gives the floor's scale and q = +-0 with the sign kept."""
    x = torch.tensor(
        [
            [3.0, -1.0, math.nan, math.inf, 0.5, 0.0, 0.0, 0.0],
            [0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0],
            [math.nan, math.inf, -math.inf, 0.0, -0.0, math.nan, 0.0, 0.0],
            [1e-3, -7.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        ]
    )
    q, scale = fast.fp8_quant(x)
    rq, rscale = reference.fp8_quant(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(scale, rscale)
    f32 = np.float32
    floor = f32(2.0**-64) / f32(448.0)
    expected = [f32(3.0) / f32(448.0), floor, floor, f32(7.0) / f32(448.0)]
    assert scale[:, 0].tolist() == [float(e) for e in expected]
    assert floor > 0 and float(floor) >= 2.0**-126  # a normal fp32
    bits = q.view(torch.uint8)
    assert bits[1].tolist() == [0x00, 0x80] * 4  # +-0 kept
    assert bits[2, :6].tolist() == [0x7F, 0x7E, 0xFE, 0x00, 0x80, 0x7F]  # NaN, +-448, +-0
    assert bits[0, 3] == 0x7E and bits[0, 1] & 0x80  # +inf saturates; the row's scale ignores it


def test_group_scales_read_their_own_group_and_the_short_last_group():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 300, generator=g)
    x[:, 256:] *= 1e-3  # the short last group (44 columns) is much smaller
    q, scale = fast.fp8_quant(x, group_size=128)
    assert scale.shape == (3, 3) and q.shape == (3, 300) and q.dtype == torch.float8_e4m3fn
    for j, (lo, hi) in enumerate([(0, 128), (128, 256), (256, 300)]):
        amax = x[:, lo:hi].abs().amax(dim=1).numpy()
        assert scale[:, j].numpy().tolist() == (amax / np.float32(448.0)).tolist()
    rq, rscale = reference.fp8_quant(x, group_size=128)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(scale, rscale)
    # a group larger than K is one group per row: the per-token result
    q1, s1 = fast.fp8_quant(x, group_size=512)
    q0, s0 = fast.fp8_quant(x)
    assert torch.equal(q1.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s1, s0)


def test_a_group_far_longer_than_k_is_one_group_without_padding_to_it():
    """``group_size`` 2**40 on a K of 300 (valid: one group of K per row).  The reference padded
    every row to the group size (``[M, 2**40]`` fp64: an allocation failure, a crash on a valid
    input); both paths now give the per-token result."""
    x = torch.randn(3, 300, generator=torch.Generator().manual_seed(5))
    q0, s0 = reference.fp8_quant(x)
    for fn in (reference.fp8_quant, fast.fp8_quant):
        q, s = fn(x, group_size=2**40)
        assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)


def test_dequantization_is_close():
    """x ~= q * scale within half an e4m3 spacing (relative 2^-4) plus the subnormal quantum."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 512, generator=g).to(torch.bfloat16)
    q, scale = fast.fp8_quant(x, group_size=128)
    deq = q.to(torch.float64) * scale.to(torch.float64).repeat_interleave(128, dim=1)
    x64 = x.to(torch.float64)
    slack = x64.abs() * 2.0**-4 * 1.0001 + scale.to(torch.float64).repeat_interleave(128, dim=1) * 2.0**-10
    assert bool(((deq - x64).abs() <= slack).all())


@pytest.mark.parametrize(("k", "group"), [(600, None), (300, 128), (96, 16), (130, None)])
def test_every_config_of_a_segment_gives_the_shipped_bits(k, group):
    """The config is keyed on (arch, segment length) only; any other block_m / block_k (one
    chunk or several) must give the same bits, since the max is exact and the rest elementwise."""
    g = torch.Generator().manual_seed(k)
    x = component.make_rows(torch.bfloat16, 11, k, group, "specials", g)
    want = fast.fp8_quant(x, group_size=group)
    seg = k if group is None else min(group, k)
    for block_m, block_k in ((1, 1 << (seg - 1).bit_length()), (4, 32), (16, 64)):
        got = fast.launch(x, group, fast.QuantConfig(block_m=block_m, block_k=block_k, num_warps=4))
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)), (block_m, block_k)
        assert torch.equal(got[1], want[1]), (block_m, block_k)


def test_the_config_never_reads_m():
    assert list(inspect.signature(fast.config_for).parameters) == ["arch_name", "seg_len"]
    assert fast.config_for("sm90", 7168).single_chunk(7168)
    assert not fast.config_for("interp", 600).single_chunk(600)  # the cpu lane runs the chunked path


def test_the_cpu_cases_cover_ties_saturation_by_scale_rounding_and_specials():
    """The cases hold quotients exactly on e4m3 midpoints, groups whose amax / scale exceeds 448
    (the scale rounded down), NaN, +-inf, -0 and input subnormals."""
    grid = component.e4m3_grid()
    mids = set(((grid[1:] + grid[:-1]) / 2).tolist())
    ties = over = nan = inf = negzero = sub = 0
    for case in COMP.cases(Lane.CPU):
        batch = COMP.build(case, torch.device("cpu"))
        x = batch.rows["x"]
        group = batch.shared["group_size"]
        _, scale = reference.fp8_quant(x, group_size=group)
        k = x.shape[1]
        s = scale.to(torch.float64).repeat_interleave(k if group is None else group, dim=1)[:, :k]
        quot = (x.to(torch.float64) / s).to(torch.float32).to(torch.float64)
        ties += sum(1 for v in quot.abs().flatten().tolist() if v in mids)
        finite = torch.isfinite(x)
        over += int(((quot.abs() > 448) & finite).sum())
        nan += int(x.isnan().sum())
        inf += int(x.isinf().sum())
        negzero += int(((x == 0) & torch.signbit(x)).sum())
        tiny = torch.finfo(x.dtype).tiny
        sub += int(((x != 0) & (x.abs() < tiny)).sum())
    assert min(ties, over, nan, inf, negzero, sub) > 0, (ties, over, nan, inf, negzero, sub)


def test_gpu_lane_cases_have_the_production_shapes():
    ks = {c.axes["k"] for c in COMP.cases(Lane.SM90)}
    assert {2048, 4096, 7168} <= ks
    assert {None, 128} <= {c.axes["group"] for c in COMP.cases(Lane.SM90)}
    bench = COMP.bench_cases(Lane.SM90)
    assert {(c.axes["rows"], c.axes["k"]) for c in bench} == {
        (m, k) for m in (1, 32, 512, 4096) for k in (4096, 7168)
    }


def test_bench_bytes():
    x = torch.zeros(4, 300, dtype=torch.bfloat16)
    assert COMP.bench_bytes is not None
    assert COMP.bench_bytes(Batch({"x": x}, {"group_size": 128})) == 4 * 300 * 2 + 4 * 300 + 4 * 4 * 3
    assert COMP.bench_bytes(Batch({"x": x}, {"group_size": None})) == 4 * 300 * 2 + 4 * 300 + 4 * 4


def test_the_per_tensor_baseline_scales_a_token_by_its_neighbours():
    """The negative control's mechanism: a small token alone and beside a large one gets other
    scales and other q bits (the registry's negative control finds it through batch_prefix)."""
    x = torch.tensor([[1.0, 0.3, -0.7, 0.01], [1000.0, 1.0, 2.0, 3.0]])
    alone = fp8_quant_per_tensor_dynamic(x[:1])
    both = fp8_quant_per_tensor_dynamic(x)
    assert alone[1].item() != both[1][0].item()
    assert not torch.equal(alone[0].view(torch.uint8), both[0][:1].view(torch.uint8))
    fast_alone, fast_both = fast.fp8_quant(x[:1]), fast.fp8_quant(x)
    assert torch.equal(fast_alone[0].view(torch.uint8), fast_both[0][:1].view(torch.uint8))


def test_property_agreement_and_row_locality():
    from hypothesis import HealthCheck, given, settings

    from batchinv.harness.compare import compare_bitwise

    assert COMP.strategy is not None

    @settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(COMP.strategy(Lane.CPU, torch.device("cpu")))
    def prop(batch: Batch) -> None:
        out = COMP.fast(**batch.kwargs())
        ref = COMP.reference(**batch.kwargs())
        for o, r in zip(out, ref, strict=True):
            assert compare_bitwise(r, o).equal, compare_bitwise(r, o)
        i = batch.num_rows // 2
        alone = COMP.fast(**batch.take([i]).kwargs())
        for o, a in zip(out, alone, strict=True):
            assert compare_bitwise(o[i : i + 1], a).equal

    prop()


def test_no_reference_uses_cuda_pow():
    """References run on the GPU lane's device: CUDA's ``torch.pow`` (and ``exp2``, ``ldexp``) is not
    correctly rounded, and an e4m3 grid spacing off by an ulp moved exact ties of fp8_quant's
    reference on the H200 (run 39).  Powers of two come from ``reference.exact.power_of_two``."""
    import pathlib

    import batchinv.reference

    root = pathlib.Path(batchinv.reference.__file__).parent
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(root.glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(f"torch.{fn}(" in line for fn in ("pow", "exp2", "ldexp"))
        and not line.lstrip().startswith("#")
    ]
    assert offenders == [], offenders
