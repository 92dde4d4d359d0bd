"""Unpinned prefill-attention baselines (negative controls) beside the pinned kernel, each with
:func:`batchinv.fast.prefill_attention.prefill_attention`'s signature and each the same split-KV
kernel (the decode kernel on packed rows) with one thing planned from the call:

* :func:`max_seqlen_planned_splits`: the FlashAttention-3-style planner -- the split size chosen
  from the batch's ``max_seqlen_q x GQA group`` with the tile scheduler's thresholds of vLLM
  #51902 (64 -> 65, 32 -> 33, 16 -> 17, 9 -> 10): a request's split boundaries move when a
  neighbour with a longer q_len joins its batch.
* :func:`chunk_planned_splits`: greedy packed chunks -- the packed rows cut into chunks of
  :data:`CHUNK_ROWS` rows across requests, the splits of each chunk's rows counted from the
  chunk's first query position instead of the request's first key (SGLang / seed 003's
  per-chunk plan): where a request's rows fall in the packing moves its boundaries.
* :func:`phase_paired`: the production pairing -- prefill rows (requests of q_len > 1) through
  a prefill config (another split size) and decode rows (q_len 1) through the decode table's: a
  request's bits do not depend on its neighbours, but a token's depend on the phase that
  computed it (the ``phase`` check's negative control).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import torch.nn.functional as F

from batchinv.fast.decode_attention import DecodeAttentionConfig, decode_attention_config
from batchinv.fast.device import arch
from batchinv.fast.prefill_attention import launch, prepare

__all__ = [
    "CHUNK_ROWS",
    "FA_THRESHOLDS",
    "chunk_planned_splits",
    "max_seqlen_planned_splits",
    "phase_paired",
    "planned_split_tokens",
]

#: vLLM #51902: FA3's scheduler changes its plan where ``max_seqlen_q * group`` crosses these.
FA_THRESHOLDS: tuple[int, ...] = (9, 16, 32, 64)

#: Rows per greedy packed chunk of :func:`chunk_planned_splits` (small: the cpu lane's packed
#: batches are tens of rows, and a request must straddle chunk boundaries for the plan to show).
CHUNK_ROWS = 8


def planned_split_tokens(base: DecodeAttentionConfig, max_seqlen_q: int, group: int) -> int:
    """The split size of the FA-style plan: the table's split times ``1 + (tiers crossed)``, the
    tiers :data:`FA_THRESHOLDS` of ``max_seqlen_q * group`` (<= 9: the table's split; 10..16:
    2x; 17..32: 3x; 33..64: 4x; >= 65: 5x) -- always a multiple of ``block_n``."""
    m = max_seqlen_q * group
    tier = sum(1 for t in FA_THRESHOLDS if m > t)
    return base.split_tokens * (1 + tier)


def max_seqlen_planned_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pinned kernel with its split planned from the batch's ``max_seqlen_q x group``
    (:func:`planned_split_tokens`)."""
    shape, cu, s = prepare(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, indices)
    base = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    max_q = max((b - a for a, b in itertools.pairwise(cu)), default=0)
    config = dataclasses.replace(base, split_tokens=planned_split_tokens(base, max_q, shape.group))
    return launch(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, indices, shape, cu, config)


