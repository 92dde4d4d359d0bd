"""Reference of the fused MoE layer ``fused_moe`` (docs/MOE.md, "The layer").

Dimension legend:
    T: tokens    H: hidden    E: experts    k: top_k    I: intermediate (w13 holds 2 I rows)

The reference is per token and fp64 (bf16 operands convert exactly): the router logits are the
fp64 dot products ``hidden @ router_weight.T`` rounded *once* to fp32 (the routing contract
starts at fp32 logits: docs/MOE.md section 1); the routing is the reference router's on those
logits; each routed expert's MLP is ``y = w2[e] @ (silu(g) * u)`` with ``[g; u] = w13[e] @ x``,
all in fp64; the output is ``sum_j p_j y_j`` (or the weight applied to ``u`` when
``apply_router_weight_on_input``: exactly once either way), in fp64, never rounded (the harness
compares it with the fast bf16 output within a derived bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from batchinv.reference import matmul as ref_matmul
from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor
from batchinv.reference.moe_router import Routing, route
from batchinv.reference.swiglu import silu64


@dataclass(frozen=True)
class FusedMoeArgs:
    """The layer's validated sizes (T, H, E, I, k) and its validated :class:`Routing`."""

    t: int
    h: int
    e: int
    i: int
    k: int
    routing: Routing


def check_fused_moe_args(
    hidden: Any,
    router_weight: Any,
    w13: Any,
    w2: Any,
    top_k: Any,
    scoring: Any,
    renormalize: Any,
    correction_bias: Any,
    n_group: Any,
    topk_group: Any,
    apply_router_weight_on_input: Any,
) -> FusedMoeArgs:
    """Validate the layer's arguments (shared by fast and reference).

    Raises:
        DTypeError: a tensor that is not bf16 (``correction_bias``: fp32), a flag not a bool;
            the router's arguments (see ``Routing.validate``).
        ArgumentError: ``hidden`` not ``[T, H]`` with ``H >= 1``; ``router_weight`` not ``[E, H]``; ``w13`` not
            ``[E, 2 I, H]`` (an odd row count does not split into gate and up); ``w2`` not
            ``[E, H, I]``; ``top_k`` outside ``[1, E]``; the router's other conditions.
        DeviceError: tensors on different devices, or on the meta device.
    """
    check_tensor("hidden", hidden, dtypes=(torch.bfloat16,), ndim=2)
    check_tensor("router_weight", router_weight, dtypes=(torch.bfloat16,), ndim=2)
    check_tensor("w13", w13, dtypes=(torch.bfloat16,), ndim=3)
    check_tensor("w2", w2, dtypes=(torch.bfloat16,), ndim=3)
    if not isinstance(apply_router_weight_on_input, bool):
        raise DTypeError(
            "apply_router_weight_on_input", "a bool", type(apply_router_weight_on_input).__name__
        )
    t, h = hidden.shape
    if h == 0:
        # an empty hidden size: every dot product is empty; refused with a name, not a raw
        # reshape error deep in the launch
        raise ArgumentError("hidden", "[T, H] with H >= 1", tuple(hidden.shape))
    e = router_weight.shape[0]
    if router_weight.shape[1] != h:
        raise ArgumentError("router_weight", f"[E, H = {h}] (H of hidden)", tuple(router_weight.shape))
    if w13.shape[0] != e or w13.shape[2] != h:
        raise ArgumentError("w13", f"[E = {e}, 2 I, H = {h}]", tuple(w13.shape))
    if w13.shape[1] % 2 or w13.shape[1] == 0:
        raise ArgumentError("w13", "an even, non-zero row count 2 I (gate rows, then up rows)", w13.shape[1])
    i = w13.shape[1] // 2
    if tuple(w2.shape) != (e, h, i):
        raise ArgumentError("w2", f"[E = {e}, H = {h}, I = {i}]", tuple(w2.shape))
    for name, tensor in (("router_weight", router_weight), ("w13", w13), ("w2", w2)):
        check_same_device(name, tensor, hidden.device)
    routing = Routing(top_k, scoring, renormalize, correction_bias, n_group, topk_group)
    routing = routing.validate(e, hidden.device)
    return FusedMoeArgs(t, h, e, i, routing.top_k, routing)


