"""The collectives on real process groups: ``all_reduce`` and the EP combine over gloo, in 2 and
4 rank processes of this machine (:func:`batchinv.harness.multirank.launch`, bounded in time: a
hang is a ``TimeoutError`` that fails the test, never a blocked CI).

One launch per world size runs every scenario (a process start costs seconds on the cpu lane);
the tests judge each rank's results against the single-process subjects of the registry, bitwise:

* the pinned all-reduce (both methods) equals ``fast.all_reduce`` of the stacked leaves at TP 1
  in every prefix launch (batch_prefix), at TP 2 and 4 (tp_degree) and on repeats;
* ``torch.distributed``'s gloo all-reduce is detected (different bits: batch_prefix, tp_degree);
* the arrival-order ring is detected under the rank skew of ``multirank.SKEWS`` at 4 ranks, the
  perturbation recorded (the measured arrival orders must differ, else the control is
  inconclusive: a skip, never a pass).  At 2 ranks the ring is one commuting sum: no order can
  change it, so it is not run as a control there;
* the pinned EP combine equals ``moe_combine`` of the rank's tokens in one process (EP 1),
  beside any token count of the other ranks, twice; the arrival-order combine is detected.
"""

from __future__ import annotations

import pytest

from batchinv.harness import multirank

pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("multirank")]

WORLDS = (2, 4)
#: The limit on one launch (every scenario, every rank), on a 2-core machine shared with others.
LAUNCH_TIMEOUT_S = 240.0


_RUNS: dict[int, list[dict]] = {}


@pytest.fixture
def runs() -> dict[int, list[dict]]:
    """The launches of this worker process, one per world size (a module-level cache: under
    xdist a module's tests may interleave with others', which would tear a module fixture down)."""
    return _RUNS


def _results(runs: dict[int, list[dict]], world: int) -> list[dict]:
    if world not in runs:
        runs[world] = multirank.launch(world, "both", timeout_s=LAUNCH_TIMEOUT_S)
    return runs[world]


_VERDICTS: dict[tuple[str, int, int], multirank.Verdicts] = {}


def _verdicts(runs: dict[int, list[dict]], kind: str, world: int) -> list[multirank.Verdicts]:
    """Each rank's verdicts on its ``kind`` results (judged once per module)."""
    judge = multirank.judge_all_reduce if kind == "all_reduce" else multirank.judge_ep
    out = []
    for rank, res in enumerate(_results(runs, world)):
        key = (kind, world, rank)
        if key not in _VERDICTS:
            _VERDICTS[key] = judge(res[kind], world, rank)
        out.append(_VERDICTS[key])
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_the_pinned_all_reduce_is_the_single_process_tree_on_every_rank(runs, world):
    for rank, v in enumerate(_verdicts(runs, "all_reduce", world)):
        assert v.pinned_checked >= 10
        assert not v.pinned_failures, f"rank {rank}: {v.pinned_failures}"


@pytest.mark.negative_control
@pytest.mark.parametrize("world", WORLDS)
def test_gloo_all_reduce_is_detected_by_different_bits(runs, world):
    for rank, v in enumerate(_verdicts(runs, "all_reduce", world)):
        found = v.control["torch_distributed"]
        assert found, f"rank {rank}: gloo's all-reduce gave the pinned invariance's bits everywhere"
        if world == 4:  # 4 ranks: the ring's order follows the element's position in the message
            assert any(f.startswith("batch_prefix") for f in found), found


@pytest.mark.negative_control
def test_the_arrival_ring_varies_under_rank_skew_and_the_skew_took_effect(runs):
    v = _verdicts(runs, "all_reduce", 4)[0]
    if v.inconclusive:
        pytest.skip(f"inconclusive (not a pass): {v.inconclusive}")
    assert len(set(v.arrival_orders)) >= 2, v.arrival_orders
    assert v.control["arrival_ring"], f"arrival orders {v.arrival_orders} gave the same bits"


@pytest.mark.parametrize("world", WORLDS)
def test_the_pinned_ep_combine_is_moe_combine_on_every_rank(runs, world):
    for rank, v in enumerate(_verdicts(runs, "ep_combine", world)):
        assert v.pinned_checked == 2 * len(multirank.EP_OTHERS)
        assert not v.pinned_failures, f"rank {rank}: {v.pinned_failures}"


@pytest.mark.negative_control
@pytest.mark.parametrize("world", WORLDS)
def test_the_arrival_order_ep_combine_is_detected_by_different_bits(runs, world):
    """Rank 0's 9 tokens must show it (a rank holding one token may happen to sum it in an order
    that gives the same bits); every rank's findings are in the message."""
    verdicts = _verdicts(runs, "ep_combine", world)
    found = [v.control["arrival_ep_combine"] for v in verdicts]
    assert any(f.startswith("ep_degree") for f in found[0]), found


def test_a_rank_past_the_deadline_fails_the_launch_and_is_killed():
    """The deadline, not the scenario, ends it: the ranks of a scenario that sleeps an hour are
    still starting (or sleeping) at 3 s, and the launch raises instead of waiting."""
    with pytest.raises(TimeoutError, match=r"still running after 3\.0 s"):
        multirank.launch(2, "hang", timeout_s=3.0)


@pytest.mark.negative_control
def test_the_arrival_order_ep_combine_varies_under_rank_skew_and_the_skew_took_effect(runs):
    v = _verdicts(runs, "ep_combine", 4)[0]
    if len(set(v.arrival_orders)) < 2:
        pytest.skip(
            f"inconclusive (not a pass): the skews did not change the arrival order {v.arrival_orders}"
        )
    assert any(f.startswith("repeat under skew") for f in v.control["arrival_ep_combine"]), (
        v.arrival_orders,
        v.control,
    )