def _shifted_indices(
    cu: list[int], lens: list[int], indices: torch.Tensor | None, split_tokens: int, device: torch.device
) -> torch.Tensor:
    """(T, K') int32: per row its keys (dense: 0..p; sparse: its index row) after ``pad`` -1
    slots, ``pad = (-c0) mod split_tokens`` with c0 the position of the row's chunk's first
    row of the same request: the kernel's index-slot splits then start at c0, not at key 0."""
    num_rows = cu[-1]
    rows: list[list[int]] = []
    idx = indices.cpu().tolist() if indices is not None else None
    for r in range(len(cu) - 1):
        q_len = cu[r + 1] - cu[r]
        for i in range(q_len):
            t = cu[r] + i
            position = lens[r] - q_len + i
            chunk_first = max(cu[r], (t // CHUNK_ROWS) * CHUNK_ROWS)  # the chunk's first row of r
            c0 = lens[r] - q_len + (chunk_first - cu[r])
            pad = (-c0) % split_tokens
            keys = list(range(position + 1)) if idx is None else idx[t]
            rows.append([-1] * pad + keys)
    width = max((len(row) for row in rows), default=1)
    out = torch.full((num_rows, max(1, width)), -1, dtype=torch.int32)
    for t, row in enumerate(rows):
        out[t, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return out.to(device)


def chunk_planned_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy packed chunks of :data:`CHUNK_ROWS` rows, each chunk's splits counted from its first
    query position: the pinned kernel's index-slot path over each row's keys preceded by
    ``(-chunk start) mod split_tokens`` unattended (-1) slots, which moves every split boundary
    to ``chunk start + s * split_tokens`` (a construction: it reads the lengths on the host)."""
    shape, cu, s = prepare(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, indices)
    config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    lens = [int(v) for v in seq_lens.tolist()]
    shifted = _shifted_indices(cu, lens, indices, config.split_tokens, q.device)
    shape = dataclasses.replace(shape, index_slots=int(shifted.shape[1]))
    return launch(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, shifted, shape, cu, config)


#: The prefill config's split, in multiples of the decode table's, of :func:`phase_paired`.
PREFILL_SPLIT_FACTOR = 2


def phase_paired(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Requests of q_len 1 through the decode table's config, the others through a prefill
    config of :data:`PREFILL_SPLIT_FACTOR` times the split: two launches, rows scattered back."""
    shape, cu, s = prepare(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, indices)
    decode = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    prefill = dataclasses.replace(decode, split_tokens=decode.split_tokens * PREFILL_SPLIT_FACTOR)
    o = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    q_lens = [b - a for a, b in itertools.pairwise(cu)]
    for is_decode, config in ((True, decode), (False, prefill)):
        requests = [r for r, n in enumerate(q_lens) if (n == 1) == is_decode]
        if not requests:
            continue
        rows = torch.cat([torch.arange(cu[r], cu[r + 1]) for r in requests]).to(q.device)
        sub_cu = [0]
        for r in requests:
            sub_cu.append(sub_cu[-1] + q_lens[r])
        req = torch.tensor(requests, device=q.device)
        sub_cu_t = torch.tensor(sub_cu, dtype=torch.int32, device=q.device)
        # the sub-batch's own longest length (None: the launcher reads it), not the batch's
        sub_shape = dataclasses.replace(shape, num_requests=len(requests), longest=None)
        sub_o, sub_lse = launch(
            q.index_select(0, rows),
            k_cache,
            v_cache,
            block_table.index_select(0, req),
            sub_cu_t,
            seq_lens.index_select(0, req),
            s,
            None if indices is None else indices.index_select(0, rows),
            sub_shape,
            sub_cu,
            config,
        )
        o[rows] = sub_o
        lse[rows] = sub_lse
    return o, lse


_DENSE_MEMO: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]] = []


def _dense(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu: list[int],
    lens: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The packed problem as dense SDPA operands (every request alike): q (R, Hq, Q, D), k, v
    (R, Hkv, L, D) and L.  Memoized on the inputs' identity (the memo holds them, so no address
    is reused): a bench times SDPA, not the conversion."""
    key = (q, k_cache, v_cache, block_table)
    for held, dense in _DENSE_MEMO:
        if all(a is b for a, b in zip(held, key, strict=True)):
            return dense
    r_count, q_len, length = len(lens), cu[1] - cu[0], lens[0]
    page = k_cache.shape[1]
    pages = block_table[:, : -(-length // page)].long()  # (R, n)
    k = k_cache[pages].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()  # (R, Hkv, L, D)
    v = v_cache[pages].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()
    qd = q.view(r_count, q_len, *q.shape[1:]).transpose(1, 2).contiguous()  # (R, Hq, Q, D)
    _DENSE_MEMO[:] = [(key, (qd, k, v, length))]
    return qd, k, v, length


def sdpa_flash_dense(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch SDPA's flash backend on the dense layout of a batch whose requests are all alike
    (one q_len, one length; dense): the bench's speed reference.  lse is not computed (-inf).

    Raises:
        Unsupported: sparse, ragged requests, or no flash backend on this device.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from batchinv.reference.errors import Unsupported

    cu = [int(v) for v in cu_seqlens_q.tolist()]
    lens = [int(v) for v in seq_lens.tolist()]
    q_lens = {b - a for a, b in itertools.pairwise(cu)}
    if indices is not None or len(q_lens) != 1 or len(set(lens)) != 1 or q.device.type != "cuda":
        raise Unsupported("sdpa_flash_dense: dense batches of alike requests on CUDA only")
    qd, k, v, length = _dense(q, k_cache, v_cache, block_table, cu, lens)
    q_len = qd.shape[2]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        if q_len == length:
            o = F.scaled_dot_product_attention(qd, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(
                qd, k, v, attn_mask=causal_lower_right(q_len, length), scale=scale, enable_gqa=True
            )
    out = o.transpose(1, 2).reshape(q.shape)
    return out, torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
