"""Reference varlen causal prefill attention over a paged KV cache (dense and sparse): fp64,
one request at a time, each request computed by the decode reference.

Dimension legend:
    R: requests of the launch (``cu_seqlens_q`` has R + 1 entries)
    T: query rows of the launch, all requests' new tokens packed (``T = cu_seqlens_q[R]``)
    Q_r: q_len of request r, ``cu_seqlens_q[r + 1] - cu_seqlens_q[r] >= 1`` (ragged)
    L_r: seq_lens[r], request r's KV length: its cached prefix ``L_r - Q_r`` plus its Q_r new
         tokens, whose K/V are already written to the cache (the last Q_r positions)
    Hq: query heads          Hkv: kv heads (GQA: Hq % Hkv == 0, head h reads kv head h // (Hq // Hkv))
    D: head dim              P: physical pages of the cache      S: page_size (tokens per page)
    M: max_pages, the width of the block table                   K: index slots (sparse mode)

Row ``t`` of ``q`` with ``cu_seqlens_q[r] <= t < cu_seqlens_q[r + 1]`` is request r's new token
``i = t - cu_seqlens_q[r]``, at absolute position ``p = L_r - Q_r + i``.  Paging is the decode
reference's (:mod:`batchinv.reference.decode_attention`): position ``j`` of request r sits at
``(block_table[r, j // S], j % S)``; table entries at ``j >= ceil(L_r / S)`` are never read.
Dense mode: row t attends to positions ``0 .. p`` (causal, bottom-right aligned inside each
request).  Sparse mode: it attends to the positions ``indices[t, :]`` lists before its -1 tail,
each ``<= p`` (a position listed twice counts twice, as in decode).

Per (t, h), with ``s_j = scale * <q[t, h], k_j>`` (``scale`` rounded to fp32 first)::

    lse = log(sum_j exp(s_j))          o = sum_j exp(s_j - lse) * v_j

in float64 from the inputs' exact values.  Request r's rows are exactly what
:func:`batchinv.reference.decode_attention.decode_attention` gives for one request of
``q_len = Q_r``: the same operations on the same values, so a row's bits are those of decode at
the same (request, position) whatever the phase -- full prefill, chunked prefill after a
cached prefix, decode (Q = 1) or speculative verify (Q = 2, 4).  An empty context (sparse,
every index -1) gives o = +0 and lse = -inf, never NaN.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from batchinv.reference.decode_attention import (
    ATTENTION_DTYPES,
    AttentionShape,
    check_decode_attention_arguments,
    check_host_values,
    decode_attention,
)
from batchinv.reference.errors import ArgumentError, check_same_device, check_tensor
from batchinv.reference.exact import round_once
from batchinv.reference.host_read import host_int64

__all__ = [
    "CU_SEQLENS_DTYPES",
    "check_prefill_attention_arguments",
    "default_scale",
    "prefill_attention",
]

#: dtypes ``cu_seqlens_q`` may have (FlashAttention's varlen API takes int32; int64 is accepted).
CU_SEQLENS_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(D)``, SDPA's and FlashAttention's default softmax scale (1.0 when D = 0)."""
    return 1.0 / math.sqrt(head_dim) if head_dim else 1.0


