"""Request-level components: the co_batch, slot and placement checks, each with a negative
control it must catch, on a toy request-level component ("paged sums"), and the ragged-batch
strategies and paged-data helpers of :mod:`batchinv.harness.requests`.

The toy: each request has a length and its values live in pages of a shared pool, addressed
through a block table; the outputs are each request's sum (fp32, added in token order) and max.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from batchinv.harness import invariance, requests
from batchinv.harness.checks import FAST, BaselineCrashed, negative_control, run_check
from batchinv.harness.invariance import VarianceDetected
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    CHECKS,
    INVARIANCE_CHECKS,
    REQUEST_CHECKS,
    Baseline,
    Batch,
    Case,
    Component,
    Toleranced,
    components,
)
from batchinv.harness.sweep import run_sweep

pytestmark = pytest.mark.cpu

PAGE = 4
MAX_LEN = 13
HUGE_LEN = 3 * MAX_LEN
POOLS = ("pool",)


def _build(case: Case, device: torch.device) -> Batch:
    """Requests with lengths 1..MAX_LEN (1, a page boundary and MAX_LEN always among them when
    there is room), each request's pages contiguous, a NaN spare page now and then, NaN tails."""
    g = torch.Generator().manual_seed(case.seed)
    n = case.axes["requests"]
    lengths = torch.randint(1, MAX_LEN + 1, (n,), generator=g).tolist()
    for i, special in enumerate((1, PAGE, MAX_LEN, PAGE + 1)[: max(0, n - 1)]):
        lengths[(i * 3 + case.seed) % n] = special
    if case.axes.get("huge") and n:  # a neighbour mix: one request past every case's longest
        lengths[0] = HUGE_LEN
    need = requests.pages_needed(lengths, PAGE)
    width = max(need, default=1)
    spares = [int(torch.randint(2, (1,), generator=g)) for _ in range(n)]
    pool = requests.nan_filled_pages(sum(need) + sum(spares) + 1, PAGE, device=device)
    table = torch.zeros((n, width), dtype=torch.int32)
    page = 0
    for r, (length, p, spare) in enumerate(zip(lengths, need, spares, strict=True)):
        for j in range(p):
            count = min(PAGE, length - j * PAGE)
            pool[page, :count] = torch.randn(count, generator=g).to(device)
            table[r, j] = page
            page += 1
        table[r, p:] = pool.shape[0] - 1  # padding: the last page, all NaN
        page += spare
    rows = {
        "block_table": table.to(device),
        "seq_lens": torch.tensor(lengths, dtype=torch.int32, device=device),
    }
    return Batch(rows, {"pool": pool})


def _values(block_table, seq_lens, pool):
    """Per request, its values in token order (fp64)."""
    out = []
    for r, length in enumerate(seq_lens.tolist()):
        pages = block_table[r, : requests.pages_needed([length], PAGE)[0]].long()
        out.append(pool[pages].reshape(-1)[:length].double())
    return out


def _reference(block_table, seq_lens, pool):
    vals = _values(block_table, seq_lens, pool)
    sums = torch.stack([v.sum() for v in vals]) if vals else torch.zeros(0, dtype=torch.float64)
    maxes = torch.stack([v.max() for v in vals]) if vals else torch.zeros(0, dtype=torch.float64)
    return sums, maxes


