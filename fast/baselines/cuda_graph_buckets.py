"""Unpinned ``cuda_graph_buckets``: the negative control of the ``cuda_graph_buckets`` component.

* ``align_then_validate``: the bucket builder seed write-up 001's first version shipped under
  batch invariance: each requested size's token count is rounded up to a multiple of 64 first
  and the padded dims are validated after.  A decode-only size whose token count is not already
  a multiple of 64 then claims more tokens than its requests have, fails validation and is
  dropped silently; with ``max_requests`` not a multiple of 64 the largest decode bucket is
  gone, and a decode step of more requests than the largest surviving bucket holds runs eager
  (unpadded, another code path).  Whether a request's step is graphed then depends on how many
  other requests share it: co_batch sees it on every lane.
"""

from __future__ import annotations

import functools

import torch

from batchinv.fast.cuda_graph_buckets import align, launch_rows, requested_sizes, table, valid
from batchinv.reference.cuda_graph_buckets import GraphConfig, check_config, check_step


@functools.lru_cache(maxsize=64)
def _buckets(cfg: GraphConfig) -> torch.Tensor:
    aligned = align(requested_sizes(cfg))
    return table(aligned[valid(aligned, cfg)])


def align_then_validate_buckets(
    max_requests: int, max_tokens: int, max_seq_len: int, num_speculative_tokens: int = 0, mix: str = "mixed"
) -> torch.Tensor:
    """The capture buckets built align-then-validate (``[B, 3]`` int64, as the fast path's)."""
    return _buckets(check_config(max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix)).clone()


def align_then_validate(
    kinds: torch.Tensor,
    num_tokens: torch.Tensor,
    *,
    max_requests: int,
    max_tokens: int,
    max_seq_len: int,
    num_speculative_tokens: int = 0,
    mix: str = "mixed",
) -> torch.Tensor:
    """``cuda_graph_buckets`` over align-then-validate buckets (same signature and outputs)."""
    cfg = check_config(max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix)
    step = check_step(kinds, num_tokens, cfg)
    return launch_rows(_buckets(cfg), step, kinds.device)
