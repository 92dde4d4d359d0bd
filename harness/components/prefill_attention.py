"""Request-level pieces of the ``prefill_attention`` component: cases, the case builder, error
inputs, the request model and the request-major adapter of the packed signature.

The registry entry, :data:`COMPONENT`, is at the end: a request-level component checked for
agreement, co_batch, slot, placement and repeat, over the paged request model of
``decode_attention`` (:mod:`batchinv.harness.components.decode_attention`'s take, concat and
relocate: pools concatenated, tables offset, relocation to other pages, NaN wherever no request
points) with the per-request ``q_lens`` row added.

Case axes: R, Hq, Hkv, D, page_size, dtype, ``mix`` (a :data:`MIXES` kind: how q_len and the
cached prefix are drawn per request), ``q_max`` (the longest q_len, and the padded width of a
request's rows), ``longest`` (the longest cached prefix), ``sparse_k`` (0: dense) and ``values``
(``normal``, or ``specials``: finite special bit patterns of :mod:`batchinv.harness.bitpatterns`
injected into q and the referenced K/V).  co_batch's neighbours mix requests in prefill and in
decode (q_len 1) and q_lens that cross the FlashAttention planner's ``max_seqlen_q x group``
thresholds (vLLM #51902), so its baseline is detected.

A :class:`Batch` holds per request (``rows``, dim 0 = requests): ``q`` (R, q_max, Hq, D) -- row
i < q_lens[r] is the request's new token i, the others NaN and never passed on --, ``q_lens``
(R,) int32, ``seq_lens`` (R,) (prefix + q_len), ``block_table`` (R, M) and, sparse, ``indices``
(R, q_max, K); ``shared``: ``k_cache``, ``v_cache`` (P, S, Hkv, D) and ``scale``.  The registry's
``fast``, ``reference`` and baselines are the packed functions behind :func:`request_major`: it
packs the valid rows into ``q [T, Hq, D]`` with ``cu_seqlens_q`` and scatters the outputs back
to (R, q_max, ...) with o = 0, lse = -inf in the padding rows (never computed).

Agreement: toleranced against the fp64 reference with ``decode_attention``'s derived bound
(:func:`batchinv.reference.decode_attention.attention_bound`), per request: a prefill request
of q_len Q is decode's request of q_len Q, row for row.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast import prefill_attention as fast_attention
from batchinv.fast.baselines import prefill_attention as baselines
from batchinv.harness.bitpatterns import catalogue, inject
from batchinv.harness.components import decode_attention as decode
from batchinv.harness.lanes import Lane
from batchinv.harness.phases import PaddedPrefillPhaseModel
from batchinv.harness.registry import (
    GPU_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    RequestModel,
    Toleranced,
)
from batchinv.harness.requests import nan_tails, pages_needed, table_padding
from batchinv.reference import decode_attention as ref_decode
from batchinv.reference import prefill_attention as ref_attention
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "prefill_attention"
DTYPES = decode.DTYPES

#: How a case draws (q_len, cached prefix) per request:
#: ``mixed``: q_len uniform in [1, q_max] (every third request in decode, q_len 1, after the
#: longest prefix), prefix in [0, longest]; ``edges``: prefixes at page and split boundaries +-1 of the cpu lane's table
#: (page 16, split 32) and 0, q_lens from :data:`EDGE_Q_LENS`; ``decode``: every request q_len 1;
#: ``verify``: q_len 2 or 4 (speculative verify); ``cold``: no prefix (a full prefill);
#: ``short``: q_len in [1, 4], prefix in [0, 16]; ``one_huge``: short requests and one with
#: prefix ``longest`` and q_len q_max; ``one_long``: short requests and one in decode (q_len 1)
#: after a prefix of ``longest``; ``uniform`` (the bench's): every request q_len q_max after a
#: prefix of ``longest``.
MIXES: tuple[str, ...] = (
    "mixed",
    "edges",
    "decode",
    "verify",
    "cold",
    "short",
    "one_huge",
    "one_long",
    "uniform",
)
EDGE_PREFIXES: tuple[int, ...] = (0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97)
EDGE_Q_LENS: tuple[int, ...] = (1, 2, 4, 7, 16, 17, 33, 40)


def _case(**axes: Any) -> Case:
    return Case(NAME, axes)


def cases(lane: Lane) -> list[Case]:
    """The sweep's cases on ``lane`` (axes: see the module docstring)."""
    out: list[Case] = []
    if lane is Lane.CPU:
        for r, hq, hkv, d, mix, q_max, longest, sparse_k, dtype, values in (
            # Three cases: the interpreter pays per program, and the phase check re-launches every
            # row of a request up to nine times (a full prefill of 40 rows costs seconds).  Longest
            # prefixes just past the split (32) and two pages (16): every cut kind is reachable.
            (2, 4, 2, 16, "mixed", 6, 40, 0, "bfloat16", "normal"),
            (2, 8, 2, 16, "edges", 8, 33, 0, "float16", "normal"),
            (2, 4, 2, 16, "mixed", 4, 34, 12, "float16", "specials"),
        ):
            out.append(
                _case(
                    R=r,
                    Hq=hq,
                    Hkv=hkv,
                    D=d,
                    page_size=16,
                    dtype=dtype,
                    mix=mix,
                    q_max=q_max,
                    longest=longest,
                    sparse_k=sparse_k,
                    values=values,
                )
            )
        return out
    for dtype in DTYPES:
        for hq, hkv in ((32, 8), (16, 2)):
            for d in (64, 128, 256):
                for mix, q_max, longest in (("mixed", 512, 4096), ("edges", 40, 1024), ("decode", 1, 4096)):
                    out.append(
                        _case(
                            R=8,
                            Hq=hq,
                            Hkv=hkv,
                            D=d,
                            page_size=16,
                            dtype=dtype,
                            mix=mix,
                            q_max=q_max,
                            longest=longest,
                            sparse_k=0,
                            values="normal",
                        )
                    )
    out.append(
        _case(
            R=8,
            Hq=16,
            Hkv=2,
            D=128,
            page_size=64,
            dtype="bfloat16",
            mix="mixed",
            q_max=64,
            longest=4096,
            sparse_k=2048,
            values="normal",
        )
    )
    return out


