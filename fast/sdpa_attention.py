"""Padding- and batch-invariant dense attention with SDPA's signature: the decode kernel
(``kernels/decode_attention.py``) on packed query rows, each row over its own visible key range.

``torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, is_causal,
scale, enable_gqa)`` with dense ``key``/``value [B, Hkv, Lk, D]``: every query row (b, i) sees
the keys ``[start, end)`` its mask allows (:func:`batchinv.reference.attention_mask.visible_key_ranges`)
and runs the decode kernel's per-row program over exactly those keys, with split boundaries
counted from ``start``.  A sequence left-padded by any amount, right-padded by any amount or
batched with sequences of any other length therefore gives every real row the same bits: the
padding moves ``start`` and ``Lk``, never the keys a row reduces over or their grouping.  The
dense K/V are read in place as a paged cache of page size 1 (page ``b * (stride_b / stride_l) +
j`` is key j of batch b), so the same kernel, config table and tree serve decode, prefill and
this path: for the same keys a row's bits equal ``prefill_attention``'s and ``decode_attention``'s.
"""

from __future__ import annotations

import torch

from batchinv.fast.decode_attention import decode_attention_config
from batchinv.fast.device import arch, check_launch_device, kernel_operand
from batchinv.fast.prefill_attention import KVLayout, PackedRows, launch_rows
from batchinv.reference.attention_mask import visible_key_ranges
from batchinv.reference.errors import ArgumentError
from batchinv.reference.sdpa_attention import SDPA_DTYPES, check_sdpa_arguments

__all__ = [
    "SDPA_DTYPES",
    "check_sdpa_arguments",
    "dense_table",
    "row_ranges",
    "sdpa_attention",
    "sdpa_attention_rows",
]


