"""Each xdist worker runs on its own GPU (a multi-GPU runner), and says which one it used.

Every instance checks that the worker's current CUDA device, and where a plain ``"cuda"``
allocation lands, is the one :func:`batchinv.harness.plugin.worker_gpu` assigns, and appends
``worker device`` to ``reports/worker-devices.txt`` (the device runs commit that file: with two
GPUs and two workers it must list gw0 on cuda:0 and gw1 on cuda:1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchinv.harness.plugin import worker_gpu

INSTANCES = 32


@pytest.mark.gpu
@pytest.mark.parametrize("instance", range(INSTANCES))
def test_worker_runs_on_its_own_gpu(instance):
    import torch

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = torch.cuda.device_count()
    expected = worker_gpu(worker, count) if count > 1 else 0
    assert torch.cuda.current_device() == expected
    assert torch.empty(1, device="cuda").device.index == expected
    log = Path("reports") / "worker-devices.txt"
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as fh:
        fh.write(f"{worker} cuda:{torch.cuda.current_device()} of {count} ({torch.cuda.get_device_name()})\n")


@pytest.mark.parametrize(
    ("worker", "count", "gpu"), [("gw0", 2, 0), ("gw1", 2, 1), ("gw2", 2, 0), ("gw5", 4, 1)]
)
def test_workers_take_gpus_round_robin(worker, count, gpu):
    assert worker_gpu(worker, count) == gpu