def check_prefill_attention_arguments(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    cu_seqlens_q: Any,
    seq_lens: Any,
    scale: Any,
    indices: Any = None,
) -> tuple[AttentionShape, list[int]]:
    """Validate the arguments of :func:`prefill_attention` (reads tensor values: a host sync).

    The checks on the cache, the table, the lengths and the scale are decode's
    (:func:`~batchinv.reference.decode_attention.check_decode_attention_arguments`, run on an
    empty ``(R, 0, Hq, D)`` stand-in of q); the varlen ones are this function's.

    Returns:
        the call's :class:`~batchinv.reference.decode_attention.AttentionShape` (with
        ``q_len = 0``: the launch's q_len is ragged) and ``cu_seqlens_q`` as Python ints.

    Raises:
        DTypeError: a non-tensor; q not bf16/fp16; k_cache/v_cache not q's dtype; block_table,
            seq_lens or indices not int32; cu_seqlens_q not int32/int64; scale not a real number.
        ArgumentError: a wrong rank; k_cache/v_cache shapes differ; head dims differ; Hq not a
            multiple of Hkv; block_table/seq_lens not of R = len(cu_seqlens_q) - 1 requests;
            indices not (T, K); a non-finite scale.  From the values: cu_seqlens_q empty, not
            starting at 0, with a duplicate entry (a request of q_len 0), decreasing (unsorted),
            or not ending at T; a q_len above its seq_len; a length needing more pages than
            the table holds (``ceil(L / S) > M``); a referenced page id outside ``[0, P)``; an
            index outside ``[-1, p]`` (p the row's position) or a non -1 after a -1.
        DeviceError: a tensor on another device than q; a tensor on the meta device.
    """
    check_tensor("q", q, dtypes=ATTENTION_DTYPES, ndim=3)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=CU_SEQLENS_DTYPES, ndim=1)
    check_same_device("cu_seqlens_q", cu_seqlens_q, q.device)
    if indices is not None:
        check_tensor("indices", indices, dtypes=(torch.int32,), ndim=2)
        check_same_device("indices", indices, q.device)
    num_rows, num_q_heads, head_dim = q.shape
    if cu_seqlens_q.shape[0] < 1:
        raise ArgumentError(
            "cu_seqlens_q", "R + 1 >= 1 entries (it starts with 0)", tuple(cu_seqlens_q.shape)
        )
    num_requests = cu_seqlens_q.shape[0] - 1
    for name, t, ndim in (("block_table", block_table, 2), ("seq_lens", seq_lens, 1)):
        check_tensor(name, t, dtypes=(torch.int32,), ndim=ndim)
        if t.shape[0] != num_requests:
            raise ArgumentError(
                name, f"dim 0 of length R = {num_requests} (len(cu_seqlens_q) - 1)", t.shape[0]
            )
    # decode's checks of everything but q's rows: an empty (R, 0, Hq, D) stand-in of q
    stand_in = q.new_empty((num_requests, 0, num_q_heads, head_dim))
    shape = check_decode_attention_arguments(
        stand_in, k_cache, v_cache, block_table, seq_lens, scale, None, read_values=False
    )
    # every value checked below, read to the host in one copy (each copy is a host sync)
    read_indices = indices is not None and indices.numel() > 0
    lens_host, table_host, cu_host, *rest = host_int64(
        seq_lens, block_table, cu_seqlens_q, *([indices] if read_indices else [])
    )
    if num_requests:  # decode's value checks (lengths, referenced page ids), first as in decode
        shape = dataclasses.replace(shape, longest=check_host_values(shape, lens_host, table_host, None))
    if indices is not None and indices.shape[0] != num_rows:
        raise ArgumentError(
            "indices", f"shape (T, K) = ({num_rows}, K) (T: the rows of q)", tuple(indices.shape)
        )
    cu = [int(v) for v in cu_host.tolist()]
    if cu[0] != 0:
        raise ArgumentError("cu_seqlens_q", "a first entry of 0", cu[0])
    for r in range(num_requests):
        if cu[r + 1] == cu[r]:
            raise ArgumentError(
                "cu_seqlens_q",
                f"strictly increasing entries: q_len >= 1 (a duplicate entry gives request {r} "
                f"q_len 0; cu_seqlens_q[{r}] = cu_seqlens_q[{r + 1}])",
                cu[r + 1],
            )
        if cu[r + 1] < cu[r]:
            raise ArgumentError(
                "cu_seqlens_q",
                f"sorted (strictly increasing) entries: cu_seqlens_q[{r + 1}] > cu_seqlens_q[{r}] = {cu[r]}",
                cu[r + 1],
            )
    if cu[-1] != num_rows:
        raise ArgumentError("cu_seqlens_q", f"a last entry of T = {num_rows} (the rows of q)", cu[-1])
    lens = [int(v) for v in lens_host.tolist()]
    for r in range(num_requests):
        q_len = cu[r + 1] - cu[r]
        if q_len > lens[r]:
            raise ArgumentError(
                "seq_lens",
                f"lengths >= q_len = {q_len} (the new tokens are part of it; request {r})",
                lens[r],
            )
    if rest:
        _check_indices(rest[0], cu, lens)
    return shape, cu


