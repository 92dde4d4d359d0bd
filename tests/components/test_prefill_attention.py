"""Tests of ``prefill_attention`` (the decode kernel on packed ragged rows) that the registry tests
cannot say: agreement with the fp64 reference on small ragged batches, one tree for all phases
(a row's bits equal decode_attention's at q_len 1, 2 and 4 for the same request and position; a
chunked prefill cut at every page boundary and at split multiples +-1 equals the full prefill),
the typed errors, and empty work.
"""

from __future__ import annotations

import math

import pytest
import torch

from batchinv.fast.decode_attention import decode_attention, decode_attention_config
from batchinv.fast.device import arch
from batchinv.fast.prefill_attention import prefill_attention as fast
from batchinv.harness.components import prefill_attention as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Case
from batchinv.reference.decode_attention import attention_bound
from batchinv.reference.errors import ArgumentError
from batchinv.reference.prefill_attention import prefill_attention as reference

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")
D = 16 if LANE is Lane.CPU else 64


def any_lane(fn):
    """A test of kernel behaviour: the cpu lane (interpreter) and every GPU lane."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def paged(lens, hkv=2, d=D, page_size=16, dtype=torch.bfloat16, seed=0):
    """A NaN-filled pool with each request's tokens in random pages; (k, v, table)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens]
    num_pages = sum(need) + 2
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.full((len(lens), max(need, default=0) + 1), -1, dtype=torch.int32)
    k = torch.full((num_pages, page_size, hkv, d), math.nan, dtype=dtype)
    v = torch.full_like(k, math.nan)
    taken = 0
    for r, n in enumerate(need):
        ids = perm[taken : taken + n]
        taken += n
        table[r, :n] = ids.to(torch.int32)
        flat_k = torch.randn(n * page_size, hkv, d, generator=gen)
        flat_v = torch.randn(n * page_size, hkv, d, generator=gen)
        flat_k[lens[r] :] = math.nan
        flat_v[lens[r] :] = math.nan
        k[ids] = flat_k.view(n, page_size, hkv, d).to(dtype)
        v[ids] = flat_v.view(n, page_size, hkv, d).to(dtype)
    return k.to(DEVICE), v.to(DEVICE), table.to(DEVICE)


def packed_q(q_lens, hq=4, d=D, dtype=torch.bfloat16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype).to(DEVICE)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return q, cu


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.equal(bits(a), bits(b)), what


@any_lane
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_agrees_with_the_reference_within_decodes_bound(dtype):
    q_lens, prefixes = [1, 7, 20, 2], [40, 0, 60, 17]
    lens = [a + b for a, b in zip(q_lens, prefixes, strict=True)]
    k, v, table = paged(lens, dtype=dtype)
    q, cu = packed_q(q_lens, dtype=dtype)
    seq_lens = i32(lens)
    o, lse = fast(q, k, v, table, cu, seq_lens)
    assert o.dtype == dtype and lse.dtype == torch.float32
    ref_o, ref_lse = reference(q, k, v, table, cu, seq_lens)
    config = decode_attention_config(arch(q.device), D, dtype)
    c = cu.tolist()
    for r in range(len(lens)):
        rows = slice(c[r], c[r + 1])
        b_o, b_lse = attention_bound(
            q[rows].unsqueeze(0),
            k,
            v,
            table[r : r + 1],
            seq_lens[r : r + 1],
            D**-0.5,
            reference=(ref_o[rows].unsqueeze(0), ref_lse[rows].unsqueeze(0)),
            split_tokens=config.split_tokens,
            block_n=config.block_n,
        )
        assert bool(((o[rows].double() - ref_o[rows]).abs() <= b_o[0]).all()), r
        assert bool(((lse[rows].double() - ref_lse[rows]).abs() <= b_lse[0]).all()), r


