"""Batches of requests: ragged lengths and paged data, generic (no attention math).

* Hypothesis strategies for ragged batches, exported for users' own tests: :func:`seq_lens`
  (one length: 1, split-size multiples +-1, page boundaries +-1, the longest context, or any in
  between) and :func:`ragged_seq_lens` (a batch of them: short, long, equal, one huge).
* Paged data (a KV cache ``[pages, page_size, ...]`` addressed through a ``block_table
  [R, max_pages]`` and ``seq_lens [R]``): :func:`nan_filled_pages`, :func:`pages_needed`,
  :func:`table_padding` (random page ids, or -1) and :func:`nan_tails` for case builders, and
  one request model, :class:`PagedLayout` (:func:`paged_model` makes its
  :class:`~batchinv.harness.registry.RequestModel`): ``take`` keeps the pools whole, ``concat``
  concatenates them and offsets the block tables (padding with -1 or with a NaN page; ragged
  rows such as sparse index lists padded with -1), and ``relocate`` moves every request's tokens
  to other pages in a random order with other table padding, NaN everywhere no request points.

A request's data lives in its rows (dim 0 of ``Batch.rows``) and in the pools named in ``shared``;
the pages a request references are the first ``ceil(seq_len / page_size)`` entries of its block
table row, and of its last page only the first ``seq_len % page_size`` tokens (all when 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from batchinv.harness.lanes import Lane
from batchinv.harness.neighbours import Transform, rewritable, rewrite_at, rewrite_rows
from batchinv.harness.registry import Batch, Case, RequestModel
from batchinv.reference.host_read import host_int64

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


def table_padding(
    shape: tuple[int, ...], num_pages: int, generator: torch.Generator, *, minus_one: bool = False
) -> torch.Tensor:
    """Block-table padding of ``shape`` (int64, CPU): random page ids in ``[0, num_pages)``
    (``[0, 1)`` when the pool is empty), and with ``minus_one`` each entry -1 half the time (the
    ids are drawn first, then the coin flips, from ``generator``).  Write a request's page ids
    over its first ``ceil(seq_len / page_size)`` entries."""
    ids = torch.randint(max(1, num_pages), shape, generator=generator)
    if not minus_one:
        return ids
    return torch.where(torch.rand(shape, generator=generator) < 0.5, ids, -1)


def nan_tails(pool: torch.Tensor, block_table: torch.Tensor, lengths: Sequence[int]) -> None:
    """NaN, in place, the tokens of each request's last page past its length (``pool [pages,
    page_size, ...]``, ``block_table [R, max_pages]`` with the request's page ids first)."""
    page_size = pool.shape[1]
    for r, length in enumerate(lengths):
        if length % page_size:
            pool[int(block_table[r, length // page_size]), length % page_size :] = math.nan


@dataclass(frozen=True)
class PagedLayout:
    """Where a paged batch keeps its requests, and how its requests are taken, joined and moved.

    ``rows`` (dim 0 = requests) hold ``block_table [R, max_pages]`` (int: a request's page ids
    first, then padding), ``seq_lens [R]`` and any other per-request tensors; ``shared`` holds
    the page pools named in ``pools`` (each ``[pages, page_size, ...]``, one page numbering for
    all of them, e.g. ``("k_cache", "v_cache")``) and other operands, which every part of a
    co-batch must share.  Negative table entries are kept as they are (a sentinel); the others
    are page ids.

    Attributes:
        pools: the names of the page pools in ``shared``; the first one's ``shape[0]`` is the
            page count.
        block_table, seq_lens: the names of the block table and the lengths in ``rows``.
        ragged: rows holding a list per request whose last dim is padded with -1 (e.g. sparse
            ``indices [R, Q, K]``): :meth:`concat` pads them with -1 to the widest part.
        minus_one_padding: the subject takes -1 as table padding: :meth:`concat` pads tables
            with -1 and :meth:`relocate` makes each padding entry -1 half the time.  False:
            padding is always a page id (:meth:`concat` adds one NaN page and pads with it).
        spare_pages: :meth:`relocate` gives the new pool ``1..spare_pages`` pages more than the
            requests reference.
        extra_columns: :meth:`relocate` widens the table by ``0..extra_columns`` columns (0:
            the same width, and nothing drawn for it).
    """

    pools: tuple[str, ...]
    block_table: str = "block_table"
    seq_lens: str = "seq_lens"
    ragged: tuple[str, ...] = ()
    minus_one_padding: bool = False
    spare_pages: int = 3
    extra_columns: int = 2

    def take(self, batch: Batch, requests: Sequence[int] | torch.Tensor) -> Batch:
        """The requests at ``requests`` (in that order, an index may repeat), over the same pools."""
        return take_requests(batch, requests)

    def concat(self, parts: Sequence[Batch]) -> Batch:
        """The requests of every part in order, in one launch: the pools concatenated, each
        part's page ids offset by the pages before it (negative entries stay), tables padded to
        the widest (with -1, or with one NaN page added after the pools), :attr:`ragged` rows
        padded with -1 to the widest, the other rows concatenated.

        Raises:
            ValueError: no parts, or parts whose other ``shared`` operands differ (e.g. another
                attention ``scale``).
        """
        if not parts:
            raise ValueError("paged concat: no parts")
        first = parts[0]
        for p in parts[1:]:
            for name, value in first.shared.items():
                if name not in self.pools and not _same(p.shared[name], value):
                    raise ValueError(f"paged concat: parts with different {name!r}")
        offsets, total = [], 0
        for p in parts:
            offsets.append(total)
            total += int(p.shared[self.pools[0]].shape[0])
        fill = -1 if self.minus_one_padding else total  # total: the NaN page after the pools
        width = max(int(p.rows[self.block_table].shape[1]) for p in parts)
        tables = []
        for p, off in zip(parts, offsets, strict=True):
            bt = p.rows[self.block_table]
            tables.append(_pad_last(torch.where(bt >= 0, bt + off, bt), width, fill))
        rows = {}
        for k in first.rows:
            if k == self.block_table:
                rows[k] = torch.cat(tables)
            elif k in self.ragged:
                widest = max(int(p.rows[k].shape[-1]) for p in parts)
                rows[k] = torch.cat([_pad_last(p.rows[k], widest, -1) for p in parts])
            else:
                rows[k] = torch.cat([p.rows[k] for p in parts])
        shared = dict(first.shared)
        for name in self.pools:
            pools = [p.shared[name] for p in parts]
            if not self.minus_one_padding:
                pools.append(torch.full_like(first.shared[name][:1], float("nan")))
            shared[name] = torch.cat(pools)
        return Batch(rows, shared)

    def relocate(self, batch: Batch, generator: torch.Generator) -> Batch:
        """The same logical requests with their tokens in other pages: a new pool of the
        referenced pages and ``1..spare_pages`` more, each referenced page copied to a page of a
        random order, the table ``0..extra_columns`` columns wider with new padding
        (:func:`table_padding`: random page ids -- other requests' or spare ones -- or -1), and
        NaN on every token no request references (spare pages, the tail of each last page).
        From ``generator``, in order: the spare count, the page order, the extra columns, the
        padding."""
        bt = batch.rows[self.block_table]
        table, lens = host_int64(bt, batch.rows[self.seq_lens])  # one host read for both
        lengths = [int(n) for n in lens.tolist()]
        page_size = int(batch.shared[self.pools[0]].shape[1])
        need = pages_needed(lengths, page_size)
        total = sum(need) + 1 + int(torch.randint(self.spare_pages, (1,), generator=generator))
        order = torch.randperm(total, generator=generator)
        width = max(int(table.shape[1]), max(need, default=0))
        if self.extra_columns:
            width += int(torch.randint(self.extra_columns + 1, (1,), generator=generator))
        new_table = table_padding((table.shape[0], width), total, generator, minus_one=self.minus_one_padding)
        src, dst, taken = [], [], 0
        for r, n in enumerate(need):
            new_table[r, :n] = order[taken : taken + n]
            src.append(table[r, :n])
            dst.append(order[taken : taken + n])
            taken += n
        src_ids = torch.cat(src) if src else torch.zeros(0, dtype=torch.int64)
        dst_ids = torch.cat(dst) if dst else torch.zeros(0, dtype=torch.int64)
        shared = dict(batch.shared)
        for name in self.pools:
            old = batch.shared[name]
            new = torch.full((total, *old.shape[1:]), float("nan"), dtype=old.dtype, device=old.device)
            new[dst_ids.to(old.device)] = old.index_select(0, src_ids.to(old.device))
            nan_tails(new, new_table, lengths)
            shared[name] = new
        rows = dict(batch.rows)
        rows[self.block_table] = new_table.to(dtype=bt.dtype, device=bt.device)
        return Batch(rows, shared)

    def rewrite_others(
        self,
        batch: Batch,
        keep: Sequence[int],
        transform: Transform,
        content_rows: Sequence[str] | None = None,
    ) -> tuple[Batch, bool]:
        """The ``neighbours`` check's rewrite: the same launch (tables, lengths, pools of the
        same shape and layout) with the contents of every request not in ``keep`` rewritten by
        ``transform``: its content rows (:func:`batchinv.harness.neighbours.rewrite_rows`: the
        floating-point rows, or ``content_rows``) and, in every pool, the tokens it references
        that no kept request references (a page shared with a kept request is the kept
        request's data).  Unreferenced tokens stay NaN.  Also returns whether anything changed."""
        out, changed = rewrite_rows(batch, keep, transform, content_rows)
        table, lens = host_int64(batch.rows[self.block_table], batch.rows[self.seq_lens])
        lengths = [int(n) for n in lens.tolist()]
        first = batch.shared[self.pools[0]]
        page_size = int(first.shape[1])
        kept_set = {int(k) for k in keep}
        kept = torch.zeros(first.shape[:2], dtype=torch.bool)
        others = torch.zeros(first.shape[:2], dtype=torch.bool)
        for r, length in enumerate(lengths):
            mask = kept if r in kept_set else others
            for j in range(pages_needed([length], page_size)[0]):
                mask[int(table[r, j]), : min(page_size, length - j * page_size)] = True
        target = others & ~kept
        shared = dict(out.shared)
        for name in self.pools:
            pool: torch.Tensor = batch.shared[name]
            if not rewritable(pool):
                continue
            new = rewrite_at(pool, target.to(pool.device), transform)
            if new is not None:
                shared[name], changed = new, True
        return Batch(out.rows, shared), changed

    def check_unreferenced_is_nan(self, batch: Batch) -> None:
        """Raise ``AssertionError`` if a pool holds a non-NaN element no request references (a
        case builder's self-check: docs/DESIGN.md, "Units: rows and requests", asks unreferenced
        memory to be NaN in every case)."""
        bt = batch.rows[self.block_table]
        lengths = [int(n) for n in batch.rows[self.seq_lens].tolist()]
        for name in self.pools:
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

    def model(
        self,
        neighbours: Callable[[Case, Lane], Mapping[str, Case]] | None = None,
        co_batch_sizes: Callable[[Lane], tuple[int, ...]] | None = None,
    ) -> RequestModel:
        """The :class:`~batchinv.harness.registry.RequestModel` of this layout: its
        :meth:`take`, :meth:`concat`, :meth:`relocate` and :meth:`rewrite_others`, and ``neighbours`` and
        ``co_batch_sizes`` as given."""
        return RequestModel(
            take=self.take,
            concat=self.concat,
            relocate=self.relocate,
            neighbours=neighbours,
            co_batch_sizes=co_batch_sizes,
            rewrite_others=self.rewrite_others,
        )


def _same(a: Any, b: Any) -> bool:
    """Whether two shared operands of co-batch parts are the same (tensors: the same values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)))
        )
    return bool(a == b)


def _pad_last(t: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """``t`` padded with ``value`` along its last dim to ``width``."""
    if t.shape[-1] == width:
        return t
    pad = torch.full((*t.shape[:-1], width - t.shape[-1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=-1)


def take_requests(batch: Batch, requests: Sequence[int] | torch.Tensor) -> Batch:
    """The requests at ``requests`` (in that order, an index may repeat: a copy of every rows
    tensor), ``shared`` as it is (a paged batch keeps its pools whole)."""
    return batch.take(requests if isinstance(requests, torch.Tensor) else list(requests))


def paged_model(
    pools: Sequence[str],
    *,
    block_table: str = "block_table",
    seq_lens: str = "seq_lens",
    ragged: Sequence[str] = (),
    minus_one_padding: bool = False,
    spare_pages: int = 3,
    extra_columns: int = 2,
    neighbours: Callable[[Case, Lane], Mapping[str, Case]] | None = None,
    co_batch_sizes: Callable[[Lane], tuple[int, ...]] | None = None,
) -> RequestModel:
    """The :class:`RequestModel` of a paged batch (:class:`PagedLayout` has the arguments):
    ``take`` keeps the pools whole, ``concat`` concatenates them and offsets the block tables,
    ``relocate`` moves every request's tokens to other pages in a random order with other
    table padding, NaN everywhere no request points.  E.g. ``paged_model(("k_cache",
    "v_cache"))``; decode attention's is ``paged_model(("k_cache", "v_cache"),
    ragged=("indices",), minus_one_padding=True, spare_pages=4, extra_columns=0)``."""
    layout = PagedLayout(
        tuple(pools),
        block_table=block_table,
        seq_lens=seq_lens,
        ragged=tuple(ragged),
        minus_one_padding=minus_one_padding,
        spare_pages=spare_pages,
        extra_columns=extra_columns,
    )
    return layout.model(neighbours, co_batch_sizes)


def paged_concat(parts: Sequence[Batch], pools: Sequence[str], *, block_table: str = "block_table") -> Batch:
    """:meth:`PagedLayout.concat` with its defaults: tables padded with one NaN page added
    after the pools."""
    return PagedLayout(tuple(pools), block_table=block_table).concat(parts)


def paged_relocate(
    batch: Batch,
    generator: torch.Generator,
    pools: Sequence[str],
    *,
    block_table: str = "block_table",
    seq_lens: str = "seq_lens",
) -> Batch:
    """:meth:`PagedLayout.relocate` with its defaults: 1-3 spare pages, 0-2 more table
    columns, padding entries random page ids."""
    return PagedLayout(tuple(pools), block_table=block_table, seq_lens=seq_lens).relocate(batch, generator)


def check_unreferenced_is_nan(
    batch: Batch, pools: Sequence[str], *, block_table: str = "block_table", seq_lens: str = "seq_lens"
) -> None:
    """:meth:`PagedLayout.check_unreferenced_is_nan`: raise ``AssertionError`` if a pool holds a
    non-NaN element no request references (a case builder's self-check: docs/DESIGN.md, "Units:
    rows and requests", asks unreferenced memory to be NaN in every case)."""
    PagedLayout(tuple(pools), block_table=block_table, seq_lens=seq_lens).check_unreferenced_is_nan(batch)


__all__ = [
    "PagedLayout",
    "check_unreferenced_is_nan",
    "nan_filled_pages",
    "nan_tails",
    "paged_concat",
    "paged_model",
    "paged_relocate",
    "pages_needed",
    "ragged_seq_lens",
    "seq_lens",
    "special_lengths",
    "table_padding",
    "take_requests",
]
