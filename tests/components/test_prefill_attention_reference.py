"""Tests of the prefill attention reference and of ``visible_key_ranges`` (issue 24's groundwork):

* hypothesis-driven small paged cases (ragged q_len, cached prefixes, page sizes, GQA, sparse
  indices with empty rows) checked against ``torch.nn.functional.scaled_dot_product_attention``
  in fp64 on K/V gathered position by position (allclose: another order of operations), with
  exact o = +0 / lse = -inf on empty rows and no NaN from the NaN-filled unreferenced memory;
* bitwise invariance along the request axes (alone == in a batch == in other pages);
* one schedule for all phases, on the reference: q_len 1, 2, 4 give decode's reference bits, and
  a prefill cut into a cached prefix and a continuation at every cut gives the full prefill's;
* every typed error;
* the SDPA mask ranges: Hugging Face-style left- and right-padded masks (boolean and additive,
  built here), SDPA's top-left ``is_causal`` checked against torch itself, the refusals.

Expected values come from the definitions (positions, padding lengths) or from torch's own
SDPA, never from the code under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from batchinv.harness.requests import nan_filled_pages, pages_needed
from batchinv.harness.requests import seq_lens as seq_len_strategy
from batchinv.reference.attention_mask import causal_limit, visible_key_ranges
from batchinv.reference.decode_attention import decode_attention, fp32_scale
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.exact import round_once
from batchinv.reference.prefill_attention import default_scale, prefill_attention

pytestmark = pytest.mark.cpu

DTYPES = (torch.bfloat16, torch.float16)


# --- paged cases ----------------------------------------------------------------------------


@dataclass
class Case:
    """A paged prefill launch: the call's arguments and, per row, its request and position."""

    q: torch.Tensor  # (T, Hq, D)
    k_cache: torch.Tensor  # (P, S, Hkv, D)
    v_cache: torch.Tensor  # (P, S, Hkv, D)
    block_table: torch.Tensor  # (R, M) int32
    cu_seqlens_q: torch.Tensor  # (R + 1,)
    seq_lens: torch.Tensor  # (R,) int32
    scale: float
    indices: torch.Tensor | None  # (T, K) int32
    request: list[int]  # (T,)
    position: list[int]  # (T,)
    args: dict  # what build() was given

    def rebuilt(self, **changes) -> Case:
        return build(**(self.args | changes))

    def kwargs(self) -> dict:
        return dict(
            q=self.q,
            k_cache=self.k_cache,
            v_cache=self.v_cache,
            block_table=self.block_table,
            cu_seqlens_q=self.cu_seqlens_q,
            seq_lens=self.seq_lens,
            scale=self.scale,
            indices=self.indices,
        )


def build(
    requests: list[tuple[int, int]],
    *,
    page_size: int = 4,
    hkv: int = 2,
    group: int = 2,
    d: int = 8,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    placement_seed: int | None = None,
    sparse_k: int | None = None,
    cu_dtype: torch.dtype = torch.int32,
) -> Case:
    """Requests given as (seq_len, q_len).  The data (K/V per position, q, indices) comes from
    ``seed`` alone and the page placement from ``placement_seed``: pages in a random order, 1-2
    spare NaN pages, table padding columns pointing at a NaN page, every unreferenced token NaN."""
    args = dict(locals())
    data = torch.Generator().manual_seed(seed)
    place = torch.Generator().manual_seed(seed if placement_seed is None else placement_seed + 10**6)
    hq = hkv * group
    lens = [length for length, _ in requests]
    need = pages_needed(lens, page_size)
    spare = 1 + int(torch.randint(2, (1,), generator=place))
    total = sum(need) + spare
    order = torch.randperm(total, generator=place).tolist()
    nan_page = order[-1]  # never referenced
    width = max(need, default=0) + int(torch.randint(3, (1,), generator=place))
    table = torch.full((len(requests), width), nan_page, dtype=torch.int32)
    k_cache = nan_filled_pages(total, page_size, hkv, d, dtype=dtype)
    v_cache = nan_filled_pages(total, page_size, hkv, d, dtype=dtype)
    cursor = 0
    for r, length in enumerate(lens):
        k = torch.randn(length, hkv, d, generator=data).to(dtype)  # [L, Hkv, D], by position
        v = torch.randn(length, hkv, d, generator=data).to(dtype)
        for j in range(need[r]):
            page = order[cursor]
            cursor += 1
            table[r, j] = page
            n = min(page_size, length - j * page_size)
            k_cache[page, :n] = k[j * page_size : j * page_size + n]
            v_cache[page, :n] = v[j * page_size : j * page_size + n]
    cu = [0]
    request, position = [], []
    for r, (length, q_len) in enumerate(requests):
        cu.append(cu[-1] + q_len)
        request += [r] * q_len
        position += list(range(length - q_len, length))
    t = cu[-1]
    q = (2 * torch.randn(t, hq, d, generator=data)).to(dtype)  # wide enough scores
    indices = None
    if sparse_k is not None:
        indices = torch.full((t, sparse_k), -1, dtype=torch.int32)
        for row, p in enumerate(position):
            n = int(torch.randint(min(sparse_k, p + 1) + 1, (1,), generator=data))  # 0: an empty row
            indices[row, :n] = torch.randperm(p + 1, generator=data)[:n].to(torch.int32)
    return Case(
        q,
        k_cache,
        v_cache,
        table,
        torch.tensor(cu, dtype=cu_dtype),
        torch.tensor(lens, dtype=torch.int32),
        default_scale(d) * 1.5,
        indices,
        request,
        position,
        args,
    )


