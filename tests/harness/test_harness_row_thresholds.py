"""batch_prefix finds a row-count threshold anywhere in 1..257 (issue 25, section 5).

The old sweep skipped M 3..6 and compared only rows 0 and 1 in its small launches, so a subject
that changes its fp32 summation order above 4 rows came back ``inconclusive`` as a negative
control although a quarter of the fp32 case's rows change bits when run alone.
"""

from __future__ import annotations

import pytest
import torch

from batchinv.harness import invariance, testing
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import ROW_THRESHOLD_MS, Batch, prefix_sweep, threshold_cycle


def _split_sum_above(rows: int):
    """RMSNorm whose fp32 sum of squares is split in two halves above ``rows`` rows (on the base
    sweep: inconclusive as a baseline, no compared row changes bits)."""

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        sq = x.float() * x.float()
        if x.shape[0] > rows:
            half = sq.shape[-1] // 2
            total = sq[:, :half].sum(-1, keepdim=True) + sq[:, half:].sum(-1, keepdim=True)
        else:
            total = sq.sum(-1, keepdim=True)
        return (x.float() * torch.rsqrt(total / x.shape[-1] + eps) * weight.float()).to(x.dtype)

    return rms_norm


@pytest.mark.cpu
def test_a_subject_varying_above_4_rows_is_detected_as_a_baseline():
    subject = _split_sum_above(4)
    report = testing.check_subject("rms_norm", subject, lane="cpu", role="baseline", name="above4")
    assert report.ok, report.summary()
    detection = next(r for r in report.results if r.status == "fail")
    assert detection.check == "batch_prefix"


def _shift_above(rows: int):
    """One ULP on every element of a launch of more than ``rows`` rows."""

    def fn(b: Batch):
        x = b.rows["x"]
        return (x * (1.0 + 2.0**-23) if x.shape[0] > rows else x * 1.0,)

    return fn


@pytest.mark.parametrize("lane", [Lane.SM90, Lane.CPU])
def test_every_threshold_is_crossed(lane):
    b = Batch({"x": torch.randn(40, 8, generator=torch.Generator().manual_seed(0)) + 4.0})
    ms, cycle = prefix_sweep(lane), threshold_cycle(lane)
    reach = max(cycle, b.num_rows)
    for rows in range(1, max(ROW_THRESHOLD_MS)):
        result = invariance.batch_prefix(_shift_above(rows), b, ms, cycle_to=cycle)
        assert result.passed == (rows >= reach), (lane, rows, result.where)


def test_small_launches_compare_distinct_rows():
    launches = invariance.prefix_launches(300, prefix_sweep(Lane.CPU))
    below_7 = {r for m, rows in launches if m <= 6 for r in rows}
    assert below_7 == set(range(21))  # 1 + 2 + ... + 6 rows, each once
    for m, rows in invariance.prefix_launches(3, prefix_sweep(Lane.SM90), cycle_to=257):
        assert len(rows) == m and set(rows) <= {0, 1, 2}


#: The batch sizes vLLM's tuned fused-MoE config files are keyed by; a launch of M rows takes
#: the config of the nearest key (``min(keys, key=lambda k: abs(k - M))``,
#: ``vllm/model_executor/layers/fused_moe/fused_moe.py:try_get_optimal_moe_config``).
VLLM_CONFIG_KEYS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


def _shift_with_config(key: int):
    """One ULP on every element of a launch whose nearest config key is ``key``: its bits change
    inside a band of row counts (21..28 for 24), not above a threshold."""

    def fn(b: Batch):
        x = b.rows["x"]
        nearest = min(VLLM_CONFIG_KEYS, key=lambda k: abs(k - x.shape[0]))
        return (x * (1.0 + 2.0**-23) if nearest == key else x * 1.0,)

    return fn


@pytest.mark.parametrize(("lane", "rows"), [(Lane.SM90, 3), (Lane.CPU, 300)])
def test_a_config_band_of_nearest_key_lookup_is_launched(lane, rows):
    b = Batch({"x": torch.randn(rows, 4, generator=torch.Generator().manual_seed(0)) + 4.0})
    ms, cycle = prefix_sweep(lane), threshold_cycle(lane)
    reach = max(cycle, b.num_rows)
    for key in VLLM_CONFIG_KEYS:
        if key > reach:
            continue
        result = invariance.batch_prefix(_shift_with_config(key), b, ms, cycle_to=cycle)
        assert not result.passed, (lane, key, "no launch takes this key's config")