def _gathered(block_table, seq_lens, pool, *, contiguous=False):
    n = seq_lens.shape[0]
    longest = int(seq_lens.max()) if n else 0
    j = torch.arange(longest)
    if contiguous:  # assumes the request's pages follow its first one: a fixed physical layout
        pages = (block_table[:, :1].long() + (j // PAGE)[None]).clamp(max=pool.shape[0] - 1)
    else:
        pages = block_table.long()[:, j // PAGE]
    vals = pool[pages, (j % PAGE)[None].expand(n, longest)]
    return vals, j[None] < seq_lens[:, None]


def _sums(block_table, seq_lens, pool, *, contiguous=False):
    """Each request's values added in token order in fp32, and their max: one fixed order per
    request, whatever the batch."""
    vals, valid = _gathered(block_table, seq_lens, pool, contiguous=contiguous)
    n = seq_lens.shape[0]
    acc = torch.zeros(n, dtype=torch.float32)
    mx = torch.full((n,), float("-inf"))
    for c in range(vals.shape[1]):
        v, ok = vals[:, c], valid[:, c]
        acc = torch.where(ok, acc + v, acc)
        mx = torch.where(ok, torch.maximum(mx, v), mx)
    return acc, mx


def _fast(block_table, seq_lens, pool):
    return _sums(block_table, seq_lens, pool)


def _small_batch_nudge(block_table, seq_lens, pool):
    """Another path for batches under 8 requests (a batch-planned split): co_batch catches it."""
    s, m = _sums(block_table, seq_lens, pool)
    return (s + 2.0**-10 if seq_lens.shape[0] < 8 else s), m


def _slot_dependent(block_table, seq_lens, pool):
    """The result depends on the request's slot (per-slot metadata): slot catches it."""
    s, m = _sums(block_table, seq_lens, pool)
    return s + torch.arange(s.shape[0], dtype=s.dtype) * 2.0**-12, m


def _fixed_layout(block_table, seq_lens, pool):
    """Reads a request's pages as if they followed its first one: placement catches it."""
    return _sums(block_table, seq_lens, pool, contiguous=True)


def _bound(batch, ref):
    vals = _values(batch.rows["block_table"], batch.rows["seq_lens"], batch.shared["pool"])
    # sequential fp32 addition of n values: |error| <= (n - 1) u sum|x| (u = 2^-24), plus slack
    # for the fp64 reference's own rounding; the max is exact.
    sums = torch.tensor(
        [(len(v) * 2.0**-24 * 1.01) * float(v.abs().sum()) for v in vals], dtype=torch.float64
    )
    return sums, torch.zeros(1, dtype=torch.float64)


BASELINES = (
    Baseline("small_batch", _small_batch_nudge, "another path below 8 requests"),
    Baseline("slot_dependent", _slot_dependent, "depends on the request's slot"),
    Baseline("fixed_layout", _fixed_layout, "reads pages as if contiguous, ignoring the block table"),
)
CATCHES = {"small_batch": "co_batch", "slot_dependent": "slot", "fixed_layout": "placement"}


def _toy(fast=_fast, baselines=BASELINES, sizes=(5, 1)):
    return Component(
        name="paged_sums",
        summary="each request's sum and max over its paged values",
        reference=_reference,
        fast=fast,
        baselines=tuple(baselines),
        cases=lambda lane: [Case("paged_sums", {"requests": n}, seed=s) for n in sizes for s in (0, 1)],
        build=_build,
        agreement=Toleranced(
            bound=_bound,
            justification="sequential fp32 sum: (n - 1) u sum|x|",
            out_dtypes=lambda batch: (torch.float32, torch.float32),
        ),
        requests=requests.paged_model(POOLS),
    )


TOY = _toy()
CASE = Case("paged_sums", {"requests": 5}, seed=0)


def _mixes(case: Case, lane: Lane) -> dict[str, Case]:
    """The toy's neighbour mixes: the case's lengths with another seed, and 7 requests of which
    one is HUGE_LEN long."""
    del lane
    return {
        "plain": case.with_seed(case.seed + 7919),
        "one_huge": Case("paged_sums", {"requests": 7, "huge": True}, seed=case.seed + 2 * 7919),
    }


def _long_neighbour_nudge(block_table, seq_lens, pool):
    """Another path when any request of the launch is past MAX_LEN (a plan chosen by the longest
    context): only a co-batch with a huge neighbour reaches it."""
    s, m = _sums(block_table, seq_lens, pool)
    return (s + 2.0**-10 if int(seq_lens.max()) > MAX_LEN else s), m


def _with_mixes(comp: Component) -> Component:
    assert comp.requests is not None
    return dataclasses.replace(comp, requests=dataclasses.replace(comp.requests, neighbours=_mixes))


#: The toy with a subject that varies only beside a huge request: PLAIN has one pool of other
#: requests (the same case, another seed), MIXED the mixes of :func:`_mixes`.
PLAIN = _toy(baselines=(Baseline("long_neighbour", _long_neighbour_nudge, "a plan by the longest request"),))
MIXED = _with_mixes(PLAIN)


def test_the_request_checks_follow_the_row_checks_and_apply_only_to_request_level_components():
    assert REQUEST_CHECKS == ("co_batch", "slot", "placement")
    assert CHECKS == (
        "agreement",
        "batch_prefix",
        "position",
        "row_start",
        "partition",
        "repeat",
        "co_batch",
        "slot",
        "placement",
        "phase",
        "padding",
        "neighbours",
        "config_equivalence",
        "modes",
        "tp_degree",
        "cross_process",
    )
    assert set(REQUEST_CHECKS) <= set(INVARIANCE_CHECKS)
    assert TOY.applicable_checks() == (
        "agreement", "co_batch", "slot", "placement", "repeat", "neighbours", "cross_process",
    )  # fmt: skip
    with_partition = Component(**{**TOY.__dict__, "partition_arg": "num_sm_parts"})
    assert with_partition.applicable_checks() == (
        "agreement",
        "co_batch",
        "slot",
        "placement",
        "partition",
        "repeat",
        "neighbours",
        "cross_process",
    )
    for comp in components():  # the row-wise components keep their checks; request-level ones get theirs
        if comp.requests is None:
            assert not set(REQUEST_CHECKS) & set(comp.applicable_checks())
        else:
            assert set(REQUEST_CHECKS) <= set(comp.applicable_checks())


def test_cases_leave_unreferenced_memory_nan_and_relocation_keeps_it_so():
    batch = _build(CASE, torch.device("cpu"))
    requests.check_unreferenced_is_nan(batch, POOLS)
    g = torch.Generator().manual_seed(5)
    moved = TOY.requests.relocate(batch, g)
    requests.check_unreferenced_is_nan(moved, POOLS)
    assert not torch.equal(moved.rows["block_table"][:, :1], batch.rows["block_table"][:, :1].long())
    for a, b in zip(_reference(**batch.kwargs()), _reference(**moved.kwargs()), strict=True):
        assert torch.equal(a, b)


#: The toy's checks that run in this process (cross_process needs a registered component: the
#: toy's is a skip, tests/harness/test_cross_process.py covers it).
IN_PROCESS_CHECKS = [c for c in TOY.applicable_checks() if c != "cross_process"]


@pytest.mark.parametrize("requests_in_case", [5, 1])
@pytest.mark.parametrize("check", IN_PROCESS_CHECKS)
def test_the_pinned_toy_passes_every_check(check, requests_in_case):
    result = run_check(TOY, FAST, check, Case("paged_sums", {"requests": requests_in_case}, seed=0), Lane.CPU)
    assert result.status == "pass", (result.detail, result.where)


@pytest.mark.parametrize("baseline", sorted(CATCHES))
def test_each_baseline_is_caught_by_its_check(baseline):
    result = run_check(TOY, baseline, CATCHES[baseline], CASE, Lane.CPU)
    assert result.status == "fail", result.detail
    assert result.rows_differing >= 1 and result.first_difference
    assert "--check " + CATCHES[baseline] in result.repro


def test_the_request_checks_each_see_their_own_axis():
    """A baseline that varies along one axis passes the checks of the others (with the others'
    co-batch of 5 requests, the small-batch path runs at every slot)."""
    assert run_check(TOY, "small_batch", "slot", CASE, Lane.CPU).status == "pass"
    assert run_check(TOY, "small_batch", "placement", CASE, Lane.CPU).status == "pass"
    assert run_check(TOY, "fixed_layout", "co_batch", CASE, Lane.CPU).status == "pass"
    assert run_check(TOY, "fixed_layout", "slot", CASE, Lane.CPU).status == "pass"
    assert run_check(TOY, "slot_dependent", "placement", CASE, Lane.CPU).status == "pass"


@pytest.mark.negative_control
@pytest.mark.xfail(strict=True, raises=VarianceDetected, reason="each baseline varies")
@pytest.mark.parametrize("baseline", sorted(CATCHES))
def test_negative_controls_detect_each_baseline(baseline):
    negative_control(TOY, baseline, Lane.CPU)


def test_the_sweep_gives_the_right_verdicts():
    outcome = run_sweep([TOY], Lane.CPU, jobs=1)
    assert outcome.ok
    # cross_process: the toy is not registered, no fresh process can rebuild its cases (a skip)
    assert {c.check: c.status for c in outcome.checks} == {
        **dict.fromkeys(TOY.applicable_checks(), "pass"),
        "cross_process": "skip",
    }
    assert {c.baseline: c.verdict for c in outcome.controls} == dict.fromkeys(CATCHES, "detected")
    detected = {c.check: set(c.detected_by) for c in outcome.checks}
    assert detected["co_batch"] == {"small_batch", "slot_dependent"}  # slot 0 alone vs in its batch
    assert detected["placement"] == {"fixed_layout"}


def test_zero_requests_are_skipped_not_passed():
    outcome = run_sweep([_toy(sizes=(0,))], Lane.CPU, include_baselines=False)
    assert {c.check: c.status for c in outcome.checks} == dict.fromkeys(TOY.applicable_checks(), "skip")


def test_with_no_other_request_co_batch_and_slot_compare_nothing():
    batch = _build(Case("paged_sums", {"requests": 1}, seed=0), torch.device("cpu"))
    none = TOY.requests.take(batch, [])

    def fn(b):
        return _fast(**b.kwargs())

    for result in (
        invariance.co_batch(fn, batch, none, TOY.requests),
        invariance.slot(fn, batch, none, TOY.requests),
    ):
        assert result.comparisons == 0 and result.vacuous


def test_co_batch_reaches_its_sizes_by_cycling_the_other_requests():
    batch = _build(CASE, torch.device("cpu"))
    seen = []

    def fn(b):
        seen.append(b.num_rows)
        return _fast(**b.kwargs())

    result = invariance.co_batch(fn, batch, batch, TOY.requests, (1, 2, 7, 31, 255))
    assert result.passed and result.comparisons in (12, 18)  # 2 or 3 targets x (its batch + 5 sizes)
    assert {2, 3, 8, 32, 256} <= set(seen)


def _writes_into_pool(block_table, seq_lens, pool):
    out = _sums(block_table, seq_lens, pool)
    pool.zero_()
    return out


def test_a_fast_function_writing_into_its_input_is_an_error():
    for check in IN_PROCESS_CHECKS:
        result = run_check(_toy(fast=_writes_into_pool), FAST, check, CASE, Lane.CPU)
        assert result.status == "error" and "wrote into its input 'pool'" in result.detail, check


def _extra_output_alone(block_table, seq_lens, pool):
    s, m = _sums(block_table, seq_lens, pool)
    return (s, m, m) if seq_lens.shape[0] == 1 else (s, m)


def test_another_output_count_alone_is_an_error_not_a_detection():
    comp = _toy(baselines=[Baseline("odd", _extra_output_alone, "x")])
    with pytest.raises(BaselineCrashed, match="ContractViolation"):
        negative_control(comp, "odd", Lane.CPU)


# --- strategies and paged helpers ---------------------------------------------------------------


def test_special_lengths_hit_one_boundaries_and_the_longest_context():
    got = requests.special_lengths(100, 16, split=32)
    assert {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 99, 100} <= set(got)
    assert min(got) == 1 and max(got) == 100


@given(requests.seq_lens(100, 16, split=32))
def test_seq_lens_stay_in_range(n):
    assert 1 <= n <= 100


@given(requests.ragged_seq_lens(6, 40, PAGE, split=8), st.integers(0, 2**31 - 1))
def test_relocating_and_concatenating_ragged_batches_keeps_every_request(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    need = requests.pages_needed(lengths, PAGE)
    pool = requests.nan_filled_pages(sum(need) + 1, PAGE)
    table = torch.full((len(lengths), max(need, default=1)), sum(need), dtype=torch.int32)
    page = 0
    for r, (length, p) in enumerate(zip(lengths, need, strict=True)):
        for j in range(p):
            count = min(PAGE, length - j * PAGE)
            pool[page, :count] = torch.randn(count, generator=g)
            table[r, j] = page
            page += 1
    batch = Batch(
        {"block_table": table, "seq_lens": torch.tensor(lengths, dtype=torch.int32)}, {"pool": pool}
    )
    model = requests.paged_model(POOLS)
    expected = _reference(**batch.kwargs())
    moved = model.relocate(batch, g)
    requests.check_unreferenced_is_nan(moved, POOLS)
    both = model.concat([moved, model.take(batch, list(reversed(range(len(lengths)))))])
    requests.check_unreferenced_is_nan(both, POOLS)
    sums, maxes = _reference(**both.kwargs())
    n = len(lengths)
    assert torch.equal(sums[:n], expected[0]) and torch.equal(sums[n:], expected[0].flip(0))
    assert torch.equal(maxes[:n], expected[1])


@pytest.mark.parametrize("check", ["batch_prefix", "position", "row_start"])
def test_row_checks_do_not_run_on_a_request_level_component(check):
    result = run_check(TOY, FAST, check, CASE, Lane.CPU)
    assert result.status == "skip" and "request-level" in result.detail


def test_max_m_cuts_the_co_batch_sizes_and_says_so():
    cut = run_check(TOY, "small_batch", "co_batch", CASE, Lane.CPU, m_limit=3)
    assert cut.m_cut
    assert not any("with 7 others" in w or "with 255 others" in w for w in cut.where)
    assert not run_check(TOY, FAST, "co_batch", CASE, Lane.CPU).m_cut


def test_co_batch_draws_its_other_requests_from_every_mix_at_the_same_cost():
    """Mixes are dealt round-robin over the (target, size) pairs: as many launches as with one
    pool, every mix used, and each label names its mix."""
    labels = []
    for comp in (PLAIN, MIXED):
        seen: list[str] = []
        original = invariance.DriverResult.record

        def spy(self, label, *args, _seen=seen, _original=original, **kwargs):
            _seen.append(label)
            return _original(self, label, *args, **kwargs)

        invariance.DriverResult.record = spy
        try:
            assert run_check(comp, FAST, "co_batch", CASE, Lane.CPU).status == "pass"
        finally:
            invariance.DriverResult.record = original
        labels.append(seen)
    plain, mixed = labels
    assert len(plain) == len(mixed)
    assert any(label.endswith("(plain)") for label in mixed)
    assert any(label.endswith("(one_huge)") for label in mixed)
    assert not any("(" in label for label in plain)


def test_a_subject_varying_only_beside_a_huge_request_is_caught_through_the_one_huge_mix():
    caught = run_check(MIXED, "long_neighbour", "co_batch", CASE, Lane.CPU)
    assert caught.status == "fail" and caught.where
    assert all(w.endswith("(one_huge)") for w in caught.where), caught.where
    assert "(one_huge)" in caught.detail
    # without the mixes (the same case with another seed) nothing reaches the other path
    assert run_check(PLAIN, "long_neighbour", "co_batch", CASE, Lane.CPU).status == "pass"
    assert run_check(MIXED, FAST, "co_batch", CASE, Lane.CPU).status == "pass"
    assert run_check(MIXED, FAST, "slot", CASE, Lane.CPU).status == "pass"


def test_a_single_request_case_still_sees_every_mix():
    one = Case("paged_sums", {"requests": 1}, seed=0)
    caught = run_check(MIXED, "long_neighbour", "co_batch", one, Lane.CPU, m_limit=2)
    assert caught.status == "fail" and caught.where == ["request 0 with 1 other (one_huge)"]


# --- the paged layout's options (decode attention's: -1 padding, ragged index lists) -------------

MINUS_ONE = requests.PagedLayout(
    ("k", "v"), ragged=("indices",), minus_one_padding=True, spare_pages=4, extra_columns=0
)


def _two_pool_batch(lengths, k, seed):
    """Requests over two pools ``k``/``v`` [pages, PAGE, 2], a -1-padded table one column wider
    than needed, NaN tails and spare pages, and a ragged ``indices [R, 2, k]`` row."""
    g = torch.Generator().manual_seed(seed)
    need = requests.pages_needed(lengths, PAGE)
    num_pages = sum(need) + 2
    table = requests.table_padding((len(lengths), max(need, default=0) + 1), num_pages, g, minus_one=True)
    k_pool = requests.nan_filled_pages(num_pages, PAGE, 2)
    v_pool = requests.nan_filled_pages(num_pages, PAGE, 2)
    order = torch.randperm(num_pages, generator=g)
    taken = 0
    for r, n in enumerate(need):
        table[r, :n] = order[taken : taken + n]
        k_pool[order[taken : taken + n]] = torch.randn(n, PAGE, 2, generator=g)
        v_pool[order[taken : taken + n]] = torch.randn(n, PAGE, 2, generator=g)
        taken += n
    requests.nan_tails(k_pool, table, lengths)
    requests.nan_tails(v_pool, table, lengths)
    rows = {
        "block_table": table.to(torch.int32),
        "seq_lens": torch.tensor(lengths, dtype=torch.int32),
        "indices": torch.randint(-1, 4, (len(lengths), 2, k), generator=g, dtype=torch.int32),
    }
    return Batch(rows, {"k": k_pool, "v": v_pool, "scale": 0.5})


def _tokens(batch, pool):
    """Per request, its referenced tokens of ``pool`` (bits: fp32 viewed as int32)."""
    out = []
    for r, length in enumerate(batch.rows["seq_lens"].tolist()):
        pages = batch.rows["block_table"][r, : requests.pages_needed([length], PAGE)[0]].long()
        out.append(batch.shared[pool][pages].reshape(-1, 2)[:length].view(torch.int32))
    return out


def test_table_padding_draws_page_ids_and_with_minus_one_half_of_them_minus_one():
    g = torch.Generator().manual_seed(0)
    ids = requests.table_padding((40, 50), 7, g)
    assert ids.dtype == torch.int64 and int(ids.min()) == 0 and int(ids.max()) == 6
    mixed = requests.table_padding((40, 50), 7, g, minus_one=True)
    assert set(mixed.unique().tolist()) == {-1, *range(7)}
    assert 0.4 < float((mixed == -1).double().mean()) < 0.6
    assert requests.table_padding((3, 2), 0, g).eq(0).all()  # an empty pool: page 0


def test_nan_tails_nan_only_the_tail_of_each_last_page():
    pool = torch.zeros(3, PAGE)
    table = torch.tensor([[2, -1], [0, 1]])
    requests.nan_tails(pool, table, [PAGE - 1, PAGE + 1])
    assert torch.isnan(pool[2, PAGE - 1]) and not torch.isnan(pool[2, : PAGE - 1]).any()
    assert torch.isnan(pool[1, 1:]).all() and not torch.isnan(pool[1, :1]).any()
    assert not torch.isnan(pool[0]).any()


@given(requests.ragged_seq_lens(5, 30, PAGE, split=8), st.integers(0, 2**31 - 1))
def test_relocation_keeps_every_token_and_nans_the_rest(lengths, seed):
    batch = _two_pool_batch(lengths, 3, seed)
    MINUS_ONE.check_unreferenced_is_nan(batch)
    moved = MINUS_ONE.relocate(batch, torch.Generator().manual_seed(seed))
    MINUS_ONE.check_unreferenced_is_nan(moved)
    for pool in ("k", "v"):
        for a, b in zip(_tokens(batch, pool), _tokens(moved, pool), strict=True):
            assert torch.equal(a, b)
    table = moved.rows["block_table"]
    assert table.dtype == torch.int32 and table.shape == batch.rows["block_table"].shape  # extra_columns=0
    used = sum(requests.pages_needed(lengths, PAGE))
    assert used + 1 <= moved.shared["k"].shape[0] <= used + 4  # 1..spare_pages spare pages
    assert bool(((table >= -1) & (table < moved.shared["k"].shape[0])).all())
    for name in ("seq_lens", "indices"):
        assert moved.rows[name] is batch.rows[name]
    assert moved.shared["scale"] == 0.5


def test_relocation_padding_holds_minus_one_only_where_the_layout_allows_it():
    batch = _two_pool_batch([1, 2, 5], 3, seed=0)
    pads_minus_one, widths = set(), set()  # 5 padding entries: none -1 in 1 of 32
    for seed in range(20):
        moved = MINUS_ONE.relocate(batch, torch.Generator().manual_seed(seed))
        pads_minus_one.add(bool((moved.rows["block_table"] == -1).any()))
        plain = requests.PagedLayout(("k", "v")).relocate(batch, torch.Generator().manual_seed(seed))
        assert bool((plain.rows["block_table"] >= 0).all())
        widths.add(plain.rows["block_table"].shape[1] - batch.rows["block_table"].shape[1])
    assert True in pads_minus_one
    assert widths == {0, 1, 2}  # the default: 0..2 more columns


def test_concat_pads_tables_and_ragged_rows_with_minus_one_and_offsets_page_ids():
    a, b = _two_pool_batch([9, 1], 2, seed=1), _two_pool_batch([3], 5, seed=2)
    both = MINUS_ONE.concat([a, b])
    pages_a = a.shared["k"].shape[0]
    assert both.shared["k"].shape[0] == pages_a + b.shared["k"].shape[0]  # no extra page
    width = max(a.rows["block_table"].shape[1], b.rows["block_table"].shape[1])
    table, bt_b = both.rows["block_table"], b.rows["block_table"]
    assert table.shape == (3, width)
    assert torch.equal(table[2, : bt_b.shape[1]], torch.where(bt_b[0] >= 0, bt_b[0] + pages_a, bt_b[0]))
    assert bool((table[2, bt_b.shape[1] :] == -1).all())
    idx = both.rows["indices"]
    assert idx.shape == (3, 2, 5) and bool((idx[:2, :, 2:] == -1).all())
    assert torch.equal(idx[:2, :, :2], a.rows["indices"]) and torch.equal(idx[2:], b.rows["indices"])
    for pool in ("k", "v"):
        for x, y in zip(_tokens(both, pool), _tokens(a, pool) + _tokens(b, pool), strict=True):
            assert torch.equal(x, y)
    MINUS_ONE.check_unreferenced_is_nan(both)
    # the default layout pads with one NaN page after the pools instead
    plain = requests.PagedLayout(("k", "v"), ragged=("indices",)).concat([a, b])
    assert plain.shared["k"].shape[0] == both.shared["k"].shape[0] + 1
    assert torch.isnan(plain.shared["k"][-1]).all()
    pad = plain.rows["block_table"][2, bt_b.shape[1] :]
    assert bool((pad == plain.shared["k"].shape[0] - 1).all())


def test_concat_refuses_parts_with_different_shared_operands():
    a, b = _two_pool_batch([2], 1, seed=0), _two_pool_batch([2], 1, seed=1)
    other = Batch(b.rows, {**b.shared, "scale": 0.25})
    with pytest.raises(ValueError, match="different 'scale'"):
        MINUS_ONE.concat([a, other])
    with pytest.raises(ValueError, match="no parts"):
        MINUS_ONE.concat([])


def test_take_keeps_the_pools_and_accepts_a_list_or_a_tensor():
    batch = _two_pool_batch([1, 6, 3], 2, seed=4)
    for index in ([2, 0, 2], torch.tensor([2, 0, 2])):
        got = MINUS_ONE.take(batch, index)
        assert got.shared is batch.shared
        assert torch.equal(got.rows["seq_lens"], torch.tensor([3, 1, 3], dtype=torch.int32))


def test_decode_attention_uses_the_paged_layout():
    from batchinv.harness.components import decode_attention

    layout = decode_attention.PAGED
    assert isinstance(layout, requests.PagedLayout)
    assert layout.pools == ("k_cache", "v_cache") and layout.ragged == ("indices",)
    assert layout.minus_one_padding
    model = decode_attention.COMPONENT.requests
    assert model.take == layout.take and model.concat == layout.concat and model.relocate == layout.relocate