def row_ranges(
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    b: int,
    lq: int,
    lk: int,
    device: torch.device,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row's visible keys ``[start, end)``, int64 ``(B, Lq)`` on ``device``: from the
    mask (:func:`~batchinv.reference.attention_mask.visible_key_ranges`, ``validate`` as there)
    or, without one, built on the device (no host tensor: a CUDA-graph capture copies none)."""
    if attn_mask is None:
        rows_i = torch.arange(lq, device=device, dtype=torch.int64)
        start = torch.zeros((1, lq), dtype=torch.int64, device=device)
        end = ((rows_i + 1).clamp(max=lk) if is_causal else torch.full_like(rows_i, lk)).reshape(1, lq)
    else:
        start, end = visible_key_ranges(kernel_operand(attn_mask), lq, lk, validate=validate)
    return start.to(device).reshape(-1, lq).expand(b, lq), end.to(device).reshape(-1, lq).expand(b, lq)


def dense_table(
    b: int, lk: int, pages_per_batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(batch ids (B,), block table (B, Lk))`` int32 of dense K/V read as pages of one key:
    key j of batch entry i is page ``i * pages_per_batch + j``."""
    batch_ids = torch.arange(b, device=device, dtype=torch.int32)
    table = batch_ids[:, None] * pages_per_batch + torch.arange(lk, device=device, dtype=torch.int32)
    return batch_ids, table.contiguous()


def _dense_as_pages(key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """K and V laid out so that key j of batch b is page ``b * pages_per_batch + j`` (page
    stride = the L stride) for both: in place when their strides allow it, else contiguous
    copies.  Returns (key, value, pages_per_batch)."""

    def per_batch(t: torch.Tensor) -> int | None:
        s_b, _, s_l, s_d = t.stride()
        if s_d != 1 or s_l <= 0:
            return None
        if t.shape[0] == 1:
            return 0
        return s_b // s_l if s_b % s_l == 0 else None

    k_pages, v_pages = per_batch(key), per_batch(value)
    if k_pages is None or k_pages != v_pages:
        key, value = key.contiguous(), value.contiguous()
        return key, value, key.shape[1] * key.shape[2]
    return key, value, k_pages


def sdpa_attention_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """:func:`sdpa_attention`'s output laid out ``[B, Lq, Hq, D]`` (contiguous; the operator
    ``torch.ops.batchinv.sdpa`` returns this).  ``validate=False`` skips the mask's value checks
    (they read the mask on the host; a CUDA-graph capture cannot) -- the shape checks always run."""
    s = check_sdpa_arguments(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_launch_device(name, t)
    b, hq, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    config = decode_attention_config(arch(query.device), d, query.dtype)  # ArgumentError: D
    if query.numel() == 0:  # no query row (Lq = 0, B = 0 or Hq = 0)
        return query.new_zeros((b, lq, hq, d))
    device = query.device
    start, end = row_ranges(attn_mask, is_causal, b, lq, lk, device, validate=validate)
    q = kernel_operand(query).transpose(1, 2).reshape(b * lq, hq, d)  # a view for HF's layout
    if q.stride(-1) != 1:
        q = q.contiguous()
    k, v, pages_per_batch = _dense_as_pages(kernel_operand(key), kernel_operand(value))
    if (b - 1) * pages_per_batch + lk >= 2**31:
        raise ArgumentError("key", "at most 2**31 key positions over the batch", b * pages_per_batch)
    batch_ids, table = dense_table(b, lk, pages_per_batch, device)
    rows = PackedRows(
        request=batch_ids.repeat_interleave(lq).contiguous(),
        keys=(end - start).to(torch.int32).reshape(-1).contiguous(),
        key_start=start.to(torch.int32).reshape(-1).contiguous(),
    )
    seq_lens = torch.full((b,), lk, dtype=torch.int32, device=device)
    o, _ = launch_rows(
        q,
        k,
        v,
        KVLayout(1, (k.stride(2), 0, k.stride(1)), (v.stride(2), 0, v.stride(1))),
        table,
        seq_lens,
        rows,
        None,
        scale=s,
        num_kv_heads=hkv,
        max_tokens=lk,
        splits=max(1, -(-lk // config.split_tokens)),
        config=config,
    )
    return o.view(b, lq, hq, d)


def sdpa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Padding-, batch- and phase-invariant ``scaled_dot_product_attention`` (Triton).

    ``out[b, h, i] = sum_j softmax_j(scale * <query[b, h, i], key[b, h // G, j]>) value[b, h // G, j]``
    over the keys ``j`` row i of batch b may see, ``G = Hq // Hkv``.

    Parameters
    ----------
    query : Tensor, (B, Hq, Lq, D), bfloat16, float16 or float32
    key, value : Tensor, (B, Hkv, Lk, D), query's dtype; ``Hkv = Hq`` or, with ``enable_gqa``,
        a divisor of Hq.  D in the decode table (64/128/256 on GPUs, 16..256 interpreted).
    attn_mask : Tensor, optional
        bool (True = attend) or additive float (0 = attend, -inf / ``finfo.min`` = masked),
        broadcastable to (B, 1, Lq, Lk); each row's visible keys one contiguous range.
    is_causal : bool
        SDPA's top-left causal mask (row i sees keys ``0 .. i``); not with a mask.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    enable_gqa : bool

    Returns
    -------
    Tensor (B, Hq, Lq, D) in query's dtype (a transposed view of a contiguous (B, Lq, Hq, D)).

    Notes
    -----
    Each row is reduced over its visible keys ``[start, end)`` only, by the decode kernel's
    per-row program with split boundaries at ``start + k * split_tokens`` (the decode table's,
    keyed on arch, D and dtype), chunks in increasing position, splits merged in ascending order,
    one rounding.  Its bits are invariant along the batch (other sequences, their lengths, its
    slot), the padding on either side (how far ``start`` and ``Lk`` are moved), Lq (a prefill
    row equals the same row computed alone or in a decode step over the same keys: what rollout
    == rescoring needs) and the phase.  A row that sees no key gives 0 (SDPA's math path gives
    NaN).  Memory outside a row's range is never read for it.

    Raises
    ------
    DTypeError, ArgumentError
        As :func:`check_sdpa_arguments`; and, reading the mask, an additive value other than 0,
        -inf and finfo.min, or a row whose visible keys are not contiguous (naming the row), as
        :func:`batchinv.reference.attention_mask.visible_key_ranges`; a head dim outside the
        decode table.
    DeviceError: a non-CUDA tensor (CPU tensors when ``TRITON_INTERPRET=1``).

    Source: ``torch.nn.functional.scaled_dot_product_attention``'s semantics; flash-decoding's
    split-KV (Dao et al. 2023) with the split pinned and counted from each row's first key.
    """
    return sdpa_attention_rows(query, key, value, attn_mask, is_causal, scale, enable_gqa).transpose(1, 2)