def dense_kv(case: Case, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request r's keys and values by position, read one token at a time: [L, Hkv, D] fp64."""
    s = case.k_cache.shape[1]
    length = int(case.seq_lens[r])
    slots = [(int(case.block_table[r, p // s]), p % s) for p in range(length)]  # L >= q_len >= 1
    k = torch.stack([case.k_cache[page, off] for page, off in slots])
    v = torch.stack([case.v_cache[page, off] for page, off in slots])
    return k.double(), v.double()


def sdpa_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch's SDPA in fp64 over the gathered keys (dense: a bottom-right causal mask per
    request; sparse: the listed keys of each row) and lse from a masked logsumexp.  Returns
    (o [T, Hq, D], lse [T, Hq], empty [T])."""
    t_count, hq, d = case.q.shape
    hkv = case.k_cache.shape[2]
    s = fp32_scale(case.scale)
    o = torch.zeros(t_count, hq, d, dtype=torch.float64)
    lse = torch.full((t_count, hq), -math.inf, dtype=torch.float64)
    empty = torch.zeros(t_count, dtype=torch.bool)
    cu = case.cu_seqlens_q.tolist()
    group = hq // hkv
    for r in range(len(cu) - 1):
        k, v = dense_kv(case, r)  # [L, Hkv, D]
        length = k.shape[0]
        if case.indices is None:  # one call per request: q rows [1, Hq, Q, D], a bottom-right mask
            rows = slice(cu[r], cu[r + 1])
            qr = case.q[rows].double().transpose(0, 1)[None]  # [1, Hq, Q, D]
            kr, vr = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, L, D]
            positions = torch.tensor(case.position[rows])  # [Q]
            allowed = torch.arange(length)[None, :] <= positions[:, None]  # [Q, L]
            out = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=allowed, scale=s, enable_gqa=True)
            o[rows] = out[0].transpose(0, 1)
            scores = (qr[0] @ kr[0].repeat_interleave(group, 0).transpose(-1, -2)) * s  # [Hq, Q, L]
            lse[rows] = torch.logsumexp(scores.masked_fill(~allowed, -math.inf), dim=-1).T
            continue
        for t in range(cu[r], cu[r + 1]):  # sparse: the listed keys of each row, no mask
            chosen = [int(i) for i in case.indices[t].tolist() if i >= 0]
            if not chosen:
                empty[t] = True
                continue
            kc = k[chosen].transpose(0, 1)[None]  # [1, Hkv, N, D]
            vc = v[chosen].transpose(0, 1)[None]
            qt = case.q[t].double()[None, :, None, :]  # [1, Hq, 1, D]
            o[t] = F.scaled_dot_product_attention(qt, kc, vc, scale=s, enable_gqa=True)[0, :, 0]
            scores = (qt[0] @ kc[0].repeat_interleave(group, 0).transpose(-1, -2)) * s  # [Hq, 1, N]
            lse[t] = torch.logsumexp(scores[:, 0], dim=-1)  # [Hq]
    return o, lse, empty


@st.composite
def cases(draw) -> Case:
    page_size = draw(st.sampled_from([1, 2, 4, 16]))
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        length = draw(seq_len_strategy(40, page_size))
        q_len = draw(st.one_of(st.just(1), st.just(length), st.integers(1, length)))  # decode, cold, cached
        requests.append((length, q_len))
    sparse = draw(st.booleans())
    return build(
        requests,
        page_size=page_size,
        hkv=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 3])),
        d=draw(st.sampled_from([1, 5, 8, 16])),
        dtype=draw(st.sampled_from(DTYPES)),
        seed=draw(st.integers(0, 2**16)),
        sparse_k=draw(st.sampled_from([0, 1, 3, 8])) if sparse else None,
        cu_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
    )


# --- values ---------------------------------------------------------------------------------


@settings(max_examples=25)
@given(cases())
def test_rows_agree_with_torch_sdpa_on_gathered_kv(case):
    o, lse = prefill_attention(**case.kwargs())
    t_count, hq, d = case.q.shape
    assert o.shape == (t_count, hq, d) and lse.shape == (t_count, hq)
    assert o.dtype == lse.dtype == torch.float64
    assert not o.isnan().any() and not lse.isnan().any()  # the NaN pages and tails are never read
    want_o, want_lse, empty = sdpa_rows(case)
    assert (lse[empty] == -math.inf).all()
    assert (o[empty] == 0).all() and not torch.signbit(o[empty]).any()
    torch.testing.assert_close(o[~empty], want_o[~empty], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse[~empty], want_lse[~empty], rtol=1e-12, atol=1e-12)


@settings(max_examples=15)
@given(cases(), st.integers(0, 2**16))
def test_a_request_alone_in_a_batch_and_in_other_pages_gives_the_same_bits(case, placement):
    o, lse = prefill_attention(**case.kwargs())
    moved = case.rebuilt(placement_seed=placement)
    o_moved, lse_moved = prefill_attention(**moved.kwargs())
    assert torch.equal(o, o_moved) and torch.equal(lse, lse_moved)
    cu = case.cu_seqlens_q.tolist()
    for r in range(len(cu) - 1):
        rows = slice(cu[r], cu[r + 1])
        alone = dict(case.kwargs())
        alone.update(
            q=case.q[rows],
            block_table=case.block_table[r : r + 1],
            cu_seqlens_q=torch.tensor([0, cu[r + 1] - cu[r]], dtype=case.cu_seqlens_q.dtype),
            seq_lens=case.seq_lens[r : r + 1],
            indices=None if case.indices is None else case.indices[rows],
        )
        o_r, lse_r = prefill_attention(**alone)
        assert torch.equal(o_r, o[rows]) and torch.equal(lse_r, lse[rows])


def test_rounded_outputs_are_the_fp64_values_rounded_once():
    case = build([(9, 3), (5, 5), (6, 1)], sparse_k=3, seed=3)
    o, lse = prefill_attention(**case.kwargs())
    o16, lse32 = prefill_attention(**case.kwargs(), rounded=True)
    assert o16.dtype == case.q.dtype and lse32.dtype == torch.float32
    assert torch.equal(o16, round_once(o, case.q.dtype)) and torch.equal(
        lse32, round_once(lse, torch.float32)
    )
    empty = lse == -math.inf
    assert empty.any()  # sparse_k = 3 over 14 rows with seed 3 leaves empty rows
    assert (lse32[empty] == -math.inf).all() and not torch.signbit(o16[empty].float()).any()


def test_the_default_scale_is_one_over_sqrt_d():
    case = build([(7, 4)], d=16)
    explicit = dict(case.kwargs(), scale=0.25)
    default = dict(case.kwargs())
    del default["scale"]
    for a, b in zip(prefill_attention(**explicit), prefill_attention(**default), strict=True):
        assert torch.equal(a, b)


def test_empty_work():
    """T = 0 (no requests) gives empty outputs; a sparse launch of 0 index slots gives every row
    o = +0 and lse = -inf."""
    case = build([(5, 2)], sparse_k=0)
    o, lse = prefill_attention(**case.kwargs())
    assert (o == 0).all() and not torch.signbit(o).any() and (lse == -math.inf).all()
    none = dict(
        case.kwargs(),
        q=case.q[:0],
        block_table=case.block_table[:0],
        cu_seqlens_q=torch.tensor([0], dtype=torch.int32),
        seq_lens=case.seq_lens[:0],
        indices=None,
    )
    o, lse = prefill_attention(**none)
    assert o.shape == (0, *case.q.shape[1:]) and lse.shape == (0, case.q.shape[1])


def test_nan_in_unreferenced_memory_and_future_positions_never_reaches_a_row():
    """Every unreferenced token is NaN (build); a NaN written at a request's last position (a
    key the earlier rows must not see) reaches that row only."""
    case = build([(10, 6), (7, 3)], page_size=4, seed=5)
    p = 9  # request 0's last position
    page = int(case.block_table[0, p // 4])
    case.v_cache[page, p % 4, 0, 0] = float("nan")
    o, lse = prefill_attention(**case.kwargs())
    nan_rows = o.isnan().any(dim=(1, 2))  # [T]
    assert nan_rows.tolist() == [False] * 5 + [True] + [False] * 3
    assert not lse.isnan().any()  # the NaN is in v: the weights stay finite


# --- one schedule for all phases ------------------------------------------------------------


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_uniform_q_len_gives_the_decode_reference_bits(q_len, sparse):
    lens = [q_len, q_len + 1, 7, 16, 17, 33]
    case = build(
        [(n, q_len) for n in lens], page_size=4, hkv=2, group=3, seed=q_len, sparse_k=5 if sparse else None
    )
    o, lse = prefill_attention(**case.kwargs())
    r, hq, d = len(lens), case.q.shape[1], case.q.shape[2]
    indices = None if case.indices is None else case.indices.reshape(r, q_len, -1)
    want_o, want_lse = decode_attention(
        case.q.reshape(r, q_len, hq, d),
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.seq_lens,
        case.scale,
        indices,
    )
    assert torch.equal(o.reshape(r, q_len, hq, d), want_o) and torch.equal(
        lse.reshape(r, q_len, hq), want_lse
    )
    o16, lse32 = prefill_attention(**case.kwargs(), rounded=True)
    assert torch.equal(o16, round_once(want_o, case.q.dtype).reshape(o16.shape))
    assert torch.equal(lse32, round_once(want_lse, torch.float32).reshape(lse32.shape))


def one_request(case: Case, seq_len: int, rows: slice) -> dict:
    """Request 0 of ``case`` with KV length ``seq_len`` and the query rows ``rows`` of its full
    prefill (the positions ``seq_len - len(rows) .. seq_len - 1``)."""
    q = case.q[rows]
    return dict(
        case.kwargs(),
        q=q,
        cu_seqlens_q=torch.tensor([0, q.shape[0]], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        indices=None if case.indices is None else case.indices[rows],
    )


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("length", [1, 5, 8, 13])
def test_a_prefill_cut_into_cached_prefix_and_continuation_gives_the_full_rows(length, sparse):
    """Chunked prefill at every cut c: the continuation (rows c.., seq_len L) and the prefix as
    its own prefill (rows ..c, seq_len c) give the full prefill's rows bitwise (fp64)."""
    case = build([(length, length)], page_size=4, seed=length, sparse_k=4 if sparse else None)
    o, lse = prefill_attention(**case.kwargs())
    for c in range(length):
        o_c, lse_c = prefill_attention(**one_request(case, length, slice(c, length)))
        assert torch.equal(o_c, o[c:]) and torch.equal(lse_c, lse[c:]), f"continuation after a cut at {c}"
        if c:
            o_p, lse_p = prefill_attention(**one_request(case, c, slice(0, c)))
            assert torch.equal(o_p, o[:c]) and torch.equal(lse_p, lse[:c]), f"prefix cut at {c}"
        for step in range(c, length):  # each of its rows decoded alone (q_len 1 at seq_len step + 1)
            o_d, lse_d = prefill_attention(**one_request(case, step + 1, slice(step, step + 1)))
            assert torch.equal(o_d, o[step : step + 1]) and torch.equal(lse_d, lse[step : step + 1])


def test_mixed_prefill_and_decode_in_one_launch_give_each_requests_own_rows():
    full = build([(12, 12), (9, 9)], page_size=4, seed=11)
    o, lse = prefill_attention(**full.kwargs())
    mixed = dict(
        full.kwargs(),
        q=torch.cat([full.q[5:12], full.q[20:21]]),  # request 0 continues after 5; request 1 decodes its last
        cu_seqlens_q=torch.tensor([0, 7, 8], dtype=torch.int32),
    )
    o_m, lse_m = prefill_attention(**mixed)
    assert torch.equal(o_m, torch.cat([o[5:12], o[20:21]])) and torch.equal(
        lse_m, torch.cat([lse[5:12], lse[20:21]])
    )


# --- typed errors ---------------------------------------------------------------------------


def _base() -> Case:
    return build([(9, 3), (5, 2)], page_size=4, hkv=2, group=2, d=8, sparse_k=4, seed=1)


def _set_index(row: int, slot: int, value: int, tail: int | None = None):
    def change(kw: dict) -> dict:
        idx = kw["indices"].clone()
        if tail is not None:
            idx[row, tail] = -1
        idx[row, slot] = value
        return dict(kw, indices=idx)

    return change


ERRORS = {
    "q_len above seq_len": (
        lambda kw: dict(kw, seq_lens=torch.tensor([9, 1], dtype=torch.int32)),
        ArgumentError,
        "seq_lens",
        "q_len = 2",
        1,
    ),
    "duplicate cu_seqlens (q_len 0)": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([0, 5, 5], dtype=torch.int32)),
        ArgumentError,
        "cu_seqlens_q",
        "q_len >= 1",
        5,
    ),
    "cu_seqlens not starting at 0": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([1, 3, 5], dtype=torch.int32)),
        ArgumentError,
        "cu_seqlens_q",
        "first entry of 0",
        1,
    ),
    "unsorted cu_seqlens": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([0, 6, 5], dtype=torch.int64)),
        ArgumentError,
        "cu_seqlens_q",
        "sorted",
        5,
    ),
    "cu_seqlens ending before T": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([0, 3, 4], dtype=torch.int32)),
        ArgumentError,
        "cu_seqlens_q",
        "T = 5",
        4,
    ),
    "empty cu_seqlens": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([], dtype=torch.int32)),
        ArgumentError,
        "cu_seqlens_q",
        "R + 1 >= 1",
        (0,),
    ),
    "cu_seqlens of another R": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([0, 2, 4, 5], dtype=torch.int32)),
        ArgumentError,
        "block_table",
        "R = 3",
        2,
    ),
    "cu_seqlens float": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([0.0, 3.0, 5.0])),
        DTypeError,
        "cu_seqlens_q",
        "int32 or int64",
        "float32",
    ),
    "cu_seqlens 2-D": (
        lambda kw: dict(kw, cu_seqlens_q=torch.tensor([[0, 3, 5]], dtype=torch.int32)),
        ArgumentError,
        "cu_seqlens_q",
        "1-D",
        "2-D tensor of shape (1, 3)",
    ),
    # row 3 is request 1's first token: seq_len 5, q_len 2, position 3
    "index past the row's position": (
        _set_index(3, 0, 4),
        ArgumentError,
        "indices",
        "[0, 3]",
        4,
    ),
    "index below -1": (_set_index(0, 1, -2), ArgumentError, "indices", "row 0", -2),
    "index after a -1": (_set_index(2, 2, 0, tail=1), ArgumentError, "indices", "-1 tail", 0),
    "indices of another T": (
        lambda kw: dict(kw, indices=kw["indices"][:4]),
        ArgumentError,
        "indices",
        "(T, K) = (5, K)",
        (4, 4),
    ),
    "indices int64": (
        lambda kw: dict(kw, indices=kw["indices"].long()),
        DTypeError,
        "indices",
        "int32",
        "int64",
    ),
    "indices 3-D": (
        lambda kw: dict(kw, indices=kw["indices"][None]),
        ArgumentError,
        "indices",
        "2-D",
        "3-D tensor of shape (1, 5, 4)",
    ),
    "block table too short": (
        lambda kw: dict(kw, block_table=kw["block_table"][:, :2]),
        ArgumentError,
        "seq_lens",
        "max_pages * page_size = 8",
        9,
    ),
    "referenced page out of the pool": (
        lambda kw: dict(kw, block_table=kw["block_table"].clone().index_fill_(1, torch.tensor([0]), 99)),
        ArgumentError,
        "block_table",
        "page ids in [0,",
        99,
    ),
    "Hq not a multiple of Hkv": (
        lambda kw: dict(kw, q=kw["q"][:, :3]),
        ArgumentError,
        "k_cache",
        "dividing Hq = 3",
        2,
    ),
    "q float32": (lambda kw: dict(kw, q=kw["q"].float()), DTypeError, "q", "bfloat16 or float16", "float32"),
    "k_cache of another dtype": (
        lambda kw: dict(kw, k_cache=kw["k_cache"].half()),
        DTypeError,
        "k_cache",
        "bfloat16",
        "float16",
    ),
    "q 4-D": (
        lambda kw: dict(kw, q=kw["q"][None]),
        ArgumentError,
        "q",
        "3-D",
        "4-D tensor of shape (1, 5, 4, 8)",
    ),
    "v_cache of another shape": (
        lambda kw: dict(kw, v_cache=kw["v_cache"][:-1]),
        ArgumentError,
        "v_cache",
        "the shape of k_cache",
        None,
    ),
    "head dims differ": (lambda kw: dict(kw, q=kw["q"][..., :4]), ArgumentError, "k_cache", "D = 4", 8),
    "seq_lens int64": (
        lambda kw: dict(kw, seq_lens=kw["seq_lens"].long()),
        DTypeError,
        "seq_lens",
        "int32",
        "int64",
    ),
    "block_table of another R": (
        lambda kw: dict(kw, block_table=kw["block_table"][:1]),
        ArgumentError,
        "block_table",
        "R = 2",
        1,
    ),
    "cu_seqlens on meta": (
        lambda kw: dict(kw, cu_seqlens_q=kw["cu_seqlens_q"].to("meta")),
        DeviceError,
        "cu_seqlens_q",
        "a tensor with data",
        None,
    ),
    "non-finite scale": (lambda kw: dict(kw, scale=math.nan), ArgumentError, "scale", "finite", None),
    "scale a string": (lambda kw: dict(kw, scale="0.5"), DTypeError, "scale", "a real number", "str"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_bad_arguments_raise_typed_errors_naming_them(name):
    change, error, argument, expected, given_value = ERRORS[name]
    kw = change(_base().kwargs())
    with pytest.raises(error) as info:
        prefill_attention(**kw)
    assert type(info.value) is error
    assert info.value.argument == argument, info.value
    assert expected in info.value.expected, info.value
    if given_value is not None:
        assert info.value.given == given_value, info.value


def test_the_base_of_the_error_cases_is_valid():
    o, _ = prefill_attention(**_base().kwargs())
    assert o.shape == (5, 4, 8)


# --- SDPA mask ranges -----------------------------------------------------------------------


def hf_padding_mask(lengths: list[int], total: int, side: str) -> torch.Tensor:
    """Hugging Face's 2-D ``attention_mask`` [B, total]: 1 on tokens, 0 on padding (left
    padding puts the pads first, as batched ``generate()`` does)."""
    rows = []
    for n in lengths:
        ones, zeros = [1] * n, [0] * (total - n)
        rows.append(zeros + ones if side == "left" else ones + zeros)
    return torch.tensor(rows, dtype=torch.int64)


def hf_4d_mask(
    attention_mask: torch.Tensor,
    q_len: int,
    *,
    kind: str,
    dtype: torch.dtype = torch.float32,
    unmask: bool = False,
) -> torch.Tensor:
    """The 4-D mask [B, 1, q, kv] Hugging Face gives SDPA: causal by cache position (the q rows
    are the last q of kv) and the padding mask, boolean (True = attend) or additive (0 /
    finfo(dtype).min).  ``unmask``: rows that see nothing attend everything
    (``AttentionMaskConverter._unmask_unattended``, so SDPA's memory-efficient path gives no NaN)."""
    _, kv = attention_mask.shape
    cache_position = torch.arange(kv - q_len, kv)  # [q]
    causal = torch.arange(kv)[None, :] <= cache_position[:, None]  # [q, kv]
    allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]  # [B, 1, q, kv]
    if unmask:
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    if kind == "bool":
        return allowed
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_left_padded_prefill_rows_see_from_their_first_token(kind):
    lengths, total = [5, 1, 8, 3], 8
    start, end = visible_key_ranges(
        hf_4d_mask(hf_padding_mask(lengths, total, "left"), total, kind=kind), total, total
    )
    assert start.shape == end.shape == (4, 1, total)
    for b, n in enumerate(lengths):
        pad = total - n
        for i in range(total):
            want = (pad, i + 1) if i >= pad else (0, 0)  # a pad row sees no token: empty
            assert (int(start[b, 0, i]), int(end[b, 0, i])) == want, (b, i)


