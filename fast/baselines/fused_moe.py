"""Unpinned baseline of ``fused_moe``: the same pipeline with the stages' unpinned variants.

``unpinned_stages``: grouped GEMMs with split-K for small-M experts
(:func:`batchinv.fast.baselines.grouped_gemm.split_k_small_m`: a token's reduction tree depends
on how many other tokens share its experts), the activation's bf16 intermediate above 32 rows
(:func:`batchinv.fast.baselines.swiglu.swiglu_bf16_above_32_rows`) and the token-count dispatched
combine (:func:`batchinv.fast.baselines.moe_combine.token_count_dispatch_moe_combine`).  The
logits matmul, the router and the align stay pinned: an unpinned router could change a token's
experts, and the layer's agreement cases keep the routing away from near-ties, so this baseline
isolates the post-routing stages (the router's own baselines are checked by ``moe_router``).

``token_count_configs``: the production speed baseline of ``batchinv bench fused_moe`` -- the
grouped GEMMs' whole config (BLOCK_K included) and the align block from the token count T as
vLLM's tuned tables do (:func:`batchinv.fast.baselines.grouped_gemm.token_count_configs`), and
the atomic-add combine.  No host sync, so it is timed in a CUDA graph like the pinned layer.

``per_tensor_fp8_activations``: online FP8 MoE as vLLM #57016 ran it -- both grouped GEMMs'
activations quantized to e4m3 with *one* dynamic scale, the amax over every co-batched token
(:func:`batchinv.fast.baselines.fp8_quant.fp8_quant_per_tensor_dynamic`, ``scale = amax / 448``),
then dequantized (``q * scale`` in fp32, rounded to bf16) into the pinned grouped GEMM, every
other stage pinned.  A token's quantized activations, hence its output, follow the largest
activation of the launch: greedy tokens flipped within ~10 positions there.  The emulation
(dequantize, then the bf16 GEMM) has other bits than an FP8 tensor-core GEMM with the scale on
the accumulator, but the same dependence on the batch; it runs on every lane (torch's e4m3
casts run on the CPU), and is not timed (it is a negative control, not a speed path).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from batchinv.fast.baselines.fp8_quant import fp8_quant_per_tensor_dynamic
from batchinv.fast.baselines.grouped_gemm import split_k_small_m, token_count_block_m
from batchinv.fast.baselines.grouped_gemm import token_count_configs as token_count_gemm
from batchinv.fast.baselines.moe_combine import atomic_add_moe_combine, token_count_dispatch_moe_combine
from batchinv.fast.baselines.swiglu import swiglu_bf16_above_32_rows
from batchinv.fast.fused_moe import compose
from batchinv.fast.grouped_gemm import grouped_gemm


def _with_stages(doc: str, **stages: Any) -> Callable[..., torch.Tensor]:
    """:func:`batchinv.fast.fused_moe.compose` with these stage implementations: the signature
    of :func:`batchinv.fast.fused_moe.fused_moe` (the same names and defaults)."""
    fn = functools.partial(compose, **stages)
    fn.__doc__ = doc
    return fn


unpinned_stages = _with_stages(
    """:func:`batchinv.fast.fused_moe.fused_moe` with the unpinned grouped GEMM, activation and
    combine (module docstring).""",
    gemm=split_k_small_m,
    activation=swiglu_bf16_above_32_rows,
    combine=token_count_dispatch_moe_combine,
)

token_count_configs = _with_stages(
    """:func:`batchinv.fast.fused_moe.fused_moe` with per-token-count grouped GEMM configs and the
    atomic-add combine (module docstring).""",
    gemm=token_count_gemm,
    combine=atomic_add_moe_combine,
    align_block=token_count_block_m,
)


def per_tensor_fp8(a: torch.Tensor) -> torch.Tensor:
    """``a [rows, K]`` (bf16) quantized to e4m3 with one scale for the whole tensor (the amax of
    its finite elements / 448) and dequantized: ``(q * scale)`` in fp32, rounded to ``a``'s dtype."""
    q, scale = fp8_quant_per_tensor_dynamic(a)
    return (q.to(torch.float32) * scale).to(a.dtype)


def _per_tensor_fp8_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """The pinned grouped GEMM on :func:`per_tensor_fp8` activations (one scale per launch)."""
    return grouped_gemm(per_tensor_fp8(a), w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)


per_tensor_fp8_activations = _with_stages(
    """:func:`batchinv.fast.fused_moe.fused_moe` with both GEMMs' activations through one dynamic
    per-tensor FP8 scale, the amax over every co-batched token (module docstring).""",
    gemm=_per_tensor_fp8_gemm,
)
