"""Batches of requests: ragged lengths and paged data, generic (no attention math).

* Hypothesis strategies for ragged batches, exported for users' own tests: :func:`seq_lens`
  (one length: 1, split-size multiples +-1, page boundaries +-1, the longest context, or any in
  between) and :func:`ragged_seq_lens` (a batch of them: short, long, equal, one huge).
* Paged data (a KV cache ``[pages, page_size, ...]`` addressed through a ``block_table
  [R, max_pages]`` and ``seq_lens [R]``): :func:`nan_filled_pages`, and :func:`paged_model`, a
  :class:`~batchinv.harness.registry.RequestModel` whose ``take`` keeps the pools whole,
  ``concat`` concatenates them and offsets the block tables, and ``relocate`` moves every
  request's tokens to other pages in a random order with other table padding, NaN everywhere no
  request points.

A request's data lives in its rows (dim 0 of ``Batch.rows``) and in the pools named in ``shared``;
the pages a request references are the first ``ceil(seq_len / page_size)`` entries of its block
table row, and of its last page only the first ``seq_len % page_size`` tokens (all when 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchinv.harness.registry import Batch, RequestModel

# --- hypothesis strategies ------------------------------------------------------------------


def special_lengths(max_len: int, page_size: int, split: int | None = None, min_len: int = 1) -> list[int]:
    """The lengths a ragged-batch generator must hit, inside ``[min_len, max_len]``: 0 and 1,
    every page boundary +-1 and every multiple of ``split`` +-1 (the first 8 and the last 2
    multiples of each), and ``max_len``, the longest context."""
    values = {0, 1, 2, max_len, max_len - 1}
    for step in (page_size, split):
        if not step:
            continue
        count = max_len // step
        for k in [*range(1, min(count, 8) + 1), *range(max(1, count - 1), count + 1)]:
            values |= {k * step - 1, k * step, k * step + 1}
    return sorted(v for v in values if min_len <= v <= max_len)


def seq_lens(max_len: int, page_size: int, split: int | None = None, min_len: int = 1) -> Any:
    """A hypothesis strategy of one request length in ``[min_len, max_len]``: half the draws are
    :func:`special_lengths` (1, page boundaries +-1, split multiples +-1, the longest context),
    the others any length."""
    from hypothesis import strategies as st

    if not 0 <= min_len <= max_len:
        raise ValueError(f"seq_lens: need 0 <= min_len <= max_len, got {min_len}, {max_len}")
    specials = special_lengths(max_len, page_size, split, min_len)
    return st.one_of(st.sampled_from(specials), st.integers(min_len, max_len))


def ragged_seq_lens(
    max_requests: int,
    max_len: int,
    page_size: int,
    split: int | None = None,
    *,
    min_requests: int = 1,
    min_len: int = 1,
) -> Any:
    """A hypothesis strategy of a batch's lengths (a list of ``min_requests..max_requests``
    ints): independent :func:`seq_lens` draws, all-equal batches, and short batches with one
    request of the longest context."""
    from hypothesis import strategies as st

    one = seq_lens(max_len, page_size, split, min_len)
    sizes = st.integers(min_requests, max_requests)
    mixed = st.lists(one, min_size=min_requests, max_size=max_requests)
    equal = st.tuples(one, sizes).map(lambda ls: [ls[0]] * ls[1])

    def one_huge(draw_lens: tuple[list[int], int]) -> list[int]:
        lens, at = draw_lens
        out = list(lens)
        if out:
            out[at % len(out)] = max_len
        return out

    short = st.lists(
        st.integers(min_len, min(max_len, max(min_len, page_size))),
        min_size=min_requests,
        max_size=max_requests,
    )
    huge = st.tuples(short, st.integers(0, max(0, max_requests - 1))).map(one_huge)
    return st.one_of(mixed, equal, huge)


# --- paged data -------------------------------------------------------------------------------


def nan_filled_pages(
    num_pages: int,
    page_size: int,
    *feature_shape: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A page pool ``[num_pages, page_size, *feature_shape]`` of quiet NaN: write the tokens the
    requests reference into it, and an out-of-bounds read shows as NaN."""
    return torch.full((num_pages, page_size, *feature_shape), float("nan"), dtype=dtype, device=device)


