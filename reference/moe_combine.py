"""Reference of ``moe_combine`` (docs/MOE.md section 5): the weighted sum of a token's k expert
outputs.

Dimension legend:
    T: tokens, k: top_k (slots), H: hidden

``out[t] = sum_j w[t, j] * y[t, j]`` with every product and sum an IEEE fp64 operation, in slot
order j = 0..k-1 starting from the first product (``acc = w0 y0; acc = acc + w_j y_j``: separate
torch ops, so no fused multiply-add), then one rounding to y's dtype
(:func:`batchinv.reference.exact.round_once`).  ``topk_weights=None``: the weights were already
applied, the plain sum ``acc = y0; acc = acc + y_j``.  A NaN result is the canonical quiet NaN
of the output dtype (positive, payload 0...: IEEE leaves the propagated payload open, so the
contract fixes it).  The fast kernel performs the same fp64 operations in the same order, so
agreement is exact.
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_same_device, check_tensor
from batchinv.reference.exact import round_once

#: Output (= expert_out) dtypes.
DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)


def check_moe_combine_args(expert_out: Any, topk_weights: Any) -> tuple[int, int, int]:
    """Validate; returns ``(T, k, H)``.

    Raises:
        DTypeError: ``expert_out`` not bf16/fp16/fp32, ``topk_weights`` not fp32 (or None).
        ArgumentError: ``expert_out`` not 3-D or k = 0; ``topk_weights`` not 2-D [T, k].
        DeviceError: meta tensors, or the two on different devices.
    """
    check_tensor("expert_out", expert_out, dtypes=DTYPES, ndim=3)
    num_tokens, top_k, hidden = expert_out.shape
    if top_k < 1:
        raise ArgumentError("expert_out", "[T, k, H] with k >= 1", tuple(expert_out.shape))
    if topk_weights is not None:
        check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2)
        if tuple(topk_weights.shape) != (num_tokens, top_k):
            raise ArgumentError(
                "topk_weights", f"shape [T, k] = {[num_tokens, top_k]}", list(topk_weights.shape)
            )
        check_same_device("topk_weights", topk_weights, expert_out.device)
    return num_tokens, top_k, hidden


def canonical_nan(dtype: torch.dtype) -> torch.Tensor:
    """The canonical quiet NaN of ``dtype`` (``float('nan')``: 0x7fc0, 0x7e00, 0x7fc00000)."""
    return torch.tensor(float("nan"), dtype=dtype)


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, H]`` of expert_out's dtype and device: fp64 slot-order sum, one rounding (see module)."""
    check_moe_combine_args(expert_out, topk_weights)
    y = expert_out.detach().resolve_neg().cpu().to(torch.float64)  # exact
    w = None if topk_weights is None else topk_weights.detach().resolve_neg().cpu().to(torch.float64)
    top_k = y.shape[1]
    acc = y[:, 0] if w is None else torch.mul(w[:, 0, None], y[:, 0])
    for j in range(1, top_k):
        term = y[:, j] if w is None else torch.mul(w[:, j, None], y[:, j])
        acc = torch.add(acc, term)
    out = round_once(acc, expert_out.dtype)
    out = torch.where(torch.isnan(acc), canonical_nan(expert_out.dtype), out)
    return out.to(expert_out.device)
