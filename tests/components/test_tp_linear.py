"""``tp_linear``: the row-parallel linear at TP degrees 1, 2, 4, 8 has the single-rank pinned
matmul's bits (the sweep's ``tp_degree`` check compares every degree with ``tp_degree=1``, the
pinned matmul itself; ``tests/components/test_components.py`` runs it and the negative
controls).  Here: how K is cut across ranks, the degrees refused, why one fp32 partial per rank
cannot work, and the chunk-sum kernel the all-reduce reuses."""

from __future__ import annotations

import pytest
import torch

from batchinv.fast.matmul import matmul, plan, sum_chunks
from batchinv.fast.tp_linear import rank_slices, tp_linear
from batchinv.harness.bitpatterns import to_bits
from batchinv.harness.components import tp_linear as component
from batchinv.harness.lanes import Lane
from batchinv.reference.errors import ArgumentError

pytestmark = pytest.mark.cpu


def test_each_rank_holds_whole_consecutive_chunks():
    for t in (1, 2, 4, 8):
        ranks = rank_slices(500, 64, t)  # 8 chunks, the last 52 wide
        flat = [s for rank in ranks for s in rank]
        assert len(ranks) == t and {len(r) for r in ranks} == {8 // t}
        assert [(s.start, s.stop) for s in flat] == [(j * 64, min(500, j * 64 + 64)) for j in range(8)]
    for bad in (3, 5, 16, 0, -2, True, 2.0):
        with pytest.raises(ArgumentError, match="tp_degree"):
            rank_slices(512, 64, bad)  # type: ignore[arg-type]


def test_one_partial_per_rank_would_not_give_the_single_rank_bits():
    """Why the all-reduce carries chunk sums: two half-K matmuls added (one fp32 partial per
    rank) associate the chunk chain otherwise, and the bits differ; the chunk sums do not."""
    batch = component.mm.build(component.cases(Lane.CPU)[0], torch.device("cpu"))
    x, w = batch.rows["x"], batch.shared["weight"]
    single = matmul(x, w, out_dtype=torch.float32)
    halves = matmul(x[:, :256], w[:, :256], out_dtype=torch.float32) + matmul(
        x[:, 256:], w[:, 256:], out_dtype=torch.float32
    )
    assert not torch.equal(to_bits(single), to_bits(halves))
    assert torch.equal(to_bits(single), to_bits(tp_linear(x, w, out_dtype=torch.float32, tp_degree=2)))


def test_sum_chunks_is_the_split_executions_second_kernel():
    g = torch.Generator().manual_seed(0)
    ws = torch.randn(5, 3, 7, generator=g) * torch.tensor([1e8, 1.0, -1e8, 1e-3, 3.0])[:, None, None]
    bias = torch.randn(7, generator=g).to(torch.bfloat16)
    want = ws[0].clone()
    for c in ws[1:]:
        want = want + c
    got = sum_chunks(ws, bias, torch.float32)
    assert torch.equal(got, want + bias.float())
    with pytest.raises(ArgumentError, match="'ws'"):
        sum_chunks(ws.transpose(1, 2), None, torch.float32)
    with pytest.raises(ArgumentError, match="'bias'"):
        sum_chunks(ws, bias[:3], torch.float32)
    with pytest.raises(ArgumentError, match="'out_dtype'"):
        sum_chunks(ws, None, torch.float64)
    assert plan(3, 7, 512, torch.float32, torch.device("cpu")).config.tree.chunk_k == 64  # the cases' premise


def outside_tp_linear(x, weight, bias=None, *, layout="linear", out_dtype=None, tp_degree=None):
    """An outside subject with a ``tp_degree`` parameter: the shipped launcher."""
    return tp_linear(x, weight, bias, layout=layout, out_dtype=out_dtype, tp_degree=tp_degree)


def outside_bf16_rank_order(x, weight, bias=None, *, layout="linear", out_dtype=None, tp_degree=None):
    """An outside subject that rounds each rank's output to the activation dtype."""
    from batchinv.fast.baselines.tp_linear import tp_linear_bf16_rank_order

    return tp_linear_bf16_rank_order(x, weight, bias, layout=layout, out_dtype=out_dtype, tp_degree=tp_degree)


def outside_single_rank(x, weight, bias=None, *, layout="linear", out_dtype=None):
    """An outside subject without a ``tp_degree`` parameter."""
    return tp_linear(x, weight, bias, layout=layout, out_dtype=out_dtype)


def test_an_outside_subject_with_a_tp_degree_parameter_gets_the_tp_degree_check():
    """The ``tp_degree`` check serves outside subjects as ours: one with the parameter is judged
    at every degree (a 16-bit all-reduce fails), one without is a skip saying so."""
    from batchinv.harness import check_subject

    def tp_rows(subject):
        report = check_subject("tp_linear", subject, lane="cpu", checks=["tp_degree"])
        return [r for r in report if r.check == "tp_degree"]

    assert {r.status for r in tp_rows(outside_tp_linear)} == {"pass"}
    assert "fail" in {r.status for r in tp_rows(outside_bf16_rank_order)}
    skipped = tp_rows(outside_single_rank)
    assert skipped and all(r.status == "skip" and "no tp_degree keyword" in r.detail for r in skipped)
