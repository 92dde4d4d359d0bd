"""Triton kernel of the MoE router (launcher: ``batchinv.fast.moe_router``).

One program per token; the token's E logits are register-resident as a ``[BLOCK_G, BLOCK_S]``
tile (group g, expert s of the group: expert id ``g * S + s``).  The selection is integer work on
the monotone int32 keys the topk kernels rank by (``monotone_key`` of
:mod:`batchinv.fast.kernels.primitives`, imported, never copied): the ``topk_group`` groups are
kept one at a time, then the k experts are taken one slot at a time, best key first, the lowest
group / expert id among equal keys (a few argmax steps: cheaper than the topk kernels' 32-step
threshold search for k <= 8, and ordered best first).  The weights are computed in
fp64 with the reference's operations in the reference's order, except the softmax denominator's
sum over E (a tree here, torch's order there), and rounded once to fp32.
"""

import triton
import triton.language as tl

from batchinv.fast.kernels.primitives import MAGNITUDE_MASK, NEG_INF, monotone_key, quiet_nan

#: Below every int32 key: masked lanes of the int64 key tile.
KEY_SENTINEL = tl.constexpr(-(2**40))
ID_SENTINEL = tl.constexpr(2**30)


@triton.jit
def _canonical_nan(v):
    """``v`` (fp32) with every NaN replaced by the quiet NaN 0x7fc00000."""
    nan = quiet_nan()
    return tl.where(v != v, nan, v)


@triton.jit
def _value_of_key(key):
    """The fp32 value of an int32 monotone key (its inverse; -0 comes back as +0)."""
    bits = tl.where(key < 0, key ^ MAGNITUDE_MASK, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _sigmoid64(x):
    """``1 / (1 + exp(-x))`` in fp64 (``x`` fp32, widened exactly)."""
    x64 = x.to(tl.float64)
    return 1.0 / (1.0 + tl.exp(-x64))


@triton.jit
def _group_keys(key64, valid, IS_PAIR: tl.constexpr):
    """int32 ``[BLOCK_G]``: the key of each group's score: fp32(best + second best value) when
    ``IS_PAIR`` (a correction bias, groups of >= 2), else the group's best key (vLLM's max)."""
    masked = tl.where(valid, key64, KEY_SENTINEL)
    best = tl.max(masked, axis=1)  # [BLOCK_G]
    if IS_PAIR:
        num_best = tl.sum((masked == best[:, None]).to(tl.int32), axis=1)
        below = tl.max(tl.where(masked < best[:, None], masked, KEY_SENTINEL), axis=1)
        second = tl.where(num_best >= 2, best, below)
        total = _value_of_key(best.to(tl.int32)) + _value_of_key(second.to(tl.int32))  # fp32 add
        return monotone_key(_canonical_nan(total))
    else:
        return best.to(tl.int32)


# Sizes and strides are not specialized (a value class per size would compile more variants;
# the work is integer selection plus fp64 elementwise math whose bits do not depend on it).
_NOT_SPECIALIZED = [
    "num_experts",
    "n_group",
    "group_size",
    "topk_group",
    "stride_logits_row",
    "stride_logits_col",
    "stride_bias",
    "stride_weights_row",
    "stride_ids_row",
]


@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def moe_router_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    n_group,
    group_size,
    topk_group,
    stride_logits_row,
    stride_logits_col,
    stride_bias,
    stride_weights_row,
    stride_ids_row,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_E: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    IS_PAIR: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """Token ``program_id(0)``: its K (weight, expert id) pairs, best first."""
    row = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_S)
    valid = (offs_g[:, None] < n_group) & (offs_s[None, :] < group_size)  # [BLOCK_G, BLOCK_S]
    expert = offs_g[:, None] * group_size + offs_s[None, :]  # [BLOCK_G, BLOCK_S] int32
    logits_row = logits_ptr + row * stride_logits_row
    x = tl.load(logits_row + expert.to(tl.int64) * stride_logits_col, mask=valid, other=0.0)

    # Selection values and keys (the reference's fp32 operations, one by one).
    if SIGMOID:
        v = _sigmoid64(x).to(tl.float32)  # one rounding
        if HAS_BIAS:
            bias = tl.load(bias_ptr + expert.to(tl.int64) * stride_bias, mask=valid, other=0.0)
            v = v + bias  # one fp32 add
        v = _canonical_nan(v)
    else:
        v = x
    key64 = monotone_key(v).to(tl.int64)

    candidate = valid
    if GROUPED:  # keep topk_group groups, one at a time: best key first, the lower group on ties
        gkey = tl.where(offs_g < n_group, _group_keys(key64, valid, IS_PAIR).to(tl.int64), KEY_SENTINEL)
        kept = offs_g < 0
        for _ in range(topk_group):
            best_group = tl.max(tl.where(kept, KEY_SENTINEL, gkey), axis=0)
            first = tl.min(tl.where(~kept & (gkey == best_group), offs_g, ID_SENTINEL), axis=0)
            kept = kept | (offs_g == first)
        candidate = valid & kept[:, None]

    # Flat views of the tile (row-major: lane g * BLOCK_S + s): one reduction per step below.
    key_flat = tl.reshape(key64, (BLOCK_E,))
    candidate = tl.reshape(candidate, (BLOCK_E,))
    expert_flat = tl.reshape(expert, (BLOCK_E,))
    x_flat = tl.reshape(x, (BLOCK_E,))
    valid_flat = tl.reshape(valid, (BLOCK_E,))
    if not SIGMOID:  # softmax over all E in fp64: m the largest non-NaN logit, a tree sum
        finite = tl.where((x_flat != x_flat) | ~valid_flat, NEG_INF, x_flat)
        m = tl.max(finite, axis=0).to(tl.float64)
        total = tl.sum(tl.where(valid_flat, tl.exp(x_flat.to(tl.float64) - m), 0.0), axis=0)

    # The K slots, best key first, the lowest expert id among equal keys; each slot's fp64 score
    # and the slot-order sum of the scores (the renormalization's denominator).
    offs_k = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), tl.int32)
    p = tl.zeros((BLOCK_K,), tl.float64)
    denom = tl.zeros((), tl.float64)
    for j in range(K):
        best = tl.max(tl.where(candidate, key_flat, KEY_SENTINEL), axis=0)
        pick = tl.min(tl.where(candidate & (key_flat == best), expert_flat, ID_SENTINEL), axis=0)
        candidate = candidate & (expert_flat != pick)
        x_j = tl.load(logits_row + pick.to(tl.int64) * stride_logits_col)
        if SIGMOID:  # _sigmoid64's formula, inlined (a helper call costs ~1 ms in the interpreter)
            p_j = 1.0 / (1.0 + tl.exp(-x_j.to(tl.float64)))
        else:
            p_j = tl.exp(x_j.to(tl.float64) - m) / total
        ids = tl.where(offs_k == j, pick, ids)
        p = tl.where(offs_k == j, p_j, p)
        denom = denom + p_j  # 0 + p_0 = p_0 exactly (p_0 >= 0 or NaN)

    # Weights: renormalized in fp64 when asked, rounded once to fp32.
    in_k = offs_k < K
    if RENORMALIZE:
        p = p / denom
    tl.store(weights_ptr + row * stride_weights_row + offs_k, p.to(tl.float32), mask=in_k)
    tl.store(ids_ptr + row * stride_ids_row + offs_k, ids, mask=in_k)
