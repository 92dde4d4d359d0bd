"""Mutants of ``prefill_attention`` (the decode kernel on packed ragged rows and its launcher).

Each subject is request-major, as the registry entry's ``fast``
(:func:`batchinv.harness.components.prefill_attention.request_major` around the packed launcher),
and runs the shipped launcher with one line of the kernel or launcher replaced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import batchinv.fast.kernels.decode_attention as attention_kernels
from batchinv.fast import prefill_attention as launcher
from batchinv.fast.baselines.prefill_attention import _shifted_indices
from batchinv.fast.decode_attention import decode_attention_config
from batchinv.fast.device import arch
from batchinv.harness.components.prefill_attention import request_major

from .kernels import with_kernel
from .patch import mutate


def prefill_attention_splits_from_the_chunk_start() -> Callable[..., Any]:
    """The launcher plans each greedy packed chunk (8 rows) on its own: a row's split
    boundaries counted from its chunk's first query position instead of the request's first key
    (the shipped kernel's index-slot walk over the row's keys after that many -1 slots)."""

    def subject(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
        *,
        scale: float | None = None,
        indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape, cu, s = launcher.prepare(
            q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, indices
        )
        config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
        lens = [int(v) for v in seq_lens.tolist()]
        shifted = _shifted_indices(cu, lens, indices, config.split_tokens, q.device)
        shape = dataclasses.replace(shape, index_slots=int(shifted.shape[1]))
        return launcher.launch(
            q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, shifted, shape, cu, config
        )

    return request_major(subject)


def prefill_attention_causal_off_by_one() -> Callable[..., Any]:
    """The launcher's row plan gives rows of q_len > 1 requests one key too few (p: a row does not
    see its own key; never one too many, which would read the table's padding)."""
    row_plan = mutate(
        launcher,
        "row_plan",
        "keys = lens - q_lens[row_request] + (t - cu[:-1][row_request]) + 1  # [T]",
        "keys = lens - q_lens[row_request] + (t - cu[:-1][row_request]) + 1 - (q_lens[row_request] > 1).to(torch.int64)",
    )
    return request_major(with_kernel(launcher, "row_plan", row_plan, launcher.prefill_attention))


def prefill_attention_lse_in_base_2() -> Callable[..., Any]:
    """The merge kernel writes lse as a base-2 logarithm (o unchanged)."""
    kernel = mutate(
        attention_kernels,
        "decode_attention_merge_kernel",
        "lse = tl.where(empty, NEG_INF, m + tl.log(l_sum))",
        "lse = tl.where(empty, NEG_INF, (m + tl.log(l_sum)) * 1.4426950408889634)",
    )
    return request_major(
        with_kernel(attention_kernels, "decode_attention_merge_kernel", kernel, launcher.prefill_attention)
    )


def prefill_attention_empty_split_merged() -> Callable[..., Any]:
    """The merge kernel takes every split as live: a split with no attended key (0, -inf) is
    merged like one with keys (SGLang #22291's empty prefix chunk)."""
    kernel = mutate(
        attention_kernels,
        "decode_attention_merge_kernel",
        "live = lse_s != NEG_INF  # an empty split changes nothing, not even a zero's sign; NaN is live",
        "live = lse_s == lse_s",
    )
    return request_major(
        with_kernel(attention_kernels, "decode_attention_merge_kernel", kernel, launcher.prefill_attention)
    )


def prefill_attention_split_from_max_seqlen_q() -> Callable[..., Any]:
    """The launcher's split size planned from the launch's max_seqlen_q x GQA group (the
    FlashAttention-3 planner's thresholds, vLLM #51902) instead of the table's fixed split."""
    from batchinv.fast.baselines.prefill_attention import max_seqlen_planned_splits

    return request_major(max_seqlen_planned_splits)


def prefill_attention_prefill_config_for_q_len_above_1() -> Callable[..., Any]:
    """Requests of q_len > 1 launched through a separately tuned prefill config (twice the
    split), q_len 1 through the decode table's: batch-invariant, phase-variant."""
    from batchinv.fast.baselines.prefill_attention import phase_paired

    return request_major(phase_paired)
