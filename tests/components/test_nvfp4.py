"""The NVFP4 reference (``reference/nvfp4.py``) and the ``w4a16_nvfp4`` registry entry, on CPU.

Exact tests: every e2m1 code against a table written from the format's definition, the nibble
order, block-scale application, dequantization against a slow per-element loop in exact
rational arithmetic (e4m3 decoded from its bits here, not by torch), quantize -> dequantize on
the grid, round-to-nearest-even ties and saturation, the GEMM against exact integer sums, typed
errors; then the tolerance bound (the modelled kernel meets it, a folded global scale does
not) and the component's lane: sm100 only, reported "not run on this lane" elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction

import pytest
import torch
from lane_env import needs_cpu_lane_child

from batchinv.fast import w4a16_nvfp4 as fast_nvfp4
from batchinv.harness.components import w4a16_nvfp4 as component
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import COMPONENT_MODULES, get
from batchinv.harness.sweep import plan, run_sweep
from batchinv.reference import nvfp4
from batchinv.reference.errors import ArgumentError, DTypeError, NotBuiltError

pytestmark = pytest.mark.cpu

#: e2m1 (OCP MX v1.0, section 5.3.3: 1 sign, 2 exponent bits with bias 1, 1 mantissa bit; no
#: inf/NaN), written out code by code: s e1 e0 m -> value.
E2M1_TABLE: dict[int, float] = {
    0b0000: 0.0,  # exponent 0: subnormal, 0.m * 2**0
    0b0001: 0.5,
    0b0010: 1.0,  # 1.0 * 2**(1-1)
    0b0011: 1.5,
    0b0100: 2.0,  # 1.0 * 2**(2-1)
    0b0101: 3.0,
    0b0110: 4.0,  # 1.0 * 2**(3-1)
    0b0111: 6.0,
    0b1000: -0.0,
    0b1001: -0.5,
    0b1010: -1.0,
    0b1011: -1.5,
    0b1100: -2.0,
    0b1101: -3.0,
    0b1110: -4.0,
    0b1111: -6.0,
}


def _e4m3_fraction(byte: int) -> Fraction:
    """float8_e4m3fn from its bits (1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
    exponent 0 subnormal; 0x7f / 0xff NaN, excluded by the callers), as an exact fraction."""
    assert byte & 0x7F != 0x7F
    sign = -1 if byte & 0x80 else 1
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return sign * Fraction(mantissa, 8) * Fraction(1, 2**6)
    return sign * (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


def _e4m3(values: list[float]) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32).to(torch.float8_e4m3fn)
    assert t.to(torch.float32).tolist() == values  # exact e4m3 values only
    return t


def _g(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _random_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random packed codes, random non-NaN e4m3 bytes (both signs, subnormals), a random fp32 global scale."""
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    scale_bytes = torch.randint(0, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)
    scale_bytes |= torch.randint(0, 2, (n, k // 16), generator=gen, dtype=torch.uint8) << 7
    g = torch.rand((), generator=gen, dtype=torch.float32) * 3 + 2.0**-20
    return packed, scale_bytes.view(torch.float8_e4m3fn), g


def test_every_e2m1_code_decodes_to_the_format_value():
    codes = torch.arange(16, dtype=torch.uint8)
    values = nvfp4.decode_e2m1(codes)
    assert values.dtype == torch.float64
    for code, expected in E2M1_TABLE.items():
        got = float(values[code])
        assert got == expected, (code, got, expected)
        assert (str(got)[0] == "-") == (str(expected)[0] == "-"), f"sign of zero for code {code:04b}"
    assert nvfp4.E2M1_MAGNITUDES == tuple(E2M1_TABLE[c] for c in range(8))


def test_nibble_order_low_nibble_is_the_even_k():
    packed = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8)
    assert nvfp4.unpack_e2m1(packed).tolist() == [[0x1, 0x2, 0x7, 0xF]]
    w = nvfp4.dequantize_nvfp4(
        torch.tensor([[0x21] + [0] * 7], dtype=torch.uint8), _e4m3([1.0]).reshape(1, 1), _g(1.0)
    )
    assert w[0, :2].tolist() == [0.5, 1.0]  # k = 0: low nibble (0x1 = 0.5); k = 1: high (0x2 = 1.0)


def test_pack_unpack_round_trip():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (7, 64), generator=gen, dtype=torch.uint8)
    packed = nvfp4.pack_e2m1(codes)
    assert packed.shape == (7, 32) and packed.dtype == torch.uint8
    assert torch.equal(nvfp4.unpack_e2m1(packed), codes)
    raw = torch.randint(0, 256, (5, 24), generator=gen, dtype=torch.uint8)
    assert torch.equal(nvfp4.pack_e2m1(nvfp4.unpack_e2m1(raw)), raw)


