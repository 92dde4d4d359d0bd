"""Reference decode attention over a paged KV cache (dense and sparse): fp64, one request at a time.

Dimension legend:
    R: requests of the launch
    Q: q_len, new query tokens per request (uniform in a launch: 1, or 2/4 for speculative decoding)
    Hq: query heads          Hkv: kv heads (GQA: Hq % Hkv == 0, head h reads kv head h // (Hq // Hkv))
    D: head dim              P: physical pages of the cache      S: page_size (tokens per page)
    T: max_pages, the width of the block table                   K: index slots (sparse mode)
    L: seq_lens[r], request r's KV length, its Q new tokens included (they are the last Q positions)

Request r's logical page j lives in physical page ``block_table[r, j]``; KV position p sits at
``(block_table[r, p // S], p % S)``.  Table entries at ``j >= ceil(L / S)`` are padding and never
read.  Dense mode: query token i (0-based among the Q) attends to positions ``p < L - Q + i + 1``
(causal inside the new tokens).  Sparse mode: it attends to the positions ``indices[r, i, :]``
not equal to -1 (a position listed twice counts twice, as the kernel's index loop does).

Per (r, i, h), with ``s_p = scale * <q, k_p>`` (``scale`` rounded to fp32 first, as the kernel
sees it)::

    lse = log(sum_p exp(s_p))          o = sum_p exp(s_p - lse) * v_p

in float64 from the inputs' exact values.  An empty context (every index -1) gives o = 0 and
lse = -inf, never NaN.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor
from batchinv.reference.host_read import host_int64

__all__ = [
    "ATTENTION_DTYPES",
    "AttentionShape",
    "attention_bound",
    "check_decode_attention_arguments",
    "decode_attention",
]

#: q / KV dtypes the component accepts (fast and reference alike).
ATTENTION_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class AttentionShape:
    """The named dims of a validated call (see the module's legend)."""

    num_requests: int  # R
    q_len: int  # Q
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    num_pages: int  # P
    page_size: int  # S
    max_pages: int  # T
    index_slots: int | None  # K (None: dense mode)
    #: the longest length of ``seq_lens`` where validation read the values (None where it did
    #: not: under CUDA-graph capture, or R = 0), so the launcher sizes its grid without reading
    #: them again
    longest: int | None = None

    @property
    def group(self) -> int:
        """Query heads per kv head (Hq // Hkv)."""
        return self.num_q_heads // self.num_kv_heads


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_decode_attention_arguments(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    seq_lens: Any,
    scale: Any,
    indices: Any = None,
    *,
    read_values: bool | None = None,
) -> AttentionShape:
    """Validate the arguments of :func:`decode_attention` (shared with the fast path).

    ``read_values`` (default: True unless a CUDA graph is being captured on q's device) turns on
    the checks that read tensor values -- lengths, referenced page ids, index bounds: a host
    sync, skipped under capture, where the fast path reads what it is given.

    Returns:
        the call's :class:`AttentionShape`.

    Raises:
        DTypeError: a non-tensor; q not bf16/fp16; k_cache/v_cache not q's dtype; block_table,
            seq_lens or indices not int32; scale not a real number (or a bool).
        ArgumentError: a wrong rank; k_cache/v_cache shapes differ; head dims differ; Hq not a
            multiple of Hkv (or Hkv == 0); block_table/seq_lens/indices of another R (indices
            of another Q); a non-finite scale; a sparse or nested tensor.  With values read: a
            negative length, a length below Q, a length needing more pages than the table holds
            (``ceil(L / S) > T``), a referenced page id outside ``[0, P)``, an index outside
            ``[-1, L)``.
        DeviceError: a tensor on another device than q; a tensor on the meta device.
    """
    check_tensor("q", q, dtypes=ATTENTION_DTYPES, ndim=4)
    check_tensor("k_cache", k_cache, dtypes=(q.dtype,), ndim=4)
    check_tensor("v_cache", v_cache, dtypes=(q.dtype,), ndim=4)
    check_tensor("block_table", block_table, dtypes=(torch.int32,), ndim=2)
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), ndim=1)
    if indices is not None:
        check_tensor("indices", indices, dtypes=(torch.int32,), ndim=3)
    for name, t in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_table", block_table),
        ("seq_lens", seq_lens),
        ("indices", indices),
    ):
        if t is not None:
            check_same_device(name, t, q.device)
    num_requests, q_len, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, kv_dim = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ArgumentError("v_cache", f"the shape of k_cache {tuple(k_cache.shape)}", tuple(v_cache.shape))
    if kv_dim != head_dim:
        raise ArgumentError("k_cache", f"head dim D = {head_dim} (the last dim of q)", kv_dim)
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ArgumentError(
            "k_cache", f"Hkv >= 1 dividing Hq = {num_q_heads} (GQA: Hq % Hkv == 0)", num_kv_heads
        )
    if page_size < 1:
        raise ArgumentError("k_cache", "page_size >= 1 (dim 1)", page_size)
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.shape[0] != num_requests:
            raise ArgumentError(name, f"dim 0 of length R = {num_requests} (the requests of q)", t.shape[0])
    if indices is not None and tuple(indices.shape[:2]) != (num_requests, q_len):
        raise ArgumentError(
            "indices", f"shape (R, Q, K) = ({num_requests}, {q_len}, K)", tuple(indices.shape)
        )
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise DTypeError("scale", "a real number (float)", type(scale).__name__)
    try:
        finite = math.isfinite(fp32_scale(float(scale)))  # the kernel (and the reference) use it in fp32
    except OverflowError:  # an int past fp64's range
        finite = False
    if not finite:
        raise ArgumentError("scale", "a float finite in fp32 (|scale| <= 3.4e38)", scale)
    max_pages = block_table.shape[1]
    shape = AttentionShape(
        num_requests,
        q_len,
        num_q_heads,
        num_kv_heads,
        head_dim,
        num_pages,
        page_size,
        max_pages,
        None if indices is None else indices.shape[2],
    )
    if read_values is None:
        read_values = not _capturing(q.device)
    if read_values and num_requests:
        shape = replace(shape, longest=_check_values(shape, block_table, seq_lens, indices))
    return shape