@any_lane
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_rows_equal_decode_at_q_len_1_2_4(sparse):
    """Every row of a mixed prefill/decode launch == decode_attention's bits for the same request
    and position: alone at q_len 1, and as the last row of a uniform q_len 2 / 4 launch."""
    q_lens, prefixes = [1, 5, 12, 4], [70, 30, 0, 33]
    lens = [a + b for a, b in zip(q_lens, prefixes, strict=True)]
    k, v, table = paged(lens)
    q, cu = packed_q(q_lens)
    seq_lens = i32(lens)
    indices = None
    if sparse:
        gen = torch.Generator().manual_seed(5)
        rows = []
        for r, n in enumerate(q_lens):
            for i in range(n):
                visible = lens[r] - n + i + 1
                chosen = torch.randperm(visible, generator=gen)[: min(24, visible)]
                rows.append(torch.cat([chosen, torch.full((24 - chosen.numel(),), -1)]))
        indices = torch.stack(rows).to(torch.int32).to(DEVICE)
    o, lse = fast(q, k, v, table, cu, seq_lens, indices=indices)
    c = cu.tolist()
    for r, n in enumerate(q_lens):
        for i in range(n):
            t = c[r] + i
            p = lens[r] - n + i
            for q_len in (1, 2, 4):
                if q_len > p + 1 or t - q_len + 1 < c[r]:
                    continue  # the verify window must lie inside this request's rows
                window = slice(t - q_len + 1, t + 1)
                idx = None if indices is None else indices[window].unsqueeze(0)
                d_o, d_lse = decode_attention(
                    q[window].unsqueeze(0), k, v, table[r : r + 1], i32([p + 1]), D**-0.5, idx
                )
                assert_same_bits(d_o[0, -1], o[t], f"o, request {r} row {i} q_len {q_len}")
                assert_same_bits(d_lse[0, -1], lse[t], f"lse, request {r} row {i} q_len {q_len}")


@any_lane
def test_chunked_prefill_equals_the_full_prefill():
    """A 70-token prompt cut into a cached prefix and a continuation at every page boundary and at
    every split multiple +-1 gives the full prefill's bits on every continuation row."""
    length = 70
    k, v, table = paged([length, 50])
    q, cu = packed_q([length])
    other, _ = packed_q([1], seed=9)
    o_full, lse_full = fast(q, k, v, table[:1], cu, i32([length]))
    split = decode_attention_config(arch(q.device), D, q.dtype).split_tokens
    cuts = {j * 16 for j in range(1, 5)} | {s + e for s in range(split, length, split) for e in (-1, 0, 1)}
    for cut in sorted(c for c in cuts if 0 < c < length):
        rest = length - cut
        o, lse = fast(q[cut:], k, v, table[:1], i32([0, rest]), i32([length]))
        assert_same_bits(o, o_full[cut:], f"o, cut at {cut}")
        assert_same_bits(lse, lse_full[cut:], f"lse, cut at {cut}")
        # the same continuation beside a request in decode, in one launch
        both = torch.cat([q[cut:], other])
        o, lse = fast(both, k, v, table, i32([0, rest, rest + 1]), i32([length, 50]))
        assert_same_bits(o[:rest], o_full[cut:], f"o, cut at {cut}, with a decode request")
        assert_same_bits(lse[:rest], lse_full[cut:], f"lse, cut at {cut}, with a decode request")


@any_lane
def test_empty_work():
    k, v, table = paged([5])
    q = torch.empty(0, 4, D, dtype=torch.bfloat16, device=DEVICE)
    o, lse = fast(q, k, v, table[:0], i32([0]), i32([]))
    assert o.shape == (0, 4, D) and lse.shape == (0, 4)
    # an empty sparse context: o = +0, lse = -inf, never NaN
    q1, cu = packed_q([2])
    idx = torch.full((2, 4), -1, dtype=torch.int32, device=DEVICE)
    o, lse = fast(q1, k, v, table, cu, i32([5]), indices=idx)
    assert bool((bits(o) == 0).all()) and bool((lse == -math.inf).all())


