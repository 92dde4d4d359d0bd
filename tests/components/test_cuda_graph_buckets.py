"""Tests of ``cuda_graph_buckets``: the seed's regressions (max_requests = 100, the 1- and
2-request decode buckets), the bucket table against the reference, and hypothesis properties:
every admissible step maps to exactly one bucket, the bucket depends only on the step's dims,
no requested size is dropped, every token count is a multiple of 64.

Expected tables are written out by hand or follow from the definitions in the reference
(validity, holding); never from the code under test.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from batchinv.fast import cuda_graph_buckets as fast
from batchinv.fast.baselines.cuda_graph_buckets import align_then_validate, align_then_validate_buckets
from batchinv.harness.components import cuda_graph_buckets as component
from batchinv.harness.lanes import Lane
from batchinv.reference import cuda_graph_buckets as ref
from batchinv.reference.cuda_graph_buckets import DECODE, PREFILL, TOKEN_ALIGN, BatchDims

CPU = torch.device("cpu")
SEED_CONFIG = {
    "max_requests": 100,
    "max_tokens": 512,
    "max_seq_len": 64,
    "num_speculative_tokens": 0,
    "mix": "decode",
}


def decode_step(count: int, spec: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(count, dtype=torch.int64), torch.full((count,), spec + 1, dtype=torch.int64)


def rows(table: torch.Tensor) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in r) for r in table]


@pytest.mark.cpu
def test_decode_only_buckets_survive_max_requests_100():
    """Seed 001's review finding: with max_requests = 100 the largest decode size (100 tokens,
    100 requests) must become a 128-token bucket, not vanish; a decode step of 100 requests is
    graphed, padded to 128 tokens."""
    want = [(64, 0, d) for d in (1, 2, 4, 8, 16, 32, 64)] + [(128, 0, 100)]
    assert rows(fast.capture_buckets(**SEED_CONFIG)) == want
    assert [
        (b.tokens, b.prefill, b.decode) for b in ref.capture_buckets(ref.check_config(**SEED_CONFIG))
    ] == want
    for count in (65, 99, 100):
        assert fast.cuda_graph_buckets(*decode_step(count), **SEED_CONFIG).tolist() == [[1, 0]] * count


@pytest.mark.cpu
def test_align_then_validate_drops_the_largest_decode_bucket_at_max_requests_100():
    """The negative control written out: aligned first, (100, 0, 100) becomes (128, 0, 100),
    which claims 28 tokens more than 100 decode requests have and fails validation; only the
    64-request size (already aligned) survives, and a decode step of 65 to 100 requests runs
    eager at its own token count (100 mod 64 = 36) while one of 64 is graphed."""
    assert rows(align_then_validate_buckets(**SEED_CONFIG)) == [(64, 0, 64)]
    assert align_then_validate(*decode_step(100), **SEED_CONFIG).tolist() == [[0, 36]] * 100
    assert align_then_validate(*decode_step(64), **SEED_CONFIG).tolist() == [[1, 0]] * 64


@pytest.mark.cpu
def test_one_and_two_request_decode_steps_pad_to_64_tokens():
    """Seed 001: auto-sizing injected 1- and 2-token decode buckets whose graphed norms ran in
    another M % 32 bit class than the 64-padded eager steps; under the pin they pad to 64."""
    for count in (1, 2):
        table = fast.capture_buckets(**SEED_CONFIG)
        step = BatchDims(count, 0, count)
        assert rows(table[fast.step_bucket(table, step)][None]) == [(64, 0, count)]
        assert fast.cuda_graph_buckets(*decode_step(count), **SEED_CONFIG).tolist() == [[1, 0]] * count


@pytest.mark.cpu
def test_a_full_prefill_step_keeps_its_bucket_when_max_tokens_is_not_64_aligned():
    """The mixed twin of the seed's regression: max_tokens = max_requests * max_seq_len = 5000
    (not a multiple of 64); the 5000-token size aligns to 5056 > 100 * 50, so align-then-validate
    drops it and a full prefill step runs eager; validate-then-align keeps it."""
    cfg = {
        "max_requests": 100,
        "max_tokens": 5000,
        "max_seq_len": 50,
        "num_speculative_tokens": 0,
        "mix": "mixed",
    }
    kinds, tokens = torch.ones(100, dtype=torch.int64), torch.full((100,), 50, dtype=torch.int64)
    assert (5056, 100, 0) in rows(fast.capture_buckets(**cfg))
    assert (5056, 100, 0) not in rows(align_then_validate_buckets(**cfg))
    assert fast.cuda_graph_buckets(kinds, tokens, **cfg).tolist() == [[1, 0]] * 100
    assert align_then_validate(kinds, tokens, **cfg).tolist() == [[0, 5000 % 64]] * 100


@pytest.mark.cpu
def test_a_64_multiple_max_requests_hides_the_regression():
    """Why the sweep has the max_requests = 100 case: at 128 (as the seed's first test, at 512)
    align-then-validate still graphs every decode step -- only the sizes below 64 are dropped."""
    cfg = {**SEED_CONFIG, "max_requests": 128}
    for count in (1, 63, 64, 65, 128):
        assert align_then_validate(*decode_step(count), **cfg).tolist() == [[1, 0]] * count


@pytest.mark.cpu
def test_a_decode_step_takes_a_decode_bucket_and_a_step_with_a_prefill_a_mixed_one():
    cfg = {"max_requests": 4, "max_tokens": 16, "max_seq_len": 8, "num_speculative_tokens": 0, "mix": "mixed"}
    table = ref.capture_buckets(ref.check_config(**cfg))
    assert ref.match_bucket(table, BatchDims(3, 0, 3)) == BatchDims(64, 0, 4)
    assert ref.match_bucket(table, BatchDims(9, 1, 2)) == BatchDims(64, 4, 0)  # prefill slots hold decodes
    assert ref.match_bucket(table, BatchDims(1, 1, 0)) == BatchDims(64, 1, 0)


@pytest.mark.cpu
def test_the_cases_are_admissible_beside_99_neighbours():
    """Every co-batch the checks form is a step the configuration admits (a neighbour pool plus
    the case's longest request fits max_requests and max_tokens)."""
    for case in component.cases(Lane.CPU):
        batch = component.build(case, CPU)
        ref.check_step(batch.rows["kinds"], batch.rows["num_tokens"], ref.check_config(**batch.shared))
        for mix in component.neighbours(case, Lane.CPU).values():
            pool = component.build(mix, CPU)
            for r in range(batch.num_rows):
                joined = component.COMPONENT.requests.concat([batch.take([r]), pool])
                ref.check_step(
                    joined.rows["kinds"], joined.rows["num_tokens"], ref.check_config(**batch.shared)
                )
    assert any(c.axes["max_requests"] % 64 for c in component.cases(Lane.CPU))


# --- hypothesis -----------------------------------------------------------------------------

CONFIGS = component.config_strategy()


def _table(cfg) -> list[BatchDims]:
    return ref.capture_buckets(ref.check_config(**cfg))


@given(CONFIGS)
@example(SEED_CONFIG)
def test_the_fast_table_equals_the_reference_table(cfg):
    assert rows(fast.capture_buckets(**cfg)) == [(b.tokens, b.prefill, b.decode) for b in _table(cfg)]


@given(CONFIGS)
@example(SEED_CONFIG)
def test_no_requested_size_is_dropped_and_every_token_count_is_a_multiple_of_64(cfg):
    c = ref.check_config(**cfg)
    table = set(_table(cfg))
    for size in ref.requested_sizes(c):
        assert ref.is_valid(size, c), size  # the sizing asks only for steps the server can form
        assert BatchDims(ref.align_tokens(size.tokens), size.prefill, size.decode) in table, size
    assert all(b.tokens % TOKEN_ALIGN == 0 and b.tokens >= TOKEN_ALIGN for b in table)
    assert all(int(t) % TOKEN_ALIGN == 0 for t in fast.capture_buckets(**cfg)[:, 0])


@st.composite
def config_and_step(draw):
    cfg = draw(CONFIGS)
    kinds, tokens = draw(component.step_strategy(cfg))
    return cfg, kinds, tokens


@given(config_and_step())
@example((SEED_CONFIG, [DECODE] * 100, [1] * 100))
def test_every_admissible_step_maps_to_exactly_one_bucket(args):
    """The buckets holding the step are not empty, their smallest is unique (the table has no
    duplicates), and the fast path picks it; every request of the step gets (graphed, 0)."""
    cfg, kinds, tokens = args
    c = ref.check_config(**cfg)
    k, n = torch.tensor(kinds), torch.tensor(tokens)
    step = ref.check_step(k, n, c)
    table = _table(cfg)
    assert len(set(table)) == len(table)
    holding = [b for b in table if ref.holds(b, step)]
    assert holding, step
    smallest = min(holding)
    assert [b for b in holding if b == smallest] == [smallest]
    fast_table = fast.capture_buckets(**cfg)
    assert rows(fast_table[fast.step_bucket(fast_table, step)][None]) == [
        (smallest.tokens, smallest.prefill, smallest.decode)
    ]
    assert fast.cuda_graph_buckets(k, n, **cfg).tolist() == [[1, 0]] * len(kinds)


@given(config_and_step(), st.data())
def test_the_bucket_of_a_step_depends_only_on_its_dims(args, data):
    """Reordering the requests, or moving prefill tokens between prefills (same tokens,
    prefill and decode counts), picks the same bucket."""
    cfg, kinds, tokens = args
    c = ref.check_config(**cfg)
    table = fast.capture_buckets(**cfg)
    step = ref.check_step(torch.tensor(kinds), torch.tensor(tokens), c)
    order = data.draw(st.permutations(range(len(kinds))))
    k2, n2 = [kinds[i] for i in order], [tokens[i] for i in order]
    prefills = [i for i, kind in enumerate(k2) if kind == PREFILL]
    if len(prefills) >= 2:  # move tokens from one prefill to another, within max_seq_len
        a, b = prefills[0], prefills[-1]
        move = min(n2[a] - 1, c.max_seq_len - n2[b])
        n2[a], n2[b] = n2[a] - move, n2[b] + move
    other = ref.check_step(torch.tensor(k2), torch.tensor(n2), c)
    assert other == step
    assert fast.step_bucket(table, other) == fast.step_bucket(table, step)
