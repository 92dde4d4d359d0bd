"""Mutants of issue 25 (sections 4 and 6): the router's group rule, and the survivor classes that
the cpu sweep's former cases let through (sigmoid at top_k == E, a double rounding in the
combine, a grouped GEMM config keyed on the token count, a decode split off its table value,
a decode split planned from the launch's longest request past 4 splits).

Each builds a subject with its component's fast signature (see :mod:`tests.mutants`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import batchinv.fast.kernels.moe_combine as moe_combine_kernels
import batchinv.fast.kernels.moe_router as moe_router_kernels
from batchinv.fast import decode_attention as attention_launcher
from batchinv.fast import grouped_gemm as grouped_gemm_launcher
from batchinv.fast import moe_combine as moe_combine_launcher
from batchinv.fast import moe_router as moe_router_launcher
from batchinv.fast.kernels.primitives import round_to

from .kernels import with_kernel
from .patch import mutate

# --- moe_router --------------------------------------------------------------------------------


def moe_router_group_score_top2_without_bias() -> Callable[..., Any]:
    """The former rule: groups ranked by the sum of their two best keys' values with no bias."""
    return mutate(  # type: ignore[no-any-return]
        moe_router_launcher,
        "launch",
        "IS_PAIR=group_size >= 2 and correction_bias is not None,  # else: the group's best key",
        "IS_PAIR=group_size >= 2,",
        entry="moe_router",
    )


def moe_router_full_k_not_renormalized() -> Callable[..., Any]:
    """``renormalize`` skipped when ``top_k == E`` (as if the chosen scores always summed to 1:
    true of softmax only)."""
    kernel = mutate(
        moe_router_kernels,
        "moe_router_kernel",
        "p = p / denom",
        "p = tl.where(K < num_experts, p / denom, p)",
    )
    return with_kernel(moe_router_launcher, "moe_router_kernel", kernel, moe_router_launcher.moe_router)


# --- moe_combine -------------------------------------------------------------------------------


def moe_combine_double_rounding() -> Callable[..., Any]:
    """The fp64 sum rounded to fp32 to nearest, then to the 16-bit dtype (two roundings)."""
    kernel = mutate(
        moe_combine_kernels,
        "moe_combine_kernel",
        "out = round_from_f64(acc, dtype)",
        "out = round_to(acc.to(tl.float32), dtype)",
        extra_globals={"round_to": round_to},
    )
    return with_kernel(moe_combine_launcher, "moe_combine_kernel", kernel, moe_combine_launcher.moe_combine)


# --- grouped_gemm ------------------------------------------------------------------------------

#: Tokens above which the mutant's launcher changes its config (a "large batch" bucket).
LARGE_LAUNCH_TOKENS = 32


def _halve_block_k_for_large_launches(checked: Any, a: Any) -> Any:
    """``(args, config)`` with BLOCK_K halved when the launch has more than 32 tokens."""
    args, config = checked
    if a.shape[0] > LARGE_LAUNCH_TOKENS:
        config = replace(config, block_k=max(16, config.block_k // 2))
    return args, config


def grouped_gemm_block_k_from_token_count() -> Callable[..., Any]:
    return mutate(  # type: ignore[no-any-return]
        grouped_gemm_launcher,
        "grouped_gemm",
        "args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)",
        "args, cfg = halve_block_k_for_large_launches("
        "checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot), a)",
        extra_globals={"halve_block_k_for_large_launches": _halve_block_k_for_large_launches},
    )


# --- decode_attention --------------------------------------------------------------------------


def _one_chunk_longer(config: Any) -> Any:
    """``config`` with its split one chunk (``block_n``) longer: every boundary moves."""
    return replace(config, split_tokens=config.split_tokens + config.block_n)


def decode_attention_split_one_chunk_longer() -> Callable[..., Any]:
    """The launcher's split_tokens off by one chunk (48 slots on the cpu lane, not 32): a token's
    split boundaries, and so its merge tree, are not the table's."""
    return mutate(  # type: ignore[no-any-return]
        attention_launcher,
        "decode_attention",
        "config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)",
        "config = one_chunk_longer(decode_attention_config(arch(q.device), shape.head_dim, q.dtype))",
        extra_globals={"one_chunk_longer": _one_chunk_longer},
    )


#: The split count above which the launch-planned mutants change the plan: more splits than
#: the cpu lane's 97-slot cases (4 splits of 32) have on their own.
LAUNCH_SPLITS = 4


def _longest_dense(seq_lens: Any, indices: Any) -> int | None:
    """The launch's longest context (dense launches only; sparse ones plan from K)."""
    if indices is not None or seq_lens.numel() == 0:
        return None
    return int(seq_lens.max())


def _doubled_past_four_splits(config: Any, shape: Any, seq_lens: Any, indices: Any) -> Any:
    """``config`` with its split doubled when some request of the launch needs more than
    :data:`LAUNCH_SPLITS` splits of it (a "long batch" bucket keyed on the launch)."""
    longest = _longest_dense(seq_lens, indices)
    if (
        longest is not None
        and attention_launcher.max_splits(shape, config.split_tokens, longest) > LAUNCH_SPLITS
    ):
        return replace(config, split_tokens=2 * config.split_tokens)
    return config


def _at_most_four_splits(config: Any, shape: Any, seq_lens: Any, indices: Any) -> Any:
    """``config`` with its split grown (whole chunks) until the launch's longest request has at
    most :data:`LAUNCH_SPLITS` splits (a split dimension of the grid capped, as a fixed-size
    workspace would): the split size comes from the other requests' lengths."""
    longest = _longest_dense(seq_lens, indices)
    if longest is None:
        return config
    per_split = -(-longest // LAUNCH_SPLITS)  # ceil
    wanted = -(-per_split // config.block_n) * config.block_n  # whole chunks
    return replace(config, split_tokens=max(config.split_tokens, wanted))


_ATTENTION_CONFIG = "config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)"


def _launch_planned(plan: Callable[..., Any]) -> Callable[..., Any]:
    return mutate(  # type: ignore[no-any-return]
        attention_launcher,
        "decode_attention",
        _ATTENTION_CONFIG,
        "config = launch_plan(decode_attention_config(arch(q.device), shape.head_dim, q.dtype), "
        "shape, seq_lens, indices)",
        extra_globals={"launch_plan": plan},
    )


def decode_attention_split_doubled_past_four_splits() -> Callable[..., Any]:
    """The split size doubles when any request of the launch needs more than 4 splits."""
    return _launch_planned(_doubled_past_four_splits)


def decode_attention_splits_capped_at_four_per_launch() -> Callable[..., Any]:
    """The split size grows so the launch's longest request has at most 4 splits."""
    return _launch_planned(_at_most_four_splits)