def pages_needed(lengths: Sequence[int], page_size: int) -> list[int]:
    """``ceil(length / page_size)`` per request."""
    return [-(-int(n) // page_size) for n in lengths]


def paged_model(
    pools: Sequence[str], *, block_table: str = "block_table", seq_lens: str = "seq_lens"
) -> RequestModel:
    """The :class:`RequestModel` of a paged batch: ``rows`` hold ``block_table [R, max_pages]``
    (int), ``seq_lens [R]`` and any other per-request tensors; ``shared`` holds the page pools
    named in ``pools`` (each ``[pages, page_size, ...]``, one page numbering for all of them, e.g.
    ``("k_cache", "v_cache")``) and any other operands, passed through.  Negative table entries
    are kept as they are (a sentinel); the others are page ids."""
    names = tuple(pools)

    def take(batch: Batch, requests: Sequence[int]) -> Batch:
        return batch.take(list(requests))

    def concat(parts: Sequence[Batch]) -> Batch:
        return paged_concat(parts, names, block_table=block_table)

    def relocate(batch: Batch, generator: torch.Generator) -> Batch:
        return paged_relocate(batch, generator, names, block_table=block_table, seq_lens=seq_lens)

    return RequestModel(take=take, concat=concat, relocate=relocate)


def paged_concat(parts: Sequence[Batch], pools: Sequence[str], *, block_table: str = "block_table") -> Batch:
    """The requests of every part in one launch: pools concatenated (plus one NaN page), each
    part's page ids offset by the pages before it, tables padded to the widest with the NaN page."""
    if not parts:
        raise ValueError("paged_concat: no parts")
    first = parts[0]
    offsets, total = [], 0
    for p in parts:
        offsets.append(total)
        total += int(p.shared[pools[0]].shape[0])
    width = max(int(p.rows[block_table].shape[1]) for p in parts)
    tables = []
    for p, off in zip(parts, offsets, strict=True):
        bt = p.rows[block_table]
        shifted = torch.where(bt >= 0, bt + off, bt)
        pad = torch.full((bt.shape[0], width - bt.shape[1]), total, dtype=bt.dtype, device=bt.device)
        tables.append(torch.cat([shifted, pad], dim=1))
    rows = {
        k: torch.cat(tables) if k == block_table else torch.cat([p.rows[k] for p in parts])
        for k in first.rows
    }
    shared = dict(first.shared)
    for name in pools:
        pool = first.shared[name]
        nan_page = torch.full_like(pool[:1], float("nan"))
        shared[name] = torch.cat([*(p.shared[name] for p in parts), nan_page])
    return Batch(rows, shared)


def paged_relocate(
    batch: Batch,
    generator: torch.Generator,
    pools: Sequence[str],
    *,
    block_table: str = "block_table",
    seq_lens: str = "seq_lens",
) -> Batch:
    """The same logical requests with their tokens in other pages: every referenced page moves
    to a random page of a new pool (1-3 spare pages more, pages in random order), the table gets
    0-2 more columns, padding entries point at random pages (other requests' or spare ones), and
    every token no request references (spare pages, the tail of each last page) is NaN."""
    bt = batch.rows[block_table]
    lengths = [int(n) for n in batch.rows[seq_lens].tolist()]
    first_pool = batch.shared[pools[0]]
    page_size = int(first_pool.shape[1])
    need = pages_needed(lengths, page_size)
    used = sum(need)
    total = used + 1 + int(torch.randint(3, (1,), generator=generator))
    order = torch.randperm(total, generator=generator).tolist()
    width = max(int(bt.shape[1]), max(need, default=0)) + int(torch.randint(3, (1,), generator=generator))
    new_bt = torch.randint(total, (bt.shape[0], width), generator=generator, dtype=torch.int64)
    src_pages, dst_pages, counts = [], [], []
    cursor = 0
    for r, (n, length) in enumerate(zip(need, lengths, strict=True)):
        for j in range(n):
            dst = order[cursor]
            cursor += 1
            new_bt[r, j] = dst
            src_pages.append(int(bt[r, j]))
            dst_pages.append(dst)
            counts.append(min(page_size, length - j * page_size))
    shared = dict(batch.shared)
    for name in pools:
        old = batch.shared[name]
        new = torch.full((total, *old.shape[1:]), float("nan"), dtype=old.dtype, device=old.device)
        for src, dst, c in zip(src_pages, dst_pages, counts, strict=True):
            new[dst, :c] = old[src, :c]
        shared[name] = new
    rows = dict(batch.rows)
    rows[block_table] = new_bt.to(dtype=bt.dtype, device=bt.device)
    return Batch(rows, shared)


def check_unreferenced_is_nan(
    batch: Batch, pools: Sequence[str], *, block_table: str = "block_table", seq_lens: str = "seq_lens"
) -> None:
    """Raise ``AssertionError`` if a pool holds a non-NaN element no request references (a case
    builder's self-check: docs/DESIGN.md, "Units: rows and requests", asks unreferenced memory
    to be NaN in every case)."""
    bt = batch.rows[block_table]
    lengths = [int(n) for n in batch.rows[seq_lens].tolist()]
    for name in pools:
        pool: torch.Tensor = batch.shared[name]
        page_size = int(pool.shape[1])
        referenced = torch.zeros(pool.shape[:2], dtype=torch.bool, device=pool.device)
        for r, length in enumerate(lengths):
            for j in range(pages_needed([length], page_size)[0]):
                referenced[int(bt[r, j]), : min(page_size, length - j * page_size)] = True
        flat = pool.reshape(pool.shape[0], page_size, -1)
        stray = (~referenced[..., None] & ~torch.isnan(flat.float())).any(dim=-1)
        if bool(stray.any()):
            page, token = (int(v) for v in stray.nonzero()[0])
            raise AssertionError(f"{name}: page {page} token {token} is not referenced and not NaN")


__all__ = [
    "check_unreferenced_is_nan",
    "nan_filled_pages",
    "paged_concat",
    "paged_model",
    "paged_relocate",
    "pages_needed",
    "ragged_seq_lens",
    "seq_lens",
    "special_lengths",
]