def _first(bad: torch.Tensor) -> int:
    return int(bad.nonzero()[0, 0])


def _check_values(
    shape: AttentionShape, block_table: torch.Tensor, seq_lens: torch.Tensor, indices: torch.Tensor | None
) -> int:
    """Raise on a value the call cannot take (see :func:`check_decode_attention_arguments`);
    return the longest length.  One host read for all the tensors."""
    lens, table, *rest = host_int64(seq_lens, block_table, *([] if indices is None else [indices]))
    return check_host_values(shape, lens, table, rest[0] if rest else None)


def check_host_values(
    shape: AttentionShape, lens: torch.Tensor, table: torch.Tensor, idx: torch.Tensor | None
) -> int:
    """The value checks of :func:`check_decode_attention_arguments` on host int64 copies of
    ``seq_lens [R]``, ``block_table [R, T]`` and ``indices [R, Q, K]`` (or None), R >= 1 (read
    with :func:`host_int64`, e.g. together with a caller's other tensors); returns the longest
    length.

    Raises:
        ArgumentError: as :func:`check_decode_attention_arguments` with values read.
    """
    if bool((lens < 0).any()):
        r = _first(lens < 0)
        raise ArgumentError("seq_lens", f"lengths >= 0 (request {r})", int(lens[r]))
    if bool((lens < shape.q_len).any()):
        r = _first(lens < shape.q_len)
        raise ArgumentError(
            "seq_lens",
            f"lengths >= Q = {shape.q_len} (the new tokens are part of it; request {r})",
            int(lens[r]),
        )
    pages_needed = (lens + shape.page_size - 1) // shape.page_size  # [R]
    if bool((pages_needed > shape.max_pages).any()):
        r = _first(pages_needed > shape.max_pages)
        raise ArgumentError(
            "seq_lens",
            f"at most max_pages * page_size = {shape.max_pages * shape.page_size} tokens "
            f"(the pages block_table holds; request {r})",
            int(lens[r]),
        )
    referenced = torch.arange(shape.max_pages)[None, :] < pages_needed[:, None]  # [R, T]
    bad = referenced & ((table < 0) | (table >= shape.num_pages))
    if bool(bad.any()):
        r, j = (int(v) for v in bad.nonzero()[0])
        raise ArgumentError(
            "block_table",
            f"page ids in [0, {shape.num_pages}) for referenced pages (request {r}, logical page {j})",
            int(table[r, j]),
        )
    if idx is not None:  # [R, Q, K]
        bad = (idx < -1) | (idx >= lens[:, None, None])
        if bool(bad.any()):
            r, i, k = (int(v) for v in bad.nonzero()[0])
            raise ArgumentError(
                "indices",
                f"positions in [0, seq_len = {int(lens[r])}) or -1 (request {r}, token {i}, slot {k})",
                int(idx[r, i, k]),
            )
    return int(lens.max())


