"""Reference dense attention with ``torch.nn.functional.scaled_dot_product_attention``'s
signature: fp64, each query row over exactly the keys its mask lets it see.

Dimension legend:
    B: batch      Hq: query heads      Hkv: kv heads (GQA: head h reads kv head h // (Hq // Hkv))
    Lq: query rows    Lk: keys    D: head dim

Per (b, h, i), with ``[start, end)`` the row's visible key range
(:func:`batchinv.reference.attention_mask.visible_key_ranges`: the boolean or 0/-inf additive
mask, or SDPA's top-left ``is_causal``) and ``s_j = scale * <q, k_j>`` (``scale`` rounded to fp32
first, as the kernels use it)::

    lse = log(sum_{start <= j < end} exp(s_j))          o = sum_j exp(s_j - lse) * v_j

in float64 from the inputs' exact values, rounded once to the query's dtype.  A row that sees no
key gives o = +0 (SDPA's math path gives NaN there).  The keys outside a row's range never
enter its arithmetic, so its value does not depend on the padding around it.
"""

from __future__ import annotations

import math

import torch

from batchinv.reference.attention_mask import visible_key_ranges
from batchinv.reference.errors import ArgumentError, DTypeError, check_tensor
from batchinv.reference.exact import round_once

__all__ = ["SDPA_DTYPES", "check_sdpa_arguments", "sdpa_attention"]

#: dtypes of query, key and value (one of them for all three).
SDPA_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


def check_sdpa_arguments(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> float:
    """Shape and dtype checks of :func:`sdpa_attention` (no value is read); returns the scale.

    Raises:
        DTypeError: an operand or the mask not a tensor, not of :data:`SDPA_DTYPES`, or of unequal dtypes;
            is_causal / enable_gqa not bools; scale not a float.
        ArgumentError: an operand not 4-D ``[B, H, L, D]``; unequal B or D; key and value of
            unequal shapes; Hq not a multiple of Hkv, or Hq != Hkv without enable_gqa; a mask and
            is_causal together; a mask not of 2 to 4 dims broadcastable to (B, 1, Lq, Lk) from
            the right (its query dim 1 or Lq, key dim 1 or Lk, head dim 1, batch dim 1 or B); a
            scale that is not finite.
    """
    check_tensor("query", query, dtypes=SDPA_DTYPES, ndim=4)
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, dtypes=(query.dtype,), ndim=4)
    b, hq, _, d = query.shape
    if key.shape[0] != b or key.shape[3] != d:
        raise ArgumentError("key", f"[B={b}, Hkv, Lk, D={d}]", tuple(key.shape))
    if value.shape != key.shape:
        raise ArgumentError("value", f"key's shape {tuple(key.shape)}", tuple(value.shape))
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise DTypeError(name, "a bool", type(flag).__name__)
    hkv = key.shape[1]
    if hkv == 0 or hq % hkv or (hq != hkv and not enable_gqa):
        want = "Hkv dividing Hq with enable_gqa=True" if hq != hkv else "Hkv >= 1"
        raise ArgumentError("key", f"{want} (Hq = {hq})", hkv)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise DTypeError("attn_mask", "a tensor or None", type(attn_mask).__name__)
        lq, lk = query.shape[2], key.shape[2]
        m = tuple(attn_mask.shape)
        if not 2 <= attn_mask.dim() <= 4 or m[-1] not in (1, lk) or m[-2] not in (1, lq):
            raise ArgumentError(
                "attn_mask", f"2 to 4 dims broadcastable to (B, 1, Lq={lq}, Lk={lk}) from the right", m
            )
        if is_causal:
            raise ArgumentError("attn_mask", "None with is_causal=True (SDPA takes one of them)", "a mask")
        if attn_mask.dim() >= 3 and attn_mask.shape[-3] != 1:
            raise ArgumentError("attn_mask", "head dim 1 (one mask for every head)", tuple(attn_mask.shape))
        if attn_mask.dim() == 4 and attn_mask.shape[0] not in (1, b):
            raise ArgumentError("attn_mask", f"batch dim 1 or B = {b}", tuple(attn_mask.shape))
    if scale is None:
        return 1.0 / math.sqrt(d) if d else 1.0
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise DTypeError("scale", "a float or None", type(scale).__name__)
    if not math.isfinite(float(scale)) or not math.isfinite(
        float(torch.tensor(float(scale), dtype=torch.float32))
    ):
        raise ArgumentError("scale", "a finite fp32 value", scale)
    return float(scale)


def sdpa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    rounded: bool = False,
) -> torch.Tensor:
    """Reference SDPA (module docstring): ``o (B, Hq, Lq, D)`` in float64, or, ``rounded``, rounded
    once (ties to even) to the query's dtype.

    Parameters are :func:`batchinv.fast.sdpa_attention.sdpa_attention`'s.

    Raises:
        DTypeError, ArgumentError: as :func:`check_sdpa_arguments` and
            :func:`~batchinv.reference.attention_mask.visible_key_ranges` (an additive value other
            than 0, -inf and finfo.min; a row whose visible keys are not one range).
    """
    s = check_sdpa_arguments(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    b, hq, lq, _ = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    if query.numel() == 0:  # no query row (Lq = 0, B = 0 or Hq = 0): nothing to reduce
        return query.new_zeros(query.shape, dtype=query.dtype if rounded else torch.float64)
    start, end = visible_key_ranges(attn_mask, lq, lk, is_causal=is_causal)
    start = start.to(query.device).reshape(-1, 1, lq).expand(b, 1, lq)  # (B, 1, Lq)
    end = end.to(query.device).reshape(-1, 1, lq).expand(b, 1, lq)
    scale64 = float(torch.tensor(s, dtype=torch.float32))
    group = hq // hkv
    j = torch.arange(lk, device=query.device)
    # One batch entry at a time: its fp64 (Hq, Lq, Lk) scores, never the whole batch's.
    o = (
        torch.stack(
            [_entry(query[i], key[i], value[i], start[i], end[i], j, scale64, group) for i in range(b)]
        )
        if b
        else query.new_zeros(query.shape, dtype=torch.float64)
    )
    return round_once(o, query.dtype) if rounded else o


def _entry(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    j: torch.Tensor,
    scale64: float,
    group: int,
) -> torch.Tensor:
    """One batch entry: ``o (Hq, Lq, D)`` fp64 over each row's range ``[start, end)`` (``(1, Lq)``)."""
    k = key.double().repeat_interleave(group, dim=0)  # (Hq, Lk, D)
    v = value.double().repeat_interleave(group, dim=0)
    scores = scale64 * (query.double() @ k.transpose(-1, -2))  # (Hq, Lq, Lk)
    visible = (j >= start[..., None]) & (j < end[..., None])  # (1, Lq, Lk)
    scores = scores.masked_fill(~visible, -math.inf)
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - top)  # exactly 0 outside the range
    total = weights.sum(dim=-1, keepdim=True)
    finite = torch.isfinite(v).all(dim=-1)  # (Hq, Lk): keys whose value row is finite
    o = (weights @ torch.where(finite[..., None], v, 0.0)) / total
    # A non-finite value enters only the rows that see it (0 * NaN must not leak to the others).
    touched = (visible & ~finite[:, None, :]).any(dim=-1)  # (Hq, Lq)
    for hi, qi in touched.nonzero().tolist():
        keys = visible[0, qi]
        o[hi, qi] = (weights[hi, qi, keys] @ v[hi, keys]) / total[hi, qi]
    return torch.where(total == 0, torch.zeros_like(o), o)  # an empty row: +0 (a NaN sum stays NaN)