def router_logits(hidden: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """``[T, E]`` fp32: the fp64 dot products of the bf16 operands, rounded once to fp32."""
    return (hidden.to(torch.float64) @ router_weight.to(torch.float64).T).to(torch.float32)


@dataclass(frozen=True)
class ExpertTerms:
    """The reference's intermediates (fp64), for the harness's bound.

    ``weights``/``ids`` ``[T, k]``: the reference routing; ``gate_up`` ``[T, k, 2 I]``;
    ``act`` ``[T, k, I]`` (``silu(g) * u * scale``, scale = the weight iff on input);
    ``down`` ``[T, k, H]``; ``out`` ``[T, H]``.
    """

    weights: torch.Tensor
    ids: torch.Tensor
    gate_up: torch.Tensor
    act: torch.Tensor
    down: torch.Tensor
    out: torch.Tensor


def expert_terms(
    hidden: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    apply_router_weight_on_input: bool = False,
) -> ExpertTerms:
    """The reference layer with its intermediates (see :func:`fused_moe`)."""
    a = check_fused_moe_args(
        hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
        apply_router_weight_on_input,
    )  # fmt: skip
    weights, ids = route(router_logits(hidden, router_weight), a.routing)  # [T, k] fp64, int32
    x = hidden.to(torch.float64)  # [T, H]
    gate_up = torch.zeros(a.t, a.k, 2 * a.i, dtype=torch.float64, device=hidden.device)
    down = torch.zeros(a.t, a.k, a.h, dtype=torch.float64, device=hidden.device)
    act = torch.zeros(a.t, a.k, a.i, dtype=torch.float64, device=hidden.device)
    flat_ids = ids.to(torch.int64)
    for e in flat_ids.unique().tolist():
        tok, slot = (flat_ids == e).nonzero(as_tuple=True)
        gu = x[tok] @ w13[e].to(torch.float64).T  # [R, 2 I]
        h = silu64(gu[:, : a.i]) * gu[:, a.i :]  # [R, I]
        if apply_router_weight_on_input:
            h = h * weights[tok, slot][:, None]
        gate_up[tok, slot] = gu
        act[tok, slot] = h
        down[tok, slot] = h @ w2[e].to(torch.float64).T  # [R, H]
    out = torch.zeros(a.t, a.h, dtype=torch.float64, device=hidden.device)
    for j in range(a.k):  # slot order
        out = out + (down[:, j] if apply_router_weight_on_input else weights[:, j, None] * down[:, j])
    return ExpertTerms(weights, ids, gate_up, act, down, out)


def fused_moe(
    hidden: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    apply_router_weight_on_input: bool = False,
) -> torch.Tensor:
    """Reference fused MoE layer, per token in fp64.

    Parameters
    ----------
    hidden : Tensor [T, H], bf16
    router_weight : Tensor [E, H], bf16 (logits = hidden @ router_weight.T)
    w13 : Tensor [E, 2 I, H], bf16 (gate rows :I, up rows I:)
    w2 : Tensor [E, H, I], bf16
    top_k, scoring, renormalize, correction_bias, n_group, topk_group : the router's
        (:func:`batchinv.reference.moe_router.moe_router`)
    apply_router_weight_on_input : bool
        The routing weight multiplies the activation (``silu(g) * u * p``) instead of the
        expert's output at the combine; applied exactly once either way.

    Returns
    -------
    Tensor [T, H], float64: ``sum_j c_j * w2[e_j] @ (silu(g_j) * u_j * s_j)`` with
    ``[g_j; u_j] = w13[e_j] @ x``, ``(s_j, c_j) = (p_j, 1)`` on input, ``(1, p_j)`` otherwise;
    the routing ``(p, e)`` is the reference router's on the fp32-rounded fp64 logits.  Token-wise.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_fused_moe_args`.
    """
    return expert_terms(
        hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
        apply_router_weight_on_input,
    ).out  # fmt: skip


# --- tolerance ---------------------------------------------------------------------------------

#: bf16's unit roundoff: the relative error of each bf16 rounding of the fast path.
U_BF16 = 2.0**-8
#: fp32's unit roundoff.
U_FP32 = 2.0**-24
#: The absolute error per rounding for underflow (fp32's smallest normal; bf16 shares it).
TINY = 2.0**-126


def logit_movement(
    hidden: torch.Tensor,
    router_weight: torch.Tensor,
    l64: torch.Tensor | None = None,
    *,
    group: int,
    chunk: int | None,
) -> torch.Tensor:
    """``[T]`` fp64: how far a fast fp32 logit may be from the reference's (fp64 rounded once),
    the largest over the token's E logits.

    The fast logits are a pinned matmul's fp32 accumulator: its a-posteriori bound for that
    reduction tree (``group`` products per step in increasing k, chunks of ``chunk`` products
    summed in order: :func:`batchinv.reference.matmul.tight_bound`, rigorous for that order, the
    fp32 output rounding included), plus the reference's own rounding of the fp64 logit to fp32
    (``2^-24 |l|``) and :data:`TINY` for underflow.

    Parameters
    ----------
    hidden : Tensor [T, H], bf16
    router_weight : Tensor [E, H], bf16
    l64 : Tensor [T, E], float64, optional
        The exact logits ``hidden @ router_weight.T`` in fp64, when the caller has them.
    group, chunk : int, int or None
        The fast matmul's products per accumulation step and per chunk on the lane
        (``batchinv.fast.matmul.accumulation``).

    Returns
    -------
    Tensor [T], float64.

    Source: :func:`batchinv.reference.matmul.tight_bound`.
    """
    if l64 is None:
        l64 = hidden.double() @ router_weight.double().T
    moved = ref_matmul.tight_bound(
        hidden,
        router_weight,
        None,
        out_dtype=torch.float32,
        reference=l64,
        group=group,
        chunk=chunk,
    )
    return (moved.double() + U_FP32 * l64.abs() + TINY).amax(dim=1)


def _gamma(n: int) -> float:
    return n * U_FP32 / (1 - n * U_FP32)


def _rounded(value_bound: torch.Tensor) -> torch.Tensor:
    """The error one bf16 rounding adds to a value of magnitude at most ``value_bound``."""
    return U_BF16 * value_bound + TINY


def tolerance_bound(
    hidden: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    apply_router_weight_on_input: bool = False,
    *,
    reference: torch.Tensor,
    movement: torch.Tensor,
) -> torch.Tensor:
    """Per element of ``[T, H]``: a bound on |fast - reference| for a bf16 layer routed to the
    same experts as the reference, propagated stage by stage (fp64).

    The fast path's roundings are each a relative ``u = 2^-8`` of their value (:data:`U_BF16`),
    plus :data:`TINY` absolute for underflow:

    * the routing weights: with the same experts they differ by the router's bound plus the
      logits' movement ``dl`` (``movement``): relative ``4.1 dl + 2^-22`` (softmax and
      renormalization each at most double a logit's relative effect);
    * ``gate_up``: an fp32 dot over H, ``gamma_H |w13| |x|``, then a bf16 rounding;
    * swiglu: silu is Lipschitz 1.1 on the gate error and ``|silu g|`` on the up error (times
      the weight and its error when it is applied on the input), its own fp32 sequence 16 fp32
      ulps, then a bf16 rounding;
    * the down projection: ``|w2| dh`` propagated plus ``gamma_I |w2| |h|``, then bf16;
    * the combine: the weights' error times ``|y|``, ``c |dy|``, an fp64 sum over the k slots
      (``4 k 2^-53`` relative), and one final bf16 rounding.

    Parameters
    ----------
    hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group,
    topk_group, apply_router_weight_on_input :
        The arguments of :func:`fused_moe`.
    reference : Tensor [T, H], float64
        :func:`fused_moe` of these arguments.
    movement : Tensor [T], float64
        The logits' possible movement per token (:func:`logit_movement` for the fast matmul's
        accumulation).

    Returns
    -------
    Tensor [T, H], float64.  Valid only where both layers route to the same experts (the
    registry's cases keep a gap above the keys' movement, or exact ties).

    Source: the propagation above; ``gamma_n = n u / (1 - n u)`` (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., section 3.1).
    """
    terms = expert_terms(
        hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
        apply_router_weight_on_input,
    )  # fmt: skip
    x = hidden.double()
    on_input = apply_router_weight_on_input
    _, k, two_i = terms.gate_up.shape
    i, h = two_i // 2, x.shape[1]
    p = terms.weights.abs()  # [T, k]
    rel_w = 4.1 * movement[:, None] + 2.0**-22
    dp = p * rel_w  # [T, k]
    a1 = torch.zeros_like(terms.gate_up)  # |w13| |x|
    ids = terms.ids.to(torch.int64)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        a1[tok, slot] = x[tok].abs() @ w13[e].double().abs().T
    acc = _gamma(h) * a1
    dgu = acc + _rounded(terms.gate_up.abs() + acc)  # [T, k, 2I]
    g, u = terms.gate_up[..., :i], terms.gate_up[..., i:]
    dg, du = dgu[..., :i], dgu[..., i:]
    s, ds = (p, dp) if on_input else (torch.ones_like(p), torch.zeros_like(p))
    s, ds = s[..., None], ds[..., None]
    silu = silu64(g).abs()
    um = u.abs() + du
    prop = (1.1 * dg * um + silu * du) * (s + ds) + silu * um * ds
    hm = terms.act.abs() + prop
    dh = prop + 16 * U_FP32 * hm + _rounded(hm * (1 + 16 * U_FP32))  # [T, k, I]
    dy = torch.zeros_like(terms.down)
    ym = torch.zeros_like(terms.down)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        aw2 = w2[e].double().abs()
        dy[tok, slot] = dh[tok, slot] @ aw2.T + _gamma(i) * (
            (terms.act[tok, slot].abs() + dh[tok, slot]) @ aw2.T
        )
    dy = dy + _rounded(terms.down.abs() + dy)
    ym = terms.down.abs() + dy
    c, dc = (torch.ones_like(p), torch.zeros_like(p)) if on_input else (p, dp)
    err = (c[..., None] * dy + ym * dc[..., None]).sum(dim=1)  # [T, H]
    err = err + 4 * k * 2.0**-53 * ((c + dc)[..., None] * ym).sum(dim=1)
    return err + _rounded(reference.abs() + err)