def test_left_padded_rows_unmasked_as_hugging_face_does_see_every_key():
    mask = hf_4d_mask(
        hf_padding_mask([2, 4], 4, "left"), 4, kind="additive", dtype=torch.bfloat16, unmask=True
    )
    start, end = visible_key_ranges(mask, 4, 4)
    assert start[0, 0].tolist() == [0, 0, 2, 2] and end[0, 0].tolist() == [4, 4, 3, 4]


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_right_padded_prefill_rows_see_from_key_0(kind):
    lengths, total = [5, 1, 8], 8
    start, end = visible_key_ranges(
        hf_4d_mask(hf_padding_mask(lengths, total, "right"), total, kind=kind, dtype=torch.float16),
        total,
        total,
    )
    for b, n in enumerate(lengths):
        assert start[b, 0].tolist() == [0] * total
        assert end[b, 0].tolist() == [min(i + 1, n) for i in range(total)]


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_left_padded_decode_steps_see_from_their_first_token(kind):
    """A decode step (q_len 1) and a speculative verify (q_len 3) after a left-padded prompt."""
    lengths, total = [6, 3, 9], 12  # at least the q_len tokens of the last step
    for q_len in (1, 3):
        mask = hf_4d_mask(hf_padding_mask(lengths, total, "left"), q_len, kind=kind)
        start, end = visible_key_ranges(mask, q_len, total)
        for b, n in enumerate(lengths):
            assert start[b, 0].tolist() == [total - n] * q_len
            assert end[b, 0].tolist() == [total - q_len + i + 1 for i in range(q_len)]


