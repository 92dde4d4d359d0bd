"""Batch-invariant fused MoE layer (docs/MOE.md, "The layer"): the pinned stages composed.

No kernel of its own: pinned matmul (fp32 logits) -> ``moe_router`` -> ``moe_align`` (with the
grouped GEMM's ``layer_block_m``: a block size from T, proven bit-neutral by the grouped GEMM's
``config_equivalence``) -> ``grouped_gemm(w13)`` -> ``swiglu`` (scale = the routing
weights iff ``apply_router_weight_on_input``) -> ``grouped_gemm(w2, a_per_slot=True)`` ->
``moe_combine`` (weights iff not on input): the weights are applied exactly once.  Every stage is
batch-invariant on its own contract (docs/MOE.md sections 1-5), so a token's output bits do not
depend on the other tokens, their routing, or an expert's M.  :func:`compose` takes the stages
as arguments so the unpinned baseline (``fast/baselines/fused_moe.py``) is the same pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from batchinv.fast.device import check_no_grad
from batchinv.fast.grouped_gemm import grouped_gemm, layer_block_m
from batchinv.fast.matmul import matmul
from batchinv.fast.moe_align import moe_align
from batchinv.fast.moe_combine import moe_combine
from batchinv.fast.moe_router import moe_router
from batchinv.fast.swiglu import swiglu
from batchinv.reference.fused_moe import check_fused_moe_args


def compose(
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
    gemm: Callable[..., torch.Tensor] = grouped_gemm,
    activation: Callable[..., torch.Tensor] = swiglu,
    combine: Callable[..., torch.Tensor] = moe_combine,
    logits_fn: Callable[..., Any] | None = None,
    align_block: Callable[[torch.device, int, int, int], int] = layer_block_m,
) -> torch.Tensor:
    """The layer with the given stage implementations (defaults: the pinned ones);
    ``align_block(device, T, top_k, E)`` is the align's block_m (the grouped GEMMs' BLOCK_M)."""
    args = check_fused_moe_args(
        hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
        apply_router_weight_on_input,
    )  # fmt: skip
    for name, t in (
        ("hidden", hidden), ("router_weight", router_weight), ("w13", w13), ("w2", w2),
        ("correction_bias", correction_bias),
    ):  # fmt: skip
        if t is not None:
            check_no_grad(name, t)
    if logits_fn is None:
        logits = matmul(hidden, router_weight, out_dtype=torch.float32)  # [T, E] fp32 accumulator
    else:
        logits = logits_fn(hidden, router_weight)
    topk_weights, topk_ids = moe_router(
        logits, args.k, scoring, renormalize, correction_bias, n_group, topk_group
    )  # [T, k] fp32, int32
    sorted_ids, block_expert, num_padded = moe_align(
        topk_ids, args.e, align_block(hidden.device, args.t, args.k, args.e)
    )
    gate_up = gemm(hidden, w13, sorted_ids, block_expert, num_padded, args.k)  # [T, k, 2I] bf16
    scale = topk_weights.reshape(-1) if apply_router_weight_on_input else None
    act = activation(gate_up.view(args.t * args.k, 2 * args.i), scale)  # [T*k, I] bf16
    down = gemm(act, w2, sorted_ids, block_expert, num_padded, args.k, a_per_slot=True)  # [T, k, H]
    out = combine(down, None if apply_router_weight_on_input else topk_weights)
    return out


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
    """Fused MoE layer: ``[T, H]`` bf16 out of ``hidden [T, H]`` bf16.

    Parameters
    ----------
    hidden : Tensor [T, H], bf16
    router_weight : Tensor [E, H], bf16: logits = ``hidden @ router_weight.T`` (pinned matmul,
        the fp32 accumulator itself, never rounded through bf16)
    w13 : Tensor [E, 2 I, H], bf16 (gate rows :I, up rows I:)
    w2 : Tensor [E, H, I], bf16
    top_k, scoring, renormalize, correction_bias, n_group, topk_group
        The router's (:func:`batchinv.fast.moe_router.moe_router`).
    apply_router_weight_on_input : bool
        Multiply the activation by the routing weight (swiglu's scale) instead of the expert
        outputs at the combine.  The weights are applied exactly once either way.

    Returns
    -------
    Tensor [T, H], bf16.  The roundings are the stages': gate_up and the activation and the
    down projection each rounded once to bf16, the combine once.  Bitwise invariant in the
    other tokens (their number, routing, position), an expert's M and repeated calls; within
    the harness's derived bound of the fp64 reference (``harness/components/fused_moe.py``).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`batchinv.reference.fused_moe.check_fused_moe_args`, and the stages'.

    Source: vLLM's ``fused_experts`` pipeline (router, align, two grouped GEMMs, activation,
    combine), every stage pinned.
    """
    return compose(
        hidden, router_weight, w13, w2, top_k, scoring, renormalize, correction_bias, n_group, topk_group,
        apply_router_weight_on_input,
    )  # fmt: skip