@pytest.mark.cpu
@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("duplicate_cu", {"cu_seqlens_q": [0, 0, 3]}),
        ("unsorted_cu", {"cu_seqlens_q": [0, 3, 2]}),
        ("cu_not_ending_at_t", {"cu_seqlens_q": [0, 1, 2]}),
        ("q_len_above_seq_len", {"seq_lens": [1, 1]}),
        ("table_too_short", {"seq_lens": [1, 1000]}),
    ],
)
def test_typed_errors(name, change):
    k, v, table = paged([5, 20])
    q, _ = packed_q([1, 2])
    args = {"cu_seqlens_q": [0, 1, 3], "seq_lens": [5, 20], **change}
    with pytest.raises(ArgumentError):
        fast(q, k, v, table, i32(args["cu_seqlens_q"]), i32(args["seq_lens"]))
    with pytest.raises(ArgumentError):
        reference(q, k, v, table, i32(args["cu_seqlens_q"]), i32(args["seq_lens"]))


@pytest.mark.cpu
def test_index_past_the_rows_position_is_refused():
    k, v, table = paged([10])
    q, cu = packed_q([2])
    idx = i32([[8, -1], [9, -1]])  # row 0 sits at position 8, row 1 at 9: fine
    fast(q, k, v, table, cu, i32([10]), indices=idx)
    with pytest.raises(ArgumentError, match="indices"):
        fast(q, k, v, table, cu, i32([10]), indices=i32([[9, -1], [9, -1]]))


@pytest.mark.cpu
def test_the_fa_planner_crosses_a_threshold_in_the_sweep_cases():
    """The FA-style baseline must be detectable: its split moves between a target alone and the
    co-batches co_batch builds (their q_max x group cross a threshold of vLLM #51902)."""
    from batchinv.fast.baselines.prefill_attention import planned_split_tokens

    base = decode_attention_config("interp", 16, torch.bfloat16)
    assert [planned_split_tokens(base, m, 1) for m in (9, 10, 16, 17, 32, 33, 64, 65)] == [
        base.split_tokens * t for t in (1, 2, 2, 3, 3, 4, 4, 5)
    ]
    for case in component.cases(Lane.CPU):
        if case.axes["mix"] == "decode":
            continue
        group = case.axes["Hq"] // case.axes["Hkv"]
        alone = planned_split_tokens(base, 1, group)
        with_long = planned_split_tokens(base, case.axes["q_max"], group)
        assert alone != with_long or case.axes["q_max"] * group <= 9, case.id


def test_registered_case_ids_are_unique():
    ids = [c.id for c in component.cases(Lane.CPU)]
    assert len(ids) == len(set(ids))
    assert isinstance(component.cases(Lane.SM90)[0], Case)