@settings(max_examples=30)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), st.sampled_from(["left", "right"]), st.data())
def test_padding_masks_of_any_lengths_give_each_row_its_tokens(lengths, side, data):
    total = max(lengths) + data.draw(st.integers(0, 4))
    q_len = data.draw(st.integers(1, total))
    mask = hf_4d_mask(
        hf_padding_mask(lengths, total, side), q_len, kind=data.draw(st.sampled_from(["bool", "additive"]))
    )
    start, end = visible_key_ranges(mask, q_len, total)
    for b, n in enumerate(lengths):
        first, last = (total - n, total) if side == "left" else (0, n)  # the tokens' keys [first, last)
        for i in range(q_len):
            position = total - q_len + i
            lo, hi = first, min(last, position + 1)
            assert (int(start[b, 0, i]), int(end[b, 0, i])) == ((lo, hi) if lo < hi else (0, 0))


def test_is_causal_is_top_left_as_torch_documents_and_computes():
    q_len, kv_len = 3, 5
    start, end = visible_key_ranges(None, q_len, kv_len, is_causal=True)
    documented = torch.ones(q_len, kv_len, dtype=torch.bool).tril(diagonal=0)  # SDPA's docs
    assert start.tolist() == [0] * q_len and end.tolist() == documented.sum(dim=-1).tolist() == [1, 2, 3]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64, generator=g) for n in (q_len, kv_len, kv_len))
    from_ranges = torch.arange(kv_len)[None, :] < end[:, None]  # [q, kv]
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=from_ranges),
        rtol=1e-12,
        atol=1e-12,
    )
    _, end_br = visible_key_ranges(None, q_len, kv_len, is_causal=True, alignment="bottom_right")
    assert end_br.tolist() == [3, 4, 5] == causal_limit(q_len, kv_len, "bottom_right").tolist()
    bottom_right = torch.arange(kv_len)[None, :] < end_br[:, None]
    assert not torch.allclose(
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right),
    )
    _, end_short = visible_key_ranges(None, 4, 2, is_causal=True, alignment="bottom_right")
    assert end_short.tolist() == [0, 0, 1, 2]  # kv < q: the first rows see nothing


