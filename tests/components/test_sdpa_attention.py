"""``batchinv.fast.sdpa_attention`` directly: SDPA's semantics, padding and phase invariance by
construction, one schedule with ``prefill_attention``, and the typed errors (the registry entry's
checks run in ``test_components.py``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from batchinv.fast.prefill_attention import prefill_attention
from batchinv.fast.sdpa_attention import sdpa_attention
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.reference.errors import ArgumentError, DTypeError
from batchinv.reference.sdpa_attention import sdpa_attention as reference

pytestmark = [pytest.mark.cpu, pytest.mark.gpu]
DEVICE = torch.device("cpu" if current_lane() is Lane.CPU else "cuda")
D = 16 if DEVICE.type == "cpu" else 64  # a head dim of the decode table on the lane


def _qkv(b, hq, hkv, lq, lk, d=D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, hq, d, generator=g).to(dtype).to(DEVICE).transpose(1, 2)  # HF's layout
    k = torch.randn(b, lk, hkv, d, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
    v = torch.randn(b, lk, hkv, d, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
    return q, k, v


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_matches_torch_sdpa_causal_and_masked_with_gqa():
    q, k, v = _qkv(2, 4, 2, 37, 37)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    got = sdpa_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert got.shape == want.shape and got.dtype == q.dtype
    assert (got.float() - want).abs().max() < 1e-5
    mask = torch.ones(2, 1, 37, 37, dtype=torch.bool, device=DEVICE).tril()
    mask[1, ..., :5] = False  # batch 1 left-padded by 5 keys (rows 0..4 see nothing: o = 0)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    got = sdpa_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert (got[1, :, 5:].float() - want[1, :, 5:]).abs().max() < 1e-5
    assert (got[0].float() - want[0]).abs().max() < 1e-5
    assert torch.equal(got[1, :, :5], torch.zeros_like(got[1, :, :5]))
    ref = reference(q, k, v, attn_mask=mask, enable_gqa=True)
    assert (got.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("pad", [1, 16, 17, 33, 70])
def test_left_and_right_padding_give_the_unpadded_bits(pad):
    q, k, v = _qkv(1, 4, 2, 37, 37, dtype=torch.bfloat16)
    alone = sdpa_attention(q, k, v, is_causal=True, enable_gqa=True)
    noise_q, noise_k, noise_v = _qkv(1, 4, 2, pad, pad, dtype=torch.bfloat16, seed=pad)
    total = 37 + pad
    left_mask = torch.ones(1, 1, total, total, dtype=torch.bool, device=DEVICE).tril()
    left_mask[..., :pad] = False
    left = sdpa_attention(
        torch.cat([noise_q, q], 2),
        torch.cat([noise_k * 100, k], 2),
        torch.cat([noise_v, v], 2),
        attn_mask=left_mask,
        enable_gqa=True,
    )
    right_mask = torch.zeros(1, 1, total, total, dtype=torch.bfloat16, device=DEVICE)
    right_mask[..., 37:] = torch.finfo(torch.bfloat16).min
    right_mask += torch.full((total, total), -math.inf, device=DEVICE).triu(1).to(torch.bfloat16)
    right = sdpa_attention(
        torch.cat([q, noise_q], 2),
        torch.cat([k, noise_k], 2),
        torch.cat([v, noise_v], 2),
        attn_mask=right_mask,
        enable_gqa=True,
    )
    assert torch.equal(_bits(left[:, :, pad:]), _bits(alone))
    assert torch.equal(_bits(right[:, :, :37]), _bits(alone))


def test_a_decode_step_gives_the_prefill_rows_bits():
    q, k, v = _qkv(2, 4, 2, 40, 40, dtype=torch.float16)
    prefill = sdpa_attention(q, k, v, is_causal=True, enable_gqa=True)
    for i in (0, 15, 16, 31, 32, 39):
        step = sdpa_attention(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], enable_gqa=True)
        assert torch.equal(_bits(step), _bits(prefill[:, :, i : i + 1])), i


def test_one_schedule_with_prefill_attention_over_a_paged_cache():
    """The same keys through the paged prefill launcher (page 16): the same bits, o for o."""
    q, k, v = _qkv(1, 4, 2, 45, 45, dtype=torch.bfloat16)
    dense = sdpa_attention(q, k, v, is_causal=True, enable_gqa=True)  # (1, Hq, 45, D)
    page = 16
    pages = -(-45 // page)
    k_cache = torch.zeros(pages, page, 2, D, dtype=torch.bfloat16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k_cache.view(-1, 2, D)[:45] = k[0].transpose(0, 1)
    v_cache.view(-1, 2, D)[:45] = v[0].transpose(0, 1)
    order = torch.arange(pages - 1, -1, -1)  # pages in reverse physical order
    table = order.to(torch.int32)[None].to(DEVICE)
    o, _ = prefill_attention(
        q[0].transpose(0, 1).contiguous(),
        k_cache[order.argsort()].contiguous(),
        v_cache[order.argsort()].contiguous(),
        table,
        torch.tensor([0, 45], dtype=torch.int32, device=DEVICE),
        torch.tensor([45], dtype=torch.int32, device=DEVICE),
    )
    assert torch.equal(_bits(o), _bits(dense[0].transpose(0, 1)))


def test_typed_errors_name_the_argument():
    q, k, v = _qkv(1, 4, 2, 4, 4)
    with pytest.raises(ArgumentError, match="'key'"):
        sdpa_attention(q, k, v)  # Hq != Hkv without enable_gqa
    with pytest.raises(DTypeError, match="'key'"):
        sdpa_attention(q, k.double(), v, enable_gqa=True)
    with pytest.raises(ArgumentError, match="'query'"):
        sdpa_attention(q[0], k, v, enable_gqa=True)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ArgumentError, match="'attn_mask'"):
        sdpa_attention(q, k, v, attn_mask=mask, is_causal=True, enable_gqa=True)
    with pytest.raises(ArgumentError, match="head dim 1"):
        sdpa_attention(q, k, v, attn_mask=mask.expand(1, 4, 4, 4), enable_gqa=True)
    gapped = mask.clone()
    gapped[..., 2, 1] = False
    with pytest.raises(ArgumentError, match="row 2"):
        sdpa_attention(q, k, v, attn_mask=gapped, enable_gqa=True)
    soft = torch.zeros(1, 1, 4, 4, device=DEVICE)
    soft[..., 0] = -1.0
    with pytest.raises(ArgumentError, match="additive values"):
        sdpa_attention(q, k, v, attn_mask=soft, enable_gqa=True)
    with pytest.raises(ArgumentError, match="'scale'"):
        sdpa_attention(q, k, v, scale=math.inf, enable_gqa=True)


def test_the_operator_gives_the_functions_bits_and_the_fake_its_shape():
    import batchinv.fast.enable.ops  # noqa: F401  (registers torch.ops.batchinv.sdpa)

    q, k, v = _qkv(2, 4, 2, 9, 9)
    out = torch.ops.batchinv.sdpa(q, k, v, None, True, None, True)
    assert out.shape == (2, 9, 4, D) and out.is_contiguous()
    assert torch.equal(out.transpose(1, 2), sdpa_attention(q, k, v, is_causal=True, enable_gqa=True))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert torch.ops.batchinv.sdpa(fq, fk, fv, None, True, None, True).shape == (2, 9, 4, D)


def test_masks_that_do_not_broadcast_over_the_rows_are_refused_and_empty_queries_are_empty():
    """(Found by a breaker: a mask of 3 rows against Lq = 1 was read as one row per batch entry.)"""
    q, k, v = _qkv(3, 2, 2, 1, 5)
    for shape in ((1, 1, 3, 5), (3, 5), (5,), ()):
        mask = torch.ones(shape, dtype=torch.bool, device=DEVICE)
        with pytest.raises(ArgumentError, match="'attn_mask'"):
            sdpa_attention(q, k, v, attn_mask=mask)
        with pytest.raises(ArgumentError, match="'attn_mask'"):
            reference(q, k, v, attn_mask=mask)
    with pytest.raises(DTypeError, match="'attn_mask'"):
        sdpa_attention(q, k, v, attn_mask=[[True] * 5])
    empty_q = q[:, :, :0]
    assert sdpa_attention(empty_q, k, v).shape == (3, 2, 0, D)
    assert reference(empty_q, k, v).shape == (3, 2, 0, D)


def test_a_nan_score_gives_nan_in_the_reference_as_in_the_kernel():
    q, k, v = _qkv(1, 1, 1, 2, 4)
    k[0, 0, 1, 2] = math.nan
    assert torch.isnan(reference(q, k, v)).all() and torch.isnan(sdpa_attention(q, k, v)).all()