@any_lane
def test_prefix_cache_hit_equals_the_cold_prefill_at_every_page_aligned_cut():
    """The prefix-cache scenario: a request's prefill split into a cached prefix (a cache hit,
    its K/V already in the pages) and the continuation gives the continuation's rows the bits of
    the cold prefill, o and lse, at every page-aligned cut -- and a batch of such hits beside a
    cold prefill and a decode step gives them too."""
    length, page = 70 if LANE is Lane.CPU else 600, 16
    k, v, table = paged([length], page_size=page)
    q, cu = packed_q([length])
    cold_o, cold_lse = fast(q, k, v, table, cu, i32([length]))
    for cut in range(page, length, page):
        n = length - cut
        o, lse = fast(q[cut:], k, v, table, i32([0, n]), i32([length]))
        assert_same_bits(o, cold_o[cut:], f"o, cached prefix of {cut}")
        assert_same_bits(lse, cold_lse[cut:], f"lse, cached prefix of {cut}")
    cuts = list(range(page, length, page))[:3]
    rows = [q[c:] for c in cuts] + [q, q[-1:]]  # three hits, a cold prefill, a decode step
    q_lens = [r.shape[0] for r in rows]
    cu_mixed = i32([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    o, lse = fast(
        torch.cat(rows), k, v, table.expand(len(rows), -1).contiguous(), cu_mixed, i32([length] * len(rows))
    )
    start = 0
    for c, n in zip([*cuts, 0, length - 1], q_lens, strict=True):
        assert_same_bits(o[start : start + n], cold_o[c:], f"o in the mixed batch, prefix {c}")
        assert_same_bits(lse[start : start + n], cold_lse[c:], f"lse in the mixed batch, prefix {c}")
        start += n


@any_lane
@pytest.mark.parametrize("sparse", [False, True], ids=["causal", "sparse"])
def test_row_slices_give_the_same_bits(sparse, monkeypatch):
    """A launch whose split workspace would pass ``WORKSPACE_BYTES`` goes in consecutive row
    slices (a 32k-token prefill at D 256 asked for 13 GiB on the H200 sweep): with the budget
    cut to one row, then to three, every row's o and lse keep the single launch's bits."""
    import batchinv.fast.prefill_attention as launcher

    lens, q_lens = [40, 23, 9], [7, 5, 1]
    k, v, table = paged(lens)
    q, cu = packed_q(q_lens)
    indices = None
    if sparse:  # each row: its even positions up to its own, then the -1 tail
        rows = []
        for length, n in zip(lens, q_lens, strict=True):
            for i in range(n):
                p = length - n + i
                picks = list(range(0, p + 1, 2))[:6]
                rows.append(picks + [-1] * (6 - len(picks)))
        indices = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    o_one, lse_one = fast(q, k, v, table, cu, i32(lens), indices=indices)
    split = decode_attention_config(arch(q.device), D, q.dtype).split_tokens
    per_row = q.shape[1] * -(-max(lens) // split) * (D + 1) * 4
    for rows_per_launch in (1, 3):
        monkeypatch.setattr(launcher, "WORKSPACE_BYTES", rows_per_launch * per_row)
        o, lse = fast(q, k, v, table, cu, i32(lens), indices=indices)
        assert_same_bits(o, o_one, f"o, {rows_per_launch} row(s) per launch")
        assert_same_bits(lse, lse_one, f"lse, {rows_per_launch} row(s) per launch")


def test_phase_paired_sizes_each_launch_from_its_own_requests(monkeypatch):
    """The baseline's decode launch gets a grid for its own requests' lengths, not the whole
    batch's longest (validation's ``AttentionShape.longest``; found by a breaker: the decode half
    was sized from the 1200-token prefill request)."""
    from batchinv.fast import prefill_attention as module
    from batchinv.fast.baselines.prefill_attention import phase_paired

    seen = []

    def spy(q, k, v, kv, block_table, seq_lens, rows, indices, **kw):
        seen.append((seq_lens.tolist(), kw["splits"], kw["config"].split_tokens))
        return (
            torch.zeros(q.shape, dtype=q.dtype),
            torch.zeros(q.shape[:2], dtype=torch.float32),
        )

    monkeypatch.setattr(module, "launch_rows", spy)
    lens = [3, 1200]
    pages = [math.ceil(n / 16) for n in lens]
    table = torch.zeros(2, max(pages), dtype=torch.int32)
    table[0, : pages[0]] = torch.arange(pages[0])
    table[1, : pages[1]] = torch.arange(pages[0], pages[0] + pages[1])
    cache = torch.zeros(sum(pages), 16, 1, 16, dtype=torch.bfloat16)
    q = torch.zeros(3, 1, 16, dtype=torch.bfloat16)  # request 0: 1 row (decode), request 1: 2 rows
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    phase_paired(q, cache, cache, table, cu, torch.tensor(lens, dtype=torch.int32))
    assert [s[0] for s in seen] == [[3], [1200]]
    (_, decode_splits, decode_split), (_, prefill_splits, prefill_split) = seen
    assert decode_splits == math.ceil(3 / decode_split)
    assert prefill_splits == math.ceil(1200 / prefill_split)
