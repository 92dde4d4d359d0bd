"""Phase models: how to re-launch a request-level attention component's query rows in another
*phase* -- a full prefill, a chunked prefill over a cached prefix, decode steps, a speculative
verify -- over the same KV cache contents, for the ``phase`` check
(:func:`batchinv.harness.invariance.phase`).

A query row is identified by its (request, absolute position ``p``): it attends to keys
``0 .. p`` of its request (dense) or to its own index list (sparse, every index ``<= p``), so its
bits must not depend on which launch computed it.  A launch is a list of :class:`Piece` s, each a
(request, first row, last row) range of positions computed with ``seq_lens = last + 1`` (the
piece's rows are the last ``last - first + 1`` new tokens of a request whose cached prefix is
``first`` tokens long); a request may appear in several pieces of one launch (its block-table row
repeated).

* :class:`PhaseModel` holds what the check needs of a component: its query rows per position
  (:meth:`PhaseModel.queries`), how a list of pieces becomes a launch (:meth:`PhaseModel.pack`)
  and how a launch's outputs split back into the pieces' rows (:meth:`PhaseModel.unpack`), the
  split sizes whose multiples +-1 are mandatory cut points (:meth:`PhaseModel.split_tokens`), and
  whether launches may be ragged (``prefill``: any q_len per piece) or uniform (decode: one q_len
  per launch).
* :func:`plan` picks the launches of one case deterministically from its seed: the phase every
  other is compared with (a full prefill; for a uniform model q_len-1 decode steps) and at most
  :data:`MAX_LAUNCHES` launches in all.
* :class:`PrefillPhaseModel` (varlen ``q [T, Hq, D]`` packed by ``cu_seqlens_q``: the signature of
  ``prefill_attention``) and :class:`DecodePhaseModel` (``q [R, Q, Hq, D]``, one q_len per launch:
  ``decode_attention``) are the two layouts; a component entry instantiates one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from batchinv.harness.registry import Batch, Outputs

__all__ = [
    "DEFAULT_SPLIT_TOKENS",
    "MAX_LAUNCHES",
    "DecodePhaseModel",
    "Launch",
    "PaddedPrefillPhaseModel",
    "PhaseModel",
    "PhasePlan",
    "Piece",
    "PrefillPhaseModel",
    "Rows",
    "cut_points",
    "plan",
    "positions",
]

#: Split sizes whose multiples +-1 are mandatory cut points and positions when a component does
#: not say its own (:meth:`PhaseModel.split_tokens`).
DEFAULT_SPLIT_TOKENS: tuple[int, ...] = (32, 64, 256)
#: Chunked-prefill launches per case; the cut points are dealt round-robin over them.
MAX_CHUNK_LAUNCHES = 4
#: Mandatory page-boundary cut points (and positions) per request: the first this many.
PAGE_CAP = 4
#: Mandatory multiples of each split size per request: the first this many, each -1, 0 and +1.
SPLIT_CAP = 2
#: Cut points (and positions) drawn from the case seed per request, beside the mandatory ones.
RANDOM_POINTS = 2
#: Cut points per request at most (the mandatory ones first, in increasing order).
MAX_CUTS = 12
#: Positions per request that decode and verify launches compute at most (mandatory first).
MAX_POSITIONS = 12
#: q_len of the speculative-verify launches.
VERIFY_Q_LENS: tuple[int, ...] = (2, 4)
#: The most launches one case of the check makes, the compared phase included: one full prefill,
#: up to :data:`MAX_CHUNK_LAUNCHES` chunked prefills, one launch of decode steps, one per verify
#: q_len and one mixed launch (9); a uniform model, decode steps and one launch per verify q_len
#: (3).  With at most :data:`MAX_POSITIONS` positions and :data:`MAX_CUTS` cut points per request
#: over three requests it keeps the check as cheap as a request check on the cpu lane, where the
#: kernels run in the interpreter.
MAX_LAUNCHES = 1 + MAX_CHUNK_LAUNCHES + 1 + len(VERIFY_Q_LENS) + 1


@dataclass(frozen=True)
class Piece:
    """Rows ``first .. last`` (absolute positions, inclusive) of request ``request`` of the case,
    computed with ``seq_lens = last + 1`` in the phase named ``phase`` (e.g. ``"chunk cut at
    48"``)."""

    request: int
    first: int
    last: int
    phase: str

    @property
    def q_len(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Launch:
    """One launch: its pieces, in order."""

    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class PhasePlan:
    """The launches of one case: ``base`` computes the rows every other launch is compared with
    (``base_phase`` names it: ``"full prefill"``, ``"decode q_len 1"``); ``others`` in order."""

    base_phase: str
    base: tuple[Launch, ...]
    others: tuple[Launch, ...]

    @property
    def launches(self) -> int:
        return len(self.base) + len(self.others)


@dataclass(frozen=True)
class Rows:
    """The query rows of the positions a plan uses, per request of the case.

    Attributes:
        q: per request, its query rows ``[n, ...]`` (one per used position, in increasing order).
        indices: per request, its index rows ``[n, K]`` (sparse) or None.
        at: per request, the row of ``q`` (and ``indices``) each used position has.
    """

    q: Mapping[int, torch.Tensor]
    indices: Mapping[int, torch.Tensor | None]
    at: Mapping[int, Mapping[int, int]]

    def _select(self, t: torch.Tensor, piece: Piece) -> torch.Tensor:
        at = self.at[piece.request]
        idx = torch.tensor([at[p] for p in range(piece.first, piece.last + 1)], device=t.device)
        return t.index_select(0, idx)

    def q_of(self, piece: Piece) -> torch.Tensor:
        """The piece's query rows, ``[q_len, ...]``."""
        return self._select(self.q[piece.request], piece)

    def indices_of(self, piece: Piece) -> torch.Tensor:
        """The piece's index rows, ``[q_len, K]`` (sparse models only)."""
        t = self.indices[piece.request]
        if t is None:
            raise ValueError("Rows.indices_of: a dense case has no index rows")
        return self._select(t, piece)


class PhaseModel:
    """How a request-level attention component re-launches query rows in another phase.

    Subclasses give the layout (:meth:`lengths`, :meth:`page_size`, :meth:`case_rows`,
    :meth:`pack`, :meth:`unpack`); :meth:`queries` fills every position a plan uses from the
    case's own rows and, for positions the case has no row for, from a generator (random q; a
    random ascending index list ``<= p`` with a -1 tail in sparse cases).

    Attributes:
        prefill: launches may be ragged (any q_len per piece, full and chunked prefills, mixed
            launches); False: one q_len per launch (decode and verify only).
        output_names: the name of each output in failure messages (``("o", "lse")``).
        splits: ``splits(batch) -> tuple`` of split sizes, or None for
            :data:`DEFAULT_SPLIT_TOKENS` (see :meth:`split_tokens`).
    """

    prefill: bool = True
    output_names: tuple[str, ...] = ("o", "lse")

    def __init__(self, splits: Callable[[Batch], Sequence[int]] | None = None) -> None:
        self.splits = splits

    # -- layout (subclasses) --------------------------------------------------------------------

    def lengths(self, batch: Batch) -> list[int]:
        """``seq_lens`` of the case's requests."""
        raise NotImplementedError

    def page_size(self, batch: Batch) -> int:
        """Tokens per page of the case's KV cache."""
        raise NotImplementedError

    def case_rows(self, batch: Batch, request: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The case's own query rows of ``request`` (its last q_len positions): ``q [Q, ...]``
        and its index rows ``[Q, K]`` or None."""
        raise NotImplementedError

    def pack(self, batch: Batch, rows: Rows, pieces: Sequence[Piece]) -> Batch:
        """One launch computing ``pieces`` over ``batch``'s KV cache and block tables."""
        raise NotImplementedError

    def unpack(self, outputs: Outputs, pieces: Sequence[Piece]) -> list[Outputs]:
        """Each piece's rows of the launch's outputs: per piece, a tuple of tensors with dim 0
        = the piece's positions (``o [q_len, Hq, D]``, ``lse [q_len, Hq]``)."""
        raise NotImplementedError

    # -- generic --------------------------------------------------------------------------------

    def split_tokens(self, batch: Batch) -> tuple[int, ...]:
        """The split sizes whose multiples +-1 are mandatory cut points: the component's own
        (``splits``) or :data:`DEFAULT_SPLIT_TOKENS`."""
        if self.splits is None:
            return DEFAULT_SPLIT_TOKENS
        return tuple(int(s) for s in self.splits(batch) if int(s) > 0)

    def queries(self, batch: Batch, used: Mapping[int, Sequence[int]], generator: torch.Generator) -> Rows:
        """Query rows of every position in ``used[r]`` of each request r: the case's own rows
        where it has them (its last q_len positions; sparse: if their indices are all ``<= p``),
        drawn from ``generator`` elsewhere (q from a standard normal in q's dtype; sparse:
        ``1 .. K`` distinct ascending positions ``<= p`` and a -1 tail)."""
        qs: dict[int, torch.Tensor] = {}
        idxs: dict[int, torch.Tensor | None] = {}
        ats: dict[int, dict[int, int]] = {}
        lengths = self.lengths(batch)
        for r, wanted in used.items():
            length = lengths[r]
            own_q, own_idx = self.case_rows(batch, r)
            start = length - own_q.shape[0]  # the position of the case's first own row
            need = sorted(set(wanted))
            ats[r] = {p: i for i, p in enumerate(need)}
            q = torch.zeros((len(need), *own_q.shape[1:]), dtype=own_q.dtype, device=own_q.device)
            fresh = [i for i, p in enumerate(need) if p < start]
            if fresh:
                drawn = torch.randn((len(fresh), *own_q.shape[1:]), generator=generator)
                q[torch.tensor(fresh, device=q.device)] = drawn.to(q.dtype).to(q.device)
            for i, p in enumerate(need):
                if p >= start:
                    q[i] = own_q[p - start]
            qs[r] = q
            idxs[r] = None
            if own_idx is not None:
                k = own_idx.shape[1]
                idx = torch.full((len(need), k), -1, dtype=own_idx.dtype, device=own_idx.device)
                for i, p in enumerate(need):
                    row = own_idx[p - start] if p >= start else None
                    if row is not None and bool((row <= p).all()):
                        idx[i] = row
                        continue
                    count = int(torch.randint(1, min(k, p + 1) + 1, (1,), generator=generator))
                    chosen = torch.randperm(p + 1, generator=generator)[:count].sort().values
                    idx[i, :count] = chosen.to(idx.dtype).to(idx.device)
                idxs[r] = idx
        return Rows(qs, idxs, ats)


def _rng(seed: int, request: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + request * 7919 + salt) % (2**63))


def _specials(length: int, page_size: int, splits: Sequence[int], low: int) -> list[int]:
    """Page boundaries (the first :data:`PAGE_CAP`; -1 and 0 of each) and split multiples -1,
    0, +1 (the first :data:`SPLIT_CAP` of each split) inside ``[low, length - 1]``."""
    values: list[int] = []
    for k in range(1, PAGE_CAP + 1):
        values += [k * page_size - 1, k * page_size]
    for s in splits:
        for k in range(1, SPLIT_CAP + 1):
            values += [k * s - 1, k * s, k * s + 1]
    return sorted({v for v in values if low <= v <= length - 1})


def cut_points(length: int, page_size: int, splits: Sequence[int], seed: int, request: int) -> list[int]:
    """The cached-prefix lengths ``c`` (``1 <= c < length``) a chunked prefill of a request of
    ``length`` tokens is cut at: every page boundary (the first :data:`PAGE_CAP`), every split
    multiple -1, 0, +1 (the first :data:`SPLIT_CAP` of each split), and :data:`RANDOM_POINTS`
    drawn from the seed; at most :data:`MAX_CUTS` (the mandatory ones first)."""
    if length < 2:
        return []
    mandatory = _specials(length, page_size, splits, 1)
    g = _rng(seed, request, 1)
    drawn = [int(v) for v in torch.randint(1, length, (RANDOM_POINTS,), generator=g)]
    chosen = list(dict.fromkeys([*mandatory, *drawn]))[:MAX_CUTS]
    return sorted(chosen)


def positions(length: int, page_size: int, splits: Sequence[int], seed: int, request: int) -> list[int]:
    """The positions decode and verify launches compute for a request of ``length`` tokens, at
    most :data:`MAX_POSITIONS`, in this priority: the last; split multiples -1, 0, +1 (the first
    :data:`SPLIT_CAP` of each split); :data:`RANDOM_POINTS` from the seed; 0; page boundaries -1
    and 0 (the first :data:`PAGE_CAP`)."""
    if length < 1:
        return []
    split_points = sorted({k * s + e for s in splits for k in range(1, SPLIT_CAP + 1) for e in (-1, 0, 1)})
    page_points = sorted({k * page_size + e for k in range(1, PAGE_CAP + 1) for e in (-1, 0)})
    g = _rng(seed, request, 2)
    drawn = [int(v) for v in torch.randint(0, length, (RANDOM_POINTS,), generator=g)]
    ordered = [length - 1, *split_points, *drawn, 0, *page_points]
    inside = [p for p in dict.fromkeys(ordered) if 0 <= p < length]
    return sorted(inside[:MAX_POSITIONS])


def _verify_pieces(
    request: int, length: int, points: Sequence[int], q_len: int, seed: int, label: str
) -> list[Piece]:
    """Windows of ``q_len`` rows holding every position of ``points``: the lowest position not
    yet held opens a window at a slot drawn from the seed (clamped to the request: a window is
    inside ``0 .. length - 1``), which holds every point it covers (points a few positions apart,
    a split multiple -1, 0 and +1, share a window, at different slots)."""
    if length < q_len:
        return []
    g = _rng(seed, request, 10 + q_len)
    pieces: list[Piece] = []
    for p in sorted(points):
        if pieces and pieces[-1].first <= p <= pieces[-1].last:
            continue
        slot = int(torch.randint(0, q_len, (1,), generator=g))
        first = min(max(p - slot, 0), length - q_len)
        pieces.append(Piece(request, first, first + q_len - 1, label))
    return pieces


def plan(model: PhaseModel, batch: Batch, targets: Sequence[int], seed: int) -> PhasePlan:
    """The launches of the phase check on ``batch``'s requests ``targets``, deterministic in
    ``seed``; at most :data:`MAX_LAUNCHES`.

    Ragged models (``prefill``): the base is one full prefill (every target, rows ``0 .. L - 1``);
    then chunked prefills (each cut point c of :func:`cut_points` as two pieces, ``0 .. c - 1`` and
    ``c .. L - 1``, dealt over :data:`MAX_CHUNK_LAUNCHES` launches), one launch of decode steps
    (q_len 1 at each of :func:`positions`), one launch per verify q_len (each position in a window
    of that q_len, at a slot drawn from the seed) and one mixed launch (the first, third...
    target in a chunked prefill cut at a seeded point, the others in decode steps; one target:
    both).  Uniform models: the base is the decode steps (q_len 1 at each of :func:`positions`),
    then the verify launches; rows of a verify window that are not among the positions are
    computed but not compared.
    """
    lengths = model.lengths(batch)
    page = model.page_size(batch)
    splits = model.split_tokens(batch)
    points = {r: positions(lengths[r], page, splits, seed, r) for r in targets}
    verify: list[Launch] = []
    for q_len in VERIFY_Q_LENS:
        label = f"verify q_len {q_len}"
        pieces = [p for r in targets for p in _verify_pieces(r, lengths[r], points[r], q_len, seed, label)]
        if pieces:
            verify.append(Launch(tuple(pieces)))
    if not model.prefill:
        base = Launch(tuple(Piece(r, p, p, "decode q_len 1") for r in targets for p in points[r]))
        return PhasePlan("decode q_len 1", (base,) if base.pieces else (), tuple(verify))
    full = Launch(tuple(Piece(r, 0, lengths[r] - 1, "full prefill") for r in targets if lengths[r] > 0))
    chunks: list[list[Piece]] = [[] for _ in range(MAX_CHUNK_LAUNCHES)]
    for r in targets:
        for i, c in enumerate(cut_points(lengths[r], page, splits, seed, r)):
            label = f"chunk cut at {c}"
            chunks[i % MAX_CHUNK_LAUNCHES] += [
                Piece(r, 0, c - 1, f"{label} (first chunk)"),
                Piece(r, c, lengths[r] - 1, label),
            ]
    decode = [Piece(r, p, p, "decode q_len 1") for r in targets for p in points[r]]
    mixed: list[Piece] = []
    for i, r in enumerate(targets):
        in_prefill = i % 2 == 0 or len(targets) == 1
        in_decode = i % 2 == 1 or len(targets) == 1
        if in_prefill and lengths[r] >= 2:
            c = int(torch.randint(1, lengths[r], (1,), generator=_rng(seed, r, 3)))
            mixed.append(Piece(r, c, lengths[r] - 1, f"mixed launch: chunk cut at {c}"))
        if in_decode:
            mixed += [Piece(r, p, p, "mixed launch: decode q_len 1") for p in points[r]]
    others = [Launch(tuple(c)) for c in chunks if c]
    others += [Launch(tuple(decode))] if decode else []
    others += verify
    others += [Launch(tuple(mixed))] if mixed else []
    base_launches = (full,) if full.pieces else ()
    assert len(base_launches) + len(others) <= MAX_LAUNCHES
    return PhasePlan("full prefill", base_launches, tuple(others))


def used_positions(plan_: PhasePlan) -> dict[int, list[int]]:
    """Every position some piece of ``plan_`` computes, per request."""
    out: dict[int, set[int]] = {}
    for launch in (*plan_.base, *plan_.others):
        for p in launch.pieces:
            out.setdefault(p.request, set()).update(range(p.first, p.last + 1))
    return {r: sorted(v) for r, v in out.items()}


def _like_source(batch: Batch, kwargs: Mapping[str, object]) -> Batch:
    """``kwargs`` as a :class:`Batch` laid out like ``batch``: the names ``batch`` has in
    ``rows`` (tensors) go to rows, the others to shared."""
    rows = {k: v for k, v in kwargs.items() if k in batch.rows and isinstance(v, torch.Tensor)}
    shared = {k: v for k, v in kwargs.items() if k not in rows}
    return Batch(rows, shared)


class PrefillPhaseModel(PhaseModel):
    """The phase model of a varlen prefill attention over a paged KV cache, the signature of
    ``prefill_attention(q [T, Hq, D], k_cache, v_cache, block_table [R, M], cu_seqlens_q [R + 1],
    seq_lens [R], *, scale=None, indices=None [T, K])``: request r owns rows
    ``cu[r] .. cu[r + 1] - 1`` at positions ``seq_lens[r] - q_len[r] + i``.

    It reads the case through ``batch.kwargs()`` (whatever the entry keeps in ``rows`` and in
    ``shared``) and lays a launch out as the case is: the names the case has in ``rows`` stay
    there.  Every piece is a request of the launch (its block-table row repeated, ``seq_lens =
    last + 1``, ``cu_seqlens_q`` of the case's dtype); other keyword arguments (``scale``) are
    passed through.

    Parameters
    ----------
    splits : callable, optional
        ``splits(batch) -> split sizes`` of the component's table (its mandatory cut points);
        default :data:`DEFAULT_SPLIT_TOKENS`.
    """

    prefill = True

    def lengths(self, batch: Batch) -> list[int]:
        return [int(v) for v in batch.kwargs()["seq_lens"].tolist()]

    def page_size(self, batch: Batch) -> int:
        return int(batch.kwargs()["k_cache"].shape[1])

    def case_rows(self, batch: Batch, request: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        kw = batch.kwargs()
        cu = [int(v) for v in kw["cu_seqlens_q"].tolist()]
        rows = slice(cu[request], cu[request + 1])
        idx = kw.get("indices")
        return kw["q"][rows], None if idx is None else idx[rows]

    def pack(self, batch: Batch, rows: Rows, pieces: Sequence[Piece]) -> Batch:
        kw = dict(batch.kwargs())
        q = torch.cat([rows.q_of(p) for p in pieces])
        cu = [0]
        for p in pieces:
            cu.append(cu[-1] + p.q_len)
        table = kw["block_table"]
        req = torch.tensor([p.request for p in pieces], dtype=torch.long, device=table.device)
        kw["q"] = q
        kw["cu_seqlens_q"] = torch.tensor(cu, dtype=kw["cu_seqlens_q"].dtype, device=q.device)
        kw["seq_lens"] = torch.tensor(
            [p.last + 1 for p in pieces], dtype=kw["seq_lens"].dtype, device=kw["seq_lens"].device
        )
        kw["block_table"] = table.index_select(0, req)
        if kw.get("indices") is not None:
            kw["indices"] = torch.cat([rows.indices_of(p) for p in pieces])
        return _like_source(batch, kw)

    def unpack(self, outputs: Outputs, pieces: Sequence[Piece]) -> list[Outputs]:
        out, start = [], 0
        for p in pieces:
            out.append(tuple(o[start : start + p.q_len] for o in outputs))
            start += p.q_len
        return out


class DecodePhaseModel(PhaseModel):
    """The phase model of a decode attention over a paged KV cache with one q_len per launch,
    the signature of ``decode_attention(q [R, Q, Hq, D], k_cache, v_cache, block_table [R, M],
    seq_lens [R], scale, indices=None [R, Q, K])``: token i of request r is at position
    ``seq_lens[r] - Q + i``.  Launches are decode steps (q_len 1) and speculative verifies (q_len
    2 and 4), each piece a request of the launch (its block-table row repeated).

    Parameters
    ----------
    splits : callable, optional
        ``splits(batch) -> split sizes`` of the component's table; default
        :data:`DEFAULT_SPLIT_TOKENS`.
    """

    prefill = False

    def lengths(self, batch: Batch) -> list[int]:
        return [int(v) for v in batch.kwargs()["seq_lens"].tolist()]

    def page_size(self, batch: Batch) -> int:
        return int(batch.kwargs()["k_cache"].shape[1])

    def case_rows(self, batch: Batch, request: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        kw = batch.kwargs()
        idx = kw.get("indices")
        return kw["q"][request], None if idx is None else idx[request]

    def pack(self, batch: Batch, rows: Rows, pieces: Sequence[Piece]) -> Batch:
        if len({p.q_len for p in pieces}) > 1:
            raise ValueError("DecodePhaseModel.pack: one q_len per launch")
        kw = dict(batch.kwargs())
        table = kw["block_table"]
        req = torch.tensor([p.request for p in pieces], dtype=torch.long, device=table.device)
        kw["q"] = torch.stack([rows.q_of(p) for p in pieces])
        kw["seq_lens"] = torch.tensor(
            [p.last + 1 for p in pieces], dtype=kw["seq_lens"].dtype, device=kw["seq_lens"].device
        )
        kw["block_table"] = table.index_select(0, req)
        if kw.get("indices") is not None:
            kw["indices"] = torch.stack([rows.indices_of(p) for p in pieces])
        return _like_source(batch, kw)

    def unpack(self, outputs: Outputs, pieces: Sequence[Piece]) -> list[Outputs]:
        return [tuple(o[i] for o in outputs) for i in range(len(pieces))]


class PaddedPrefillPhaseModel(PrefillPhaseModel):
    """The phase model of a prefill attention laid out request-major, as a registry entry keeps
    it: ``q [R, q_max, Hq, D]`` with a ``q_lens [R]`` row (request r's new tokens are its rows
    ``0 .. q_lens[r] - 1``, the others padding never computed), ``seq_lens [R]``,
    ``block_table [R, M]`` and, sparse, ``indices [R, q_max, K]``; outputs ``o [R, q_max, ...]``
    and ``lse [R, q_max, Hq]``.  A launch pads its pieces to the longest piece (q zeros, indices
    -1) and each piece reads back its first ``q_len`` rows."""

    def case_rows(self, batch: Batch, request: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        kw = batch.kwargs()
        n = int(kw["q_lens"][request])
        idx = kw.get("indices")
        return kw["q"][request, :n], None if idx is None else idx[request, :n]

    def pack(self, batch: Batch, rows: Rows, pieces: Sequence[Piece]) -> Batch:
        kw = dict(batch.kwargs())
        q_case = kw["q"]
        width = max(p.q_len for p in pieces)
        q = torch.zeros((len(pieces), width, *q_case.shape[2:]), dtype=q_case.dtype, device=q_case.device)
        for i, p in enumerate(pieces):
            q[i, : p.q_len] = rows.q_of(p)
        table = kw["block_table"]
        req = torch.tensor([p.request for p in pieces], dtype=torch.long, device=table.device)
        kw["q"] = q
        lens = kw["seq_lens"]
        kw["q_lens"] = torch.tensor([p.q_len for p in pieces], dtype=kw["q_lens"].dtype, device=lens.device)
        kw["seq_lens"] = torch.tensor([p.last + 1 for p in pieces], dtype=lens.dtype, device=lens.device)
        kw["block_table"] = table.index_select(0, req)
        if kw.get("indices") is not None:
            idx_case = kw["indices"]
            idx = torch.full(
                (len(pieces), width, idx_case.shape[2]), -1, dtype=idx_case.dtype, device=idx_case.device
            )
            for i, p in enumerate(pieces):
                idx[i, : p.q_len] = rows.indices_of(p)
            kw["indices"] = idx
        return _like_source(batch, kw)

    def unpack(self, outputs: Outputs, pieces: Sequence[Piece]) -> list[Outputs]:
        return [tuple(o[i, : p.q_len] for o in outputs) for i, p in enumerate(pieces)]