def fp32_scale(scale: float) -> float:
    """``scale`` rounded to fp32: the value the kernel multiplies by (the reference uses it too)."""
    return float(torch.tensor(float(scale), dtype=torch.float32))


def _gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, table_row: torch.Tensor, length: int, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Request's keys and values in logical order, fp64: two [L, Hkv, D] tensors."""
    num_pages = -(-length // page_size)
    pages = table_row[:num_pages].to(torch.int64)  # [ceil(L / S)]
    _, _, hkv, d = k_cache.shape
    k = k_cache.index_select(0, pages).reshape(-1, hkv, d)[:length]  # [L, Hkv, D]
    v = v_cache.index_select(0, pages).reshape(-1, hkv, d)[:length]  # [L, Hkv, D]
    return k.to(torch.float64), v.to(torch.float64)


def _token_context(
    k: torch.Tensor, v: torch.Tensor, length: int, q_len: int, i: int, index_row: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values query token ``i`` attends to: two [N, Hkv, D] fp64 tensors."""
    if index_row is None:
        n = length - q_len + i + 1  # causal inside the new tokens
        return k[:n], v[:n]
    chosen = index_row[index_row >= 0].to(torch.int64)  # [N], in slot order
    return k.index_select(0, chosen), v.index_select(0, chosen)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference decode attention over a paged KV cache, in float64.

    ``o[r, i, h] = sum_p softmax_p(scale * <q[r, i, h], k_p>) v_p`` over the positions p query
    token i of request r attends to (dense: ``p < L - Q + i + 1``; sparse: ``indices[r, i]``
    without -1), with k/v of kv head ``h // (Hq // Hkv)``; ``lse[r, i, h] = log sum_p exp(s_p)``.

    Parameters
    ----------
    q : Tensor, (R, Q, Hq, D), bfloat16 or float16
    k_cache, v_cache : Tensor, (P, S, Hkv, D), q's dtype
    block_table : Tensor, (R, T), int32; entries past ``ceil(L / S)`` are never read
    seq_lens : Tensor, (R,), int32, ``Q <= L <= T * S``
    scale : float, finite (rounded to fp32 before use, as the kernel sees it)
    indices : Tensor, (R, Q, K), int32, optional: positions in ``[0, L)`` or -1 (unused)

    Returns
    -------
    (o, lse): float64 tensors (R, Q, Hq, D) and (R, Q, Hq).

    Notes
    -----
    Each request is computed alone from its own pages: outputs do not depend on the batch.  An
    empty context (sparse, every index -1) gives o = +0 and lse = -inf, and so does a token
    whose every attended score is -inf (a -inf score is a masked key, weight 0; the fast path
    agrees).  NaN or inf in an attended key or value otherwise propagates as the formula says
    (a NaN or +inf score: NaN o and lse); memory not attended is never read.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError: see :func:`check_decode_attention_arguments`.

    Source: the textbook definition (Vaswani et al. 2017) over vLLM's paged KV layout.
    """
    shape = check_decode_attention_arguments(
        q, k_cache, v_cache, block_table, seq_lens, scale, indices, read_values=True
    )
    r_count, q_len, hq, d = q.shape
    group = shape.group
    s = fp32_scale(scale)
    o = torch.zeros(r_count, q_len, hq, d, dtype=torch.float64, device=q.device)  # (R, Q, Hq, D)
    lse = torch.full((r_count, q_len, hq), -math.inf, dtype=torch.float64, device=q.device)  # (R, Q, Hq)
    lens = seq_lens.tolist()
    for r in range(r_count):
        k, v = _gather_kv(k_cache, v_cache, block_table[r], lens[r], shape.page_size)  # [L, Hkv, D]
        for i in range(q_len):
            kc, vc = _token_context(k, v, lens[r], q_len, i, None if indices is None else indices[r, i])
            if kc.shape[0] == 0:  # empty context: o = 0, lse = -inf
                continue
            kh = kc.repeat_interleave(group, dim=1)  # [N, Hq, D]
            vh = vc.repeat_interleave(group, dim=1)  # [N, Hq, D]
            scores = torch.einsum("hd,nhd->hn", q[r, i].to(torch.float64), kh) * s  # [Hq, N]
            lse_ri = torch.logsumexp(scores, dim=-1)  # [Hq]
            # a -inf score is a masked key, weight 0 -- also when every score is -inf (lse = -inf:
            # -inf - -inf would be NaN), which gives the empty context's pair (o = 0, lse = -inf)
            weights = torch.where(torch.isneginf(scores), 0.0, (scores - lse_ri[:, None]).exp())  # [Hq, N]
            o[r, i] = torch.einsum("hn,nhd->hd", weights, vh)  # [Hq, D]
            lse[r, i] = lse_ri
    assert o.shape == (*q.shape[:3], d) and lse.shape == q.shape[:3]
    return o, lse


# --- agreement bound ----------------------------------------------------------------------------

U32 = 2.0**-24  #: fp32 unit roundoff
#: exp: ex2.approx.f32 within 2 ulp (4 u) relative; the argument x * log2(e) adds |x| u (counted apart).
K_EXP = 4.0
#: log: lg2.approx.f32 times ln 2, within 4 u of log l plus an absolute 2**-22 near l = 1.
K_LOG = 4.0
#: division: div.full.f32 within 2 ulp (4 u).
K_DIV = 4.0
#: fp32 dot accumulation on tensor cores may truncate instead of rounding: one ulp (2 u) per add.
K_DOT = 2.0
#: The weights times values on tensor cores: p enters either as a 16-bit head + tail pair (two
#: 16-bit dots; relative error <= 2 u_16**2: 2**-18 in bf16, 2**-22 in fp16) or through a 3xTF32
#: dot (<= 2**-21).  Counted per weight relative to it, with a factor 2 of margin:
W_REL: dict[torch.dtype, float] = {torch.bfloat16: 2.0**-17, torch.float16: 2.0**-20}
#: ... and, in fp16 only, absolutely: a head or tail below fp16's normal range is a subnormal, off
#: by up to half of 2**-24 (counted as 2**-24) in units of its chunk's running-max scale.
W_ABS: dict[torch.dtype, float] = {torch.bfloat16: 0.0, torch.float16: 2.0**-24}


#: Explicit mantissa bits of the output dtypes.
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def _unit_roundoff(dtype: torch.dtype) -> float:
    return 2.0 ** -(_MANTISSA_BITS[dtype] + 1)


def _half_min_subnormal(dtype: torch.dtype) -> float:
    return 0.5 * float(torch.finfo(dtype).smallest_normal) * 2.0 ** -_MANTISSA_BITS[dtype]


def attention_bound(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
    *,
    reference: tuple[torch.Tensor, torch.Tensor],
    split_tokens: int,
    block_n: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element bounds on ``|fast - reference|`` for o (R, Q, Hq, D) and lse (R, Q, Hq), fp64.

    The fast kernel (``fast/decode_attention.py``) computes, per (r, i, h): scores in fp32 from a
    D-long dot of exact products; per split of ``split_tokens`` positions an online softmax over
    chunks of ``block_n`` (rescaled by ``alpha = exp(m_old - m_new)`` per chunk), a partial
    (o_s, lse_s); then a merge of the ``n_s`` partials with weights ``exp(lse_s - m)``; one
    rounding of o to the output dtype.  With ``u = 2**-24`` and, from the fp64 reference:

    * ``S = max_p |scale| sum_d |q_d k_pd|`` and the score error ``delta = K_DOT (D + 1) u S``
      (D adds plus the scale product; K_DOT = 2 for truncating accumulation);
    * ``G = max_p s_p - min_p s_p`` (the score range, >= every exp argument);
    * ``c = split_tokens / block_n`` chunks per split, ``n_s`` the splits of this token;
    * ``eps_w = 2 delta + (c + n_s + 3)(K_EXP + 2 G + 2) u``: the relative error of a normalized
      weight -- the score error enters the numerator and lse, and each of at most ``c + n_s + 3``
      exp factors (a term's exp, its chunk's rescales, the split weight) carries K_EXP u plus the
      rounding of its argument (x - m and x log2 e: 2 |x| u <= 2 G u) and of its product (u);
    * ``eps_sum = K_DOT (block_n + c + n_s + 4) u + 2 K_DIV u``: the fp32 sums of the weights
      and of the weighted values (a block_n dot, c chunk adds, n_s merge adds, the two adds of a
      3xTF32 dot's partial products) relative to the sums of their magnitudes, and the two
      divisions (o_s = acc / l, o = acc / l);
    * ``W_REL``: the weights enter the weighted values through tensor-core dots that carry p
      as a 16-bit head + tail pair or as 3xTF32 (16-bit values are exact either way), a
      relative error of each weight (2**-17 in bf16, 2**-20 in fp16, with margin); in fp16 a
      head or tail can be subnormal: an absolute ``W_ABS = 2**-24`` per position in units of
      the running maximum, i.e. at most ``W_ABS exp(max_p s_p - lse) sum_p |v_p|`` on o;
    * ``A = sum_p P_p |v_p|`` per output element (the magnitude the sums cancel to o).

    Then ``|o_fast - o| <= u_out |o| + (1 + u_out)((eps_w + eps_sum + W_REL) A + W_ABS term) + u_sub``: the fp32 value
    is within ``(eps_w + eps_sum + W_REL) A`` plus the W_ABS term of o and one rounding to the output dtype (``u_out`` half
    an ulp, ``u_sub`` half its smallest subnormal, 2**-126 for a GPU's flushed fp32) follows.
    And ``|lse_fast - lse| <= delta + eps_w + eps_sum + (K_LOG + 3) u (|lse| + 1)``.

    How tight: eps terms are O(10**-5) for the issue's shapes, so the bound on o is about half
    an ulp of the output plus a few fp32 ulps of A.  Merging the same partials in another order
    changes o by a few u A and lse by a few u |lse|: within the bound (a reordering mutant is
    caught bitwise instead, by the component's order-exact ``merge_order`` cases: see
    ``batchinv.harness.components.decode_attention.exact``).  Dropping the last partial page removes
    positions of weight ``P_drop``, moving lse by ``log(1 - P_drop)`` (~P_drop >> the lse bound
    whenever P_drop > ~1e-5, i.e. any dropped position in contexts below ~10**5 tokens) and o by
    ``P_drop (v - o)``: caught.  Empty context: bound 0 (o = 0 and lse = -inf are exact).
    """
    shape = check_decode_attention_arguments(
        q, k_cache, v_cache, block_table, seq_lens, scale, indices, read_values=True
    )
    o_ref, lse_ref = reference
    r_count, q_len, hq, d = q.shape
    group = shape.group
    s = abs(fp32_scale(scale))
    u_out = _unit_roundoff(q.dtype)
    u_sub = _half_min_subnormal(q.dtype) + 2.0**-126
    c = max(1, split_tokens // block_n)
    bound_o = torch.zeros(r_count, q_len, hq, d, dtype=torch.float64, device=q.device)  # (R, Q, Hq, D)
    bound_lse = torch.zeros(r_count, q_len, hq, dtype=torch.float64, device=q.device)  # (R, Q, Hq)
    lens = seq_lens.tolist()
    for r in range(r_count):
        k, v = _gather_kv(k_cache, v_cache, block_table[r], lens[r], shape.page_size)  # [L, Hkv, D]
        for i in range(q_len):
            index_row = None if indices is None else indices[r, i]
            kc, vc = _token_context(k, v, lens[r], q_len, i, index_row)
            n = kc.shape[0]
            if n == 0:
                continue
            slots = n if index_row is None else index_row.shape[0]
            n_splits = max(1, -(-slots // split_tokens))
            kh = kc.repeat_interleave(group, dim=1)  # [N, Hq, D]
            vh = vc.repeat_interleave(group, dim=1)  # [N, Hq, D]
            q64 = q[r, i].to(torch.float64)  # [Hq, D]
            scores = torch.einsum("hd,nhd->hn", q64, kh) * fp32_scale(scale)  # [Hq, N]
            magnitude = torch.einsum("hd,nhd->hn", q64.abs(), kh.abs()) * s  # [Hq, N]
            delta = K_DOT * (d + 1) * U32 * magnitude.amax(dim=-1)  # [Hq]
            spread = scores.amax(dim=-1) - scores.amin(dim=-1)  # [Hq]
            eps_w = 2 * delta + (c + n_splits + 3) * (K_EXP + 2 * spread + 2) * U32  # [Hq]
            eps_sum = (K_DOT * (block_n + c + n_splits + 4) + 2 * K_DIV) * U32
            weights = (scores - lse_ref[r, i][:, None]).exp()  # [Hq, N]
            a = torch.einsum("hn,nhd->hd", weights, vh.abs())  # [Hq, D]
            eps_o = eps_w + eps_sum + W_REL[q.dtype]  # the weights' 16-bit/TF32 cut enters o, not lse
            # fp16 subnormal heads/tails: W_ABS per position, scaled by exp(s_max - lse) <= 1 / P_max
            w_abs = W_ABS[q.dtype] * (scores.amax(dim=-1) - lse_ref[r, i]).exp()  # [Hq]
            err = eps_o[:, None] * a + w_abs[:, None] * vh.abs().sum(dim=0)  # [Hq, D]
            bound_o[r, i] = u_out * o_ref[r, i].abs() + (1 + u_out) * err + u_sub
            bound_lse[r, i] = delta + eps_w + eps_sum + (K_LOG + 3) * U32 * (lse_ref[r, i].abs() + 1)
    return bound_o, bound_lse
