"""Request-level pieces of the ``decode_attention`` component: cases, the case builder, error
inputs, and its paged request model (:data:`PAGED`, a
:class:`~batchinv.harness.requests.PagedLayout`: :func:`take`, :func:`concat`, :func:`relocate`).

The registry entry, :data:`COMPONENT`, is at the end: a request-level component (its
``RequestModel`` is :data:`PAGED`'s take / concat / relocate and :func:`neighbours`), checked for
agreement, co_batch, slot, placement, phase (decode steps vs speculative verifies of the same
positions: :class:`~batchinv.harness.phases.DecodePhaseModel`) and repeat.  co_batch puts each
target request among other requests of four length mixes (:func:`neighbours`: long, short, equal
-- on the cpu lane one split longer than any request of the case -- and one huge, 2x the case's
longest context on the cpu lane, 4x on GPU lanes), one mix per (target, co-batch size) pair.

A :class:`Batch` of this component holds, per request (``rows``, dim 0 = requests): ``q``
(R, Q, Hq, D), ``seq_lens`` (R,), ``block_table`` (R, T) and, in sparse cases, ``indices``
(R, Q, K); and ``shared``: the page pools ``k_cache``, ``v_cache`` (P, S, Hkv, D) and ``scale``.
Memory no request references is NaN: pages no request owns, the tail of each request's last
page; table padding holds random page ids or -1.  Inputs come from the case's seed and a CPU
``torch.Generator``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast import decode_attention as fast_attention
from batchinv.fast.baselines import decode_attention as baselines
from batchinv.harness.lanes import Lane
from batchinv.harness.phases import DecodePhaseModel
from batchinv.harness.registry import Baseline, Batch, Case, Component, ErrorCase, Toleranced
from batchinv.harness.requests import PagedLayout, nan_filled_pages, nan_tails, pages_needed, table_padding
from batchinv.reference import decode_attention as ref_attention
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.exact import round_once

NAME = "decode_attention"
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}

#: Length kinds of a case (per request, cycled or drawn from the seed):
#: ``edges``: 1, Q, page and split boundaries +-1 of the cpu lane's table (page 16, split 32);
#: ``mixed``: uniform in [Q, longest]; ``equal``: every request at ``longest``;
#: ``one_huge``: one request at ``longest``, the others short; ``short``: uniform in [Q, Q + 16];
#: ``merge_order``: the order-exact design (:func:`_merge_order_kv`): every request at
#: ``MERGE_SPLITS`` splits of the lane's ``split_tokens`` (``longest`` is not used);
#: ``merge_order_long``: every request but the last as in ``merge_order``, the last at ``longest``
#: with random KV (more splits than the others: the case's own batch holds both).
LENGTH_KINDS: tuple[str, ...] = (
    "edges",
    "mixed",
    "equal",
    "one_huge",
    "short",
    "merge_order",
    "merge_order_long",
)
EDGE_LENGTHS: tuple[int, ...] = (1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 95, 96, 97)
#: The long request of the cpu lane's ``merge_order_long`` case: 6 splits of the interpreter's 32
#: slots beside an order-exact request of 4, so a split plan drawn from the launch's longest
#: request past 4 splits changes the order-exact requests' bits inside their own batch, whatever
#: the neighbours (random KV would show it only by chance: o rounds to 16 bits, few lse values).
MERGE_ORDER_LONG = 161


def _case(**axes: Any) -> Case:
    return Case(NAME, axes)


def cases(lane: Lane) -> list[Case]:
    """The sweep's cases on ``lane``: tiny shapes on the cpu lane (the interpreter is slow), the
    issue's shapes on GPU lanes.  Axes: R, Q, Hq, Hkv, D, page_size, dtype, lengths (a
    :data:`LENGTH_KINDS` kind), longest (the longest context), sparse_k (0: dense)."""
    out: list[Case] = []
    if lane is Lane.CPU:
        for r, q_len, hq, hkv, d, lengths, sparse_k, dtype in (
            (1, 1, 1, 1, 16, "edges", 0, "bfloat16"),
            (3, 1, 4, 1, 16, "edges", 0, "bfloat16"),
            (9, 1, 4, 4, 16, "edges", 0, "float16"),
            (9, 2, 4, 1, 16, "edges", 0, "bfloat16"),
            (3, 2, 4, 4, 64, "mixed", 0, "float16"),
            (3, 1, 4, 1, 16, "one_huge", 0, "bfloat16"),
            (3, 1, 4, 1, 16, "mixed", 24, "bfloat16"),
            (9, 2, 4, 1, 16, "edges", 40, "float16"),
            (3, 1, 4, 1, 16, "merge_order", 0, "bfloat16"),  # (longest: its neighbours' scale)
            (2, 2, 2, 2, 16, "merge_order", 0, "float16"),
            (2, 1, 4, 1, 16, "merge_order_long", 0, "float16"),  # (longest: MERGE_ORDER_LONG)
        ):
            out.append(
                _case(
                    R=r,
                    Q=q_len,
                    Hq=hq,
                    Hkv=hkv,
                    D=d,
                    page_size=16,
                    dtype=dtype,
                    lengths=lengths,
                    longest=MERGE_ORDER_LONG if lengths == "merge_order_long" else 97,
                    sparse_k=sparse_k,
                )
            )
        return out
    for dtype in DTYPES:
        for hq, hkv in ((32, 8), (16, 1), (8, 8)):
            for d in (64, 128, 256):
                for page_size in (16, 64):
                    for lengths, longest in (("mixed", 1024), ("one_huge", 32768), ("edges", 97)):
                        out.append(
                            _case(
                                R=8,
                                Q=1,
                                Hq=hq,
                                Hkv=hkv,
                                D=d,
                                page_size=page_size,
                                dtype=dtype,
                                lengths=lengths,
                                longest=longest,
                                sparse_k=0,
                            )
                        )
    for dtype, page_size in (("bfloat16", 16), ("float16", 64)):
        out.append(
            _case(
                R=8,
                Q=1,
                Hq=32,
                Hkv=8,
                D=128,
                page_size=page_size,
                dtype=dtype,
                lengths="merge_order",
                longest=1024,  # unused by the design; the scale of its co_batch neighbours
                sparse_k=0,
            )
        )
    for q_len in (2, 4):
        out.append(
            _case(
                R=8,
                Q=q_len,
                Hq=32,
                Hkv=8,
                D=128,
                page_size=16,
                dtype="bfloat16",
                lengths="mixed",
                longest=4096,
                sparse_k=0,
            )
        )
    out.append(
        _case(
            R=8,
            Q=1,
            Hq=16,
            Hkv=1,
            D=128,
            page_size=64,
            dtype="bfloat16",
            lengths="mixed",
            longest=8192,
            sparse_k=2048,
        )
    )
    return out


#: Splits per request in ``merge_order`` cases: a power of two, so the merge's final division
#: by the split count is exact.
MERGE_SPLITS = 4


def _lengths(
    kind: str, count: int, q_len: int, longest: int, seed: int, gen: torch.Generator, split_tokens: int
) -> list[int]:
    if kind == "merge_order":
        return [MERGE_SPLITS * split_tokens] * count
    if kind == "merge_order_long":
        return [MERGE_SPLITS * split_tokens] * (count - 1) + [longest] * min(count, 1)
    if kind == "edges":
        return [max(q_len, EDGE_LENGTHS[(seed + r) % len(EDGE_LENGTHS)]) for r in range(count)]
    if kind == "mixed":
        return [int(v) for v in torch.randint(q_len, longest + 1, (count,), generator=gen)]
    if kind == "equal":
        return [longest] * count
    if kind == "one_huge":
        short = [int(v) for v in torch.randint(q_len, q_len + 17, (count,), generator=gen)]
        if count:
            short[int(torch.randint(count, (1,), generator=gen))] = longest
        return short
    if kind == "short":
        return [int(v) for v in torch.randint(q_len, q_len + 17, (count,), generator=gen)]
    raise ValueError(f"lengths: expected one of {LENGTH_KINDS}, got {kind!r}")


def _sparse_indices(lens: Sequence[int], q_len: int, k: int, seed: int, gen: torch.Generator) -> torch.Tensor:
    """(R, Q, K) int32: per token a random ascending set of positions < L and a -1 tail; every
    fourth request (by seed) is an empty context (all -1); odd requests get -1 inside the list."""
    out = torch.full((len(lens), q_len, k), -1, dtype=torch.int32)
    for r, length in enumerate(lens):
        if (seed + r) % 4 == 0:
            continue
        for i in range(q_len):
            count = int(torch.randint(1, min(k, length) + 1, (1,), generator=gen))
            chosen = torch.randperm(length, generator=gen)[:count].sort().values
            row = torch.cat([chosen, torch.full((k - count,), -1)])
            if r % 2:
                row = row[torch.randperm(k, generator=gen)]
            out[r, i] = row.to(torch.int32)
    return out


#: ``merge_order`` values per dtype: (big, small) with small 25 bits below big, both exact in
#: the dtype (fp16 cannot hold 2**25), small times 7 still exact and its quarter a normal number.
_MERGE_VALUES: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (2.0**25, 1.0),
    torch.float16: (2.0**14, 2.0**-11),
}

#: ``merge_order`` patterns: per split s, ``(b, m)``: split s holds ``sign * (b * big + m * odd *
#: small)``.  In each, the two bigs come before the small in ascending order (and cancel before it
#: is added), so the ascending fp32 merge is exact; any order that adds the small to an
#: accumulator holding a lone big rounds (25 bits) and ends elsewhere: the pattern catches exactly
#: the orders where the small split is not merged after both big splits (zeros add nothing).
#:
#: * ``(big, -big, small, 0)``: orders merging split 2 before split 0 or split 1;
#: * ``(big, -big, 0, small)``: split 3 before split 0 or split 1;
#: * ``(big, 0, -big, small)``: split 3 before split 0 or split 2 (and the pairwise tree);
#: * ``(0, big, -big, small)``: split 3 before split 1 or split 2 (and the pairwise tree).
#:
#: Together: every order except ascending and (1, 0, 2, 3) -- the only other order with split 2
#: after splits 0 and 1 and split 3 last -- and the pairwise tree ``(s0 + s1) + (s2 + s3)``.
#: (1, 0, 2, 3) can never differ: with every merge weight exactly 1 the first two merges are
#: ``0 + a`` and ``a + b``, and fp32 addition is commutative.
_MERGE_PATTERNS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((1, 0), (-1, 0), (0, 1), (0, 0)),
    ((1, 0), (-1, 0), (0, 0), (0, 1)),
    ((1, 0), (0, 0), (-1, 0), (0, 1)),
    ((0, 0), (1, 0), (-1, 0), (0, 1)),
)


def _merge_order_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: Sequence[int],
    split_tokens: int,
    gen: torch.Generator,
) -> None:
    """Overwrite the referenced KV of a ``merge_order`` batch (in place, CPU tensors) with the
    order-exact design: every key 0 (every score 0, so each split's softmax weights are exp(0) = 1
    and every full split has the same lse: every merge weight is exp(0) = 1); all positions of
    split s hold ``v_s`` in a channel, with ``v`` per (request, kv head, channel) one of the
    :data:`_MERGE_PATTERNS` -- pattern ``(c + r) % 4`` in channel c of request r, so every kv head
    of every request holds each pattern (D >= 4) -- times ``sign`` = +-1, its small times ``m`` in
    {1, 3, 5, 7}, both from ``gen``.

    Each partial o_s = v_s exactly, the ascending fp32 merge cancels the two bigs before it adds
    ``m * small`` and divides by 4 exactly, so o is the fp64 reference ``sign * m * small / 4``
    rounded once; a merge in another order that adds ``m * small`` to a lone big rounds (25 bits)
    and ends elsewhere.  The patterns together catch every order of the 4 splits other than
    ascending and (1, 0, 2, 3), in every kv head of every request, and the pairwise tree; no
    design can catch (1, 0, 2, 3): with merge weights exactly 1 its first two merges are ``0 + v_1``
    and ``v_1 + v_0``, and fp32 addition is commutative.  :func:`exact` holds these o bitwise.
    The lengths must be ``MERGE_SPLITS * split_tokens`` (whole pages: no NaN tail)."""
    big, small = _MERGE_VALUES[v_cache.dtype]
    page_size, hkv, d = v_cache.shape[1], v_cache.shape[2], v_cache.shape[3]
    patterns = torch.tensor(_MERGE_PATTERNS, dtype=torch.float64)  # [P, MERGE_SPLITS, 2]
    for r, length in enumerate(lens):
        if length != MERGE_SPLITS * split_tokens or split_tokens % page_size:
            raise ValueError(
                f"merge_order: length {length} is not {MERGE_SPLITS} x {split_tokens} in whole pages"
            )
        sign = torch.randint(2, (hkv, d), generator=gen).to(torch.float64) * 2 - 1
        odd = torch.randint(4, (hkv, d), generator=gen).to(torch.float64) * 2 + 1
        chosen = patterns[(torch.arange(d) + r) % len(_MERGE_PATTERNS)]  # [D, MERGE_SPLITS, 2]
        bigs, smalls = chosen[..., 0].T, chosen[..., 1].T  # [MERGE_SPLITS, D]
        per_split = sign * (bigs[:, None] * big + smalls[:, None] * odd * small) + 0.0  # no -0
        values = per_split.repeat_interleave(split_tokens, dim=0)  # [L, Hkv, D]
        ids = table[r, : length // page_size].to(torch.int64)
        k_cache[ids] = 0.0
        v_cache[ids] = values.view(-1, page_size, hkv, d).to(v_cache.dtype)


def build(case: Case, device: torch.device) -> Batch:
    """The batch of ``case``: a deterministic function of its axes and seed (``merge_order``
    cases: of the lane's ``split_tokens`` too, from the fast kernel's config table on ``device``;
    bench cases, axis ``fill="device"``: :func:`build_on_device`)."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    a = case.axes
    if a.get("fill") == "device":
        return build_on_device(case, device)
    gen = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[a["dtype"]]
    r_count, q_len, hq, hkv, d, page_size = a["R"], a["Q"], a["Hq"], a["Hkv"], a["D"], a["page_size"]
    merge_order = a["lengths"] in ("merge_order", "merge_order_long")
    split_tokens = decode_attention_config(arch(device), d, dtype).split_tokens if merge_order else 0
    lens = _lengths(a["lengths"], r_count, q_len, a["longest"], case.seed, gen, split_tokens)
    need = pages_needed(lens, page_size)
    spare = 1 + int(torch.randint(3, (1,), generator=gen))
    num_pages = sum(need) + spare
    max_pages = max(need, default=0) + 1
    perm = torch.randperm(num_pages, generator=gen)
    table = table_padding((r_count, max_pages), num_pages, gen, minus_one=True)
    k_cache = nan_filled_pages(num_pages, page_size, hkv, d, dtype=dtype)
    v_cache = nan_filled_pages(num_pages, page_size, hkv, d, dtype=dtype)
    taken = 0
    for r in range(r_count):
        ids = perm[taken : taken + need[r]]
        taken += need[r]
        table[r, : need[r]] = ids
        k_cache[ids] = torch.randn(need[r], page_size, hkv, d, generator=gen).to(dtype)
        v_cache[ids] = torch.randn(need[r], page_size, hkv, d, generator=gen).to(dtype)
    if merge_order:  # merge_order_long: all but the last request
        designed = lens if a["lengths"] == "merge_order" else lens[:-1]
        _merge_order_kv(k_cache, v_cache, table, designed, split_tokens, gen)
    nan_tails(k_cache, table, lens)
    nan_tails(v_cache, table, lens)
    rows: dict[str, torch.Tensor] = {
        "q": torch.randn(r_count, q_len, hq, d, generator=gen).to(dtype),
        "seq_lens": torch.tensor(lens, dtype=torch.int32),
        "block_table": table.to(torch.int32),
    }
    if a["sparse_k"]:
        rows["indices"] = _sparse_indices(lens, q_len, a["sparse_k"], case.seed, gen)
    return Batch(
        {name: t.to(device) for name, t in rows.items()},
        {"k_cache": k_cache.to(device), "v_cache": v_cache.to(device), "scale": 1.0 / math.sqrt(d)},
    )


