"""Registry entry ``fused_moe``: the whole MoE layer (docs/MOE.md, "The layer"), request-level
over tokens (a request = a token: ``take`` / ``concat`` are rows of ``hidden``).

Routing and agreement.  The fast logits are the pinned matmul's fp32 accumulator; the reference
rounds the fp64 logits once to fp32 (the fast order is not reproducible in fp64).  The two
differ by at most ``dl`` per logit (:func:`logit_movement`: the matmul's a-posteriori bound for
its summation order, rigorous, about sqrt(H) times smaller than ``gamma_H sum |x| |w_r|`` on
random data, plus both roundings), so where two selection
keys are that close the two routers may pick different experts and the layers would not be
comparable.  Agreement cases therefore hold two kinds of cutoff (:func:`routing_cutoffs`):
*stable* ones, whose gap (group scores at ``topk_group``, keys at ``top_k``) is above twice the
keys' possible movement (:func:`stable_routing`; a token without is redrawn), and *exact ties*
(``values="ties"``): experts with bitwise equal router rows and biases (:func:`tie_classes`) have
bitwise equal logits and keys in both implementations, so a tie straddling a cutoff is broken to
the lower id by both and agreement compares the whole layer there.  Left out of agreement: near
but inexact ties, where the reference is not the fast layer's expectation.  With the same
experts, the weights differ by the router's bound plus the logits' movement (relative
``4.1 dl + 2^-22``: softmax and renormalization each at most double a logit's relative effect),
which :func:`bound` includes.

The bound (:func:`bound`) follows the fast path's roundings, each a relative ``u = 2^-8`` of its
value: ``gate_up`` (fp32 dot over H, ``gamma_H |w13| |x|``, then bf16), swiglu (silu Lipschitz
1.1 on the gate error, ``|silu g|`` on the up error, its own fp32 sequence 16 fp32 ulps, then
bf16), the down projection (``|w2| dh`` propagated, ``gamma_I |w2| |h|``, then bf16), and the
combine (weights' error times ``|y|``, ``c |dy|``, fp64 sum, one bf16 rounding); plus 2^-126
absolute per rounding for underflow.

Values (axis ``values``): ``normal``; ``cancel`` (hidden columns 0 and H-1 are +-CANCEL and
w13's columns 0 and H-1 are equal, router_weight's zero: gate_up's fp32 partial sums are large,
so another summation tree for the up projection -- the split-K baseline -- shows after bf16);
``ties`` (router rows (and biases) duplicated: experts 0 and ``E / n_group - 1`` of group 0,
and with ``n_group >= 3`` grouped selection group 2 a copy of group 1; the tokens alternate
between a group tie straddling ``topk_group`` with an expert of the kept group chosen, and an
expert tie straddling ``top_k``; :func:`check_ties` asserts it at build).  Only router rows are
duplicated: the tied experts' MLPs differ, so a tie broken to the higher id changes the output
far beyond the bound (the mutants ``fused_moe_*_ties_to_higher_id``).

Neighbours (co_batch / slot; never compared with the reference, so drawn without the stable
redraw): ``flood`` (copies of the case's tokens with small perturbations: routed to the case's
experts, raising their M), ``elsewhere`` (negated copies: the lowest keys, so other experts
under softmax), ``random`` and ``near_tie`` (:func:`_near_tie_tokens`: the two keys at the
``top_k`` cutoff closer than the keys' possible movement, i.e. within fp32 rounding of a swap).
The checks compare the case's own tokens, so near-ties enter co_batch as other requests; a
near-tie token as the compared target (alone, co-batched, repeated) is
``tests/components/test_fused_moe.py``'s.  Not built: near-ties at the group cutoff.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast import fused_moe as fast_moe
from batchinv.fast.baselines import fused_moe as bl
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    ALL_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    RequestModel,
    Toleranced,
    token_co_batch_sizes,
)
from batchinv.harness.weights import seeded_normal
from batchinv.reference import fused_moe as ref_moe
from batchinv.reference.errors import ArgumentError, DTypeError
from batchinv.reference.fused_moe import U_FP32

NAME = "fused_moe"
CANCEL = 2.0**18
#: The gap a selection cutoff must have, in units of the keys' possible movement.
GAP_FACTOR = 2.0
MAX_TRIES = 400


def _case(
    e: int,
    k: int,
    h: int,
    i: int,
    t: int,
    scoring: str,
    renormalize: bool,
    on_input: bool,
    n_group: int = 1,
    topk_group: int = 1,
    values: str = "normal",
    seed: int = 0,
) -> Case:
    return Case(
        NAME,
        {
            "E": e,
            "top_k": k,
            "H": h,
            "I": i,
            "T": t,
            "scoring": scoring,
            "n_group": n_group,
            "topk_group": topk_group,
            "renormalize": renormalize,
            "on_input": on_input,
            "values": values,
        },
        seed,
    )


def cases(lane: Lane) -> list[Case]:
    """cpu lane: E 4..8, k 2, H / I 32..64, T <= 6; every (on_input, renormalize) pair, softmax
    and sigmoid with bias and groups; one ``cancel`` case for the unpinned baseline; one
    grouped ``ties`` case (T 4: group and expert ties dealt alternately).  GPU lanes: Qwen3-30B-A3B-,
    DeepSeek-V3- (E 256, k 8, H 7168, grouped, bias; I 256 instead of 2048: its full expert stack
    is 22 GB, copied per check by the build cache, and ran pytest workers out of memory on the
    H200; the full shape runs in the bench) and Mixtral-like shapes, ``ties`` at a Mixtral-like
    and a smaller grouped shape (E 64: DeepSeek's E 256 makes a straddle a rare draw)."""
    if not lane.is_gpu:
        return [  # the cancel case first: the negative control stops at its first detection
            _case(4, 2, 64, 32, 3, "softmax", False, False, values="cancel", seed=4),
            _case(8, 2, 64, 32, 6, "softmax", False, False),
            _case(8, 2, 64, 32, 5, "softmax", True, True, seed=1),
            _case(8, 2, 32, 64, 4, "sigmoid", True, False, n_group=4, topk_group=2, seed=2),
            _case(8, 2, 32, 32, 4, "sigmoid", False, True, n_group=4, topk_group=2, seed=3),
            _case(8, 2, 32, 32, 4, "sigmoid", True, False, n_group=4, topk_group=2, values="ties", seed=5),
        ]
    return [
        _case(128, 8, 2048, 768, 32, "softmax", True, False),
        _case(128, 8, 2048, 768, 16, "softmax", False, True, values="cancel", seed=1),
        _case(256, 8, 7168, 256, 8, "sigmoid", True, False, n_group=8, topk_group=4, seed=2),
        _case(8, 2, 4096, 14336, 16, "softmax", True, True, seed=3),
        _case(8, 2, 4096, 1024, 16, "softmax", True, True, values="ties", seed=6),
        _case(64, 8, 1024, 256, 8, "sigmoid", True, False, n_group=8, topk_group=4, values="ties", seed=5),
    ]


# --- generation --------------------------------------------------------------------------------


def _weight_seed(axes: dict[str, Any]) -> int:
    key = {n: axes[n] for n in ("E", "top_k", "H", "I", "scoring", "n_group", "values")}
    return zlib.crc32(repr(sorted(key.items())).encode())


def _weights(axes: dict[str, Any], device: torch.device) -> dict[str, Any]:
    e, h, i = int(axes["E"]), int(axes["H"]), int(axes["I"])
    gdev = device if device.type == "cuda" else torch.device("cpu")
    gen = torch.Generator(device=gdev).manual_seed(_weight_seed(axes))

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return seeded_normal(shape, gen, scale, device)

    router_weight = randn(e, h, scale=1 / math.sqrt(h))
    router_weight[:, 0] = 0  # the cancel pair never enters the logits
    router_weight[:, -1] = 0
    w13 = randn(e, 2 * i, h, scale=1 / math.sqrt(h))
    w13[..., -1] = w13[..., 0]
    w2 = randn(e, h, i, scale=1 / math.sqrt(i))
    bias = None
    if axes["scoring"] == "sigmoid":
        bias = (torch.randn(e, generator=gen, device=gdev) * 0.1).to(device)
    if axes["values"] == "ties":  # exact ties (module docstring): duplicated router rows
        size = e // int(axes["n_group"])
        pairs = [(0, size - 1)] if size > 1 else []  # two experts of group 0
        if int(axes["n_group"]) >= 3 and int(axes["topk_group"]) < int(axes["n_group"]):
            pairs += [(size + j, 2 * size + j) for j in range(size)]  # group 2 := group 1
        for a, b in pairs:
            router_weight[b] = router_weight[a]
            if bias is not None:
                bias[b] = bias[a]
    return {
        "router_weight": router_weight,
        "w13": w13,
        "w2": w2,
        "top_k": int(axes["top_k"]),
        "scoring": axes["scoring"],
        "renormalize": bool(axes["renormalize"]),
        "correction_bias": bias,
        "n_group": int(axes["n_group"]),
        "topk_group": int(axes["topk_group"]),
        "apply_router_weight_on_input": bool(axes["on_input"]),
    }


def logit_movement(
    hidden: torch.Tensor, router_weight: torch.Tensor, l64: torch.Tensor | None = None
) -> torch.Tensor:
    """``[T]`` fp64: how far a fast fp32 logit may be from the reference's (fp64 rounded once):
    :func:`batchinv.reference.fused_moe.logit_movement` for the pinned matmul's reduction tree
    on this lane (chunks summed in increasing k by groups of 16 on a GPU, of its BLOCK_K under
    the interpreter).  ``l64``: the exact logits ``hidden @ router_weight.T`` in fp64, when the
    caller has them."""
    from batchinv.fast import matmul as fast_matmul

    group, chunk = fast_matmul.accumulation(
        router_weight.shape[0], hidden.shape[1], hidden.dtype, hidden.device
    )
    return ref_moe.logit_movement(hidden, router_weight, l64, group=group, chunk=chunk)


def tie_classes(shared: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``([E], [n_group])`` int64: experts (groups) with bitwise equal router rows and biases
    share a class.  Their logits are the same computation on the same bits in the fast matmul
    and in the reference, so their selection keys tie *exactly* in both (``values="ties"``)."""
    rw, bias = shared["router_weight"], shared["correction_bias"]
    n_group = shared["n_group"]
    rows = rw.double()
    if bias is not None:
        rows = torch.cat([rows, bias.double()[:, None]], dim=1)
    expert = torch.unique(rows.cpu(), dim=0, return_inverse=True)[1]
    group = torch.unique(rows.cpu().reshape(n_group, -1), dim=0, return_inverse=True)[1]
    return expert.to(rw.device), group.to(rw.device)


def _cutoff(
    keys: torch.Tensor, classes: torch.Tensor, c: int, need: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(stable [T], straddle [T], class [T])`` of the cutoff after the ``c`` best of ``keys [T, n]``
    (``classes [T, n]``: the exact-tie class of each entry).  A cutoff between two classes is
    stable when its gap exceeds ``need [T]``; a tie class that straddles it (members on both
    sides: the lower ids are taken, in fast and reference alike) is stable when the gaps above
    and below the whole class exceed ``need`` (its members adjacent in the order).  ``class``:
    the class of the last entry taken."""
    t, n = keys.shape
    if c >= n:
        no = torch.zeros(t, dtype=torch.bool, device=keys.device)
        return ~no, no, classes[:, 0]
    order = keys.argsort(dim=1, descending=True, stable=True)
    ks, cs = keys.gather(1, order), classes.gather(1, order)
    straddle = cs[:, c - 1] == cs[:, c]
    plain = (ks[:, c - 1] - ks[:, c]) > need
    block = cs == cs[:, c - 1 : c]
    pos = torch.arange(n, device=keys.device).expand(t, n)
    lo = torch.where(block, pos, n).amin(dim=1)
    hi = torch.where(block, pos, -1).amax(dim=1)
    adjacent = (hi - lo + 1) == block.sum(dim=1)
    inf = torch.full((t,), math.inf, dtype=keys.dtype, device=keys.device)

    def at(i: torch.Tensor) -> torch.Tensor:
        return ks.gather(1, i.clamp(0, n - 1)[:, None])[:, 0]

    above = torch.where(lo > 0, at(lo - 1) - at(lo), inf)
    below = torch.where(hi < n - 1, at(hi) - at(hi + 1), inf)
    ok = torch.where(straddle, adjacent & (above > need) & (below > need), plain)
    return ok, straddle, cs[:, c - 1]


def routing_cutoffs(hidden: torch.Tensor, shared: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The routing's selection cutoffs per token, on the exact (fp64) keys.

    Returns ``stable [T]`` (every cutoff gap above :data:`GAP_FACTOR` times the keys' possible
    movement between fast and reference logits; an exact tie class counts as one key),
    ``expert_tie [T]`` (a tie class straddles the ``top_k`` cutoff), ``group_tie [T]`` (a tie
    class of groups straddles the ``topk_group`` cutoff and an expert of its kept group is
    chosen: breaking that tie the other way changes the experts), ``keys [T, E]`` (the
    selection keys, dropped groups' ``-inf``) and ``need [T]`` (the gap a cutoff needs)."""
    rw = shared["router_weight"]
    cls, gcls = tie_classes(shared)
    exact = hidden.double() @ rw.double().T
    l64 = exact.gather(
        1, _representative(cls)[None, :].expand(hidden.shape[0], -1)
    )  # a class's members get its first member's dot product (equal in exact arithmetic)
    dl = logit_movement(hidden, rw, exact)[:, None]  # [T, 1]
    k, n_group, topk_group = shared["top_k"], shared["n_group"], shared["topk_group"]
    if shared["scoring"] == "softmax":
        key, move = l64, dl + U_FP32 * l64.abs().amax(dim=1, keepdim=True)
    else:
        key = torch.sigmoid(l64)
        if shared["correction_bias"] is not None:
            key = key + shared["correction_bias"].double()
        move = dl / 4 + 4 * U_FP32 * (1 + key.abs().amax(dim=1, keepdim=True))
    need = GAP_FACTOR * move[:, 0]  # [T]
    t, e = key.shape
    stable = torch.ones(t, dtype=torch.bool, device=key.device)
    group_tie = torch.zeros(t, dtype=torch.bool, device=key.device)
    if n_group > 1 and topk_group < n_group:
        g = key.view(t, n_group, e // n_group)
        if shared["correction_bias"] is not None:  # the router's group score (docs/MOE.md)
            top2 = g.topk(min(2, e // n_group), dim=2).values.sum(dim=2)  # [T, G]
        else:
            top2 = g.amax(dim=2)  # without a bias: the group's best key
        ok, group_tie, tied = _cutoff(top2, gcls[None, :].expand(t, -1), topk_group, 2 * need)
        stable &= ok
        kept = torch.zeros(t, n_group, dtype=torch.bool, device=key.device)
        kept.scatter_(1, top2.argsort(dim=1, descending=True, stable=True)[:, :topk_group], True)
        key = torch.where(kept.repeat_interleave(e // n_group, dim=1), key, torch.full_like(key, -math.inf))
    unique = -1 - torch.arange(e, device=key.device)  # dropped experts: a class of their own
    classes = torch.where(key == -math.inf, unique, cls[None, :].expand(t, -1))
    ok, expert_tie, _ = _cutoff(key, classes, k, need)
    if n_group > 1 and topk_group < n_group:  # the tie's kept group must supply a chosen expert
        chosen = key.argsort(dim=1, descending=True, stable=True)[:, :k] // (e // n_group)  # [T, k]
        group_tie &= (gcls[chosen] == tied[:, None]).any(dim=1)
    return {
        "stable": stable & ok,
        "expert_tie": expert_tie,
        "group_tie": group_tie,
        "keys": key,
        "need": need,
    }


def _representative(classes: torch.Tensor) -> torch.Tensor:
    """``[n]``: the first index of each entry's class."""
    n = classes.numel()
    first = torch.full((int(classes.max()) + 1,), n, dtype=torch.long, device=classes.device)
    first.scatter_reduce_(0, classes, torch.arange(n, device=classes.device), reduce="amin")
    return first[classes]


def stable_routing(hidden: torch.Tensor, shared: dict[str, Any]) -> torch.Tensor:
    """``[T]`` bool: the token's routing cannot differ between fast and reference logits (every
    cutoff gap above :data:`GAP_FACTOR` times the keys' possible movement; an exact tie class,
    ``values="ties"``, counts as one key: :func:`routing_cutoffs`)."""
    return routing_cutoffs(hidden, shared)["stable"]


def _tie_kinds(shared: dict[str, Any]) -> tuple[str, ...]:
    """The cutoffs a ``values="ties"`` case's tokens straddle, dealt round-robin over its tokens:
    ``group_tie`` (where the weights hold a duplicated group) and ``expert_tie``."""
    _, gcls = tie_classes(shared)
    grouped = shared["n_group"] > 1 and shared["topk_group"] < shared["n_group"]
    dup_group = grouped and bool((torch.bincount(gcls) > 1).any())
    return ("group_tie", "expert_tie") if dup_group else ("expert_tie",)


def _tokens(axes: dict[str, Any], seed: int, shared: dict[str, Any], device: torch.device) -> torch.Tensor:
    """The case's hidden ``[T, H]`` bf16, every token with a stable routing (``values="ties"``:
    token i straddles the cutoff ``_tie_kinds(shared)[i % len]`` with an exact tie); a
    neighbour's (``mix`` set) as drawn, near-ties kept (never compared with the reference)."""
    t, h = int(axes["T"]), int(axes["H"])
    gen = torch.Generator().manual_seed(seed)
    mix = axes.get("mix")
    if mix == "near_tie":
        return _near_tie_tokens(axes, gen, shared, device)
    if mix in ("flood", "elsewhere"):
        of = {**axes, "T": int(axes["of_T"]), "mix": None}
        base = _tokens(of, int(axes["of_seed"]), shared, device).float().cpu()
        base = base[torch.arange(t) % base.shape[0]]
        if mix == "elsewhere":
            base = -base
    else:
        base = torch.randn(t, h, generator=gen)

    copies = mix in ("flood", "elsewhere")
    keep = 0.0 if axes["values"] == "ties" else 1.0  # a ties redraw: a new token (rare straddles)

    def draw(rows: torch.Tensor, fresh: bool) -> torch.Tensor:
        kept = keep if fresh and mix is None else 1.0
        noise = (0.05 if copies else 1.0) * torch.randn(rows.numel(), h, generator=gen)
        x = base[rows] * kept + noise * (1.0 if fresh or copies else 0.0)
        x = x.to(torch.bfloat16)
        if axes["values"] == "cancel":
            sign = (torch.randint(2, (rows.numel(),), generator=gen) * 2 - 1).to(torch.bfloat16)
            x[:, 0] = sign * CANCEL
            x[:, -1] = -sign * CANCEL
        return x

    hidden = draw(torch.arange(t), fresh=False).to(device)
    if mix is not None or axes.get("routing") == "free":  # neighbours, bench cases: no reference
        return hidden
    kinds = _tie_kinds(shared) if axes["values"] == "ties" else ()
    for _ in range(MAX_TRIES):
        cut = routing_cutoffs(hidden, shared)
        good = cut["stable"]
        if kinds:
            good = good & torch.stack([cut[kinds[i % len(kinds)]][i] for i in range(t)])
        bad = (~good).nonzero().flatten().cpu()
        if bad.numel() == 0:
            return hidden
        hidden[bad.to(device)] = draw(bad, fresh=True).to(device)
    raise RuntimeError(f"fused_moe: no stable routing for {bad.numel()} tokens after {MAX_TRIES} draws")


#: Hidden columns the near-tie construction sets (0 and H - 1 are the cancel pair's).
NEAR_TIE_COLUMNS = (1, 2, 3, 4)


def _near_tie_tokens(
    axes: dict[str, Any], gen: torch.Generator, shared: dict[str, Any], device: torch.device
) -> torch.Tensor:
    """``[T, H]`` bf16 tokens whose two keys at the ``top_k`` cutoff (of different tie classes)
    are within the keys' possible movement of each other: within an fp32 rounding or a
    summation order of swapping, so any change of the logits' bits would change the experts.
    A random token is moved onto the tie by Newton steps on single coordinates (fp64 keys,
    rounded to bf16 each time): one column of the largest key derivative, then the
    :data:`NEAR_TIE_COLUMNS` (zero before: each removes ~8 more bits of the gap)."""
    t, h, k = int(axes["T"]), int(axes["H"]), shared["top_k"]
    rw = shared["router_weight"].double()
    bias = shared["correction_bias"]
    cls, _ = tie_classes(shared)
    sigmoid = shared["scoring"] == "sigmoid"
    free = torch.ones(h, dtype=torch.bool)
    free[[0, h - 1, *NEAR_TIE_COLUMNS]] = False

    def gap_and_slope(x: torch.Tensor, p: int, q: int) -> tuple[float, torch.Tensor]:
        lg = rw @ x.double()  # [E]
        if not sigmoid:
            return float(lg[p] - lg[q]), (rw[p] - rw[q]).cpu()
        sg = torch.sigmoid(lg)
        key = sg + (bias.double() if bias is not None else 0.0)
        ds = sg * (1 - sg)
        return float(key[p] - key[q]), (ds[p] * rw[p] - ds[q] * rw[q]).cpu()

    rows = []
    for _ in range(t):
        for _ in range(MAX_TRIES):
            x = torch.randn(h, generator=gen)
            x[list(NEAR_TIE_COLUMNS)] = 0
            if axes["values"] == "cancel":
                x[0], x[-1] = CANCEL, -CANCEL
            xb = x.to(torch.bfloat16).to(device)
            order = routing_cutoffs(xb[None], shared)["keys"][0].argsort(descending=True, stable=True)
            p, q = int(order[k - 1]), int(order[k])
            if cls[p] == cls[q]:
                continue
            _, slope = gap_and_slope(xb, p, q)
            steps = [int(torch.where(free, slope.abs(), -1.0).argmax()), *NEAR_TIE_COLUMNS]
            for col in steps:
                gap, slope = gap_and_slope(xb, p, q)
                if slope[col] != 0:
                    xb[col] = (xb[col].double() - gap / float(slope[col])).to(torch.bfloat16)
            cut = routing_cutoffs(xb[None], shared)
            order = cut["keys"][0].argsort(descending=True, stable=True)
            gap, _ = gap_and_slope(xb, p, q)
            at_cutoff = {int(order[k - 1]), int(order[k])} == {p, q}
            if at_cutoff and abs(gap) * GAP_FACTOR <= float(cut["need"][0]):
                rows.append(xb)
                break
        else:
            raise RuntimeError(f"fused_moe: no near-tie token after {MAX_TRIES} draws")
    return torch.stack(rows)


def check_ties(hidden: torch.Tensor, shared: dict[str, Any]) -> None:
    """Raise unless a ``values="ties"`` batch is what it claims: the reference's logits of each
    tie class bitwise equal, every token straddling its cutoff with an exact tie and otherwise
    stable (:func:`routing_cutoffs`)."""
    cls, _ = tie_classes(shared)
    logits = ref_moe.router_logits(hidden, shared["router_weight"])
    if not torch.equal(logits, logits[:, _representative(cls)]):
        raise RuntimeError("fused_moe ties: a tie class's reference logits differ")
    cut = routing_cutoffs(hidden, shared)
    kinds = _tie_kinds(shared)
    for i in range(hidden.shape[0]):
        kind = kinds[i % len(kinds)]
        if not (bool(cut["stable"][i]) and bool(cut[kind][i])):
            raise RuntimeError(f"fused_moe ties: token {i} does not straddle the {kind} cutoff")


def build(case: Case, device: torch.device) -> Batch:
    """Weights from a seed of the shape axes (co-batched cases share them), tokens from
    ``case.seed`` (near-tie tokens resampled: :func:`stable_routing`; ``values="ties"``: exact
    ties straddling the cutoffs, checked by :func:`check_ties`; neighbours as drawn)."""
    axes = dict(case.axes)
    shared = _weights(axes, device)
    hidden = _tokens(axes, case.seed, shared, device)
    if axes["values"] == "ties" and axes.get("mix") is None:
        check_ties(hidden, shared)
    return Batch({"hidden": hidden}, shared)


# --- the request model -------------------------------------------------------------------------


def take(batch: Batch, requests: Sequence[int] | torch.Tensor) -> Batch:
    """The tokens at ``requests`` (in order, repeats allowed)."""
    return batch.take(torch.as_tensor(list(requests), dtype=torch.long))


def concat(parts: Sequence[Batch]) -> Batch:
    """The tokens of every part in one launch; the parts must share the layer's weights."""
    first = parts[0].shared
    for p in parts[1:]:
        for name in ("router_weight", "w13", "w2"):
            if p.shared[name] is not first[name] and not torch.equal(p.shared[name], first[name]):
                raise ValueError(f"concat: parts with different {name}")
    return Batch.concat(parts)


def _nan_padded(x: torch.Tensor, gap: int) -> torch.Tensor:
    buf = torch.full((*x.shape[:-1], x.shape[-1] + gap), math.nan, dtype=x.dtype, device=x.device)
    buf[..., : x.shape[-1]] = x
    return buf[..., : x.shape[-1]]


def relocate(batch: Batch, generator: torch.Generator) -> Batch:
    """The same tokens and weights in other memory: every row followed by a NaN gap."""
    gap = 1 + int(torch.randint(8, (1,), generator=generator))
    s = batch.shared
    return Batch(
        {"hidden": _nan_padded(batch.rows["hidden"], gap)},
        {**s, **{n: _nan_padded(s[n], gap) for n in ("router_weight", "w13", "w2")}},
    )


#: Other tokens per neighbour case: few on the cpu lane (the interpreter), 64 on GPU lanes
#: (co_batch cycles through them up to thousands).
NEIGHBOUR_TOKENS = {False: 4, True: 64}


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """``flood`` / ``elsewhere`` / ``random`` / ``near_tie`` other tokens (module docstring), the
    case's values axis (its weights)."""
    ax = dict(case.axes)
    out = {}
    for i, mix in enumerate(("flood", "elsewhere", "random", "near_tie")):
        axes = {**ax, "T": NEIGHBOUR_TOKENS[lane.is_gpu], "mix": mix, "of_T": ax["T"], "of_seed": case.seed}
        out[mix] = Case(case.component, axes, seed=case.seed + 7919 * (i + 1))
    return out


# --- bench -------------------------------------------------------------------------------------

#: The issue's token counts and shapes (bf16): Qwen3-30B-A3B-, DeepSeek-V3- and Mixtral-like.
BENCH_TOKENS = (1, 8, 64, 256, 1024, 4096)
BENCH_SHAPES = (
    (128, 8, 2048, 768, "softmax", 1, 1),
    (256, 8, 7168, 2048, "sigmoid", 8, 4),
    (8, 2, 4096, 14336, "softmax", 1, 1),
)


def bench_cases(lane: Lane) -> list[Case]:
    """``batchinv bench`` cases (GPU lanes): every shape of :data:`BENCH_SHAPES` at every T of
    :data:`BENCH_TOKENS`, renormalized weights applied at the combine; tokens as drawn (axis
    ``routing="free"``: no near-tie redraw, since nothing is compared with the reference)."""
    if not lane.is_gpu:
        return []
    return [
        Case(
            NAME,
            {**_case(e, k, h, i, t, scoring, True, False, n_group=g, topk_group=tg).axes, "routing": "free"},
            t,
        )
        for e, k, h, i, scoring, g, tg in BENCH_SHAPES
        for t in BENCH_TOKENS
    ]


def _experts_used(batch: Batch) -> int:
    """How many distinct experts the batch's tokens are routed to (the pinned router's choice)."""
    from batchinv.fast.matmul import matmul
    from batchinv.fast.moe_router import moe_router

    kw = batch.kwargs()
    logits = matmul(kw["hidden"], kw["router_weight"], out_dtype=torch.float32)
    _, ids = moe_router(
        logits,
        kw["top_k"],
        kw["scoring"],
        kw["renormalize"],
        kw["correction_bias"],
        kw["n_group"],
        kw["topk_group"],
    )
    return int(ids.unique().numel())


def bench_bytes(batch: Batch) -> int:
    """The weights of every expert the tokens use (w13 and w2, read once), the router weight, and
    hidden read and written once: the decode floor."""
    kw = batch.kwargs()
    per_expert = (kw["w13"][0].numel() + kw["w2"][0].numel()) * 2
    return _experts_used(batch) * per_expert + kw["router_weight"].numel() * 2 + 2 * kw["hidden"].numel() * 2


def bench_flops(batch: Batch) -> int:
    """The expert GEMMs' flops: ``2 T k (2 I H + H I)`` (the router's ``2 T E H`` included)."""
    kw = batch.kwargs()
    t, h = kw["hidden"].shape
    e, two_i, _ = kw["w13"].shape
    return 2 * t * kw["top_k"] * 3 * (two_i // 2) * h + 2 * t * e * h


# --- agreement ---------------------------------------------------------------------------------


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """Per element of ``[T, H]``: the propagated bound of the module docstring (fp64),
    :func:`batchinv.reference.fused_moe.tolerance_bound` with this lane's logit movement."""
    kw = batch.kwargs()
    movement = logit_movement(kw["hidden"], kw["router_weight"])
    return (ref_moe.tolerance_bound(**kw, reference=reference[0], movement=movement),)


# --- error inputs --------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs and the typed error each must raise (fast and reference alike)."""
    good = build(_case(4, 2, 32, 32, 2, "softmax", False, False, seed=5), device).kwargs()

    def bad(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    hidden, rw, w13, w2 = good["hidden"], good["router_weight"], good["w13"], good["w2"]
    return [
        ErrorCase(
            "hidden_size_mismatch", bad(hidden=hidden[:, :16]), ArgumentError, "'router_weight'.*H = 16"
        ),
        ErrorCase("w13_odd_rows", bad(w13=w13[:, :-1]), ArgumentError, "'w13'.*even"),
        ErrorCase("w13_other_hidden", bad(w13=w13[..., :16]), ArgumentError, "'w13'"),
        ErrorCase("w2_other_intermediate", bad(w2=w2[..., :16]), ArgumentError, "'w2'"),
        ErrorCase("top_k_above_experts", bad(top_k=5), ArgumentError, "'top_k'"),
        ErrorCase("router_weight_1d", bad(router_weight=rw[0]), ArgumentError, "'router_weight'"),
        ErrorCase(
            "router_weight_transposed", bad(router_weight=rw.T.contiguous()), ArgumentError, "'router_weight'"
        ),
        ErrorCase("hidden_float32", bad(hidden=hidden.float()), DTypeError, "'hidden'"),
        ErrorCase(
            "on_input_not_bool",
            bad(apply_router_weight_on_input=1),
            DTypeError,
            "'apply_router_weight_on_input'",
        ),
        ErrorCase(
            "bias_with_softmax",
            bad(correction_bias=torch.zeros(4, device=device)),
            ArgumentError,
            "'correction_bias'",
        ),
    ]


COMPONENT = Component(
    name=NAME,
    summary="fused MoE layer: pinned logits, router, align, grouped GEMMs, swiglu and combine composed",
    reference=ref_moe.fused_moe,
    fast=fast_moe.fused_moe,
    baselines=(
        Baseline(
            "unpinned_stages",
            bl.unpinned_stages,
            "the same pipeline with split-K for small-M experts in both grouped GEMMs, a bf16 activation "
            "above 32 rows and the token-count dispatched combine: a token's bits follow its experts' M",
            expected_to_vary_on=ALL_LANES,
            timed=False,
        ),
        Baseline(
            "token_count_configs",
            bl.token_count_configs,
            "the production speed baseline: the grouped GEMMs' config (BLOCK_K included) and align block "
            "from the token count, as vLLM's tuned per-T tables pick them, and the atomic-add combine",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "per_tensor_fp8_activations",
            bl.per_tensor_fp8_activations,
            "online FP8 experts (vLLM #57016): both GEMMs' activations quantized with one dynamic e4m3 "
            "scale, the amax over every co-batched token, so a token's output follows the largest "
            "activation of the launch -- the negative control of neighbours",
            expected_to_vary_on=ALL_LANES,
            timed=False,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "three bf16 intermediates (gate_up, the activation, the down projection) and fp32 GEMM sums "
        "cannot equal the fp64 reference; the bound propagates each stage's error (gamma_n sum |w| |x| "
        "per GEMM, a relative 2^-8 per bf16 rounding, silu's Lipschitz constant 1.1, the routing "
        "weights' error from the logits' movement) to the output, with one final bf16 rounding",
        out_dtypes=lambda batch: (torch.bfloat16,),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16,),
    error_cases=error_cases,
    requests=RequestModel(
        take=take,
        concat=concat,
        relocate=relocate,
        neighbours=neighbours,
        co_batch_sizes=token_co_batch_sizes,
    ),
    bench_cases=bench_cases,
    bench_bytes=bench_bytes,
    bench_flops=bench_flops,
)