def _check_indices(idx: torch.Tensor, cu: list[int], lens: list[int]) -> None:
    """``idx``: the host int64 copy of ``indices`` [T, K]."""
    rows = torch.arange(idx.shape[0])  # [T]
    request = torch.bucketize(rows, torch.tensor(cu[1:]), right=True)  # [T], row t's request r
    start = torch.tensor(cu[:-1])[request]  # [T]
    length = torch.tensor(lens)[request]  # [T]
    q_len = (torch.tensor(cu[1:]) - torch.tensor(cu[:-1]))[request]  # [T]
    position = length - q_len + (rows - start)  # [T], the row's absolute position p

    def where(t: int, k: int) -> str:
        r = int(request[t])
        return f"request {r}, row {t} (token {t - cu[r]}, position {int(position[t])}), slot {k}"

    bad = (idx < -1) | (idx > position[:, None])  # [T, K]
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise ArgumentError(
            "indices",
            f"positions in [0, p] = [0, {int(position[t])}] (causal: at most the row's position) "
            f"or -1 ({where(t, k)})",
            int(idx[t, k]),
        )
    after_tail = (idx >= 0) & ((idx == -1).to(torch.int64).cummax(dim=1).values > 0)  # [T, K]
    if bool(after_tail.any()):
        t, k = (int(v) for v in after_tail.nonzero()[0])
        raise ArgumentError(
            "indices",
            f"a -1 tail: no position after a -1 in a row ({where(t, k)})",
            int(idx[t, k]),
        )


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
    rounded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference varlen causal prefill attention over a paged KV cache, in float64.

    ``o[t, h] = sum_j softmax_j(scale * <q[t, h], k_j>) v_j`` over the positions j row t (of
    request r, at position ``p = L_r - Q_r + t - cu_seqlens_q[r]``) attends to -- dense:
    ``0 <= j <= p``; sparse: ``indices[t]`` before its -1 tail -- with k/v of kv head
    ``h // (Hq // Hkv)``; ``lse[t, h] = log sum_j exp(s_j)`` (natural log).

    Parameters
    ----------
    q : Tensor, (T, Hq, D), bfloat16 or float16
        The new tokens of every request, packed in request order.
    k_cache, v_cache : Tensor, (P, S, Hkv, D), q's dtype
        The paged cache, the new tokens' K/V already written after each request's prefix.
    block_table : Tensor, (R, M), int32; entries past ``ceil(L_r / S)`` are never read
    cu_seqlens_q : Tensor, (R + 1,), int32 or int64
        ``0 = cu[0] < cu[1] < ... < cu[R] = T``: request r owns rows ``cu[r] .. cu[r + 1] - 1``.
    seq_lens : Tensor, (R,), int32, ``Q_r <= L_r <= M * S`` (prefix + new tokens)
    scale : float, optional
        Finite, rounded to fp32 before use (as the kernels see it); default ``1 / sqrt(D)``.
    indices : Tensor, (T, K), int32, optional
        Per row, positions in ``[0, p]`` then a tail of -1 (seed 003's sparse-MLA prefill, fed
        from ``topk``).  None: dense causal attention.
    rounded : bool, default False
        False: the exact-as-fp64 values (what the agreement bound consumes, as every reference
        of the project returns).  True: o rounded once (ties to even) to q's dtype and lse
        rounded once to float32 -- the component's output dtypes.

    Returns
    -------
    (o, lse): tensors (T, Hq, D) and (T, Hq), float64 (``rounded``: q's dtype and float32).

    Notes
    -----
    Each request is computed alone from its own pages and each row from its own keys: the
    output is bitwise invariant along the batch (co-scheduled requests, their order, their
    q_len), the pages a request's tokens sit in, the table's padding, and the phase that
    computes a row (a request's prefill cut into a cached prefix and a continuation at any
    point gives the same rows as its full prefill; Q_r = 1, 2, 4 gives the bits of
    :func:`~batchinv.reference.decode_attention.decode_attention`).  An empty context (sparse,
    every index -1) gives o = +0 and lse = -inf, never NaN; T = 0 gives empty outputs.  NaN
    or inf in an attended key or value propagates as the formula says; memory not attended
    (other pages, the tail of a last page, positions past p) is never read.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError: see :func:`check_prefill_attention_arguments`.

    Source: FlashAttention's varlen interface (``flash_attn_varlen_func``: ``cu_seqlens_q``,
    causal aligned to the bottom right of each request) over vLLM's paged prefill semantics
    (``query_start_loc``, ``seq_lens``, ``block_table``); the textbook softmax attention
    (Vaswani et al. 2017).
    """
    head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else 0
    s = default_scale(head_dim) if scale is None else scale
    _, cu = check_prefill_attention_arguments(
        q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, indices
    )
    t_count, hq, d = q.shape
    o = torch.zeros(t_count, hq, d, dtype=torch.float64, device=q.device)  # (T, Hq, D)
    lse = torch.full((t_count, hq), -math.inf, dtype=torch.float64, device=q.device)  # (T, Hq)
    for r in range(len(cu) - 1):
        rows = slice(cu[r], cu[r + 1])  # request r's Q_r rows
        index_rows = None if indices is None else indices[rows].unsqueeze(0)  # (1, Q_r, K)
        o_r, lse_r = decode_attention(  # one request of q_len Q_r: (1, Q_r, Hq, D), (1, Q_r, Hq)
            q[rows].unsqueeze(0),
            k_cache,
            v_cache,
            block_table[r : r + 1],
            seq_lens[r : r + 1],
            s,
            index_rows,
        )
        o[rows] = o_r[0]
        lse[rows] = lse_r[0]
    assert o.shape == q.shape and lse.shape == q.shape[:2]
    if rounded:
        return round_once(o, q.dtype), round_once(lse, torch.float32)
    return o, lse
