"""The bit-pattern catalogue: values checked against independent constructions (struct, IEEE
constants), not against the catalogue itself."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from batchinv.harness.bitpatterns import catalogue, from_bits, inject, pattern, to_bits


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_catalogue_round_trips_raw_bits(dtype):
    for p in catalogue(dtype):
        assert int(to_bits(p.tensor().reshape(1))[0]) == p.bits, p.name


def test_fp32_values_match_ieee_constants():
    assert pattern(torch.float32, "+min_subnormal").tensor().item() == _f32(1) == 2.0**-149
    assert pattern(torch.float32, "+max_subnormal").tensor().item() == (1 - 2.0**-23) * 2.0**-126
    assert pattern(torch.float32, "+min_normal").tensor().item() == 2.0**-126
    assert pattern(torch.float32, "+max_normal").tensor().item() == torch.finfo(torch.float32).max
    assert pattern(torch.float32, "-inf").tensor().item() == -math.inf
    assert math.copysign(1.0, pattern(torch.float32, "-0").tensor().item()) == -1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_formats_match_finfo(dtype):
    info = torch.finfo(dtype)
    assert pattern(dtype, "+max_normal").tensor().item() == info.max
    assert pattern(dtype, "+min_normal").tensor().item() == info.tiny
    assert pattern(dtype, "+min_subnormal").tensor().item() == info.smallest_normal * info.eps


def test_nan_classes_keep_their_bits():
    for name, bits in [
        ("+signalling_nan", 0x7F800001),
        ("-signalling_nan", 0xFF800001),
        ("+quiet_nan", 0x7FC00000),
        ("all_ones_nan", 0xFFFFFFFF),
        ("all_ones_minus_one_nan", 0xFFFFFFFE),
    ]:
        p = pattern(torch.float32, name)
        assert p.bits == bits and p.is_nan
        assert math.isnan(p.tensor().item())
    assert not pattern(torch.float32, "+inf").is_nan


def test_inject_is_sparse_seeded_and_bit_exact():
    background = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    snan = pattern(torch.float32, "+signalling_nan")
    a = inject(background, [snan], 0.05, torch.Generator().manual_seed(1))
    b = inject(background, [snan], 0.05, torch.Generator().manual_seed(1))
    assert torch.equal(to_bits(a), to_bits(b))
    hit = to_bits(a) == snan.bits
    assert 0.02 < hit.float().mean().item() < 0.08
    assert torch.equal(a[~hit], background[~hit])


def test_from_bits_rejects_unknown_dtype():
    with pytest.raises(TypeError, match="dtype"):
        from_bits([0], torch.int32)
