"""Reference of ``prefill_chunk_plan``: chunked prefill, one request per chunk (plain Python).

Dimension legend:
    R: requests; W: ``max_chunks``, the geometry's fixed width (so dim 0 is the request axis
    and a request's outputs have one shape alone and in any co-batch); G = 4 geometry fields
    (:data:`GEOMETRY_FIELDS`).

Chunked prefill runs a prompt in chunks of at most ``token_budget`` tokens.  A prefill
attention kernel that takes no schedule metadata plans its internal splits from the call
geometry (the chunk's query rows, where the request's rows start inside it), so a request's
bits are a function of that geometry.  The pinned plan gives every chunk to one request:
request ``r`` of ``L`` tokens gets ``ceil(L / B)`` chunks, chunk ``k`` holding its tokens
``[k B, min(L, (k + 1) B))`` at row 0 of a chunk of exactly those rows -- its solo plan, the
same whatever else is scheduled.  Greedy packing (the production default, the baseline) fills
each chunk up to the budget with the next request's tokens, so a request's chunk boundaries
and chunk sizes shift with its neighbours (seed write-up 003: found by an e2e sweep with prefix
caching off, localized to layer-0 attention).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import MAX_WIDTH, ArgumentError, check_int, check_tensor

#: The last dim of ``chunks``: per chunk, the offset of its first token inside the request,
#: its number of the request's tokens, the rows of the whole chunk (the kernel's M), and the
#: row inside the chunk where the request's tokens start.  Columns past a request's
#: ``num_chunks`` are :data:`PAD`.
GEOMETRY_FIELDS: tuple[str, ...] = ("offset", "length", "chunk_rows", "row_start")
#: The value of every geometry field past a request's last chunk.
PAD = -1


def check_prefill_chunk_plan_arguments(
    prompt_lens: Any, token_budget: Any, max_chunks: Any, *, slack: int = 0
) -> list[int]:
    """Validate the arguments; returns the prompt lengths as Python ints.

    ``slack`` is how many chunks more than its solo plan a planner may give a request (0 for
    the pinned plan; greedy packing can cut a request once more than its solo plan).

    Raises:
        DTypeError: ``prompt_lens`` not an int32/int64 tensor; ``token_budget`` or
            ``max_chunks`` not a host integer (:func:`~batchinv.reference.errors.check_int`).
        ArgumentError: ``prompt_lens`` not 1-D or with a negative length; ``token_budget`` or
            ``max_chunks`` below 1, ``token_budget`` above
            :data:`~batchinv.reference.errors.MAX_SIZE` or ``max_chunks`` above
            :data:`~batchinv.reference.errors.MAX_WIDTH` (the int64 arithmetic must hold); a request that needs more than ``max_chunks`` chunks (the
            plan raises rather than truncate a prompt).
    """
    check_tensor("prompt_lens", prompt_lens, dtypes=(torch.int32, torch.int64), ndim=1)
    budget = check_int("token_budget", token_budget, 1)
    width = check_int("max_chunks", max_chunks, 1, MAX_WIDTH)
    lengths = [int(n) for n in prompt_lens.tolist()]
    for r, n in enumerate(lengths):
        if n < 0:
            raise ArgumentError("prompt_lens", "lengths >= 0", f"{n} at request {r}")
        need = -(-n // budget) + (slack if n else 0)
        if need > width:
            raise ArgumentError(
                "prompt_lens",
                f"at most max_chunks = {width} chunks of token_budget = {budget} per request "
                "(a plan never truncates a prompt)",
                f"{n} tokens at request {r}, which need {need} chunks",
            )
    return lengths


def solo_chunks(length: int, token_budget: int) -> list[tuple[int, int, int, int]]:
    """The solo plan of one request of ``length`` tokens: ``(offset, length, chunk_rows,
    row_start)`` per chunk, in order (none for an empty prompt)."""
    out = []
    offset = 0
    while offset < length:
        n = min(token_budget, length - offset)
        out.append((offset, n, n, 0))
        offset += n
    return out


def prefill_chunk_plan(
    prompt_lens: torch.Tensor, token_budget: int, max_chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's chunk geometry under the one-request-per-chunk plan.

    Parameters
    ----------
    prompt_lens : Tensor, (R,), int32 or int64: each request's prompt tokens to prefill (0: none)
    token_budget : int >= 1: the most tokens a chunk holds
    max_chunks : int >= 1: the width W of the output (a request needing more raises)

    Returns
    -------
    (num_chunks, chunks): ``num_chunks`` (R,) int64; ``chunks`` (R, W, 4) int64, per chunk
    ``(offset, length, chunk_rows, row_start)`` (:data:`GEOMETRY_FIELDS`), :data:`PAD` past
    ``num_chunks``; on ``prompt_lens``' device.  Bitwise invariant along every batch axis: a
    request's outputs are its solo plan, whatever the other requests are and wherever it sits.

    Raises
    ------
    DTypeError, ArgumentError
        As :func:`check_prefill_chunk_plan_arguments`.
    """
    lengths = check_prefill_chunk_plan_arguments(prompt_lens, token_budget, max_chunks)
    token_budget, max_chunks = int(token_budget), int(max_chunks)
    counts = []
    rows = []
    for n in lengths:
        chunks = solo_chunks(n, token_budget)
        counts.append(len(chunks))
        rows.append([list(c) for c in chunks] + [[PAD] * 4] * (max_chunks - len(chunks)))
    device = prompt_lens.device
    num_chunks = torch.tensor(counts, dtype=torch.int64, device=device)
    geometry = torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(lengths), max_chunks, 4)
    return num_chunks, geometry
