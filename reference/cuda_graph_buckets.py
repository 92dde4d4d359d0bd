"""Reference of ``cuda_graph_buckets``: the CUDA-graph capture buckets and the bucket of a step
(plain Python).

Dimension legend:
    R: requests of one step (a batch the server runs in one forward); a step's dims are
    ``(tokens, prefill requests, decode requests)``; a bucket's are ``(tokens, prefill slots,
    decode slots)``.

A server captures one CUDA graph per bucket and pads each step to the smallest bucket holding
it; a step no bucket holds runs eager (another code path, unpadded).  Under batch invariance
every bucket's token count is a multiple of :data:`TOKEN_ALIGN` (64), so that a kernel whose
reduction depends on ``M % 32`` (a norm's bit class, seed write-up 001) sees one class in every
step, graphed or not.  The alignment is *padding*: the pinned builder validates each requested
size on its own, unpadded dims, and then rounds its token count up (validate-then-align).  The
production path it replaced rounded first and validated the padded dims (align-then-validate):
a decode-only size whose token count was not already a multiple of 64 then claimed more tokens
than its requests have, failed validation and was dropped without a word -- with
``max_requests = 100`` the largest decode bucket (100 requests) vanished and every decode step
of 65 to 100 requests ran eager, off the graphed path.

The sizing (after Megatron-LM's ``CUDAGraphBatchDimensionBuilder``, simplified): decode-only
sizes of ``d`` requests for ``d`` in 1, 2, 4, ... below ``max_requests`` and ``max_requests``
itself (``d (s + 1)`` tokens, ``s`` speculative tokens per decode request); with ``mix =
"mixed"`` also mixed sizes of ``t`` tokens for ``t`` in 1, 2, 4, ... below ``max_tokens`` and
``max_tokens``, with ``min(max_requests, t)`` prefill slots (a prefill slot may hold a decode
request).  A decode-only step takes a decode-only bucket; a step with a prefill a mixed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_int, check_tensor

#: Every bucket's token count is a multiple of this (the smallest bucket has this many tokens).
TOKEN_ALIGN = 64
#: ``kinds`` values.
DECODE, PREFILL = 0, 1
MIXES: tuple[str, ...] = ("decode", "mixed")
#: The last dim of the output: whether the step replays a captured graph (1) or runs eager
#: (0), and the step's launch token count (padded to its bucket, or unpadded when eager)
#: modulo :data:`TOKEN_ALIGN`.
LAUNCH_FIELDS: tuple[str, ...] = ("graphed", "token_class")


@dataclass(frozen=True, order=True)
class BatchDims:
    """A step's or a bucket's dims, ordered by tokens, then prefill, then decode count."""

    tokens: int
    prefill: int
    decode: int


@dataclass(frozen=True)
class GraphConfig:
    """The server configuration the buckets are built for (validated by :func:`check_config`)."""

    max_requests: int
    max_tokens: int
    max_seq_len: int
    num_speculative_tokens: int = 0
    mix: str = "mixed"

    @property
    def decode_tokens(self) -> int:
        """Tokens of one decode request: its token plus the speculative ones."""
        return self.num_speculative_tokens + 1


def check_config(
    max_requests: Any, max_tokens: Any, max_seq_len: Any, num_speculative_tokens: Any = 0, mix: Any = "mixed"
) -> GraphConfig:
    """Validate a configuration.

    Raises:
        DTypeError: a size not an int.
        ArgumentError: a size below its minimum (1; 0 speculative tokens); ``mix`` not one of
            :data:`MIXES`; ``max_tokens`` below ``max_requests * (s + 1)`` (a full decode step
            would not fit) or, with ``mix = "mixed"``, above ``max_requests * max_seq_len`` (no
            step can hold that many tokens: the largest mixed size would be invalid).
    """
    cfg = GraphConfig(
        check_int("max_requests", max_requests, 1),
        check_int("max_tokens", max_tokens, 1),
        check_int("max_seq_len", max_seq_len, 1),
        check_int("num_speculative_tokens", num_speculative_tokens, 0),
        mix,
    )
    if mix not in MIXES:
        raise ArgumentError("mix", f"one of {MIXES}", mix)
    if cfg.max_tokens < cfg.max_requests * cfg.decode_tokens:
        raise ArgumentError(
            "max_tokens",
            f">= max_requests * (num_speculative_tokens + 1) = {cfg.max_requests * cfg.decode_tokens}",
            cfg.max_tokens,
        )
    if mix == "mixed" and cfg.max_tokens > cfg.max_requests * cfg.max_seq_len:
        raise ArgumentError(
            "max_tokens",
            f"<= max_requests * max_seq_len = {cfg.max_requests * cfg.max_seq_len} with mix='mixed'",
            cfg.max_tokens,
        )
    return cfg


def ladder(top: int) -> list[int]:
    """1, 2, 4, ... below ``top``, and ``top``."""
    out, v = [], 1
    while v < top:
        out.append(v)
        v *= 2
    return [*out, top]


def requested_sizes(cfg: GraphConfig) -> list[BatchDims]:
    """The sizes the sizing distribution asks for, unpadded (each valid by construction)."""
    out = [BatchDims(d * cfg.decode_tokens, 0, d) for d in ladder(cfg.max_requests)]
    if cfg.mix == "mixed":
        out += [BatchDims(t, min(cfg.max_requests, t), 0) for t in ladder(cfg.max_tokens)]
    return out


def is_valid(dims: BatchDims, cfg: GraphConfig) -> bool:
    """Whether ``dims`` is a step the server can form: some tokens, at most ``max_requests``
    requests, at least one token per prefill and ``s + 1`` per decode request, and no more
    than ``max_seq_len`` per prefill and ``s + 1`` per decode request."""
    if dims.tokens <= 0 or dims.prefill < 0 or dims.decode < 0:
        return False
    if dims.prefill + dims.decode > cfg.max_requests:
        return False
    if dims.tokens < dims.prefill + dims.decode * cfg.decode_tokens:
        return False
    return dims.tokens <= dims.prefill * cfg.max_seq_len + dims.decode * cfg.decode_tokens


def align_tokens(tokens: int) -> int:
    """``tokens`` rounded up to a multiple of :data:`TOKEN_ALIGN`, at least one multiple."""
    return max(TOKEN_ALIGN, -(-tokens // TOKEN_ALIGN) * TOKEN_ALIGN)


def capture_buckets(cfg: GraphConfig) -> list[BatchDims]:
    """The buckets: each requested size validated on its own dims, then its token count
    aligned (validate-then-align); deduplicated, in ascending order."""
    kept = {
        BatchDims(align_tokens(d.tokens), d.prefill, d.decode)
        for d in requested_sizes(cfg)
        if is_valid(d, cfg)
    }
    return sorted(kept)


def holds(bucket: BatchDims, step: BatchDims) -> bool:
    """Whether a step can be padded to ``bucket``: enough tokens; a decode-only step needs a
    decode-only bucket with enough decode slots; a step with a prefill needs enough prefill
    slots and enough slots in all (a prefill slot may hold a decode request)."""
    if bucket.tokens < step.tokens:
        return False
    if step.prefill == 0:
        return bucket.prefill == 0 and bucket.decode >= step.decode
    return bucket.prefill >= step.prefill and bucket.prefill + bucket.decode >= step.prefill + step.decode


def match_bucket(buckets: list[BatchDims], step: BatchDims) -> BatchDims | None:
    """The smallest bucket holding ``step`` (in :class:`BatchDims` order), None: run eager."""
    holding = [b for b in buckets if holds(b, step)]
    return min(holding) if holding else None


def check_step(kinds: Any, num_tokens: Any, cfg: GraphConfig) -> BatchDims:
    """Validate one step's requests; returns its dims.

    Raises:
        DTypeError: ``kinds`` or ``num_tokens`` not an int32/int64 tensor.
        ArgumentError: not 1-D or of different lengths; a kind other than 0 (decode) or 1
            (prefill); a prefill with ``mix = "decode"`` (a decode instance never gets one); a
            decode request of other than ``s + 1`` tokens; a prefill of 0 or more than
            ``max_seq_len`` tokens; more than ``max_requests`` requests or ``max_tokens``
            tokens (the scheduler never forms such a step).
    """
    check_tensor("kinds", kinds, dtypes=(torch.int32, torch.int64), ndim=1)
    check_tensor("num_tokens", num_tokens, dtypes=(torch.int32, torch.int64), ndim=1)
    if kinds.shape != num_tokens.shape:
        raise ArgumentError("num_tokens", f"shape {tuple(kinds.shape)} (kinds')", tuple(num_tokens.shape))
    ks = [int(k) for k in kinds.tolist()]
    ns = [int(n) for n in num_tokens.tolist()]
    for r, (k, n) in enumerate(zip(ks, ns, strict=True)):
        if k not in (DECODE, PREFILL):
            raise ArgumentError("kinds", "0 (decode) or 1 (prefill)", f"{k} at request {r}")
        if k == PREFILL and cfg.mix == "decode":
            raise ArgumentError(
                "kinds", "decode requests only with mix='decode'", f"a prefill at request {r}"
            )
        if k == DECODE and n != cfg.decode_tokens:
            raise ArgumentError(
                "num_tokens",
                f"num_speculative_tokens + 1 = {cfg.decode_tokens} for a decode request",
                f"{n} at request {r}",
            )
        if k == PREFILL and not 1 <= n <= cfg.max_seq_len:
            raise ArgumentError(
                "num_tokens", f"1 to max_seq_len = {cfg.max_seq_len} for a prefill", f"{n} at request {r}"
            )
    if len(ks) > cfg.max_requests:
        raise ArgumentError("kinds", f"at most max_requests = {cfg.max_requests} requests in a step", len(ks))
    if sum(ns) > cfg.max_tokens:
        raise ArgumentError("num_tokens", f"at most max_tokens = {cfg.max_tokens} tokens in a step", sum(ns))
    prefill = sum(1 for k in ks if k == PREFILL)
    return BatchDims(sum(ns), prefill, len(ks) - prefill)


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
    """How each request of one step is launched: graphed or eager, and the launch's token class.

    Parameters
    ----------
    kinds : Tensor, (R,), int32/int64: 0 decode, 1 prefill, per request of the step
    num_tokens : Tensor, (R,), int32/int64: the request's tokens in this step (``s + 1`` for a
        decode request; 1 to ``max_seq_len`` for a prefill)
    max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix : the configuration
        (:func:`check_config`)

    Returns
    -------
    launch : Tensor, (R, 2), int64 on ``kinds``' device: per request ``(graphed,
    token_class)`` (:data:`LAUNCH_FIELDS`), the same for every request of the step.  Bitwise
    invariant along every batch axis: every step the configuration admits maps to a bucket
    (``graphed = 1``) whose token count is a multiple of 64 (``token_class = 0``), so a
    request's launch class does not depend on the other requests.

    Raises
    ------
    DTypeError, ArgumentError
        As :func:`check_config` and :func:`check_step`.
    """
    cfg = check_config(max_requests, max_tokens, max_seq_len, num_speculative_tokens, mix)
    step = check_step(kinds, num_tokens, cfg)
    bucket = match_bucket(capture_buckets(cfg), step)
    launch = [1, bucket.tokens % TOKEN_ALIGN] if bucket is not None else [0, step.tokens % TOKEN_ALIGN]
    return torch.tensor(
        [launch] * step.prefill + [launch] * step.decode, dtype=torch.int64, device=kinds.device
    ).reshape(-1, 2)
