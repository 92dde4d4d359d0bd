"""Unpinned ``prefill_chunk_plan``: the negative control of the ``prefill_chunk_plan`` component.

* ``greedy_packing``: the production default of chunked prefill.  Requests are taken in batch
  order and each chunk is filled up to the token budget: a request's tokens start wherever the
  previous request's left off, so its chunk boundaries, its chunk sizes and the rows of the
  chunks it shares (the call geometry a prefill kernel plans its splits from) depend on the
  requests before it.  Seed write-up 003: identical requests gave different bits depending on
  the co-scheduled prefills.  Deterministic, so it varies on every lane (the co_batch and slot
  checks see it on the cpu lane).
"""

from __future__ import annotations

import torch

from batchinv.reference.prefill_chunk_plan import PAD, check_prefill_chunk_plan_arguments

#: Greedy packing can cut a request into one piece more than its solo plan (its first piece
#: fills the end of a chunk another request started).
GREEDY_SLACK = 1


def greedy_packing(
    prompt_lens: torch.Tensor, token_budget: int, max_chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks packed greedily across requests (same signature and outputs as the fast path:
    per request its pieces' ``(offset, length, chunk_rows, row_start)``, -1 past its last).

    Raises:
        DTypeError, ArgumentError: as the pinned plan, with one chunk of slack per request.
    """
    lengths = check_prefill_chunk_plan_arguments(prompt_lens, token_budget, max_chunks, slack=GREEDY_SLACK)
    pieces: list[list[list[int]]] = [[] for _ in lengths]
    chunk_fill = 0
    open_chunk: list[list[int]] = []  # the pieces of the chunk being filled

    def close() -> None:
        nonlocal chunk_fill, open_chunk
        for piece in open_chunk:
            piece[2] = chunk_fill
        chunk_fill, open_chunk = 0, []

    for r, n in enumerate(lengths):
        offset = 0
        while offset < n:
            take = min(token_budget - chunk_fill, n - offset)
            piece = [offset, take, -1, chunk_fill]
            pieces[r].append(piece)
            open_chunk.append(piece)
            chunk_fill += take
            offset += take
            if chunk_fill == token_budget:
                close()
    close()
    device = prompt_lens.device
    num_chunks = torch.tensor([len(p) for p in pieces], dtype=torch.int64, device=device)
    rows = [p + [[PAD] * 4] * (max_chunks - len(p)) for p in pieces]
    geometry = torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(lengths), max_chunks, 4)
    return num_chunks, geometry
