"""What the registry tests cannot say about ``all_reduce``: the one rounding it promises,
checked against an exact rational sum; the distributed pinned paths on in-process gloo ranks
equal to the single-process subject; the registry's arrival-order control records that its
rank skew took effect; the multi-GPU lane's markers, skips and script."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from batchinv.fast.all_reduce import METHODS, all_reduce, pinned_all_reduce
from batchinv.fast.baselines import all_reduce as baselines
from batchinv.fast.gloo_threads import gloo_threads
from batchinv.harness.components import all_reduce as entry
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import MULTI_GPU_MARKERS, multi_gpu_skip_reason
from batchinv.reference.all_reduce import all_reduce as reference_all_reduce

ROOT = Path(__file__).resolve().parents[2]


def _partials(values: str, rows: int = 6, leaves: int = 4, cols: int = 24, seed: int = 3) -> torch.Tensor:
    return entry.build_partials(values, rows, leaves, cols, torch.Generator().manual_seed(seed))


def test_the_reference_is_the_exact_sum_rounded_once_where_the_fp64_sum_is_exact():
    """An oracle apart from the reference: each element's leaves summed as rationals; where that
    sum is an fp64 value (the N(0, 1) leaves: always) fp32 rounds it once."""
    p = _partials("normal")
    out = reference_all_reduce(p)
    exact_elements = 0
    for m in range(p.shape[0]):
        for n in range(p.shape[2]):
            exact = sum((Fraction(float(v)) for v in p[m, :, n]), Fraction(0))
            if Fraction(float(exact)) != exact:
                continue
            exact_elements += 1
            once = torch.tensor(float(exact), dtype=torch.float64).float()
            assert out[m, n].view(torch.int32) == once.view(torch.int32), (m, n)
    assert exact_elements == p.shape[0] * p.shape[2]


def test_the_magnitudes_values_make_the_fp32_order_visible():
    """The negative controls' inputs: two fp32 orders of the same leaves differ in many elements."""
    p = _partials("magnitudes", rows=17)
    forward = ((p[:, 0] + p[:, 1]) + p[:, 2]) + p[:, 3]
    paired = (p[:, 0] + p[:, 2]) + (p[:, 1] + p[:, 3])
    assert (forward != paired).float().mean() > 0.25


@pytest.mark.cpu
@pytest.mark.parametrize("method", METHODS)
def test_the_pinned_paths_on_gloo_ranks_are_the_single_process_tree(method):
    p = _partials("specials", rows=5, leaves=4, cols=37)
    expected = all_reduce(p, tp_degree=1)
    for degree in (1, 2, 4):
        width = 4 // degree
        outs = gloo_threads(degree).run(
            lambda r, pg, w=width: pinned_all_reduce(
                p[:, r * w : (r + 1) * w].contiguous(), pg, method=method
            )
        )
        for rank, out in enumerate(outs):
            assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), (degree, rank)


def test_the_registry_arrival_ring_records_that_its_skew_changed_the_arrival_order():
    p = _partials("magnitudes", rows=3)
    before = len(baselines.ARRIVALS)
    outs = [baselines.arrival_ring_all_reduce(p) for _ in range(3)]
    orders = list(baselines.ARRIVALS)[before:]
    assert len(orders) == 3 and len(set(orders)) >= 2, orders
    assert any(not torch.equal(o, outs[0]) for o in outs[1:]), f"orders {orders} gave the same bits"


def test_the_multi_gpu_markers_run_only_under_torchrun_with_their_world_size(monkeypatch):
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert set(MULTI_GPU_MARKERS) == {"gpu_2", "gpu_4"}
    assert multi_gpu_skip_reason({"cpu"}, Lane.CPU) is None
    assert "cpu lane" in multi_gpu_skip_reason({"gpu_2"}, Lane.CPU)
    assert "only under torchrun" in multi_gpu_skip_reason({"gpu_4"}, Lane.SM90)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert multi_gpu_skip_reason({"gpu_2"}, Lane.SM90) is None
    assert "WORLD_SIZE in [4]" in multi_gpu_skip_reason({"gpu_4"}, Lane.SM90)


def test_the_markers_are_registered(pytestconfig):
    registered = " ".join(pytestconfig.getini("markers"))
    assert "gpu_2:" in registered and "gpu_4:" in registered


def test_the_multi_gpu_lane_script_runs_torchrun_with_nvlink_multicast_off():
    script = (ROOT / "ci" / "multi_gpu.sh").read_text()
    assert "NCCL_NVLS_ENABLE=0" in script and "TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in script
    assert "torch.distributed.run" in script and "gpu_$n" in script
    assert os.access(ROOT / "ci" / "multi_gpu.sh", os.X_OK)
