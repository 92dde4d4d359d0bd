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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from batchinv.fast.baselines.grouped_gemm import split_k_small_m, token_count_block_m
from batchinv.fast.baselines.grouped_gemm import token_count_configs as token_count_gemm
from batchinv.fast.baselines.moe_combine import atomic_add_moe_combine, token_count_dispatch_moe_combine
from batchinv.fast.baselines.swiglu import swiglu_bf16_above_32_rows
from batchinv.fast.fused_moe import compose


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