def test_a_mask_combined_with_is_causal_is_their_intersection():
    mask = hf_4d_mask(hf_padding_mask([3], 6, "right"), 6, kind="bool")
    no_causal = mask | torch.ones(6, 6, dtype=torch.bool).triu(1)  # padding only, every row sees keys 0..2
    start, end = visible_key_ranges(no_causal, 6, 6, is_causal=True)
    assert start[0, 0].tolist() == [0] * 6 and end[0, 0].tolist() == [1, 2, 3, 3, 3, 3]


def test_broadcast_masks_give_ranges_of_their_own_leading_dims():
    start, end = visible_key_ranges(torch.tensor([False, True, True, False]), 3, 4)  # [kv]
    assert start.tolist() == [1, 1, 1] and end.tolist() == [3, 3, 3]
    padding = hf_padding_mask([2, 4], 4, "left").bool()[:, None, None, :]  # [B, 1, 1, kv]
    start, end = visible_key_ranges(padding, 3, 4)
    assert start.shape == (2, 1, 3) and start[:, 0, 0].tolist() == [2, 0] and (end == 4).all()
    start, end = visible_key_ranges(None, 2, 0)
    assert start.tolist() == end.tolist() == [0, 0]


def test_a_row_with_a_gap_is_refused_naming_batch_head_and_row():
    mask = torch.ones(2, 3, 4, 6, dtype=torch.bool)
    mask[1, 2, 3, 2] = False  # a hole in the middle: keys 0..1 and 3..5
    with pytest.raises(ArgumentError) as info:
        visible_key_ranges(mask, 4, 6)
    assert info.value.argument == "mask"
    assert "batch 1, head 2, row 3" in info.value.expected and info.value.given == "visible keys 0..1, 3..5"
    two_d = torch.tensor([[True, True, False, False], [True, False, True, True]])  # row 1: keys 0, 2..3
    with pytest.raises(ArgumentError) as info:
        visible_key_ranges(two_d, 2, 4)
    assert "(row 1)" in info.value.expected and info.value.given == "visible keys 0, 2..3"


