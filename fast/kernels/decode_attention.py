"""Triton kernels of split-KV (flash-decoding) decode attention over a paged KV cache (only
``@triton.jit`` code).

Stage 1, :func:`decode_attention_split_kernel`: one program per (request r, query token i, kv
head, split s) computes, for the ``GROUP`` query heads sharing the kv head, the attention over
the split's ``split_tokens`` slots -- positions ``[s * split_tokens, (s + 1) * split_tokens)``
(dense) or those slots of ``indices[r, i]`` (sparse) -- walked in chunks of ``BLOCK_N`` with an
online softmax, and writes the partial ``(o_s, lse_s)`` in fp32 to a workspace.

Stage 2, :func:`decode_attention_merge_kernel`: one program per (r, i, query head) merges the
token's partials in ascending split order (rescaling by the running maximum lse), divides once
and rounds o once to the output dtype.

Packed ragged rows (``HAS_RAGGED``, the ``prefill_attention`` launcher): the query rows of every
request are packed, ``q [T, Hq, D]``, and row t carries its request ``row_request[t]`` and its
causal key count ``row_keys[t]`` (``p + 1`` at position p), which the uniform path computes as
``L - Q + i + 1``.  Only where a row's request, key count, q row and index row are looked up
differs; from there on a row runs the same instructions on the same values as the uniform path
for the same (request, position), so prefill, chunked prefill, decode and speculative verify give
the same bits by construction.

A token's split boundaries are fixed multiples of ``split_tokens`` and every reduction runs in an
order set by ``split_tokens``, ``BLOCK_N`` and the token's own length: nothing in a program's
arithmetic depends on other requests, their number or lengths, or the grid's size.
"""

from __future__ import annotations

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import NEG_INF, round_to


@triton.jit
def _num_slots(lens_ptr, r, i, q_len, index_slots, max_tokens, HAS_INDICES: tl.constexpr):
    """The slots token i of request r walks: its causal length (dense) or the index slots (sparse),
    clamped to the table's capacity (never more splits than the workspace holds)."""
    length = tl.load(lens_ptr + r)
    if HAS_INDICES:
        n = index_slots + 0 * length
    else:
        n = tl.minimum(length - q_len + i + 1, max_tokens)
    return tl.maximum(n, 0), length


@triton.jit
def _row_slots(lens_ptr, keys_ptr, r, row, index_slots, max_tokens, HAS_INDICES: tl.constexpr):
    """:func:`_num_slots` of a packed row: its causal key count ``row_keys[row]`` (dense; the
    launcher's ``L - Q + i + 1``) or the index slots (sparse), clamped the same way."""
    length = tl.load(lens_ptr + r)
    if HAS_INDICES:
        n = index_slots + 0 * length
    else:
        n = tl.minimum(tl.load(keys_ptr + row), max_tokens)
    return tl.maximum(n, 0), length


