"""Triton kernel of ``sampler``: one program per request row (docs/COMPONENTS.md, "sampler").

The rule is ``reference/sampler.py``'s.  Nothing the program computes depends on another row
or on the tile: the max and the argmax are exact, every sum is an int64 sum of the pinned
fixed-point weights (associative, so the tile and the tree cannot change it), the weights are
element-wise IEEE fp32 operations in a fixed order (launched with ``enable_fp_fusion=False``:
no fused multiply-add), and the draw is Philox4x32-10 keyed by the request's seed with its
step as the counter.  top-k and top-p cut the order (logit descending, lower id first) by
bisection over the logits' order-preserving int32 keys, then a prefix count (or weight sum) in
id order inside the tie plateau at the cut.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The rule's constants (the values of reference/sampler.py; tests/components/test_sampler.py
# checks that they agree): the Cephes exp2f polynomial, each coefficient exactly an fp32.
C0 = tl.constexpr(0.00015353361959569156)
C1 = tl.constexpr(0.0013398873852565885)
C2 = tl.constexpr(0.00961843691766262)
C3 = tl.constexpr(0.055503323674201965)
C4 = tl.constexpr(0.24022647738456726)
C5 = tl.constexpr(0.6931471824645996)
T_FLOOR = tl.constexpr(-43.5)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _load_row(base, offs, V, stride_v):
    """A tile of the row as fp32 (NaN read as -inf, -0 as +0; lanes past V masked) and its
    int32 order keys (ordered as the values), as int64."""
    valid = offs < V
    x = tl.load(base + offs.to(tl.int64) * stride_v, mask=valid, other=0.0).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True)
    key = tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.int64)
    return x, valid, key


@triton.jit
def _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p):
    """A tile with its fixed-point weights and its membership of the top-k set (``kept_k``: key
    above ``vk``, or at ``vk`` with an id below ``cut_k``) and of the kept set (``kept``: also
    above ``vp``, or at it below ``cut_p``).  One flat function (the interpreter pays per call).

    The weight: ``t = 0`` where x == m, else fp32(fp32(x - m) * k); below ``T_FLOOR`` 0; else
    the pinned exp2 (n = floor(t + 0.5), f = t - n, the Cephes polynomial by Horner, one fp32
    multiply and one fp32 add per step) as ``(int(p * 2**24) << 18) >> -n`` (2**42 = 1).
    """
    valid = offs < V
    x = tl.load(base + offs.to(tl.int64) * stride_v, mask=valid, other=0.0).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True)
    key = tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.int64)
    t = (x - m) * k
    t = tl.where(x == m, 0.0, t)
    live = t >= T_FLOOR
    ts = tl.where(live, t, 0.0)
    n = tl.floor(ts + 0.5)
    f = ts - n
    q = f * C0
    q = q + C1
    q = q * f
    q = q + C2
    q = q * f
    q = q + C3
    q = q * f
    q = q + C4
    q = q * f
    q = q + C5
    p = f * q
    p = p + 1.0
    mant = (p * 16777216.0).to(tl.int64)
    w = tl.where(live, (mant << 18) >> (-n).to(tl.int64), 0)
    kept_k = valid & ((key > vk) | ((key == vk) & (offs < cut_k)))
    kept = kept_k & ((key > vp) | ((key == vp) & (offs < cut_p)))
    return x, key, w, kept_k, kept


@triton.jit
def sampler_kernel(
    logits_ptr,
    temperature_ptr,
    k_ptr,
    top_k_ptr,
    top_p_ptr,
    seeds_ptr,
    step_ptr,
    tokens_ptr,
    logprob_ptr,
    V,
    stride_r,
    stride_v,
    BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_r
    cols = tl.arange(0, BLOCK)
    pj = tl.arange(0, NPIV).to(tl.int64)  # the pivots of one level of the cut's search
    big = V + 0 * row  # an int64 "no id yet"

    # pass 1: the max, the first id holding it, the lowest key
    m = tl.full((), float("-inf"), tl.float32)
    first = big
    lo_key = tl.full((), 2**31, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + cols
        x, valid, key = _load_row(base, offs, V, stride_v)
        tm = tl.max(tl.where(valid, x, float("-inf")), 0)
        ti = tl.min(tl.where(valid & (x == tm), offs.to(tl.int64), big), 0)
        take = (tm > m) | (first == big)
        first = tl.where(take, ti, first)
        m = tl.maximum(m, tm)
        lo_key = tl.minimum(lo_key, tl.min(tl.where(valid, key, 2**31), 0))
    mb = m.to(tl.int32, bitcast=True)
    hi_key = tl.where(mb < 0, mb ^ 0x7FFFFFFF, mb).to(tl.int64)

    temperature = tl.load(temperature_ptr + row)
    if temperature == 0.0:
        tl.store(tokens_ptr + row, first)
        tl.store(logprob_ptr + row, 0.0)
    else:
        k = tl.load(k_ptr + row)
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        top_p = tl.load(top_p_ptr + row)
        # "no cut": every key is above lo_key - 1
        vk = lo_key - 1
        cut_k = big * 0
        vp = lo_key - 1
        cut_p = big * 0

        # top-k: vk = the largest key with count(key >= vk) >= top_k (searched NPIV pivots per
        # level), then the plateau at vk kept in id order: cut_k = 1 + the id of its need-th token
        if (top_k > 0) & (top_k < V):
            lo = lo_key
            hi = hi_key
            while lo < hi:
                stride = (hi - lo + NPIV) // NPIV
                piv = lo + pj * stride
                cnt = tl.zeros((NPIV,), tl.int64)
                for start in range(0, V, BLOCK):
                    offs = start + cols
                    x, valid, key = _load_row(base, offs, V, stride_v)
                    ge = valid[:, None] & (key[:, None] >= piv[None, :])
                    cnt += tl.sum(ge.to(tl.int64), 0)
                best = tl.max(tl.where((cnt >= top_k) & (piv <= hi), pj, 0), 0)
                lo = lo + best * stride
                hi = tl.minimum(lo + stride - 1, hi)
            vk = lo
            n_gt = big * 0
            for start in range(0, V, BLOCK):
                offs = start + cols
                x, valid, key = _load_row(base, offs, V, stride_v)
                n_gt += tl.sum((valid & (key > vk)).to(tl.int64), 0)
            need = top_k - n_gt
            seen = big * 0
            cut_k = big
            for start in range(0, V, BLOCK):
                offs = start + cols
                x, valid, key = _load_row(base, offs, V, stride_v)
                tie = (valid & (key == vk)).to(tl.int64)
                incl = tl.cumsum(tie, 0) + seen
                hit = tl.min(tl.where((tie > 0) & (incl == need), offs.to(tl.int64), big), 0)
                cut_k = tl.minimum(cut_k, hit + 1)
                seen += tl.sum(tie, 0)

        # top-p over the top-k set: thr = ceil(fp64(top_p) * fp64(total_k)); vp = the largest key
        # whose kept weight at or above it reaches thr, its plateau kept in id order up to the
        # token whose inclusive sum reaches thr
        if top_p < 1.0:
            total_k = big * 0
            for start in range(0, V, BLOCK):
                offs = start + cols
                x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
                total_k += tl.sum(tl.where(kept_k, w, 0), 0)
            thr = tl.ceil(top_p.to(tl.float64) * total_k.to(tl.float64)).to(tl.int64)
            lo = tl.maximum(lo_key, vk)
            hi = hi_key
            while lo < hi:
                stride = (hi - lo + NPIV) // NPIV
                piv = lo + pj * stride
                acc = tl.zeros((NPIV,), tl.int64)
                for start in range(0, V, BLOCK):
                    offs = start + cols
                    x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
                    ge = kept_k[:, None] & (key[:, None] >= piv[None, :])
                    acc += tl.sum(tl.where(ge, w[:, None], 0), 0)
                best = tl.max(tl.where((acc >= thr) & (piv <= hi), pj, 0), 0)
                lo = lo + best * stride
                hi = tl.minimum(lo + stride - 1, hi)
            vp_found = lo
            c_gt = big * 0
            for start in range(0, V, BLOCK):
                offs = start + cols
                x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
                c_gt += tl.sum(tl.where(kept_k & (key > vp_found), w, 0), 0)
            seen = c_gt
            cut_p = big
            for start in range(0, V, BLOCK):
                offs = start + cols
                x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
                tie = tl.where(kept_k & (key == vp_found), w, 0)
                incl = tl.cumsum(tie, 0) + seen
                hit = tl.min(tl.where(kept_k & (key == vp_found) & (incl >= thr), offs.to(tl.int64), big), 0)
                cut_p = tl.minimum(cut_p, hit + 1)
                seen += tl.sum(tie, 0)
            vp = vp_found

        # the kept set's total, the draw, and the inverse CDF over the kept set in id order
        total = big * 0
        for start in range(0, V, BLOCK):
            offs = start + cols
            x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
            total += tl.sum(tl.where(kept, w, 0), 0)
        seed = tl.load(seeds_ptr + row)
        step = tl.load(step_ptr + row)
        c0 = (step & 0xFFFFFFFF).to(tl.uint32)
        c1 = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
        zero = c0 * 0
        r0, r1, _r2, _r3 = tl.philox(seed, c0, c1, zero, zero)
        u53 = (r0.to(tl.uint64) << 21) | (r1.to(tl.uint64) >> 11)
        u = u53.to(tl.int64).to(tl.float64) * 1.1102230246251565e-16  # 2**-53
        target = tl.floor(u * total.to(tl.float64)).to(tl.int64)
        target = tl.minimum(target, total - 1)
        run = big * 0
        token = big
        for start in range(0, V, BLOCK):
            offs = start + cols
            x, key, w, kept_k, kept = _tile(base, offs, V, stride_v, m, k, vk, cut_k, vp, cut_p)
            wk = tl.where(kept, w, 0)
            incl = tl.cumsum(wk, 0) + run
            hit = tl.min(tl.where(kept & (incl > target), offs.to(tl.int64), big), 0)
            token = tl.minimum(token, hit)
            run += tl.sum(wk, 0)
        token = tl.minimum(token, V - 1)
        # the log-prob: t of the token (as in _tile) and ln(total * 2**-42), in fp64
        xt = tl.load(base + token * stride_v).to(tl.float32)
        xt = tl.where(xt != xt, float("-inf"), xt)
        tt = tl.where(xt == m, 0.0, (xt - m) * k)
        ln_s = tl.log(total.to(tl.float64) * 2.2737367544323206e-13)  # 2**-42
        lp = tt.to(tl.float64) * LN2 - ln_s
        tl.store(tokens_ptr + row, token)
        tl.store(logprob_ptr + row, lp.to(tl.float32))
