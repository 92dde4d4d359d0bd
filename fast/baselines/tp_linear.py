"""Unpinned tensor-parallel reductions of the row-parallel linear (negative controls of
``tp_linear``'s TP-degree axis, the ``partition`` check).

Each rank computes its K slice's partial with the pinned matmul (equal slices of ``K / T``);
only the reduction of the partials across ranks differs from :mod:`batchinv.fast.tp_linear`:

* ``bf16_rank_order``: the naive row-parallel linear (Megatron's ``RowParallelLinear`` with a
  16-bit all-reduce): each rank's output rounded to the activation dtype, the T outputs summed
  in rank order in that dtype (each add rounds), then the bias.  Its bits move with T.
* ``ring_order``: fp32 partials reduced in NCCL's ring order: the flattened output is cut into
  T segments and segment ``s`` is accumulated starting at rank ``(s + 1) mod T`` around the ring
  (the reduce-scatter of a ring all-reduce), then the bias in fp32 and one rounding.  Another
  association of the partials than the single rank's chunk chain, and another per segment.
"""

from __future__ import annotations

import torch

from batchinv.fast.matmul import matmul
from batchinv.reference.errors import ArgumentError
from batchinv.reference.matmul import validate


def _partials(
    x: torch.Tensor, weight: torch.Tensor, layout: str, tp_degree: int, out_dtype: torch.dtype
) -> list[torch.Tensor]:
    """Each rank's ``x[:, slice] @ W[slice]`` by the pinned matmul (equal K slices), in ``out_dtype``."""
    k = x.shape[1]
    if isinstance(tp_degree, bool) or not isinstance(tp_degree, int) or tp_degree < 1 or k % tp_degree:
        raise ArgumentError("tp_degree", f"a positive int dividing K = {k}", tp_degree)
    step = k // tp_degree
    out = []
    for r in range(tp_degree):
        ks = slice(r * step, (r + 1) * step)
        w = weight[:, ks] if layout == "linear" else weight[ks, :]
        out.append(matmul(x[:, ks], w, None, layout=layout, out_dtype=out_dtype))
    return out


def tp_linear_bf16_rank_order(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    tp_degree: int | None = None,
) -> torch.Tensor:
    """Rank outputs in the activation dtype, summed in rank order in it, then the bias."""
    args = validate(x, weight, bias, layout, out_dtype, "ieee")
    parts = _partials(x, weight, layout, tp_degree or 1, x.dtype)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    if bias is not None:
        total = total + bias.to(total.dtype)
    return total.to(args.out_dtype)


def tp_linear_ring_order(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    tp_degree: int | None = None,
) -> torch.Tensor:
    """fp32 partials reduced segment by segment in ring order, then the bias, one rounding."""
    args = validate(x, weight, bias, layout, out_dtype, "ieee")
    t = tp_degree or 1
    parts = [p.reshape(-1) for p in _partials(x, weight, layout, t, torch.float32)]
    flat = torch.empty_like(parts[0])
    bounds = [round(i * flat.numel() / t) for i in range(t + 1)]
    for s in range(t):
        seg = slice(bounds[s], bounds[s + 1])
        order = [(s + 1 + i) % t for i in range(t)]
        acc = parts[order[0]][seg]
        for r in order[1:]:
            acc = acc + parts[r][seg]
        flat[seg] = acc
    total = flat.view(args.m, args.n)
    if bias is not None:
        total = total + bias.to(torch.float32)
    return total.to(args.out_dtype)
