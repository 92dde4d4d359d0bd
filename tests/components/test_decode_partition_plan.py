"""``decode_partition_plan`` (seed 003): the covering property, what the request checks compare,
the negative control caught by each request check, and the plan lifecycle's guards.

The registry-driven tests (tests/components/test_components.py) run agreement, co_batch, slot, placement,
partition and repeat on every case, the token-balanced negative control and the error inputs;
tests/mutants/test_mutants.py plants the planner's and the lifecycle's regressions.
"""

from __future__ import annotations

import dataclasses

import decode_plan_guards as guards
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from batchinv.fast.baselines.decode_partition_plan import token_balanced, token_balanced_schedule
from batchinv.fast.decode_partition_plan import decode_partition_plan as fast
from batchinv.fast.decode_partition_plan import partition_spans, request_partitions
from batchinv.fast.decode_partition_plan_lifecycle import (
    DecodeKernel,
    DecodePlanServer,
    PlanConfig,
    PlanUnavailable,
)
from batchinv.harness.checks import FAST, run_check
from batchinv.harness.components import decode_partition_plan as component_module
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Case
from batchinv.reference.decode_partition_plan import covering_violations, request_work
from batchinv.reference.decode_partition_plan import decode_partition_plan as reference
from batchinv.reference.errors import ArgumentError

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")
COMPONENT = component_module.COMPONENT
#: The issue's partition counts: 1, 2, 4, the H200's 132 partitions and one more.
PARTITION_COUNTS = (1, 2, 4, 132, 133)
CONFIG = {"block_size": 16, "blocks_per_split": 4, "max_splits": 16}  # 1024-token capacity


def any_lane(fn):
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def _spans(parts: int, b: int) -> list[tuple[int, int]]:
    return [(int(s), int(e)) for s, e in partition_spans(b, parts, DEVICE).tolist()]


@st.composite
def _plans(draw):
    """(P, b, lengths): P from the issue's counts, b in 1..2P+1, lengths in [0, 1024]."""
    parts = draw(st.sampled_from(PARTITION_COUNTS))
    b = draw(st.integers(1, 2 * parts + 1))
    lens = draw(st.lists(st.integers(0, 1024), min_size=b, max_size=b))
    return parts, b, lens


# --- the covering property ------------------------------------------------------------------------


