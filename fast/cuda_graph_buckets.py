"""Batch-invariant ``cuda_graph_buckets``: validate-then-align capture buckets, vectorized.

The bucket table of a configuration is built once (cached on the configuration) as an int64
tensor ``[B, 3]`` of ``(tokens, prefill slots, decode slots)`` rows in ascending order: the
requested sizes are validated on their own, unpadded dims and only then have their token
counts rounded up to a multiple of :data:`~batchinv.reference.cuda_graph_buckets.TOKEN_ALIGN`
(the alignment is padding, never a reason to drop a size).  A step pads to the first row that
holds it (one vectorized mask over the table); none: eager.

Source: seed write-up 001 (Megatron-LM's 64-multiple CUDA-graph token floor under batch
invariance, and the ``max_requests = 100`` review finding that align-then-validate dropped the
largest decode bucket).
"""

from __future__ import annotations

import functools

import torch

from batchinv.reference.cuda_graph_buckets import (
    TOKEN_ALIGN,
    BatchDims,
    GraphConfig,
    check_config,
    check_step,
    ladder,
)


def requested_sizes(cfg: GraphConfig) -> torch.Tensor:
    """The sizing distribution's sizes, unpadded, as ``[n, 3]`` int64 rows (CPU)."""
    d = torch.tensor(ladder(cfg.max_requests), dtype=torch.int64)
    parts = [torch.stack([d * cfg.decode_tokens, torch.zeros_like(d), d], dim=1)]
    if cfg.mix == "mixed":
        t = torch.tensor(ladder(cfg.max_tokens), dtype=torch.int64)
        parts.append(torch.stack([t, torch.clamp(t, max=cfg.max_requests), torch.zeros_like(t)], dim=1))
    return torch.cat(parts)


def valid(sizes: torch.Tensor, cfg: GraphConfig) -> torch.Tensor:
    """Row mask: which ``(tokens, prefill, decode)`` rows are steps the server can form."""
    tokens, prefill, decode = sizes.unbind(1)
    return (
        (tokens > 0)
        & (prefill >= 0)
        & (decode >= 0)
        & (prefill + decode <= cfg.max_requests)
        & (tokens >= prefill + decode * cfg.decode_tokens)
        & (tokens <= prefill * cfg.max_seq_len + decode * cfg.decode_tokens)
    )


def align(sizes: torch.Tensor) -> torch.Tensor:
    """Token counts rounded up to a multiple of ``TOKEN_ALIGN`` (at least one), slots kept."""
    tokens = torch.clamp((sizes[:, 0] + TOKEN_ALIGN - 1) // TOKEN_ALIGN, min=1) * TOKEN_ALIGN
    return torch.cat([tokens[:, None], sizes[:, 1:]], dim=1)


def table(sizes: torch.Tensor) -> torch.Tensor:
    """Rows deduplicated and sorted ascending (lexicographically: tokens, prefill, decode)."""
    if sizes.shape[0] == 0:
        return sizes
    return torch.unique(sizes, dim=0)


@functools.lru_cache(maxsize=64)
def _buckets(cfg: GraphConfig) -> torch.Tensor:
    sizes = requested_sizes(cfg)
    return table(align(sizes[valid(sizes, cfg)]))


def capture_buckets(
    max_requests: int, max_tokens: int, max_seq_len: int, num_speculative_tokens: int = 0, mix: str = "mixed"
) -> torch.Tensor:
    """The capture buckets of a configuration: ``[B, 3]`` int64 (CPU) rows ``(tokens, prefill
    slots, decode slots)``, ascending, every token count a multiple of 64; every requested
    size is kept (validate-then-align).  Equal to
    :func:`batchinv.reference.cuda_graph_buckets.capture_buckets` row for row.

    Raises:
        DTypeError, ArgumentError: as :func:`batchinv.reference.cuda_graph_buckets.check_config`.
    """
    return _buckets(check_config(max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix)).clone()


def holding(buckets: torch.Tensor, step: BatchDims) -> torch.Tensor:
    """Row mask: which buckets hold ``step`` (a decode-only step needs a decode-only bucket)."""
    tokens, prefill, decode = buckets.unbind(1)
    enough = tokens >= step.tokens
    if step.prefill == 0:
        return enough & (prefill == 0) & (decode >= step.decode)
    return enough & (prefill >= step.prefill) & (prefill + decode >= step.prefill + step.decode)


def step_bucket(buckets: torch.Tensor, step: BatchDims) -> int:
    """The row of the smallest bucket holding ``step`` (the table is ascending, so the first
    holding row), or -1: no bucket holds it, the step runs eager."""
    mask = holding(buckets, step)
    return int(torch.nonzero(mask)[0, 0]) if bool(mask.any()) else -1


def launch_rows(buckets: torch.Tensor, step: BatchDims, device: torch.device) -> torch.Tensor:
    """The ``(graphed, token_class)`` row of every request of ``step``: the first (smallest)
    holding bucket's token count mod 64, or eager and the unpadded count mod 64."""
    first = step_bucket(buckets, step)
    if first >= 0:
        row = torch.stack([torch.ones((), dtype=torch.int64), buckets[first, 0] % TOKEN_ALIGN])
    else:
        row = torch.tensor([0, step.tokens % TOKEN_ALIGN], dtype=torch.int64)
    return row.to(device).expand(step.prefill + step.decode, 2).contiguous()


def cuda_graph_buckets(
    kinds: torch.Tensor,
    num_tokens: torch.Tensor,
    *,
    max_requests: int,
    max_tokens: int,
    max_seq_len: int,
    num_speculative_tokens: int = 0,
    mix: str = "mixed",
) -> torch.Tensor:
    """How each request of one step is launched: ``(graphed, token_class)`` per request.

    Parameters
    ----------
    kinds : Tensor, (R,), int32/int64, any stride: 0 decode, 1 prefill
    num_tokens : Tensor, (R,), int32/int64, any stride: the request's tokens in this step
    max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix : the configuration

    Returns
    -------
    launch : Tensor, (R, 2), int64 on ``kinds``' device: 1 and the bucket's token count mod 64
    (always 0) for a step some bucket holds; 0 and the step's token count mod 64 for an eager
    step.  Every step the configuration admits is held (validate-then-align keeps every
    requested size), so each request gets ``(1, 0)``: bitwise invariant along every batch axis.

    Raises
    ------
    DTypeError, ArgumentError
        As :func:`batchinv.reference.cuda_graph_buckets.check_config` and ``check_step``.
    """
    cfg = check_config(max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix)
    step = check_step(kinds, num_tokens, cfg)
    return launch_rows(_buckets(cfg), step, kinds.device)
