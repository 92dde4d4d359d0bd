"""Launcher of the batch-invariant MoE router (kernel: ``batchinv.fast.kernels.moe_router``).

Validates (the reference's checks), allocates, picks ``num_warps`` from :data:`CONFIGS` (keyed
only on arch and the expert tile, never on the number of tokens), sizes the grid (one program
per token) and launches.  Graph-capturable: no host read of device data.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.moe_router import moe_router_kernel
from batchinv.reference.moe_router import Routing

__all__ = ["CONFIGS", "launch", "moe_router", "select_num_warps"]

#: Expert tiles (BLOCK_G * BLOCK_S, a power of two) and their warps.
_TILES: Final[tuple[int, ...]] = tuple(2**i for i in range(0, 13))


def _table() -> dict[tuple[str, int], int]:
    return {
        (arch_key, tile): 1 if tile <= 64 else 2 if tile <= 256 else 4
        for arch_key in ("sm90", "sm100", "interp", "generic")
        for tile in _TILES
    }


#: num_warps keyed ONLY on (arch, expert tile) -- never on T.  The result does not depend on it
#: (integer selection, elementwise fp64 math; the tree sum of the softmax denominator is fixed by
#: the tile, not by the warps), but a table keyed on T would make speed batch-dependent.
CONFIGS: Final = MappingProxyType(_table())


def select_num_warps(arch_key: str, tile: int) -> int:
    """``num_warps`` for ``arch_key`` and the expert tile (takes no token count, by design)."""
    return CONFIGS.get((arch_key, tile)) or CONFIGS.get(("generic", tile), 8)


def moe_router(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to its ``top_k`` experts: ``(topk_weights, topk_ids)``.

    Selection ranks experts by the int32 monotone key of an fp32 selection value (softmax: the
    logit; sigmoid: ``fp32(sigmoid64(logit)) + bias`` with NaNs canonicalized), exact ties to the
    lower expert id; grouped (``n_group > 1``): the ``topk_group`` groups with the largest score
    are kept (ties to the lower group) and the experts are taken among them -- a group's score
    is its best key without a bias, ``fp32(best + second best)`` biased value with one (vLLM's
    ``grouped_topk``, DeepSeek-V3's group-limited routing); NaN groups rank as NaN experts do.  Weights: the chosen experts' softmax (over all E) or sigmoid scores in
    fp64, divided by their slot-order sum when ``renormalize``, rounded once to fp32.  The full
    contract is :func:`batchinv.reference.moe_router.moe_router` and docs/MOE.md, section 1.

    Args:
        logits: float32 ``[T, E]``, any strides; CUDA (or CPU under the Triton interpreter).
        top_k: integral in ``[1, E]``, at most ``topk_group * E / n_group``.
        scoring: "softmax" or "sigmoid".
        renormalize: bool.
        correction_bias: float32 ``[E]`` on the logits' device, sigmoid only; or None.
        n_group: integral dividing E; topk_group: integral in ``[1, n_group]``.

    Returns:
        ``topk_weights`` float32 ``[T, k]``, ``topk_ids`` int32 ``[T, k]`` (slot 0 the best).
        The ids equal the reference's bitwise; the weights equal the reference rounded once
        to fp32, except within fp64 ULPs of a rounding midpoint where either fp32 neighbour may
        come out (fp64 exp and the denominator's summation order differ by fp64 ULPs from the
        reference's; see docs/MOE.md).  Bitwise invariant along the token axis: a token's
        outputs depend on its logits alone, not on T, its position, neighbours or earlier calls.

    Raises:
        DTypeError, ArgumentError, DeviceError: see
        :meth:`batchinv.reference.moe_router.Routing.for_logits`; DeviceError also for a
        non-CUDA tensor on the GPU path.
    """
    routing = Routing(top_k, scoring, renormalize, correction_bias, n_group, topk_group)
    return launch(moe_router_kernel, logits, routing.for_logits(logits))


def launch(
    kernel: Any,
    logits: torch.Tensor,
    routing: Routing,
    *,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch ``kernel`` (the shipped one or a mutant sharing its signature) on ``logits`` with
    a ``routing`` validated against them (:meth:`Routing.for_logits`); ``transform`` rewrites
    the kernel's logits operand (a baseline's dispatch)."""
    top_k, correction_bias = routing.top_k, routing.correction_bias
    n_group, topk_group = routing.n_group, routing.topk_group
    check_launch_device("logits", logits)
    if correction_bias is not None:
        check_launch_device("correction_bias", correction_bias)
    num_tokens, num_experts = logits.shape
    device = logits.device
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=device)
    if num_tokens == 0:
        return weights, ids
    logits = kernel_operand(logits)
    if transform is not None:
        logits = transform(logits)
    bias = kernel_operand(correction_bias) if correction_bias is not None else logits
    group_size = num_experts // n_group
    block_g = triton.next_power_of_2(n_group)
    block_s = triton.next_power_of_2(group_size)
    with interpreter_quiet():
        kernel[(num_tokens,)](
            logits,
            bias,
            weights,
            ids,
            num_experts,
            n_group,
            group_size,
            topk_group,
            logits.stride(0),
            logits.stride(1),
            bias.stride(0),
            weights.stride(0),
            ids.stride(0),
            K=top_k,
            BLOCK_K=triton.next_power_of_2(top_k),
            BLOCK_G=block_g,
            BLOCK_S=block_s,
            BLOCK_E=block_g * block_s,
            SIGMOID=routing.scoring == "sigmoid",
            HAS_BIAS=correction_bias is not None,
            GROUPED=routing.grouped,
            IS_PAIR=group_size >= 2 and correction_bias is not None,  # else: the group's best key
            RENORMALIZE=routing.renormalize,
            num_warps=select_num_warps(arch(device), block_g * block_s),
        )
    return weights, ids
