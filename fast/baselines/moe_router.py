"""Unpinned production paths of the MoE router: the negative controls of ``moe_router``.

* :func:`torch_topk_router`: the common eager router (vLLM's ``fused_topk`` / ``grouped_topk``
  written in torch): fp32 ``softmax`` / ``sigmoid`` scores, ``torch.topk`` for the groups and the
  experts (ties in no specified order; on a GPU the algorithm, hence the tie order, is chosen from
  the shape, T included), fp32 renormalization.  Expected to vary on GPU lanes only: on the CPU
  ``torch.topk`` is one sequential partial sort per row.
* :func:`bf16_large_batch_router`: the pinned kernel behind a dispatch on the number of tokens,
  as production routers do when a large-batch fused path takes the router logits in the
  activation dtype: above :data:`BF16_MIN_TOKENS` tokens the logits are rounded to bf16 first
  (the gate matmul's output dtype).  A token's weights (and, on near-ties, its experts) then
  depend on how many tokens share the launch: detected on every lane by the batch_prefix check.
"""

from __future__ import annotations

import torch

from batchinv.fast.kernels.moe_router import moe_router_kernel
from batchinv.fast.moe_router import launch
from batchinv.reference.moe_router import Routing

__all__ = ["BF16_MIN_TOKENS", "bf16_large_batch_router", "torch_topk_router"]

#: The token count above which :func:`bf16_large_batch_router` takes bf16 logits.
BF16_MIN_TOKENS = 4


def torch_topk_router(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scores and ``torch.topk`` (vLLM-style eager routing).  Same signature, shapes and
    dtypes as :func:`batchinv.fast.moe_router.moe_router`; NOT batch invariant (tie order).

    Raises:
        DTypeError, ArgumentError, DeviceError: as :func:`batchinv.fast.moe_router.moe_router`.
    """
    routing = Routing(top_k, scoring, renormalize, correction_bias, n_group, topk_group).for_logits(logits)
    num_tokens, num_experts = logits.shape
    softmax = routing.scoring == "softmax"
    scores = torch.softmax(logits, dim=-1) if softmax else torch.sigmoid(logits)  # [T, E]
    bias = routing.correction_bias
    choice = scores + bias[None, :] if bias is not None else scores
    if routing.grouped:
        grouped = choice.view(num_tokens, routing.n_group, -1)
        if bias is not None and grouped.shape[2] >= 2:  # vLLM: the top-2 sum with a bias ...
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        else:  # ... the group's max without one
            group_scores = grouped.amax(dim=-1)
        group_idx = torch.topk(group_scores, routing.topk_group, dim=-1).indices  # [T, topk_group]
        mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        keep = mask[:, :, None].expand_as(grouped).reshape(num_tokens, num_experts)
        choice = choice.masked_fill(keep == 0, float("-inf"))
    ids = torch.topk(choice, routing.top_k, dim=-1).indices  # [T, k]
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(torch.float32), ids.to(torch.int32)


def bf16_large_batch_router(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pinned kernel, on logits rounded to bf16 when more than :data:`BF16_MIN_TOKENS` tokens
    share the launch.  Same signature, shapes and dtypes as
    :func:`batchinv.fast.moe_router.moe_router`; NOT batch invariant (a dispatch on T).

    Raises:
        DTypeError, ArgumentError, DeviceError: as :func:`batchinv.fast.moe_router.moe_router`.
    """

    def to_bf16(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(torch.float32) if x.shape[0] > BF16_MIN_TOKENS else x

    routing = Routing(top_k, scoring, renormalize, correction_bias, n_group, topk_group)
    return launch(moe_router_kernel, logits, routing.for_logits(logits), transform=to_bf16)
