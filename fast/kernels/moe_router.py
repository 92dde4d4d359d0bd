"""Triton kernel of the MoE router (launcher: ``batchinv.fast.moe_router``).

One program per token; the token's E logits are register-resident as a ``[BLOCK_G, BLOCK_S]``
tile (group g, expert s of the group: expert id ``g * S + s``).  The selection is integer work on
the monotone int32 keys of :mod:`batchinv.fast.kernels.topk` (imported, never copied): groups are
kept with that module's ``_select`` (ties to the lower group), then the k experts are taken one
slot at a time, best key first, the lowest id among equal keys.  The weights are computed in
fp64 with the reference's operations in the reference's order, except the softmax denominator's
sum over E (a tree here, torch's order there), and rounded once to fp32.
"""

import triton
import triton.language as tl

from batchinv.fast.kernels.topk import MAGNITUDE_MASK, _monotone_key, _select

QUIET_NAN_BITS = tl.constexpr(0x7FC00000)
NEG_INF = tl.constexpr(float("-inf"))
#: Below every int32 key: masked lanes of the int64 key tile.
KEY_SENTINEL = tl.constexpr(-(2**40))
ID_SENTINEL = tl.constexpr(2**30)


@triton.jit
def _canonical_nan(v):
    """``v`` (fp32) with every NaN replaced by the quiet NaN 0x7fc00000."""
    nan = tl.full((), QUIET_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
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
    """int32 ``[BLOCK_G]``: the key of each group's score, fp32(best + second best value)."""
    masked = tl.where(valid, key64, KEY_SENTINEL)
    best = tl.max(masked, axis=1)  # [BLOCK_G]
    if IS_PAIR:
        num_best = tl.sum((masked == best[:, None]).to(tl.int32), axis=1)
        below = tl.max(tl.where(masked < best[:, None], masked, KEY_SENTINEL), axis=1)
        second = tl.where(num_best >= 2, best, below)
        total = _value_of_key(best.to(tl.int32)) + _value_of_key(second.to(tl.int32))  # fp32 add
        return _monotone_key(_canonical_nan(total))
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
    key64 = _monotone_key(v).to(tl.int64)

    candidate = valid
    if GROUPED:
        gkey = _group_keys(key64, valid, IS_PAIR)  # [BLOCK_G]
        kept = _select(gkey, offs_g < n_group, topk_group)  # ties to the lower group
        candidate = valid & kept[:, None]

    # The K slots, best key first, the lowest expert id among equal keys.
    offs_k = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), tl.int32)
    for j in range(K):
        best = tl.max(tl.max(tl.where(candidate, key64, KEY_SENTINEL), axis=1), axis=0)
        at_best = candidate & (key64 == best)
        pick = tl.min(tl.min(tl.where(at_best, expert, ID_SENTINEL), axis=1), axis=0)
        ids = tl.where(offs_k == j, pick, ids)
        candidate = candidate & (expert != pick)

    # Weights: fp64 scores of the chosen experts, renormalized in slot order, one rounding.
    in_k = offs_k < K
    chosen = tl.load(logits_row + ids.to(tl.int64) * stride_logits_col, mask=in_k, other=0.0)
    if SIGMOID:
        p = _sigmoid64(chosen)
    else:
        finite = tl.where((x != x) | ~valid, NEG_INF, x)
        m = tl.max(tl.max(finite, axis=1), axis=0).to(tl.float64)
        z = tl.where(valid, tl.exp(x.to(tl.float64) - m), 0.0)
        total = tl.sum(tl.sum(z, axis=1), axis=0)
        p = tl.exp(chosen.to(tl.float64) - m) / total
    if RENORMALIZE:
        denom = tl.sum(tl.where(offs_k == 0, p, 0.0), axis=0)
        for j in range(1, K):
            denom = denom + tl.sum(tl.where(offs_k == j, p, 0.0), axis=0)  # slot order
        p = p / denom
    tl.store(weights_ptr + row * stride_weights_row + offs_k, p.to(tl.float32), mask=in_k)
    tl.store(ids_ptr + row * stride_ids_row + offs_k, ids, mask=in_k)