@any_lane
@given(_plans())
@example((4, 9, [0] * 9))
@example((133, 267, [1024] * 267))
@example((132, 1, [5]))
def test_every_request_is_owned_once_contiguously_in_order(plan):
    """Partition p owns [floor(p b / P), floor((p + 1) b / P)): the spans cover every request
    exactly once, contiguous and in order; each request's partition (fast and reference) is the
    span holding it, non-decreasing along the batch, so no request is split across partitions."""
    parts, b, lens = plan
    spans = _spans(parts, b)
    assert spans == [(p * b // parts, (p + 1) * b // parts) for p in range(parts)]
    assert not covering_violations(spans, b)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    want = reference(seq, parts, **CONFIG)
    got = fast(seq, parts, **CONFIG)
    for name, w, g in zip(("partition", "num_splits", "split_bounds"), want, got, strict=True):
        assert torch.equal(w, g), name
    owner = got[0].tolist()
    assert owner == sorted(owner)
    for r, p in enumerate(owner):
        assert spans[p][0] <= r < spans[p][1], (r, p)


@any_lane
@given(st.lists(st.integers(0, 1024), min_size=1, max_size=20), st.sampled_from(PARTITION_COUNTS))
def test_each_request_is_cut_at_its_own_split_multiples(lens, parts):
    """A request's splits start at 0, step by split_tokens, end at its length, -1 after: a
    function of its own length alone (the same row alone as in the batch)."""
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    _, num_splits, bounds = fast(seq, parts, **CONFIG)
    split = CONFIG["block_size"] * CONFIG["blocks_per_split"]
    for r, n in enumerate(lens):
        cuts = [*range(0, n, split), n] if n else [0]
        assert num_splits[r].item() == len(cuts) - 1
        assert bounds[r].tolist() == cuts + [-1] * (CONFIG["max_splits"] + 1 - len(cuts))
        alone = fast(seq[r : r + 1], parts, **CONFIG)
        assert all(
            torch.equal(a[0], w[r]) for a, w in zip(request_work(alone), (num_splits, bounds), strict=True)
        )


@pytest.mark.cpu
def test_the_covering_check_catches_a_request_split_across_partitions():
    """The negative control of the covering check: the token-balanced walk cuts a long request
    where a partition's budget ends, and the check names the request and both partitions."""
    spans, _, cuts = token_balanced_schedule([1000, 3, 50], 4, 16)
    assert cuts[0], "the long request must be cut for this control to mean anything"
    problems = covering_violations(spans, 3)
    assert any("request 0: in partitions 0 and 1 (split across partitions)" in p for p in problems), problems


@pytest.mark.cpu
def test_the_covering_check_catches_an_unowned_request_and_a_gap():
    assert covering_violations([(0, 2), (2, 4)], 5) == ["requests [4] owned by no partition"]
    assert covering_violations([(0, 1), (2, 3)], 3)[0].startswith("partition 1: starts at request 2")


@pytest.mark.cpu
def test_request_partitions_are_read_from_the_span_ends():
    spans = torch.tensor([[0, 0], [0, 2], [2, 2], [2, 3]], dtype=torch.int32)
    assert request_partitions(spans, 3).tolist() == [1, 1, 3]


# --- what the request checks compare ----------------------------------------------------------------


def _first_case() -> Case:
    return COMPONENT.cases(Lane.CPU)[0]


@pytest.mark.cpu
@pytest.mark.parametrize("check", ["co_batch", "slot", "partition"])
def test_the_request_checks_compare_the_partition_local_work_only(check):
    """co_batch, slot and partition compare (num_splits, split_bounds) (``RequestModel.local``):
    with the whole output compared instead, the pinned plan would 'fail' on its partition id,
    which moves with b, the slot and P by design."""
    case = _first_case()
    assert run_check(COMPONENT, FAST, check, case, Lane.CPU).status == "pass"
    whole = dataclasses.replace(COMPONENT, requests=dataclasses.replace(COMPONENT.requests, local=None))
    result = run_check(whole, FAST, check, case, Lane.CPU)
    assert result.status == "fail", f"{result.status}: {result.detail}"


@pytest.mark.cpu
@pytest.mark.parametrize("check", ["co_batch", "slot", "partition"])
def test_each_request_check_catches_the_token_balanced_planner(check):
    """Each check alone finds different bits in the token-balanced plan on the first cpu case
    (a long request cut where a partition's budget runs out): a failure, never an error."""
    result = run_check(COMPONENT, "token_balanced", check, _first_case(), Lane.CPU)
    assert result.status == "fail", f"{result.status}: {result.detail}"


@pytest.mark.cpu
def test_the_baseline_splits_a_long_request_by_the_others():
    alone = token_balanced(torch.tensor([1000], dtype=torch.int32), 4, **CONFIG)
    beside = token_balanced(torch.tensor([1000, 3, 50], dtype=torch.int32), 4, **CONFIG)
    assert alone[1][0].item() != beside[1][0].item()


@pytest.mark.cpu
def test_relocated_lengths_sit_in_a_strided_view_of_sentinels():
    batch = component_module.build(_first_case(), torch.device("cpu"))
    moved = component_module.relocate(batch, torch.Generator().manual_seed(3))
    assert torch.equal(moved.rows["seq_lens"], batch.rows["seq_lens"])


# --- the lifecycle (seed 003): each guard, as the test of its name ------------------------------------


@pytest.mark.cpu
def test_cold_start_first_call_uses_the_pinned_plan():
    guards.cold_start_first_call_uses_the_pinned_plan(DecodePlanServer)


@pytest.mark.cpu
def test_cold_start_records_the_observed_partition_count():
    guards.cold_start_records_the_observed_partition_count(DecodePlanServer)


@pytest.mark.cpu
def test_every_step_reads_its_own_pinned_plan():
    guards.every_step_reads_its_own_pinned_plan(DecodePlanServer)


@pytest.mark.cpu
def test_pinned_plan_installs_both_metadata_tensors():
    guards.pinned_plan_installs_both_metadata_tensors(DecodePlanServer)


@pytest.mark.cpu
def test_cold_start_fails_closed_without_an_observation():
    guards.cold_start_fails_closed_without_an_observation(DecodePlanServer)


@pytest.mark.cpu
def test_every_guard_runs_as_the_test_of_its_name():
    for name in guards.GUARDS:
        assert callable(globals().get(f"test_{name}")), name


@pytest.mark.cpu
def test_the_guard_batches_tell_the_in_kernel_plan_from_the_pinned_one():
    """On every guard batch and shape the kernel's own plan differs from the pinned one, so an
    output equal to the pinned plan cannot come from the kernel's own planner."""
    k = guards.kernel()
    c = guards.CONFIG
    for batch in guards.BATCHES:
        seq = guards.lengths(batch)
        for shape in guards.SHAPES:
            parts = k.num_sm_parts(shape)
            own = token_balanced(seq, parts, c.block_size, c.blocks_per_split, c.max_splits)
            pinned = guards.pinned(seq, parts)
            assert not torch.equal(own[1], pinned[1]), (batch, shape)
    assert len({k.num_sm_parts(s) for s in guards.SHAPES}) == len(guards.SHAPES)


@pytest.mark.cpu
def test_the_unavailable_plan_error_names_the_shape():
    server = DecodePlanServer(DecodeKernel(PlanConfig(), 8, observable=False), PlanConfig())
    with pytest.raises(PlanUnavailable, match=r"shape \(16, 1\)"):
        server.step(torch.tensor([5], dtype=torch.int32), (16, 1))


@pytest.mark.cpu
def test_a_batch_past_the_buffers_is_refused():
    config = PlanConfig(max_requests=2)
    server = DecodePlanServer(DecodeKernel(config, 8), config)
    with pytest.raises(ArgumentError, match=r"'seq_lens'.*max_requests = 2.*3"):
        server.step(torch.tensor([1, 2, 3], dtype=torch.int32), (16, 1))


# --- GPU: the planner is capturable --------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_lengths_equals_eager():
    """Captured once, replayed after seq_lens was rewritten in place (a decode step): every
    replay gives the eager plan's bits (no host synchronisation inside the planner)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator().manual_seed(7)
    seq = torch.randint(0, 1025, (265,), generator=gen, dtype=torch.int32).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fast(seq, 132, **CONFIG)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fast(seq, 132, **CONFIG)
    for step in range(4):
        seq.copy_(torch.randint(0, 1025, (265,), generator=gen, dtype=torch.int32))
        graph.replay()
        eager = reference(seq, 132, **CONFIG)
        torch.cuda.synchronize()
        assert all(torch.equal(c, e) for c, e in zip(captured, eager, strict=True)), f"step {step}"
