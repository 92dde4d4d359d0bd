"""Each query row's visible key range under an SDPA-style attention mask.

Dimension legend:
    B: batch             H: heads (both may be 1 or absent: a mask broadcasts to (B, H, q, kv))
    q: query rows (``q_len``)          kv: keys (``kv_len``)
    ``...``: the mask's leading dims as given (e.g. (B, 1) for Hugging Face's (B, 1, q, kv))

``torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, is_causal)``
lets row i see key j where the mask allows it: a boolean mask True = attend, an additive float
mask 0 = attend and -inf (or, as Hugging Face builds them, ``torch.finfo(dtype).min``) =
masked.  ``is_causal=True`` is the top-left aligned causal mask
``torch.ones(q, kv, dtype=torch.bool).tril(diagonal=0)`` (key j visible to row i iff j <= i;
torch's documentation of SDPA), not the bottom-right alignment
(``torch.nn.attention.bias.causal_lower_right``: j <= i + kv - q) that FlashAttention and a
paged prefill with a cached prefix use; both are offered here.

A pinned attention reduces each row over its visible keys only, with split boundaries counted
from the row's first visible key, so the row's bits do not depend on how much padding its
batch needed.  That needs the visible set of every row to be one contiguous range
``[start, end)``: true of causal, padding (left or right), sliding-window and block-diagonal
masks; anything else is refused with the row named.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_int, check_tensor

__all__ = ["CAUSAL_ALIGNMENTS", "MASK_FLOAT_DTYPES", "causal_limit", "visible_key_ranges"]

#: Float dtypes an additive mask may have.
MASK_FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Where the causal diagonal starts: SDPA's ``is_causal`` is top-left (row i sees keys 0..i);
#: bottom-right (row i sees keys 0..i + kv - q) is a prefill after a cached prefix.
CAUSAL_ALIGNMENTS: tuple[str, ...] = ("top_left", "bottom_right")

_DIM_NAMES = ("batch", "head")  # the mask's dims -4 and -3, as SDPA broadcasts them


def causal_limit(
    q_len: int, kv_len: int, alignment: Literal["top_left", "bottom_right"] = "top_left"
) -> torch.Tensor:
    """The causal end of each query row: row i sees keys ``j < limit[i]``, clamped to [0, kv].

    ``top_left`` (SDPA's ``is_causal``): ``limit[i] = i + 1``.  ``bottom_right``:
    ``limit[i] = i + 1 + kv - q``.  Returns an int64 tensor (q,) on the CPU.

    Raises:
        DTypeError, ArgumentError: q_len or kv_len not an int >= 0; an unknown alignment.
    """
    check_int("q_len", q_len, 0)
    check_int("kv_len", kv_len, 0)
    if alignment not in CAUSAL_ALIGNMENTS:
        raise ArgumentError("alignment", f"one of {CAUSAL_ALIGNMENTS}", alignment)
    shift = 0 if alignment == "top_left" else kv_len - q_len
    return (torch.arange(q_len, dtype=torch.int64) + 1 + shift).clamp(0, kv_len)  # (q,)


def _where(index: tuple[int, ...], lead: int) -> str:
    """'batch b, head h, row i[, key j]' for an index into a mask with ``lead`` leading dims."""
    names = _DIM_NAMES[len(_DIM_NAMES) - lead :]  # lead <= 2: the dims SDPA broadcasts from the right
    parts = [f"{n} {v}" for n, v in zip(names, index[:lead], strict=True)]
    parts.append(f"row {index[lead]}")
    if len(index) > lead + 1:
        parts.append(f"key {index[lead + 1]}")
    return ", ".join(parts)


def visible_key_ranges(
    mask: Any,
    q_len: int,
    kv_len: int,
    *,
    is_causal: bool = False,
    alignment: Literal["top_left", "bottom_right"] = "top_left",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row's visible keys as one contiguous range ``[start, end)``.

    Row i (of every leading index) sees key j iff the mask allows it (boolean: ``True``;
    additive: ``0``) and, with ``is_causal``, ``j < causal_limit(q_len, kv_len, alignment)[i]``.
    ``start`` is the first visible key and ``end`` one past the last; a row that sees no key
    gets ``start = end = 0`` (its attention is empty: o = 0, lse = -inf).

    Parameters
    ----------
    mask : Tensor or None
        bool (True = attend) or float16/bfloat16/float32/float64 additive (0 = attend; -inf or
        ``torch.finfo(mask.dtype).min`` = masked; -0.0 is 0), broadcastable to
        ``(B, H, q_len, kv_len)`` (at most 4-D).  None: every key visible (up to the causal
        limit).
    q_len, kv_len : int, >= 0
    is_causal : bool
        Also apply the causal limit, intersected with the mask.  SDPA's own flag is top-left;
        its documented reference refuses a mask with it (``assert attn_mask is None``), while
        torch 2.13's CPU math path takes the intersection, as this does.
    alignment : "top_left" (default, SDPA's ``is_causal``) or "bottom_right"
    validate : bool
        Check the additive values and each row's contiguity (both read the mask on the host).
        False (a CUDA-graph capture, which cannot read on the host): no value check -- any
        additive value other than -inf / finfo.min counts as visible and a gapped row's range
        runs from its first to its last visible key; the ranges are then device-only ops.

    Returns
    -------
    (start, end) : int64 tensors ``(..., q_len)`` on the mask's device (the CPU for None),
    ``...`` the mask's leading dims (of ``mask.shape`` broadcast with ``(q_len, kv_len)``).
    A function of the mask's values alone, row by row.

    Raises
    ------
    DTypeError: mask not a tensor (or None), or of another dtype (an integer mask); is_causal
        not a bool; q_len / kv_len not ints.
    ArgumentError: mask of more than 4 dims or not broadcastable to ``(..., q_len, kv_len)``;
        an additive value other than 0, -inf and ``finfo(dtype).min`` (NaN included), naming
        the batch, head, row and key; a row whose visible keys are not one contiguous range,
        naming the batch, head and row; q_len / kv_len negative; an unknown alignment.

    Source: ``torch.nn.functional.scaled_dot_product_attention``'s documented ``attn_mask`` and
    ``is_causal`` semantics; Hugging Face ``transformers``' 4-D padding + causal masks.
    """
    limit = causal_limit(q_len, kv_len, alignment)  # (q,), validates q_len, kv_len, alignment
    if not isinstance(is_causal, bool):
        raise DTypeError("is_causal", "a bool", type(is_causal).__name__)
    if mask is None:
        end = limit if is_causal else torch.full((q_len,), kv_len, dtype=torch.int64)  # (q,)
        return torch.zeros(q_len, dtype=torch.int64), end
    check_tensor("mask", mask, dtypes=(torch.bool, *MASK_FLOAT_DTYPES))
    if mask.dim() > 4:
        raise ArgumentError("mask", "at most 4 dims, broadcastable to (B, H, q, kv)", tuple(mask.shape))
    try:
        full_shape = torch.broadcast_shapes(tuple(mask.shape), (q_len, kv_len))
    except RuntimeError:
        raise ArgumentError(
            "mask",
            f"a shape broadcastable to (..., q_len, kv_len) = (..., {q_len}, {kv_len})",
            tuple(mask.shape),
        ) from None
    lead = len(full_shape) - 2
    m = mask.expand(full_shape)  # (..., q, kv), a view
    if mask.dtype == torch.bool:
        visible = m
    else:
        masked = (m == -torch.inf) | (m == torch.finfo(mask.dtype).min)  # (..., q, kv)
        bad = ~(masked | (m == 0))
        visible = ~masked
    if is_causal:
        keys = torch.arange(kv_len, device=m.device)  # (kv,)
        visible = visible & (keys[None, :] < limit.to(m.device)[:, None])  # (..., q, kv)
    count = visible.sum(dim=-1)  # (..., q)
    as_int = visible.to(torch.int8)  # argmax returns the first maximal index
    start = (
        as_int.argmax(dim=-1) if kv_len else torch.zeros(full_shape[:-1], dtype=torch.int64, device=m.device)
    )  # (..., q)
    end = kv_len - as_int.flip(-1).argmax(dim=-1) if kv_len else start.clone()  # (..., q)
    empty = count == 0
    start = torch.where(empty, 0, start)
    end = torch.where(empty, 0, end)
    gapped = end - start != count  # (..., q)
    if not validate:
        return start.to(torch.int64), end.to(torch.int64)
    # both checks' flags read to the host in one copy (each copy is a host sync)
    any_bad, any_gapped = torch.stack(
        [bad.any() if mask.dtype != torch.bool else gapped.new_zeros(()), gapped.any()]
    ).tolist()
    if any_bad:  # an additive value first, as the checks read
        index = tuple(int(v) for v in bad.nonzero()[0])
        raise ArgumentError(
            "mask",
            "additive values 0 (attend), -inf or finfo("
            f"{str(mask.dtype).removeprefix('torch.')}).min (masked) ({_where(index, lead)})",
            float(m[index]),
        )
    if any_gapped:
        index = tuple(int(v) for v in gapped.nonzero()[0])
        keys_seen = visible[index].nonzero().flatten().tolist()
        raise ArgumentError(
            "mask",
            f"each query row's visible keys one contiguous range [start, end) ({_where(index, lead)})",
            f"visible keys {_runs(keys_seen)}",
        )
    assert start.shape == end.shape == (*full_shape[:-1],)
    return start.to(torch.int64), end.to(torch.int64)


def _runs(keys: list[int]) -> str:
    """'0..3, 5..7' for [0, 1, 2, 3, 5, 6, 7]."""
    runs: list[list[int]] = []
    for k in keys:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs)
