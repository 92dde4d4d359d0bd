"""Unpinned grouped GEMMs, run as negative controls beside :mod:`batchinv.fast.grouped_gemm`.

Both choose their reduction per expert from the expert's M (its number of routed rows in this
launch), as production fused-MoE paths do, so a token's bits change with the other tokens:

* :func:`split_k_small_m` -- split-K for small-M experts (decode fills the machine by cutting
  K): fp32 partials of K slices summed pairwise after the kernel.
* :func:`bucket_block_k` -- a config per M bucket (vLLM's tuned JSON configs are keyed on the
  batch size): BLOCK_K halved for small-M experts.

Both launch the shipped kernel; they differ from the fast path only in the per-M choice.  Two
more keep their choice off the expert's M:

* :func:`token_count_configs` -- the whole config, BLOCK_K included, from the launch's token
  count T, as vLLM's tuned per-T tables do (a host integer: CUDA-graph safe, the production
  speed baseline of ``batchinv bench fused_moe``).  A token's bits change with T.
* :func:`other_block_k` -- the table's config with half its BLOCK_K: invariant along every
  batch axis, the negative control of ``config_equivalence`` on the interpreter.  On the H200
  (Triton 3.6, 2026-11-30) BLOCK_K 32, 64 and 128 gave the same bits: the tensor-core dot
  accumulates its 16-wide k-steps into the one fp32 accumulator in order whatever the tile, so
  there BLOCK_K is not a reduction choice and these three are not expected to vary.
* :func:`two_k_slices` -- K always in two slices added after: the negative control of
  ``config_equivalence`` on every lane.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from batchinv.fast.device import interpreting
from batchinv.fast.grouped_gemm import GroupedGemmConfig, checked, execute, launch
from batchinv.reference.grouped_gemm import GroupedGemmArgs, row_experts

#: Expert-M thresholds: (split into 4 at M <=, split into 2 at M <=); the bucket threshold.
_SPLIT_M = {"interp": (1, 3), "gpu": (16, 64)}
_BUCKET_M = {"interp": 4, "gpu": 32}


def _lane() -> str:
    return "interp" if interpreting() else "gpu"


def _expert_m(sorted_ids: torch.Tensor, block_expert: torch.Tensor, args: GroupedGemmArgs) -> torch.Tensor:
    """Each block's expert M (rows routed to the block's expert in this launch), [B] int64 CPU;
    0 for unused blocks."""
    used = args.num_padded
    experts = block_expert.cpu().to(torch.int64)
    counts = torch.bincount(row_experts(sorted_ids, block_expert, args)[1], minlength=args.e)
    m = torch.zeros(experts.numel(), dtype=torch.int64)
    m[: used // args.block_m] = counts[experts[: used // args.block_m]]
    return m


def _masked(block_expert: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``block_expert`` with the blocks not in ``keep`` set to -1 (skipped by the kernel)."""
    return torch.where(keep.to(block_expert.device), block_expert, torch.full_like(block_expert, -1))