@pytest.mark.parametrize("value", [1.0, -1e4, math.nan, math.inf], ids=["one", "minus_1e4", "nan", "inf"])
def test_an_additive_mask_of_other_values_is_refused_naming_the_key(value):
    mask = torch.zeros(2, 1, 3, 5, dtype=torch.float32)
    mask[..., 4] = torch.finfo(torch.float32).min
    mask[1, 0, 2, 3] = value
    with pytest.raises(ArgumentError) as info:
        visible_key_ranges(mask, 3, 5)
    assert "batch 1, head 0, row 2, key 3" in info.value.expected
    assert info.value.given == value or (math.isnan(value) and math.isnan(info.value.given))


def test_bf16_min_in_an_fp32_mask_is_not_the_masked_value():
    mask = torch.zeros(3, 5, dtype=torch.float32)
    mask[:, 4] = torch.finfo(torch.bfloat16).min
    with pytest.raises(ArgumentError, match="finfo\\(float32\\)"):
        visible_key_ranges(mask, 3, 5)


@pytest.mark.parametrize(
    "call, error, argument",
    [
        (lambda: visible_key_ranges(torch.ones(3, 5, dtype=torch.int64), 3, 5), DTypeError, "mask"),
        (lambda: visible_key_ranges([[True]], 1, 1), DTypeError, "mask"),
        (lambda: visible_key_ranges(torch.ones(3, 4, dtype=torch.bool), 3, 5), ArgumentError, "mask"),
        (
            lambda: visible_key_ranges(torch.ones(1, 1, 1, 3, 5, dtype=torch.bool), 3, 5),
            ArgumentError,
            "mask",
        ),
        (lambda: visible_key_ranges(None, -1, 5), ArgumentError, "q_len"),
        (lambda: visible_key_ranges(None, 3, 5.0), DTypeError, "kv_len"),
        (lambda: visible_key_ranges(None, 3, 5, is_causal=1), DTypeError, "is_causal"),
        (lambda: visible_key_ranges(None, 3, 5, alignment="bottom_left"), ArgumentError, "alignment"),
    ],
    ids=[
        "int_mask",
        "list_mask",
        "not_broadcastable",
        "five_dims",
        "negative_q",
        "float_kv",
        "int_causal",
        "alignment",
    ],
)
def test_bad_mask_arguments_raise_typed_errors(call, error, argument):
    with pytest.raises(error) as info:
        call()
    assert info.value.argument == argument