# The request count, lengths and split size are never specialized: Triton would otherwise compile
# variants by value (== 1, % 16 == 0), i.e. pick code by the batch.
@triton.jit(do_not_specialize=["q_len", "index_slots", "max_tokens", "split_tokens", "max_splits"])
def decode_attention_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    idx_ptr,
    row_request_ptr,
    row_keys_ptr,
    row_key_start_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    scale,
    q_len,
    num_kv_heads,
    index_slots,
    max_tokens,
    split_tokens,
    max_splits,
    stride_q_r,
    stride_q_i,
    stride_q_h,
    stride_k_p,
    stride_k_s,
    stride_k_h,
    stride_v_p,
    stride_v_s,
    stride_v_h,
    stride_t_r,
    stride_i_r,
    stride_i_i,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    TENSOR_CORES: tl.constexpr,
    WEIGHT_PAIR: tl.constexpr,
    HAS_RAGGED: tl.constexpr = False,
    HAS_KEY_START: tl.constexpr = False,
):
    """Partial attention of one split: ws_o[row, s] = o_s (fp32), ws_lse[row, s] = lse_s (fp32,
    natural log) for ``row = (r * Q + i) * Hq + h``; a split with no attended slot writes
    (0, -inf).  The last dims of q, the caches and the workspace are contiguous (stride 1).
    ``HAS_RAGGED``: ``token`` is a packed row t of q (T, Hq, D) (``stride_q_r``, ``stride_i_r``
    its row strides; ``stride_q_i``, ``stride_i_i`` and ``q_len`` unused), of request
    ``row_request[t]`` with ``row_keys[t]`` causal keys.  ``HAS_KEY_START`` (dense, ragged): row
    t's keys are the positions ``row_key_start[t] .. row_key_start[t] + row_keys[t] - 1`` of its
    request, and its splits are counted from its first key (an SDPA mask's visible range)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    kv_head = pid % num_kv_heads
    token = pid // num_kv_heads  # r * Q + i (HAS_RAGGED: the packed row t)
    if HAS_RAGGED:
        r = tl.load(row_request_ptr + token)
        n_slots, length = _row_slots(lens_ptr, row_keys_ptr, r, token, index_slots, max_tokens, HAS_INDICES)
        q_row = q_ptr + token.to(tl.int64) * stride_q_r
        idx_row = idx_ptr + token.to(tl.int64) * stride_i_r
        if HAS_KEY_START:
            key_start = tl.load(row_key_start_ptr + token)
    else:
        r = token // q_len
        i = token % q_len
        n_slots, length = _num_slots(lens_ptr, r, i, q_len, index_slots, max_tokens, HAS_INDICES)
        q_row = q_ptr + r.to(tl.int64) * stride_q_r + i.to(tl.int64) * stride_q_i
        idx_row = idx_ptr + r.to(tl.int64) * stride_i_r + i.to(tl.int64) * stride_i_i
    start = split * split_tokens
    if start < n_slots:
        g = tl.arange(0, BLOCK_G)
        g_ok = g < GROUP
        heads = (kv_head * GROUP + g).to(tl.int64)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_row + heads[:, None] * stride_q_h + d[None, :], mask=g_ok[:, None], other=0.0)
        end = tl.minimum(start + split_tokens, n_slots)
        m = tl.full([BLOCK_G], NEG_INF, tl.float32)
        l_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        lanes = tl.arange(0, BLOCK_N)
        for c in range(0, split_tokens, BLOCK_N):
            t = start + c + lanes
            lane_ok = t < end
            if HAS_INDICES:
                pos = tl.load(idx_row + t, mask=lane_ok, other=-1)
                # (indices past the length are refused on the host; here they are never read)
                valid = lane_ok & (pos >= 0) & (pos < length)
            else:
                if HAS_KEY_START:
                    pos = key_start + t
                else:
                    pos = t
                valid = lane_ok
            page = tl.load(table_ptr + r.to(tl.int64) * stride_t_r + pos // PAGE_SIZE, mask=valid, other=0)
            slot = page.to(tl.int64) * stride_k_p + (pos % PAGE_SIZE).to(tl.int64) * stride_k_s
            kv_off = slot + kv_head.to(tl.int64) * stride_k_h  # [BLOCK_N] int64
            k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            v_off = (
                page.to(tl.int64) * stride_v_p
                + (pos % PAGE_SIZE).to(tl.int64) * stride_v_s
                + kv_head.to(tl.int64) * stride_v_h
            )
            v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            # Scores: exact products of 16-bit values, fp32 accumulation -- on tensor cores, or
            # as fp32 IEEE dots in the interpreter (whose 16-bit tl.dot multiplies raw bits).
            if TENSOR_CORES:
                s = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_G, BLOCK_N]
            else:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
            s = tl.where(valid[None, :], s, NEG_INF)
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.where(m_new == NEG_INF, 1.0, tl.exp(m - m_new))
            # A -inf score is a masked key: weight 0, even while every score so far is -inf
            # (exp(-inf - -inf) would be NaN); a NaN or +inf score still gives NaN.
            p = tl.where(valid[None, :] & (s != NEG_INF), tl.exp(s - m_new[:, None]), 0.0)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            # fp32 weights times values, never one 16-bit rounding of p: on tensor cores either
            # p as a 16-bit head + tail pair (two 16-bit dots) or 3xTF32 (16-bit values are
            # exact in TF32); in the interpreter an fp32 dot.
            if TENSOR_CORES and WEIGHT_PAIR:
                p_head = p.to(v.dtype)
                p_tail = (p - p_head.to(tl.float32)).to(v.dtype)
                pv = tl.dot(p_tail, v, tl.dot(p_head, v))
            else:
                pv = tl.dot(p, v.to(tl.float32), input_precision="tf32x3")
            acc = acc * alpha[:, None] + pv
            m = m_new
        # No attended slot, or every attended score -inf: (0, -inf).  A NaN sum (a NaN or +inf
        # score) stays NaN: it must never read as an empty split.
        empty = l_sum == 0
        lse = tl.where(empty, NEG_INF, m + tl.log(l_sum))
        o = tl.where(empty[:, None], 0.0, acc / l_sum[:, None])
        rows = (token.to(tl.int64) * num_kv_heads + kv_head) * GROUP + g  # [BLOCK_G]
        ws_row = rows * max_splits + split
        tl.store(ws_lse_ptr + ws_row, lse, mask=g_ok)
        tl.store(ws_o_ptr + ws_row[:, None] * HEAD_DIM + d[None, :], o, mask=g_ok[:, None])


@triton.jit(do_not_specialize=["q_len", "index_slots", "max_tokens", "split_tokens", "max_splits"])
def decode_attention_merge_kernel(
    ws_o_ptr,
    ws_lse_ptr,
    lens_ptr,
    row_keys_ptr,
    o_ptr,
    lse_ptr,
    q_len,
    num_q_heads,
    index_slots,
    max_tokens,
    split_tokens,
    max_splits,
    HEAD_DIM: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    HAS_RAGGED: tl.constexpr = False,
):
    """o[row] = merge of the token's partials in ascending split order, rounded once to o's
    dtype; lse[row] in fp32.  No attended slot at all: o = +0, lse = -inf.  o and lse are
    contiguous (R, Q, Hq, D) and (R, Q, Hq) -- ``HAS_RAGGED``: (T, Hq, D) and (T, Hq), the
    token a packed row t with ``row_keys[t]`` causal keys (dense)."""
    row = tl.program_id(0).to(tl.int64)  # (r * Q + i) * Hq + h
    token = row // num_q_heads
    if HAS_RAGGED:  # the request only matters for its length, which _row_slots does not use here
        n_slots, _ = _row_slots(lens_ptr, row_keys_ptr, 0, token, index_slots, max_tokens, HAS_INDICES)
    else:
        r = token // q_len
        i = token % q_len
        n_slots, _ = _num_slots(lens_ptr, r, i, q_len, index_slots, max_tokens, HAS_INDICES)
    num_splits = (n_slots + split_tokens - 1) // split_tokens
    d = tl.arange(0, HEAD_DIM)
    m = tl.full((), NEG_INF, tl.float32)
    l_sum = tl.zeros((), tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(ws_lse_ptr + row * max_splits + s)
        o_s = tl.load(ws_o_ptr + (row * max_splits + s) * HEAD_DIM + d)
        live = lse_s != NEG_INF  # an empty split changes nothing, not even a zero's sign; NaN is live
        m_new = tl.maximum(m, lse_s)
        alpha = tl.exp(m - m_new)  # 0 for the first live split
        w = tl.exp(lse_s - m_new)
        acc = tl.where(live, acc * alpha + w * o_s, acc)
        l_sum = tl.where(live, l_sum * alpha + w, l_sum)
        m = tl.where(live, m_new, m)
    empty = l_sum == 0  # no live split; a NaN sum stays NaN
    o = tl.where(empty, 0.0, acc / l_sum)
    lse = tl.where(empty, NEG_INF, m + tl.log(l_sum))
    tl.store(o_ptr + row * HEAD_DIM + d, round_to(o, o_ptr.dtype.element_ty))
    tl.store(lse_ptr + row, lse)