def split_k_small_m(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """Grouped GEMM with split-K for small-M experts (4 or 2 K slices by the expert's M); the
    fp32 slice partials are added pairwise ((p0 + p1) + (p2 + p3)) and rounded once.  Within
    the bound, but a token's bits change with how many other tokens share its experts."""
    args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    out = torch.empty(args.t * args.k, args.n, dtype=a.dtype, device=a.device)
    m = _expert_m(sorted_ids, block_expert, args)
    four, two = _SPLIT_M[_lane()]
    used = torch.zeros_like(m, dtype=torch.bool)
    used[: args.num_padded // args.block_m] = True
    for splits, keep in ((1, used & (m > two)), (2, used & (m > four) & (m <= two)), (4, used & (m <= four))):
        if not bool(keep.any()):
            continue
        be = _masked(block_expert, keep)
        if splits == 1:
            launch(a, w, sorted_ids, be, num_padded, args, a_per_slot, cfg, out)
            continue
        total = _split_k_sum(a, w, sorted_ids, be, num_padded, args, a_per_slot, cfg, splits)
        rows = _rows_of(sorted_ids, be, args)
        out[rows] = total[rows].to(a.dtype)
    return out.view(args.t, args.k, args.n)


def _split_k_sum(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    args: GroupedGemmArgs,
    a_per_slot: bool,
    cfg: GroupedGemmConfig,
    splits: int,
) -> torch.Tensor:
    """``[T * k, N]`` fp32: the kernel's partials over ``splits`` K slices of ``ceil(K / splits)``
    (not aligned with BLOCK_K), added pairwise ((p0 + p1) + (p2 + p3))."""
    kps = -(-args.kdim // splits)
    ws = torch.zeros(splits, args.t * args.k, args.n, dtype=torch.float32, device=a.device)
    launch(
        a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, cfg, ws, splits=splits, k_per_split=kps
    )
    parts = list(ws)
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def two_k_slices(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """The table's config with K always cut in two slices, their fp32 partials added and rounded
    once: invariant in the batch (the split depends on nothing), but another summation tree,
    which ``config_equivalence`` must tell from the declared configs on every lane (on the H200
    halving BLOCK_K did not change a bit: :func:`other_block_k`)."""
    args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    total = _split_k_sum(a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, cfg, 2)
    return total.to(a.dtype).view(args.t, args.k, args.n)


def _rows_of(sorted_ids: torch.Tensor, block_expert: torch.Tensor, args: GroupedGemmArgs) -> torch.Tensor:
    """The flat rows of the blocks with an expert >= 0 (int64, on the ids' device)."""
    used = args.num_padded
    ids = sorted_ids[:used].to(torch.int64)
    keep = block_expert.to(torch.int64).repeat_interleave(args.block_m)[:used] >= 0
    keep &= ids < args.t * args.k
    return ids[keep]


def bucket_block_k(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """Grouped GEMM whose BLOCK_K comes from the expert's M bucket (halved at or below the
    threshold): a per-M config, so another summation grouping per expert M."""
    args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    out = torch.empty(args.t * args.k, args.n, dtype=a.dtype, device=a.device)
    m = _expert_m(sorted_ids, block_expert, args)
    small = m <= _BUCKET_M[_lane()]
    small_cfg = replace(cfg, block_k=max(16, cfg.block_k // 2))
    launch(a, w, sorted_ids, _masked(block_expert, ~small), num_padded, args, a_per_slot, cfg, out)
    launch(a, w, sorted_ids, _masked(block_expert, small), num_padded, args, a_per_slot, small_cfg, out)
    return out.view(args.t, args.k, args.n)


#: Per token count T: ``(T at most, config)``, first match wins.  GPU rows follow the shape of
#: vLLM's tuned H200 table for E = 128, N = 768 (``fused_moe/configs``; used for every shape):
#: BLOCK_M 16 and BLOCK_K 128 through the decode and small-prefill range, BLOCK_K 64 at the
#: ends.  Interpreter rows change BLOCK_K at T = 2, so the cpu lane sees the variance too.
TOKEN_COUNT_TABLE: dict[str, tuple[tuple[float, GroupedGemmConfig], ...]] = {
    "gpu": (
        (2, GroupedGemmConfig(16, 64, 64, 4, 5)),
        (32, GroupedGemmConfig(16, 64, 128, 4, 3)),
        (128, GroupedGemmConfig(16, 128, 128, 4, 2)),
        (256, GroupedGemmConfig(32, 256, 128, 4, 2)),
        (512, GroupedGemmConfig(64, 128, 64, 4, 3)),
        (math.inf, GroupedGemmConfig(128, 256, 64, 8, 4)),
    ),
    "interp": ((2, GroupedGemmConfig(16, 64, 32)), (math.inf, GroupedGemmConfig(16, 64, 64))),
}


def token_count_config(num_tokens: int) -> GroupedGemmConfig:
    """The :data:`TOKEN_COUNT_TABLE` config of a launch of ``num_tokens`` tokens."""
    return next(cfg for limit, cfg in TOKEN_COUNT_TABLE[_lane()] if num_tokens <= limit)


def token_count_block_m(device: torch.device, num_tokens: int, top_k: int, num_experts: int) -> int:
    """The align block of :func:`token_count_configs` for ``num_tokens`` tokens (the table's);
    the signature of :func:`batchinv.fast.grouped_gemm.layer_block_m`."""
    del device, top_k, num_experts
    return token_count_config(num_tokens).block_m


def _one_config(
    choose: Callable[[GroupedGemmArgs, GroupedGemmConfig], GroupedGemmConfig], doc: str
) -> Callable[..., torch.Tensor]:
    """A grouped GEMM with :func:`batchinv.fast.grouped_gemm.grouped_gemm`'s signature that runs
    the shipped kernel once with ``choose(args, table_config)``."""

    def gemm(
        a: torch.Tensor,
        w: torch.Tensor,
        sorted_ids: torch.Tensor,
        block_expert: torch.Tensor,
        num_padded: torch.Tensor,
        top_k: int,
        a_per_slot: bool = False,
    ) -> torch.Tensor:
        args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
        return execute(a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, choose(args, cfg))

    gemm.__doc__ = doc
    return gemm


token_count_configs = _one_config(
    lambda args, cfg: replace(token_count_config(args.t), block_m=args.block_m),
    """Grouped GEMM whose config (BLOCK_K included) comes from the token count T
    (:data:`TOKEN_COUNT_TABLE`; ``block_m`` stays the input's).  No host sync: capturable.""",
)

other_block_k = _one_config(
    lambda args, cfg: replace(cfg, block_k=max(16, cfg.block_k // 2)),
    """The table's config with half its BLOCK_K: invariant in the batch, but another association
    of every fp32 sum under the interpreter, which ``config_equivalence`` must tell from the
    declared configs there.""",
)
