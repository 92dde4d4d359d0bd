"""Unpinned decode-attention baselines (negative controls) beside the pinned kernel.

* :func:`batch_planned_splits`: the same split-KV kernel, with the number of splits planned from
  the batch as flash-decoding does -- enough programs to fill the SMs given ``R * Hkv`` and the
  batch's longest context -- so a request's split boundaries, and with them its merge tree, move
  with its neighbours.
* :func:`sdpa_padded`: ``torch.nn.functional.scaled_dot_product_attention`` on the padded batch
  (each request's KV gathered and padded to the longest context with a mask): the kernel and its
  reduction order are picked by torch from the padded shape, i.e. from the batch.
* :func:`verify_splits`: the same split-KV kernel with a split size that depends on the launch's
  q_len -- decode's at q_len 1, twice it for a speculative verify (q_len > 1) -- as a stack with
  a separately tuned verify (or prefill) path does: invariant along the batch, so the request
  checks pass, but a token's split boundaries and merge tree depend on the phase that computes
  it.  The negative control of the ``phase`` check.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from batchinv.fast.decode_attention import DecodeAttentionConfig, decode_attention_config, launch
from batchinv.fast.device import arch, check_launch_device, interpreting, sm_count
from batchinv.reference.decode_attention import check_decode_attention_arguments, fp32_scale

__all__ = ["PRETEND_SM_COUNT", "batch_planned_splits", "planned_config", "sdpa_padded", "verify_splits"]

#: The SM count the batch planner assumes on the cpu lane (an H100/H200 has 132).
PRETEND_SM_COUNT = 132


def planned_config(
    base: DecodeAttentionConfig, num_requests: int, num_kv_heads: int, longest: int, num_sms: int
) -> DecodeAttentionConfig:
    """Flash-decoding's plan: ``splits = ceil(num_sms / (R * Hkv))`` (at least 1), and the split
    size the longest context divided by it, rounded up to a multiple of ``block_n``."""
    splits = max(1, -(-num_sms // max(1, num_requests * num_kv_heads)))
    per_split = max(1, -(-max(1, longest) // splits))
    split_tokens = -(-per_split // base.block_n) * base.block_n
    return dataclasses.replace(base, split_tokens=split_tokens)


def batch_planned_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pinned kernel with its split planned from the batch (:func:`planned_config`) as a
    graph-capturable planner does: from shapes alone -- R, Hkv, the SM count
    (:data:`PRETEND_SM_COUNT` on the cpu lane) and the longest context the block table can hold
    (``T * page_size``, the batch's widest table; or the index slots K) -- with no host sync."""
    shape = check_decode_attention_arguments(q, k_cache, v_cache, block_table, seq_lens, scale, indices)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_launch_device(name, t)
    base = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    if indices is not None:
        longest = shape.index_slots or 1
    else:
        longest = shape.max_pages * shape.page_size
    num_sms = PRETEND_SM_COUNT if interpreting() else sm_count(q.device)
    config = planned_config(base, shape.num_requests, shape.num_kv_heads, longest, num_sms)
    return launch(q, k_cache, v_cache, block_table, seq_lens, scale, indices, shape, config)


def verify_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pinned kernel with its split chosen by phase: the table's ``split_tokens`` at q_len
    1 (decode), twice it at q_len > 1 (speculative verify).  Shapes and outputs as
    :func:`batchinv.fast.decode_attention.decode_attention`; the same tokens decoded at q_len 1
    and verified at q_len 2 or 4 get other split boundaries, so other bits past one split."""
    shape = check_decode_attention_arguments(q, k_cache, v_cache, block_table, seq_lens, scale, indices)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_launch_device(name, t)
    config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    if q.shape[1] > 1:
        config = dataclasses.replace(config, split_tokens=2 * config.split_tokens)
    return launch(q, k_cache, v_cache, block_table, seq_lens, scale, indices, shape, config)


def sdpa_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA over the padded batch: o from ``F.scaled_dot_product_attention`` (masked), lse from
    ``torch.logsumexp`` of the same fp32 scores.  Empty contexts give o = 0, lse = -inf."""
    shape = check_decode_attention_arguments(q, k_cache, v_cache, block_table, seq_lens, scale, indices)
    r_count, q_len, hq, d = q.shape
    group = shape.group
    s = fp32_scale(scale)
    lens = seq_lens.to(torch.int64)  # [R]
    if indices is None:
        width = max(1, int(lens.max())) if r_count else 1
        pos = torch.arange(width, device=q.device).expand(r_count, q_len, width)  # [R, Q, W]
        limit = (lens[:, None] - q_len + torch.arange(q_len, device=q.device)[None, :] + 1)[..., None]
        mask = pos < limit  # [R, Q, W]
    else:
        width = max(1, shape.index_slots or 1)
        pos = indices.to(torch.int64).clamp(min=0)  # [R, Q, W]
        mask = indices >= 0
    page = block_table.to(torch.int64).gather(1, (pos // shape.page_size).reshape(r_count, -1))  # [R, Q*W]
    page = torch.where(mask.reshape(r_count, -1), page, 0).reshape(r_count, q_len, width)
    slot = pos % shape.page_size
    k = k_cache[page, slot]  # [R, Q, W, Hkv, D]
    v = v_cache[page, slot]  # [R, Q, W, Hkv, D]
    k = torch.where(mask[..., None, None], k, 0)  # [R, Q, W, Hkv, D]
    v = torch.where(mask[..., None, None], v, 0)
    # one query row per (r, i): batch R * Q, Hq query heads over Hkv kv heads (GQA), W keys
    qh = q.reshape(r_count * q_len, hq, 1, d)
    kh = k.reshape(r_count * q_len, width, shape.num_kv_heads, d).transpose(1, 2)  # [RQ, Hkv, W, D]
    vh = v.reshape(r_count * q_len, width, shape.num_kv_heads, d).transpose(1, 2)
    attn_mask = mask.reshape(r_count * q_len, 1, 1, width)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, scale=s, enable_gqa=True)
    o = o.reshape(r_count, q_len, hq, d)
    qg = q.reshape(r_count * q_len, shape.num_kv_heads, group, d).float()
    scores = (qg @ kh.float().transpose(-1, -2)) * s  # [RQ, Hkv, group, W]
    scores = scores.masked_fill(~attn_mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1).reshape(r_count, q_len, hq)
    empty = ~mask.any(dim=-1)  # [R, Q]
    o = torch.where(empty[..., None, None], torch.zeros((), dtype=o.dtype, device=o.device), o)
    return o.contiguous(), lse.contiguous()