def _plan(
    mix: str, count: int, q_max: int, longest: int, seed: int, gen: torch.Generator
) -> list[tuple[int, int]]:
    """(q_len, prefix) per request."""
    if mix == "mixed":
        q_lens = [int(v) for v in torch.randint(1, q_max + 1, (count,), generator=gen)]
        q_lens = [1 if (seed + r) % 3 == 0 else n for r, n in enumerate(q_lens)]
        prefixes = [int(v) for v in torch.randint(0, longest + 1, (count,), generator=gen)]
        # a request in decode has the longest prefix: several splits, so a planner whose split
        # moves with the batch's max_seqlen_q moves its merge tree
        prefixes = [longest if n == 1 else p for n, p in zip(q_lens, prefixes, strict=True)]
        return list(zip(q_lens, prefixes, strict=True))
    if mix == "edges":
        return [
            (
                min(q_max, EDGE_Q_LENS[(seed + 3 * r) % len(EDGE_Q_LENS)]),
                min(longest, EDGE_PREFIXES[(seed + 5 * r) % len(EDGE_PREFIXES)]),
            )
            for r in range(count)
        ]
    if mix == "decode":
        return [(1, int(v)) for v in torch.randint(0, longest + 1, (count,), generator=gen)]
    if mix == "verify":
        return [
            (min(q_max, (2, 4)[(seed + r) % 2]), int(torch.randint(0, longest + 1, (1,), generator=gen)))
            for r in range(count)
        ]
    if mix == "uniform":  # the bench's: every request q_len q_max after a prefix of longest
        return [(q_max, longest)] * count
    if mix == "cold":
        return [(int(v), 0) for v in torch.randint(1, q_max + 1, (count,), generator=gen)]
    if mix in ("short", "one_huge", "one_long"):
        out = [
            (
                int(torch.randint(1, min(4, q_max) + 1, (1,), generator=gen)),
                int(torch.randint(0, 17, (1,), generator=gen)),
            )
            for _ in range(count)
        ]
        if mix != "short" and count:
            at = int(torch.randint(count, (1,), generator=gen))
            out[at] = (q_max, longest) if mix == "one_huge" else (1, longest)
        return out
    raise ValueError(f"mix: expected one of {MIXES}, got {mix!r}")


