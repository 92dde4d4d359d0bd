"""Unpinned dense attention paths with SDPA's signature: the negative controls of the
``sdpa_attention`` component (above all of its ``padding`` check).

* :func:`torch_sdpa`: ``torch.nn.functional.scaled_dot_product_attention`` as torch dispatches
  it (flash / memory-efficient / cuDNN / math by shape and mask), its tiles at absolute key
  positions of the padded row.
* :func:`eager_pinned_matmul`: Hugging Face's ``eager`` attention (``q @ k^T``, the mask added, an
  fp32 softmax, ``probs @ v``) with every product and the softmax *pinned* inside
  ``batchinv.enable()``: batch-invariant and right-padding-invariant, but left padding moves a
  row's keys across the ``probs @ v`` product's fixed K tiles.
* :func:`absolute_splits`: the pinned kernel with its splits counted from key 0 of the padded
  row instead of the row's first visible key (what a FlashAttention-style kernel does): the
  padding before a row moves its split boundaries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchinv.fast.decode_attention import decode_attention_config
from batchinv.fast.device import arch, kernel_operand
from batchinv.fast.prefill_attention import KVLayout, PackedRows, launch_rows
from batchinv.fast.sdpa_attention import dense_table, row_ranges
from batchinv.reference.sdpa_attention import check_sdpa_arguments

__all__ = ["absolute_splits", "eager_pinned_matmul", "torch_sdpa"]


def torch_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as torch runs it (no pinning)."""
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )


def eager_pinned_matmul(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Hugging Face's eager attention inside ``batchinv.enable()``: pinned matmuls and softmax."""
    from batchinv.fast.enable import enable

    s = check_sdpa_arguments(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    group = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(group, dim=1)
    v = value.repeat_interleave(group, dim=1)
    lq, lk = query.shape[2], key.shape[2]
    if attn_mask is None:
        keys = torch.arange(lk, device=query.device)
        allowed = keys[None, :] <= torch.arange(lq, device=query.device)[:, None] if is_causal else None
        attn_mask = allowed
    additive = None
    if attn_mask is not None:
        low = torch.finfo(query.dtype).min
        additive = torch.where(attn_mask, 0.0, low) if attn_mask.dtype == torch.bool else attn_mask
        additive = additive.to(query.dtype)
    with enable():
        scores = torch.matmul(query, k.transpose(2, 3)) * s
        if additive is not None:
            scores = scores + additive
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(probs, v)


def absolute_splits(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """The pinned kernel with its splits at absolute positions of the padded row: each row lists
    the slots ``0 .. end - 1`` of its padded row as indices (its visible ones by position, the
    others -1, never attended), so its split boundaries are multiples of the split from key 0."""
    s = check_sdpa_arguments(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    b, hq, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    config = decode_attention_config(arch(query.device), d, query.dtype)
    start, end = (t.reshape(-1) for t in row_ranges(attn_mask, is_causal, b, lq, lk, query.device))
    slots = torch.arange(lk, device=query.device)
    visible = (slots[None, :] >= start[:, None]) & (slots[None, :] < end[:, None])
    indices = torch.where(visible, slots[None, :], -1).to(torch.int32).contiguous()  # (B * Lq, Lk)
    q = kernel_operand(query).transpose(1, 2).reshape(b * lq, hq, d)
    k, v = kernel_operand(key).contiguous(), kernel_operand(value).contiguous()
    batch_ids, table = dense_table(b, lk, hkv * lk, query.device)
    rows = PackedRows(
        request=batch_ids.repeat_interleave(lq).contiguous(), keys=(end - start).to(torch.int32)
    )
    o, _ = launch_rows(
        q if q.stride(-1) == 1 else q.contiguous(),
        k,
        v,
        KVLayout(1, (k.stride(2), 0, k.stride(1)), (v.stride(2), 0, v.stride(1))),
        table,
        torch.full((b,), lk, dtype=torch.int32, device=query.device),
        rows,
        indices,
        scale=s,
        num_kv_heads=hkv,
        max_tokens=lk,
        splits=max(1, -(-lk // config.split_tokens)),
        config=config,
    )
    return o.view(b, lq, hq, d).transpose(1, 2)