# --- bench -----------------------------------------------------------------------------------

#: The issue's bench shape: bf16, Hq = 32, Hkv = 8, D = 128, page_size 16.
BENCH_BATCHES: tuple[int, ...] = (1, 8, 64, 256)
BENCH_CONTEXTS: tuple[int, ...] = (1024, 8192, 32768)


def bench_cases(lane: Lane) -> list[Case]:
    """``batchinv bench`` cases (GPU lanes): R in :data:`BENCH_BATCHES` x longest context in
    :data:`BENCH_CONTEXTS`, every request at the longest (``equal``) or uniform in [1, longest]
    (``mixed``); operands drawn on the device (``fill="device"``)."""
    if not lane.is_gpu:
        return []
    return [
        _case(
            R=r,
            Q=1,
            Hq=32,
            Hkv=8,
            D=128,
            page_size=16,
            dtype="bfloat16",
            lengths=lengths,
            longest=ctx,
            sparse_k=0,
            fill="device",
        )
        for lengths in ("equal", "mixed")
        for ctx in BENCH_CONTEXTS
        for r in BENCH_BATCHES
    ]


def build_on_device(case: Case, device: torch.device) -> Batch:
    """A bench batch drawn on ``device`` (GBs of KV cache: no CPU round trip): each request's
    pages a random set of the pool, pages and q from a device generator; the one spare page and
    the tails of last pages hold random values, not NaN (timing only: agreement is the sweep's)."""
    a = case.axes
    if a["sparse_k"]:
        raise ValueError("fill='device': dense cases only")
    gen = torch.Generator().manual_seed(case.seed)
    dev_gen = torch.Generator(device=device).manual_seed(case.seed)
    dtype = DTYPES[a["dtype"]]
    r_count, q_len, hq, hkv, d, page_size = a["R"], a["Q"], a["Hq"], a["Hkv"], a["D"], a["page_size"]
    if a["lengths"] in ("merge_order", "merge_order_long"):
        raise ValueError("fill='device': merge_order cases are built on the host (build)")
    lens = _lengths(a["lengths"], r_count, q_len, a["longest"], case.seed, gen, 0)
    need = pages_needed(lens, page_size)
    num_pages = sum(need) + 1
    table = torch.full((r_count, max(need) + 1), -1, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    starts = [0, *itertools.accumulate(need)]
    for r in range(r_count):
        table[r, : need[r]] = perm[starts[r] : starts[r + 1]]
    pool = (num_pages, page_size, hkv, d)
    return Batch(
        {
            "q": torch.randn(r_count, q_len, hq, d, generator=dev_gen, device=device, dtype=dtype),
            "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
            "block_table": table.to(device),
        },
        {
            "k_cache": torch.randn(pool, generator=dev_gen, device=device, dtype=dtype),
            "v_cache": torch.randn(pool, generator=dev_gen, device=device, dtype=dtype),
            "scale": 1.0 / math.sqrt(d),
        },
    )


def bench_bytes(batch: Batch) -> int:
    """The bytes a decode step must move: every attended K and V row once (dense: each token's
    causal context), q read, o and lse written."""
    q = batch.rows["q"]
    r_count, q_len, hq, d = q.shape
    hkv = batch.shared["k_cache"].shape[2]
    item = batch.shared["k_cache"].element_size()
    context = int(batch.rows["seq_lens"].to(torch.int64).sum())
    kv = 2 * context * hkv * d * item
    return kv + 2 * q.numel() * q.element_size() + 4 * r_count * q_len * hq


# --- the request model -------------------------------------------------------------------------

#: The other requests' length mixes of the co_batch check (:func:`neighbours`), in order; slot
#: uses the first.
NEIGHBOUR_MIXES: tuple[str, ...] = ("long", "short", "equal", "one_huge")
#: How much longer than the case's ``longest`` the one huge neighbour is: 4x on GPU lanes, 2x on
#: the cpu lane (the interpreter's cost grows with the context) ...
HUGE_FACTOR: dict[bool, int] = {True: 4, False: 2}
#: ... but at most this long when ``longest`` is shorter (a 255-request co-batch cycles the mix's
#: requests, so it holds the huge one ~32 times; the padded SDPA baseline must still fit).
HUGE_CAP = 16384
#: The longest context of the ``long`` and ``equal`` mixes (GPU cases reach 32768 on their own:
#: eight such neighbours per check made the GPU sweep's co_batch and slot checks its slowest).
NEIGHBOUR_LONGEST_CAP = 4096
#: The ``equal`` mix's length on the cpu lane: one slot past the last whole split of the case's
#: longest request, so each of its requests has one split more than any request of the case (129
#: slots, 5 splits of the interpreter's 32, beside the 97-slot and 4-split cases).  On the cpu lane the pairs
#: are few (3 sizes x 3 targets dealt over 4 mixes): without it only the ``one_huge`` mix, in a
#: size-1 or -2 draw that happened to hold its huge request, put a target among more splits than
#: its own batch has, and a split plan keyed on the launch's split count past 4 was caught by
#: that one pair.  GPU lanes keep ``longest`` (their co-batches of 31 and 255 hold every mix).
EQUAL_EXTRA_SPLIT: dict[bool, bool] = {True: False, False: True}
#: Requests per neighbour case (at least the case's R), by lane (GPU: True): co-batches larger
#: than a mix cycle its requests.  Four on the cpu lane: slot launches the whole mix five times
#: per target, and the interpreter's cost grows with every request (slot was half the cpu sweep).
NEIGHBOUR_REQUESTS: dict[bool, int] = {True: 8, False: 4}


def _longest_request(axes: dict[str, Any], split_tokens: int) -> int:
    """The longest length a request of a case with ``axes`` can have."""
    kind = axes["lengths"]
    if kind == "merge_order":
        return MERGE_SPLITS * split_tokens
    if kind == "merge_order_long":
        return max(MERGE_SPLITS * split_tokens, int(axes["longest"]))
    if kind == "edges":
        return max(int(axes["Q"]), max(EDGE_LENGTHS))
    if kind == "short":
        return int(axes["Q"]) + 16
    return int(axes["longest"])


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """The other requests of the co_batch and slot checks, one case per length mix, each with
    ``case``'s shape axes (Q, Hq, Hkv, D, page_size, dtype, sparse_k) and a seed derived from
    its seed: ``long`` (uniform in [Q, longest]), ``short`` (uniform in [Q, Q + 16]), ``equal``
    (every request at ``longest``; on the cpu lane at one slot past the last whole split of the
    case's longest request: :data:`EQUAL_EXTRA_SPLIT`) and ``one_huge`` (short ones and one at
    :data:`HUGE_FACTOR` times ``longest``, at most :data:`HUGE_CAP`); ``longest`` capped at
    :data:`NEIGHBOUR_LONGEST_CAP` for the ``long`` and ``equal`` mixes."""
    from batchinv.fast.decode_attention import decode_attention_config

    a = dict(case.axes)
    r_count = max(int(a["R"]), NEIGHBOUR_REQUESTS[lane.is_gpu])
    longest = min(int(a["longest"]), NEIGHBOUR_LONGEST_CAP)
    huge = max(longest, min(int(a["longest"]) * HUGE_FACTOR[lane.is_gpu], HUGE_CAP))
    equal = longest
    if EQUAL_EXTRA_SPLIT[lane.is_gpu]:
        split = decode_attention_config("interp", int(a["D"]), DTYPES[a["dtype"]]).split_tokens
        equal = min(-(-_longest_request(a, split) // split) * split + 1, NEIGHBOUR_LONGEST_CAP)
    kinds = {
        "long": ("mixed", longest),
        "short": ("short", longest),
        "equal": ("equal", equal),
        "one_huge": ("one_huge", huge),
    }
    out = {}
    for i, mix in enumerate(NEIGHBOUR_MIXES):
        lengths, top = kinds[mix]
        axes = {**a, "R": r_count, "lengths": lengths, "longest": top}
        out[mix] = Case(case.component, axes, seed=case.seed + 7919 * (i + 1))
    return out


#: The paged request model (:class:`~batchinv.harness.requests.PagedLayout`): ``take`` keeps the
#: pools whole; ``concat`` concatenates the pools (no extra page), offsets each part's page ids
#: by the pages before it (-1 padding stays -1), pads block tables and sparse ``indices`` with -1
#: to the widest part and requires one ``scale``; ``relocate`` gives a fresh pool (1-4 pages more
#: than referenced, in a random order), copies each referenced page to its new place, NaN
#: elsewhere (the last page's tail included), and new table padding of the same width (random
#: page ids or -1).
PAGED = PagedLayout(
    ("k_cache", "v_cache"), ragged=("indices",), minus_one_padding=True, spare_pages=4, extra_columns=0
)
take = PAGED.take
concat = PAGED.concat
relocate = PAGED.relocate


# --- error inputs --------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs and the typed error each must raise (fast and reference alike)."""
    base = build(
        _case(
            R=2,
            Q=1,
            Hq=4,
            Hkv=2,
            D=16,
            page_size=16,
            dtype="bfloat16",
            lengths="edges",
            longest=33,
            sparse_k=0,
        ).with_seed(3),
        device,
    )
    good = base.kwargs()

    def bad(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    q, k, v, table = good["q"], good["k_cache"], good["v_cache"], good["block_table"]
    lens = good["seq_lens"]
    num_pages = k.shape[0]
    capacity = table.shape[1] * k.shape[1]  # tokens the table holds
    shortest = int(lens.min())
    idx_ok = torch.zeros(2, 1, 4, dtype=torch.int32, device=device)
    meta = torch.empty(q.shape, dtype=q.dtype, device="meta")
    out = [
        ErrorCase("q_float32", bad(q=q.float()), DTypeError, "'q'"),
        ErrorCase("kv_dtype_mismatch", bad(k_cache=k.half()), DTypeError, "'k_cache'"),
        ErrorCase("table_int64", bad(block_table=table.long()), DTypeError, "'block_table'"),
        ErrorCase("lens_int64", bad(seq_lens=lens.long()), DTypeError, "'seq_lens'"),
        ErrorCase("indices_int64", bad(indices=idx_ok.long()), DTypeError, "'indices'"),
        ErrorCase("scale_bool", bad(scale=True), DTypeError, "'scale'"),
        ErrorCase("scale_nan", bad(scale=math.nan), ArgumentError, "'scale'"),
        ErrorCase("scale_inf_in_fp32", bad(scale=1e300), ArgumentError, "'scale'"),
        ErrorCase("scale_past_fp64", bad(scale=10**400), ArgumentError, "'scale'"),
        ErrorCase("q_rank", bad(q=q[:, 0]), ArgumentError, "'q'"),
        ErrorCase(
            "head_dim_mismatch", bad(k_cache=k[..., :8], v_cache=v[..., :8]), ArgumentError, "'k_cache'"
        ),
        ErrorCase("kv_shape_mismatch", bad(v_cache=v[:-1]), ArgumentError, "'v_cache'"),
        ErrorCase(
            "heads_not_multiple", bad(q=torch.cat([q, q[:, :, :1]], dim=2)), ArgumentError, "'k_cache'"
        ),
        ErrorCase("lens_length", bad(seq_lens=lens[:1]), ArgumentError, "'seq_lens'"),
        ErrorCase("table_length", bad(block_table=table[:1]), ArgumentError, "'block_table'"),
        ErrorCase("indices_shape", bad(indices=idx_ok[:1]), ArgumentError, "'indices'"),
        ErrorCase(
            "negative_length",
            bad(seq_lens=torch.tensor([2, -1], dtype=torch.int32, device=device)),
            ArgumentError,
            "'seq_lens'",
        ),
        ErrorCase(
            "length_below_q",
            bad(q=torch.cat([q, q], dim=1), seq_lens=torch.tensor([1, 15], dtype=torch.int32, device=device)),
            ArgumentError,
            "'seq_lens'",
        ),
        ErrorCase(
            "length_beyond_table",
            bad(seq_lens=torch.tensor([2, capacity + 1], dtype=torch.int32, device=device)),
            ArgumentError,
            "'seq_lens'",
        ),
        ErrorCase(
            "page_id_too_large",
            bad(block_table=torch.cat([torch.full_like(table[:, :1], num_pages), table[:, 1:]], dim=1)),
            ArgumentError,
            "'block_table'",
        ),
        ErrorCase(
            "page_id_negative", bad(block_table=torch.full_like(table, -1)), ArgumentError, "'block_table'"
        ),
        ErrorCase(
            "index_beyond_length", bad(indices=torch.full_like(idx_ok, shortest)), ArgumentError, "'indices'"
        ),
        ErrorCase(
            "index_below_minus_one", bad(indices=torch.full_like(idx_ok, -2)), ArgumentError, "'indices'"
        ),
        ErrorCase("meta_q", bad(q=meta), DeviceError, "'q'"),
    ]
    if device.type == "cpu":
        out.append(ErrorCase("kv_on_meta", bad(k_cache=k.to("meta")), DeviceError, "'k_cache'"))
    else:
        out.append(ErrorCase("kv_on_cpu", bad(k_cache=k.cpu(), v_cache=v.cpu()), DeviceError, "'k_cache'"))
    return out


def bound(batch: Batch, reference: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The derived bound of :func:`batchinv.reference.decode_attention.attention_bound` for the
    fast kernel's split and chunk sizes on this device (its config table's entry)."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    q = batch.rows["q"]
    config = decode_attention_config(arch(q.device), q.shape[-1], q.dtype)
    kwargs = batch.kwargs()
    return ref_attention.attention_bound(
        **kwargs,
        reference=(reference[0], reference[1]),
        split_tokens=config.split_tokens,
        block_n=config.block_n,
    )


def _fp32_normal(x: torch.Tensor) -> torch.Tensor:
    """Where fp64 ``x`` is an fp32 value that is 0 or normal (no GPU flushes it)."""
    return (x.to(torch.float32).to(torch.float64) == x) & ((x == 0) | (x.abs() >= 2.0**-126))


def _exact_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a + b, exact)`` in fp64: the sum and where it is exact (Knuth's TwoSum error is 0)."""
    total = a + b
    b_virtual = total - a
    err = (a - (total - b_virtual)) + (b - b_virtual)
    return total, err == 0


def exact(batch: Batch, reference: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The o elements the fast kernel computes exactly, found from the data: (bool (R, Q, Hq, D),
    a 0-d False for lse: lse is a log, never exact).

    An element (r, i, h, c) is held when its token is dense and its keys and values are the
    ``merge_order`` design (:func:`_merge_order_kv`), checked here on the batch itself, so that
    take / concat / relocate keep it: q finite; every key of the context 0 (all scores 0); the
    context ``n`` a power-of-two count ``>= 2`` of whole splits of the lane's ``split_tokens``
    (``<= 2**13``); in channel c each split's values one constant ``v_s``, an fp32 value, normal
    or 0, with ``split_tokens * v_s`` too; every prefix ``v_0 + ... + v_s`` exact in fp64 and an
    fp32 value, normal or 0; ``o = (v_0 + ... + v_last) / n_splits`` nonzero (a zero's sign is
    not the design's), normal in fp32 and a value of the output dtype; the fp64 reference within
    ``2**-20 |o|`` of it (its weights exp(-log n) are not exactly 1/n, so it is o only to about
    2**-30 relative: it rounds once to o, never near a tie).  Everywhere else False:
    all other cases are judged by the bound alone.  The design is exact for any seed."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    q = batch.rows["q"]
    r_count, q_len, hq, d = q.shape
    mask_o = torch.zeros(r_count, q_len, hq, d, dtype=torch.bool)
    no_lse = torch.zeros((), dtype=torch.bool)
    if "indices" in batch.rows or q.numel() == 0:
        return mask_o, no_lse
    try:
        split_tokens = decode_attention_config(arch(q.device), d, q.dtype).split_tokens
    except ArgumentError:
        return mask_o, no_lse
    k_cache, v_cache = batch.shared["k_cache"], batch.shared["v_cache"]
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    table = batch.rows["block_table"].cpu().to(torch.int64)
    lens = [int(x) for x in batch.rows["seq_lens"].cpu()]
    capacity = table.shape[1] * page_size
    o_ref = reference[0].detach().cpu().to(torch.float64)
    q_cpu = q.detach().cpu()
    for r, length in enumerate(lens):
        if length <= 0 or split_tokens > 2**13:
            continue
        pages = table[r, : -(-length // page_size)].to(k_cache.device)
        k = k_cache.index_select(0, pages).reshape(-1, hkv, d)[:length].cpu().to(torch.float64)
        v = v_cache.index_select(0, pages).reshape(-1, hkv, d)[:length].cpu().to(torch.float64)
        for i in range(q_len):
            n = min(length - q_len + i + 1, capacity)
            n_splits = n // split_tokens
            if n <= 0 or n % split_tokens or n_splits < 2 or n_splits & (n_splits - 1):
                continue
            if not bool(torch.isfinite(q_cpu[r, i]).all()) or not bool((k[:n] == 0).all()):
                continue
            per_split = v[:n].reshape(n_splits, split_tokens, hkv, d)
            ok = (per_split == per_split[:, :1]).all(dim=1)  # [n_splits, Hkv, D]
            vals = per_split[:, 0]  # [n_splits, Hkv, D]
            ok &= _fp32_normal(vals) & _fp32_normal(vals * split_tokens)
            held = ok.all(dim=0)
            acc = vals[0]
            for s in range(1, n_splits):
                acc, exact_add = _exact_sum(acc, vals[s])
                held &= exact_add & _fp32_normal(acc)
            o = acc / n_splits  # exact in fp64: a power of two, no underflow at these magnitudes
            held &= _fp32_normal(o) & (o != 0)
            held &= round_once(o, q.dtype).to(torch.float64) == o  # a value of the output dtype
            held_q = held.repeat_interleave(group, dim=0)  # [Hq, D]
            o_q = o.repeat_interleave(group, dim=0)
            # The fp64 reference's weights exp(-log n) are not exactly 1/n: it is o to ~2**-30
            # relative (cancelling 2**25-apart values), far inside o's half ulp.
            mask_o[r, i] = held_q & ((o_ref[r, i] - o_q).abs() <= 2.0**-20 * o_q.abs())
    return mask_o.to(q.device), no_lse.to(q.device)


def split_tokens(batch: Batch) -> tuple[int, ...]:
    """The fast kernel's split size on the batch's device (its config table's entry): the
    phase check's mandatory positions are its multiples +-1."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    q = batch.rows["q"]
    try:
        return (decode_attention_config(arch(q.device), q.shape[-1], q.dtype).split_tokens,)
    except ArgumentError:
        return ()


def out_dtypes(batch: Batch) -> tuple[torch.dtype, ...]:
    """``o`` in q's dtype, ``lse`` in fp32."""
    return (batch.rows["q"].dtype, torch.float32)


COMPONENT = Component(
    name=NAME,
    summary="split-KV decode attention over a paged KV cache (dense, speculative q_len, sparse indices)",
    reference=ref_attention.decode_attention,
    fast=fast_attention.decode_attention,
    baselines=(
        Baseline(
            "batch_planned_splits",
            baselines.batch_planned_splits,
            "the flash-decoding heuristic: the number of KV splits fills the SMs given R x Hkv, so a "
            "request's split boundaries and merge order change with the other requests",
            caught_by=("co_batch",),  # a request's splits follow its co-batch: the check of its why
        ),
        Baseline(
            "sdpa_padded",
            baselines.sdpa_padded,
            "torch scaled_dot_product_attention on the padded batch (backend and tiling chosen per "
            "launch shape); reported, not required to vary",
            expected_to_vary_on=frozenset(),
        ),
        Baseline(
            "verify_splits",
            baselines.verify_splits,
            "a separately tuned verify path: q_len > 1 launches use twice decode's split size, so a "
            "token's split boundaries and merge tree depend on the phase that computes it (decode "
            "q_len 1 vs speculative verify); invariant along the batch, caught by the phase check",
            caught_by=("phase",),
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "softmax of fp32 scores and an fp32 split merge cannot equal the fp64 reference; the bound "
        "(reference.decode_attention.attention_bound) is derived from D, the split and chunk "
        "counts, exp/log accuracy and one rounding to the output dtype",
        out_dtypes=out_dtypes,
        exact=exact,
        exact_justification=(
            "merge_order requests (found from the data: zero keys, per-split constant values, a "
            "power-of-two count of whole splits): every score is 0, so each split's weights are "
            "exp(0) = 1, its partial o_s is its constant value exactly and every full split has the "
            "same lse, so every merge weight is exp(0) = 1; the ascending fp32 merge adds values whose "
            "prefix sums are fp32 values (checked) and divides by a power of two: o is the fp64 "
            "reference rounded once, bitwise; every other merge order (but the one swapping the first "
            "two splits, which commutative fp32 addition cannot tell apart) and the pairwise tree add "
            "the small value to a lone big value 2**25 larger in some channel of every kv head, which "
            "rounds"
        ),
    ),
    dtypes=(torch.bfloat16, torch.float16),
    error_cases=error_cases,
    bench_cases=bench_cases,
    bench_bytes=bench_bytes,
    requests=PAGED.model(neighbours=neighbours),
    phase=DecodePhaseModel(split_tokens),
    # the quick profile: case 0 is one request of q_len 1, where the phase check has no other
    # phase to compare (a skip); case 1 (three requests) gives it rows to re-launch
    quick_cases=lambda lane: (0, 1),
)
