"""Unpinned ``moe_combine`` paths: the negative controls of the ``moe_combine`` component.

* ``atomic_add``: one program per (token, slot, column tile) adds its fp32 product into an fp32
  output with ``tl.atomic_add``, then one cast to y's dtype: the order of a token's slots is the
  atomics' arrival order (on a GPU the schedule; the interpreter runs programs in order, so only
  GPU lanes must vary).
* ``token_count_dispatch``: a production-style dispatch on the number of tokens: below
  :data:`TILE_TOKENS` tokens (decode) the fp32 products are added in slot order; from there on
  (a prefill tile of tokens) the slot axis is reduced as a pairwise tree, as ``tl.sum`` over a
  [tokens, k, H] tile does.  fp32 accumulation, so a token's bits change with the batch size on
  every lane (the batch_prefix check sees it on cancelling rows).
"""

from __future__ import annotations

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.moe_combine import moe_combine_atomic_kernel
from batchinv.fast.moe_combine import DEFAULT_BLOCK_H, MOE_COMBINE_BLOCK_H
from batchinv.reference.moe_combine import check_moe_combine_args

#: The token count from which ``token_count_dispatch`` takes its tile path.
TILE_TOKENS = 16


def atomic_add_moe_combine(
    expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 ``tl.atomic_add`` of each slot's contribution, then one cast (arrival order)."""
    num_tokens, top_k, hidden = check_moe_combine_args(expert_out, topk_weights)
    check_launch_device("expert_out", expert_out)
    y = kernel_operand(expert_out)
    w = None if topk_weights is None else kernel_operand(topk_weights)
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=y.device)
    if num_tokens and hidden:
        block_h = MOE_COMBINE_BLOCK_H.get(arch(y.device), DEFAULT_BLOCK_H)
        with interpreter_quiet():
            moe_combine_atomic_kernel[(num_tokens, top_k, triton.cdiv(hidden, block_h))](
                y,
                y if w is None else w,
                acc,
                hidden,
                y.stride(0),
                y.stride(1),
                y.stride(2),
                0 if w is None else w.stride(0),
                0 if w is None else w.stride(1),
                HAS_WEIGHTS=w is not None,
                BLOCK_H=block_h,
            )
    return acc.to(y.dtype)


def token_count_dispatch_moe_combine(
    expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 products; slot order for T < :data:`TILE_TOKENS`, a pairwise tree over the slots from
    there on (the reduction order depends on the number of tokens)."""
    num_tokens, top_k, _ = check_moe_combine_args(expert_out, topk_weights)
    terms = expert_out.float()
    if topk_weights is not None:
        terms = topk_weights[:, :, None] * terms  # [T, k, H] fp32 products
    parts = [terms[:, j] for j in range(top_k)]
    if num_tokens < TILE_TOKENS:
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
    else:
        while len(parts) > 1:
            parts = [
                parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)
            ]
        acc = parts[0]
    return acc.to(expert_out.dtype)