def test_block_scale_applies_to_its_16_elements_only():
    codes = torch.tensor([list(range(16)) * 2], dtype=torch.uint8)  # one row, two blocks
    packed = nvfp4.pack_e2m1(codes)
    w = nvfp4.dequantize_nvfp4(packed, _e4m3([16.0, 1.0]).reshape(1, 2), _g(0.25))
    expected = [E2M1_TABLE[c] * 16.0 * 0.25 for c in range(16)] + [E2M1_TABLE[c] * 0.25 for c in range(16)]
    assert w.dtype == torch.float64 and w[0].tolist() == expected


def test_dequantize_matches_a_slow_exact_loop():
    n, k = 5, 48
    packed, scales, g = _random_weight(n, k, seed=11)
    w = nvfp4.dequantize_nvfp4(packed, scales, g)
    scale_bytes = scales.view(torch.uint8)
    g_exact = Fraction(float(g))
    for row in range(n):
        for col in range(k):
            byte = int(packed[row, col // 2])
            code = byte & 0xF if col % 2 == 0 else byte >> 4
            exact = Fraction(E2M1_TABLE[code]) * _e4m3_fraction(int(scale_bytes[row, col // 16])) * g_exact
            assert Fraction(float(w[row, col])) == exact, (row, col)


def test_nan_block_scale_makes_its_block_nan():
    scales = torch.tensor([[0x7F, 0x38]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # NaN, 1.0
    w = nvfp4.dequantize_nvfp4(torch.full((1, 16), 0x22, dtype=torch.uint8), scales, _g(1.0))
    assert torch.isnan(w[0, :16]).all() and w[0, 16:].tolist() == [1.0] * 16


def _on_grid(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes and positive e4m3 scales whose blocks each hold a +-6 (so amax / 6 is the scale),
    and a few zero blocks (scale 0, codes +-0)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    blocks = codes.view(n, k // 16, 16)
    where = torch.randint(0, 16, (n, k // 16), generator=gen)
    sixes = torch.where(torch.rand(n, k // 16, generator=gen) < 0.5, 0x7, 0xF).to(torch.uint8)
    blocks.scatter_(2, where[:, :, None], sixes[:, :, None])
    scale_bytes = torch.randint(1, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)
    scale_bytes[0, 0] = 0
    blocks[0, 0] &= 0x8  # +-0 codes in the zero-scale block
    return nvfp4.pack_e2m1(codes), scale_bytes.view(torch.float8_e4m3fn), _g(0.0078125 * 3)


def test_quantize_dequantize_round_trips_on_the_grid():
    packed, scales, g = _on_grid(6, 64, seed=5)
    w = nvfp4.dequantize_nvfp4(packed, scales, g)
    packed2, scales2, g2 = nvfp4.quantize_nvfp4(w, g)
    assert torch.equal(packed2, packed)
    assert torch.equal(scales2.view(torch.uint8), scales.view(torch.uint8))
    assert g2.dtype == torch.float32 and float(g2) == float(g)
    assert torch.equal(nvfp4.dequantize_nvfp4(packed2, scales2, g2), w)


def test_quantize_rounds_ties_to_even_and_saturates():
    # Scale 1.0 (amax 6), global 1: the e2m1 midpoints go to the even code.
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.2500001, 4.9999, 0.0, -0.0, 1.0, 3.0]
    packed, scales, _ = nvfp4.quantize_nvfp4(torch.tensor([row], dtype=torch.float64), _g(1.0))
    assert scales.to(torch.float32).tolist() == [[1.0]]
    got = nvfp4.decode_e2m1(nvfp4.unpack_e2m1(packed))[0].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0, 0.5, 4.0, 0.0, -0.0, 1.0, 3.0]
    # amax / 6 = 1.0625: the e4m3 tie between 1.0 (even code 0x38) and 1.125 goes to 1.0; the
    # element 6.375 then saturates at 6.
    packed, scales, _ = nvfp4.quantize_nvfp4(torch.tensor([[6.375] + [0.0] * 15]), _g(1.0))
    assert scales.to(torch.float32).tolist() == [[1.0]]
    assert float(nvfp4.decode_e2m1(nvfp4.unpack_e2m1(packed))[0, 0]) == 6.0
    # amax / 6 = 7/6 -> e4m3 1.125; 7 / 1.125 = 6.2 saturates to 6 (6.75 after dequantization)
    packed, scales, g = nvfp4.quantize_nvfp4(torch.tensor([[-7.0] + [1.0] * 15]), _g(1.0))
    assert scales.to(torch.float32).tolist() == [[1.125]]
    assert float(nvfp4.dequantize_nvfp4(packed, scales, g)[0, 0]) == -6.75
    # A block scale above 448 saturates at 448.
    _, scales, _ = nvfp4.quantize_nvfp4(torch.tensor([[6.0 * 1000] + [0.0] * 15]), _g(1.0))
    assert scales.to(torch.float32).tolist() == [[448.0]]


def test_default_global_scale_fits_the_largest_block_scale():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    packed, scales, g = nvfp4.quantize_nvfp4(w)
    amax = float(w.abs().max())
    assert float(g) == float(torch.tensor(amax / (6 * 448), dtype=torch.float32))
    assert float(scales.to(torch.float32).max()) == 448.0
    err = (nvfp4.dequantize_nvfp4(packed, scales, g) - w).abs()
    assert float(err.max()) <= amax / 6  # at most half the widest e2m1 gap (2) of the top block
    zero = nvfp4.quantize_nvfp4(torch.zeros(2, 16))
    assert float(zero[2]) == 1.0 and not zero[0].any()


def test_gemm_is_exact_for_integer_inputs():
    m, n, k = 5, 6, 48
    gen = torch.Generator().manual_seed(9)
    x = torch.randint(-20, 21, (m, k), generator=gen).to(torch.bfloat16)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scale_values = [1.0, 2.0, 3.0, 16.0, 0.5]
    pick = torch.randint(0, len(scale_values), (n, k // 16), generator=gen)
    scales = _e4m3([scale_values[i] for i in pick.flatten().tolist()]).reshape(n, k // 16)
    bias = torch.randint(-50, 51, (n,), generator=gen).to(torch.float32)
    g = 0.125
    out = nvfp4.w4a16_nvfp4_matmul(x, nvfp4.pack_e2m1(codes), scales, _g(g), bias, out_dtype=torch.float32)
    assert out.dtype == torch.float64 and out.shape == (m, n)
    for i in range(m):
        for j in range(n):
            exact = Fraction(float(bias[j])) + sum(
                Fraction(float(x[i, kk]))
                * Fraction(E2M1_TABLE[int(codes[j, kk])])
                * Fraction(scale_values[int(pick[j, kk // 16])])
                * Fraction(g)
                for kk in range(k)
            )
            assert Fraction(float(out[i, j])) == exact, (i, j)


@pytest.mark.parametrize("error_case", component.error_cases(torch.device("cpu")), ids=lambda e: e.name)
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_bad_input_raises_a_typed_error_naming_the_argument(error_case, impl):
    """The component's error inputs, against the reference and the fast callable (which
    validates before it reports that it is not built): run here, since the component's own
    registry tests run only on sm100."""
    fn = nvfp4.w4a16_nvfp4_matmul if impl == "reference" else fast_nvfp4.w4a16_nvfp4_matmul
    assert impl in error_case.applies_to
    with pytest.raises(error_case.error, match=error_case.match):
        fn(**error_case.kwargs)


def test_weight_helpers_raise_typed_errors():
    good_scales = torch.zeros(4, 2, dtype=torch.float8_e4m3fn)
    with pytest.raises(ArgumentError, match=r"'packed'.*multiple of 16"):
        nvfp4.dequantize_nvfp4(torch.zeros(4, 12, dtype=torch.uint8), good_scales, _g(1.0))
    with pytest.raises(ArgumentError, match=r"'block_scales'.*\[4, 2\]"):
        nvfp4.dequantize_nvfp4(
            torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 1).to(torch.float8_e4m3fn), _g(1.0)
        )
    with pytest.raises(DTypeError, match="'block_scales'"):
        nvfp4.dequantize_nvfp4(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2), _g(1.0))
    with pytest.raises(ArgumentError, match=r"'global_scale'.*> 0"):
        nvfp4.dequantize_nvfp4(torch.zeros(4, 16, dtype=torch.uint8), good_scales, _g(float("inf")))
    with pytest.raises(ArgumentError, match=r"'w'.*even K"):
        nvfp4.quantize_nvfp4(torch.zeros(2, 33))
    with pytest.raises(ArgumentError, match=r"'w'.*multiple of 16"):
        nvfp4.quantize_nvfp4(torch.zeros(2, 40))
    with pytest.raises(ArgumentError, match=r"'w'.*finite"):
        nvfp4.quantize_nvfp4(torch.full((2, 16), float("nan")))
    with pytest.raises(DTypeError, match="'global_scale'"):
        nvfp4.quantize_nvfp4(torch.zeros(2, 16), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ArgumentError, match=r"'codes'.*even K"):
        nvfp4.pack_e2m1(torch.zeros(2, 3, dtype=torch.uint8))


def test_fast_is_not_built_and_says_so():
    batch = component.build(component.cases(Lane.CPU)[0], torch.device("cpu"))
    with pytest.raises(NotBuiltError, match=r"not built.*sm100") as info:
        fast_nvfp4.w4a16_nvfp4_matmul(**batch.kwargs())
    assert isinstance(info.value, NotImplementedError)
    baseline = get("w4a16_nvfp4").baseline("flashinfer_cute_dsl_autotuned")
    with pytest.raises(NotBuiltError):
        baseline.fn(**batch.kwargs())


def _model_kernel(batch, *, fold_global_scale: bool = False) -> torch.Tensor:
    """The kernel the bound models: e2m1 * e4m3 in x's dtype, fp32 accumulation, the global
    scale on the fp32 accumulator, fp32 bias, one rounding.  ``fold_global_scale``: the
    downgrade that rounds ``e2m1 * e4m3 * g`` to x's dtype per weight instead."""
    x, s = batch.rows["x"], batch.shared
    g = float(s["global_scale"])
    w = nvfp4.dequantize_nvfp4(s["packed"], s["block_scales"], s["global_scale"])  # exact
    v = (w if fold_global_scale else w / g).to(x.dtype)  # w / g exact: e2m1 * e4m3
    acc = x.float() @ v.float().t()
    if not fold_global_scale:
        acc = acc * s["global_scale"]
    if s["bias"] is not None:
        acc = acc + s["bias"].float()
    return acc.to(s["out_dtype"] or x.dtype)


@pytest.mark.parametrize("case", component.cases(Lane.CPU), ids=lambda c: c.id)
def test_the_modelled_kernel_meets_the_bound(case):
    batch = component.build(case, torch.device("cpu"))
    ref = nvfp4.w4a16_nvfp4_matmul(**batch.kwargs())
    bound = component.bound(batch, (ref,))[0]
    out = _model_kernel(batch)
    assert out.dtype == component.COMPONENT.agreement.out_dtypes(batch)[0]
    assert bool(((out.double() - ref).abs() <= bound).all())


def test_a_global_scale_folded_into_16_bit_weights_exceeds_the_bound():
    """The bound's negative control: rounding e2m1 * e4m3 * g to fp16 per weight (2**-11 of
    each product) is far above fp32 accumulation's error with a fp32 output."""
    case = next(c for c in component.cases(Lane.CPU) if c.axes["out"] == "fp32")
    batch = component.build(case, torch.device("cpu"))
    ref = nvfp4.w4a16_nvfp4_matmul(**batch.kwargs())
    bound = component.bound(batch, (ref,))[0]
    out = _model_kernel(batch, fold_global_scale=True)
    assert bool(((out.double() - ref).abs() > bound).any())


def test_component_runs_on_sm100_only_and_is_registered():
    comp = get("w4a16_nvfp4")
    # Registered, at any position: COMPONENT_MODULES' order is only the order components are
    # listed in (sweep tables and report, ``batchinv list``, registry test ids); an sm100-only
    # component has no task off its lane wherever it sits, so a new component may be appended.
    assert "w4a16_nvfp4" in COMPONENT_MODULES
    assert comp.lanes == frozenset({Lane.SM100})
    assert all(b.lanes <= comp.lanes for b in comp.baselines)
    assert plan([comp], Lane.CPU) == [] and plan([comp], Lane.SM90) == []
    assert plan([comp], Lane.SM100)  # its checks exist on its own lane


def test_sweep_off_its_lane_reports_it_not_run_and_passes():
    comp = get("w4a16_nvfp4")
    outcome = run_sweep([comp], Lane.CPU)
    assert outcome.ok and not outcome.checks and not outcome.controls
    assert outcome.not_on_lane == [("w4a16_nvfp4", ("sm100",))]
    assert outcome.summary()["not_on_lane"] == [{"component": "w4a16_nvfp4", "lanes": ["sm100"]}]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchinv.harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "250"},
    )


@needs_cpu_lane_child
def test_cli_lists_its_lane_and_sweep_reports_not_run_on_this_lane(tmp_path):
    listed = _cli("list", "w4a16_nvfp4", "--lane", "cpu", "--no-entry-points")
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if "w4a16_nvfp4" in ln)
    assert "sm100" in line
    swept = _cli(
        "sweep", "w4a16_nvfp4", "--lane", "cpu", "--no-progress", "--report", str(tmp_path / "r.jsonl")
    )
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "w4a16_nvfp4: not run on this lane (cpu); it runs on sm100" in swept.stdout
