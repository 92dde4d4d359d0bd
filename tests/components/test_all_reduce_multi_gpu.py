"""The collectives over NCCL, one rank per GPU: the ``gpu_2`` / ``gpu_4`` lane (``ci/multi_gpu.sh``
runs this module under ``torchrun``; the plugin skips it anywhere else, with the reason).

**Not yet run**: no multi-GPU machine kind was lent when it was written.  Every rank runs the
same tests in the same order, so the scenarios' collectives meet; each rank judges its own
results against the single-process subjects on its GPU, bitwise (``harness/multirank.py``).
The arrival-order EP combine receives from any source, which NCCL lacks: it runs over a gloo
group of the same ranks.  With 2 ranks NCCL's sum is one commuting addition (its algorithm
cannot change the bits); it is detected there by the TP degree (each rank's fp32 pre-sum),
and from 4 ranks on also by the message size (the large GPU-lane messages of
``multirank.MULTIRANK_GPU_SEEDS``), if NCCL's choice of ring / tree and chunking moves a row's
order -- the run will say.
"""

from __future__ import annotations

import os

import pytest

from batchinv.harness import multirank

pytestmark = [pytest.mark.gpu]

WORLDS = [
    pytest.param(2, marks=pytest.mark.gpu_2, id="gpu_2"),
    pytest.param(4, marks=pytest.mark.gpu_4, id="gpu_4"),
]


@pytest.fixture(scope="module")
def nccl():
    return multirank.init_from_env("nccl")


@pytest.fixture(scope="module")
def results(nccl):
    pg, device = nccl
    return multirank.both_scenario(pg, device)


def _rank() -> int:
    return int(os.environ["RANK"])


@pytest.mark.parametrize("world", WORLDS)
def test_the_pinned_all_reduce_is_the_single_process_tree_over_nccl(nccl, results, world):
    v = multirank.judge_all_reduce(results["all_reduce"], world, _rank(), nccl[1])
    assert v.pinned_checked >= 10 and not v.pinned_failures, v.pinned_failures


@pytest.mark.negative_control
@pytest.mark.parametrize("world", WORLDS)
def test_nccl_all_reduce_is_detected_by_different_bits(nccl, results, world):
    found = multirank.judge_all_reduce(results["all_reduce"], world, _rank(), nccl[1]).control
    assert found["torch_distributed"], "NCCL's all-reduce gave the pinned invariance's bits everywhere"


@pytest.mark.negative_control
@pytest.mark.parametrize("world", [WORLDS[1]])
def test_the_arrival_ring_varies_under_rank_skew_over_nccl(nccl, results, world):
    v = multirank.judge_all_reduce(results["all_reduce"], world, _rank(), nccl[1])
    if _rank() != 0:
        pytest.skip("rank 0 records the arrival order")
    if v.inconclusive:
        pytest.skip(f"inconclusive (not a pass): {v.inconclusive}")
    assert v.control["arrival_ring"], f"arrival orders {v.arrival_orders} gave the same bits"


@pytest.mark.parametrize("world", WORLDS)
def test_the_pinned_ep_combine_is_moe_combine_over_nccl(nccl, results, world):
    v = multirank.judge_ep(results["ep_combine"], world, _rank(), nccl[1])
    assert not v.pinned_failures, v.pinned_failures


@pytest.mark.negative_control
@pytest.mark.parametrize("world", WORLDS)
def test_the_arrival_order_ep_combine_is_detected(nccl, results, world):
    v = multirank.judge_ep(results["ep_combine"], world, _rank(), nccl[1])
    assert any(f.startswith("ep_degree") for f in v.control["arrival_ep_combine"]), v.control