def _sparse_indices(
    q_lens: Sequence[int], lens: Sequence[int], q_max: int, k: int, seed: int, gen: torch.Generator
) -> torch.Tensor:
    """(R, q_max, K) int32: per row at position p a random set of positions <= p (ascending for
    even requests, shuffled for odd ones) and a -1 tail; every fourth request (by seed) an empty
    context (all -1); padding rows all -1."""
    out = torch.full((len(lens), q_max, k), -1, dtype=torch.int32)
    for r, (q_len, length) in enumerate(zip(q_lens, lens, strict=True)):
        if (seed + r) % 4 == 0:
            continue
        for i in range(q_len):
            visible = length - q_len + i + 1
            count = int(torch.randint(1, min(k, visible) + 1, (1,), generator=gen))
            chosen = torch.randperm(visible, generator=gen)[:count]
            if r % 2 == 0:
                chosen = chosen.sort().values
            out[r, i, :count] = chosen.to(torch.int32)
    return out


def _specials(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``t`` with about 3% of its elements replaced by the dtype's finite special values (+-0,
    subnormals, min normal): scores and sums stay in the fp32 contract's range."""
    finite = [
        p for p in catalogue(t.dtype) if "nan" not in p.name and "inf" not in p.name and "max" not in p.name
    ]
    return inject(t, finite, 0.03, gen)


def build(case: Case, device: torch.device) -> Batch:
    """The batch of ``case``: a deterministic function of its axes and seed."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[a["dtype"]]
    r_count, hq, hkv, d, page_size, q_max = a["R"], a["Hq"], a["Hkv"], a["D"], a["page_size"], a["q_max"]
    plan = _plan(a["mix"], r_count, q_max, a["longest"], case.seed, gen)
    q_lens = [n for n, _ in plan]
    lens = [n + prefix for n, prefix in plan]
    need = pages_needed(lens, page_size)
    spare = 1 + int(torch.randint(3, (1,), generator=gen))
    num_pages = sum(need) + spare
    max_pages = max(need, default=0) + 1 + (case.seed % 2)  # an odd page count every other seed
    perm = torch.randperm(num_pages, generator=gen)
    table = table_padding((r_count, max_pages), num_pages, gen, minus_one=True)
    k_cache = torch.full((num_pages, page_size, hkv, d), math.nan, dtype=dtype)
    v_cache = torch.full((num_pages, page_size, hkv, d), math.nan, dtype=dtype)
    specials = a["values"] == "specials"
    taken = 0
    for r in range(r_count):
        ids = perm[taken : taken + need[r]]
        taken += need[r]
        table[r, : need[r]] = ids
        k = torch.randn(need[r], page_size, hkv, d, generator=gen).to(dtype)
        v = torch.randn(need[r], page_size, hkv, d, generator=gen).to(dtype)
        k_cache[ids] = _specials(k, gen) if specials else k
        v_cache[ids] = _specials(v, gen) if specials else v
    nan_tails(k_cache, table, lens)
    nan_tails(v_cache, table, lens)
    q = torch.full((r_count, q_max, hq, d), math.nan, dtype=dtype)
    for r, n in enumerate(q_lens):
        rows = torch.randn(n, hq, d, generator=gen).to(dtype)
        q[r, :n] = _specials(rows, gen) if specials else rows
    rows_: dict[str, torch.Tensor] = {
        "q": q,
        "q_lens": torch.tensor(q_lens, dtype=torch.int32),
        "seq_lens": torch.tensor(lens, dtype=torch.int32),
        "block_table": table.to(torch.int32),
    }
    if a["sparse_k"]:
        rows_["indices"] = _sparse_indices(q_lens, lens, q_max, a["sparse_k"], case.seed, gen)
    return Batch(
        {name: t.to(device) for name, t in rows_.items()},
        {"k_cache": k_cache.to(device), "v_cache": v_cache.to(device), "scale": 1.0 / math.sqrt(d)},
    )


# --- the request-major adapter -------------------------------------------------------------------


def pack(
    q: torch.Tensor, q_lens: torch.Tensor, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Request-major rows -> the packed ``(q [T, Hq, D], cu_seqlens_q [R + 1] int32, indices
    [T, K])`` of :func:`~batchinv.fast.prefill_attention.prefill_attention` (a q_len <= 0 gives
    an empty or unsorted ``cu_seqlens_q``, which the function refuses)."""
    n = [int(v) for v in q_lens.tolist()]
    cu = torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=q.device)
    if q.dim() != 4:
        return q, cu, indices  # not request-major: passed on for the function to refuse
    rows = _valid_rows(n, q.shape[1], q.device)  # one gather: a bench times the kernel, not the packing
    packed = q.reshape(-1, *q.shape[2:]).index_select(0, rows)
    idx = None
    if indices is not None:
        idx = indices.reshape(-1, indices.shape[-1]).index_select(0, rows)
    return packed, cu, idx


