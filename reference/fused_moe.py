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
        ArgumentError: ``hidden`` not ``[T, H]``; ``router_weight`` not ``[E, H]``; ``w13`` not
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