def _valid_rows(q_lens: Sequence[int], q_max: int, device: torch.device) -> torch.Tensor:
    """The flat indices ``r * q_max + i`` (``i < q_lens[r]``) of the request-major rows, int64."""
    flat = [r * q_max + i for r, k in enumerate(q_lens) for i in range(max(0, min(k, q_max)))]
    return torch.tensor(flat, dtype=torch.long, device=device)


def request_major(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``fn`` (the packed signature) on a request-major batch: outputs (R, q_max, Hq, D) and
    (R, q_max, Hq), the padding rows o = 0, lse = -inf (set here, never computed)."""

    def subject(
        q: torch.Tensor,
        q_lens: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: Any,
        indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        packed, cu, idx = pack(q, q_lens, indices)
        o, lse = fn(packed, k_cache, v_cache, block_table, cu, seq_lens, scale=scale, indices=idx)
        r_count, q_max = q.shape[0], q.shape[1]
        o_out = torch.zeros((r_count, q_max, *o.shape[1:]), dtype=o.dtype, device=o.device)
        lse_out = torch.full((r_count, q_max, lse.shape[1]), -math.inf, dtype=lse.dtype, device=lse.device)
        rows = _valid_rows([int(v) for v in q_lens.tolist()], q_max, o.device)
        o_out.view(-1, *o.shape[1:]).index_copy_(0, rows, o)
        lse_out.view(-1, lse.shape[1]).index_copy_(0, rows, lse)
        return o_out, lse_out

    subject.__name__ = getattr(fn, "__name__", "prefill_attention")
    subject.__qualname__ = subject.__name__
    subject.__doc__ = (
        f"Request-major adapter of {subject.__name__} (harness/components/prefill_attention.py)."
    )
    return subject


# --- the request model -------------------------------------------------------------------------

#: The other requests' mixes of co_batch (in order; slot uses the first): short requests in
#: prefill and decode together, all in decode, one request of q_len q_max among short ones (its
#: max_seqlen_q x group crosses the FA planner's thresholds), one long decode among short ones.
NEIGHBOUR_MIXES: tuple[str, ...] = ("short", "decode", "long_q", "one_long")
#: The longest cached prefix of a neighbour (the interpreter pays per split; the huge one: 2x the
#: case's longest).
NEIGHBOUR_PREFIX_CAP = 32


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """The other requests of co_batch and slot, one case per :data:`NEIGHBOUR_MIXES` mix, with
    ``case``'s shape axes (q_max included, so ``concat`` joins them) and derived seeds."""
    a = dict(case.axes)
    r_count = max(int(a["R"]), decode.NEIGHBOUR_REQUESTS[lane.is_gpu])
    longest = max(16, int(a["longest"]))
    cap = longest if lane.is_gpu else min(longest, NEIGHBOUR_PREFIX_CAP)
    kinds = {
        "short": ("short", cap),
        "decode": ("decode", cap),
        "long_q": ("one_huge", min(cap, 32)),
        "one_long": ("one_long", 2 * longest),
    }
    out = {}
    for i, mix in enumerate(NEIGHBOUR_MIXES):
        kind, top = kinds[mix]
        axes = {**a, "R": r_count, "mix": kind, "longest": top, "values": "normal"}
        out[mix] = Case(case.component, axes, seed=case.seed + 7919 * (i + 1))
    return out


def concat(parts: Sequence[Batch]) -> Batch:
    """decode_attention's concat (pools concatenated, tables offset, -1 padding) with the
    ``q_lens`` rows joined too; the parts share q_max."""
    joined = decode.concat(parts)
    rows = dict(joined.rows)
    rows["q_lens"] = torch.cat([p.rows["q_lens"] for p in parts])
    order = ["q", "q_lens", "seq_lens", "block_table", *(["indices"] if "indices" in rows else [])]
    return Batch({k: rows[k] for k in order}, joined.shared)


# --- error inputs --------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs and the typed error each must raise (fast and reference alike)."""
    base = build(
        _case(
            R=2,
            Hq=4,
            Hkv=2,
            D=16,
            page_size=16,
            dtype="bfloat16",
            mix="edges",
            q_max=4,
            longest=33,
            sparse_k=0,
            values="normal",
        ).with_seed(3),
        device,
    )
    good = base.kwargs()

    def bad(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    q, k, table, lens, q_lens = (
        good["q"],
        good["k_cache"],
        good["block_table"],
        good["seq_lens"],
        good["q_lens"],
    )
    capacity = table.shape[1] * k.shape[1]

    def i32(values: Any) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return [
        ErrorCase("q_float32", bad(q=q.float()), DTypeError, "'q'"),
        ErrorCase("kv_dtype_mismatch", bad(k_cache=k.half()), DTypeError, "'k_cache'"),
        ErrorCase("table_int64", bad(block_table=table.long()), DTypeError, "'block_table'"),
        ErrorCase("lens_int64", bad(seq_lens=lens.long()), DTypeError, "'seq_lens'"),
        ErrorCase("scale_nan", bad(scale=math.nan), ArgumentError, "'scale'"),
        ErrorCase("q_len_zero", bad(q_lens=i32([0, 1])), ArgumentError, "'cu_seqlens_q'"),
        ErrorCase("q_len_negative", bad(q_lens=i32([2, -1])), ArgumentError, "'cu_seqlens_q'"),
        ErrorCase(
            "q_len_above_seq_len",
            bad(q_lens=i32([2, 2]), seq_lens=i32([1, 2])),
            ArgumentError,
            "'seq_lens'",
        ),
        ErrorCase(
            "length_beyond_table",
            bad(seq_lens=i32([int(q_lens[0]) + 1, capacity + 1])),
            ArgumentError,
            "'seq_lens'",
        ),
        ErrorCase(
            "page_id_negative", bad(block_table=torch.full_like(table, -1)), ArgumentError, "'block_table'"
        ),
        ErrorCase(
            "index_beyond_position",
            bad(indices=torch.full((2, q.shape[1], 4), capacity, dtype=torch.int32, device=device)),
            ArgumentError,
            "'indices'",
        ),
        ErrorCase(
            "index_after_tail",
            bad(indices=i32([[[-1, 0]] * q.shape[1]] * 2)),
            ArgumentError,
            "'indices'",
        ),
        ErrorCase("meta_q", bad(q=torch.empty(q.shape, dtype=q.dtype, device="meta")), DeviceError, "'q'"),
    ]


# --- agreement -----------------------------------------------------------------------------------


def bound(batch: Batch, reference: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """decode_attention's derived bound (:func:`~batchinv.reference.decode_attention.attention_bound`)
    for the decode table's split and chunk sizes on this device, request by request (request r of
    q_len Q is decode's request of q_len Q); 0 in the padding rows (exactly 0 and -inf there)."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    rows = batch.rows
    q = rows["q"]
    config = decode_attention_config(arch(q.device), q.shape[-1], q.dtype)
    o_bound = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse_bound = torch.zeros(q.shape[:3], dtype=torch.float64, device=q.device)
    for r, n in enumerate(int(v) for v in rows["q_lens"].tolist()):
        one = slice(r, r + 1)
        idx = rows["indices"][one, :n] if "indices" in rows else None
        o_r, lse_r = ref_decode.attention_bound(
            q[one, :n],
            batch.shared["k_cache"],
            batch.shared["v_cache"],
            rows["block_table"][one],
            rows["seq_lens"][one],
            batch.shared["scale"],
            idx,
            reference=(reference[0][one, :n], reference[1][one, :n]),
            split_tokens=config.split_tokens,
            block_n=config.block_n,
        )
        o_bound[r, :n] = o_r[0]
        lse_bound[r, :n] = lse_r[0]
    return o_bound, lse_bound


def out_dtypes(batch: Batch) -> tuple[torch.dtype, ...]:
    """``o`` in q's dtype, ``lse`` in fp32."""
    return (batch.rows["q"].dtype, torch.float32)


#: ``batchinv bench`` points (R, q_len, cached prefix): prefills of 512..8192 tokens, R 1..32,
#: and chunked prefills after a cached prefix.
BENCH_POINTS: tuple[tuple[int, int, int], ...] = (
    (1, 512, 0),
    (1, 2048, 0),
    (1, 8192, 0),
    (8, 2048, 0),
    (32, 512, 0),
    (64, 512, 0),
    (8, 512, 2048),
    (1, 1024, 7168),
)


def bench_cases(lane: Lane) -> list[Case]:
    """``batchinv bench`` cases (GPU lanes): :data:`BENCH_POINTS` at Hq 32 / Hkv 8, D 128, bf16,
    page 16, every request alike (``uniform``)."""
    if not lane.is_gpu:
        return []
    return [
        _case(
            R=r,
            Hq=32,
            Hkv=8,
            D=128,
            page_size=16,
            dtype="bfloat16",
            mix="uniform",
            q_max=q,
            longest=prefix,
            sparse_k=0,
            values="normal",
        )
        for r, q, prefix in BENCH_POINTS
    ]


def bench_flops(batch: Batch) -> int:
    """The causal attention's flops: per query row at position p, (p + 1) keys x D x Hq x 4 (the
    scores' and the weighted values' multiply-adds)."""
    q = batch.rows["q"]
    hq, d = q.shape[2], q.shape[3]
    total = 0
    for n, length in zip(batch.rows["q_lens"].tolist(), batch.rows["seq_lens"].tolist(), strict=True):
        first = length - n + 1  # keys of the first new row
        total += (first + length) * n // 2 * 4 * d * hq
    return total


def bench_bytes(batch: Batch) -> int:
    """q and o once, each request's K and V once, lse once."""
    q, k = batch.rows["q"], batch.shared["k_cache"]
    rows = int(batch.rows["q_lens"].sum())
    keys = int(batch.rows["seq_lens"].sum())
    per_row = q.shape[2] * q.shape[3] * q.element_size()
    per_key = 2 * k.shape[2] * k.shape[3] * k.element_size()
    return rows * (2 * per_row + 4 * q.shape[2]) + keys * per_key


def _take(batch: Batch, requests: Sequence[int]) -> Batch:
    return decode.take(batch, requests)


COMPONENT = Component(
    name=NAME,
    summary="varlen causal prefill attention over a paged KV cache: the decode kernel on packed rows (one tree for all phases)",
    reference=request_major(ref_attention.prefill_attention),
    fast=request_major(fast_attention.prefill_attention),
    baselines=(
        Baseline(
            "max_seqlen_planned_splits",
            request_major(baselines.max_seqlen_planned_splits),
            "the FlashAttention-3-style planner: the split size from the batch's max_seqlen_q x GQA "
            "group with vLLM #51902's thresholds (9/16/32/64), so a request's split boundaries move "
            "when a neighbour with a longer q_len joins",
        ),
        Baseline(
            "chunk_planned_splits",
            request_major(baselines.chunk_planned_splits),
            "greedy packed chunks of 8 rows, each chunk's splits counted from its first query "
            "position instead of the request's first key: where the packing puts a request moves "
            "its split boundaries",
            caught_by=("phase",),  # a chunked prefill packs a request's rows otherwise
            timed=False,  # a construction (one launch per chunk from Python), not a production speed
        ),
        Baseline(
            "sdpa_flash_dense",
            request_major(baselines.sdpa_flash_dense),
            "bench only: torch SDPA's flash backend on the same problem laid out dense (every "
            "request alike; converted once, outside the timed call) -- the speed reference of "
            "issue 24, not a pinned path; other batches are Unsupported",
            expected_to_vary_on=frozenset(),
            lanes=GPU_LANES,
        ),
        Baseline(
            "phase_paired",
            request_major(baselines.phase_paired),
            "the production pairing: q_len > 1 requests through a prefill config (twice the split), "
            "q_len 1 requests through the decode table's: batch-invariant per request, but a token's "
            "bits depend on its phase -- the negative control of the phase check",
            caught_by=("phase",),
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "softmax of fp32 scores and an fp32 split merge cannot equal the fp64 reference; the bound "
        "is decode_attention's (reference.decode_attention.attention_bound), per request: a prefill "
        "request of q_len Q runs decode's per-row program for q_len Q",
        out_dtypes=out_dtypes,
    ),
    dtypes=(torch.bfloat16, torch.float16),
    error_cases=error_cases,
    requests=RequestModel(
        take=_take,
        concat=concat,
        relocate=decode.relocate,
        neighbours=neighbours,
        rewrite_others=decode.PAGED.rewrite_others,
    ),
    phase=PaddedPrefillPhaseModel(decode.split_tokens),
    bench_cases=bench_cases,
    bench_bytes=bench_bytes,
    bench_flops=bench_flops,
)
