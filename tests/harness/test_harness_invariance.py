"""Each invariance driver catches a planted function that breaks its axis, and passes a
function that is invariant (so a pass means something)."""

from __future__ import annotations

import pytest
import torch

from batchinv.harness import invariance
from batchinv.harness.registry import Batch


def _batch(rows=40, cols=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Batch({"x": torch.randn(rows, cols, generator=g)})


def invariant(b: Batch):
    return (b.rows["x"] * 3.0 + 1.0,)


def depends_on_m(b: Batch):
    x = b.rows["x"]
    return (x * 3.0 + (1.0 if x.shape[0] < 16 else 1.0 + 2.0**-20),)


def depends_on_position(b: Batch):
    x = b.rows["x"]
    return (x + torch.arange(x.shape[0], dtype=x.dtype)[:, None] * 2.0**-18,)


def test_batch_prefix_catches_m_dependence_and_passes_invariant():
    b = _batch()
    ms = (1, 2, 7, 8, 15, 16, 17, 32, 33)
    assert invariance.batch_prefix(invariant, b, ms).passed
    r = invariance.batch_prefix(depends_on_m, b, ms)
    assert not r.passed
    assert r.where == ["M=1", "M=2", "M=7", "M=8", "M=15"]
    # the launches below 16 rows take consecutive windows (rows 0, 1-2, 3-9, ...): each row once
    assert r.rows_differing == 1 + 2 + 7 + 8 + 15 and r.worst_ulp is not None and r.worst_ulp > 0


def test_position_catches_position_dependence_and_passes_invariant():
    b, n = _batch(8), _batch(20, seed=1)
    assert invariance.position(invariant, b, n, [0, 7], [0, 5, 19]).passed
    r = invariance.position(depends_on_position, b, n, [0, 7], [0, 5, 19])
    assert not r.passed
    assert "row 0 at position 5/20" in r.where


def _window_sum(b: Batch):
    """Sums each row's window [row_start, row_end) in a fixed order: row-local, invariant."""
    x, s, e = b.rows["x"], b.rows["row_starts"], b.rows["row_ends"]
    out = torch.stack(
        [x[i, s[i] : e[i]].sum() if e[i] > s[i] else x.new_zeros(()) for i in range(x.shape[0])]
    )
    return (out,)


def _window_sum_leaky(b: Batch):
    """Adds the absolute row_start: a result that depends on where the packer put the row."""
    return (_window_sum(b)[0] + b.rows["row_starts"].to(torch.float32) * 2.0**-10,)


def _shift(b: Batch, offset: int, g: torch.Generator) -> Batch:
    x = b.rows["x"]
    pad = torch.randn(x.shape[0], offset, generator=g)
    return Batch(
        {
            "x": torch.cat([pad, x], dim=1),
            "row_starts": b.rows["row_starts"] + offset,
            "row_ends": b.rows["row_ends"] + offset,
        }
    )


def test_row_start_catches_offset_dependence_and_passes_invariant():
    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(3))
    b = Batch({"x": x, "row_starts": torch.zeros(6, dtype=torch.long), "row_ends": torch.full((6,), 12)})
    offsets = (0, 1, 7, 33)
    assert invariance.row_start(_window_sum, b, _shift, offsets, torch.Generator().manual_seed(0)).passed
    r = invariance.row_start(_window_sum_leaky, b, _shift, offsets, torch.Generator().manual_seed(0))
    assert not r.passed and r.where == ["row_start+=1", "row_start+=7", "row_start+=33"]


def test_partition_catches_partition_dependence_and_passes_invariant():
    b = _batch(10)

    def pinned(batch, count):
        return invariant(batch)

    def unpinned(batch, count):
        x = batch.rows["x"]
        return (x * 3.0 + (0.0 if count in (None, 1) else 2.0**-12),)

    counts = invariance.sm_partition_counts(132)
    assert counts == (1, 2, 3, 132, 133, 265)
    assert invariance.partition(pinned, b, counts).passed
    r = invariance.partition(unpinned, b, counts)
    assert not r.passed and "partitions=2" in r.where


def test_repeat_catches_state_carried_between_calls():
    b = _batch(6)
    calls = {"n": 0}

    def stateful(batch):
        calls["n"] += 1
        return (batch.rows["x"] + calls["n"] * 2.0**-16,)

    assert invariance.repeat(invariant, b).passed
    assert not invariance.repeat(stateful, b).passed


@pytest.mark.parametrize("n_outputs", [1, 2])
def test_multi_output_functions_compare_every_output(n_outputs):
    b = _batch(20)

    def second_output_leaks(batch):
        x = batch.rows["x"]
        leaky = x + (x.shape[0] % 3) * 2.0**-16
        return (leaky,) if n_outputs == 1 else (x * 2.0, leaky)

    r = invariance.batch_prefix(second_output_leaks, b, (1, 2, 3, 4))
    assert not r.passed


def _bucketed(x: torch.Tensor, m: int) -> torch.Tensor:
    # a per-M bucket whose configs differ in bits: above 16 rows the scale is one ULP off 1.0
    return x * (1.0 if m <= 16 else 1.0 + 2.0**-23)


def test_modes_finds_a_bucket_frozen_at_the_first_compiled_m():
    # vLLM's compiled batch-invariant matmul: the bucket of the traced M kept for every M
    frozen: list[int] = []

    def eager(b):
        return (_bucketed(b.rows["x"], b.num_rows),)

    def compiled(b):
        frozen.append(frozen[0] if frozen else b.num_rows)
        return (_bucketed(b.rows["x"], frozen[0]),)

    result = invariance.modes(eager, compiled, None, _batch(rows=40), ms=[1, 8, 32])
    assert not result.passed
    assert result.where == ["compiled M=1 vs eager", "compiled M=8 vs eager"], result.where


def test_modes_finds_an_operator_the_compiled_call_did_not_run_even_with_equal_bits():
    # issue 25: the compiled graph kept the compiler's own op, whose bits equal the kernel's here;
    # only the run-time count of the operators shows it
    from collections import Counter

    calls: Counter[str] = Counter()

    def eager(b):
        calls["log_softmax"] += 1  # what the operator's body counts when it runs
        return (b.rows["x"] * 2.0,)

    def left_to_the_compiler(b):
        return (b.rows["x"] * 2.0,)  # the same bits, no operator ran

    result = invariance.modes(eager, left_to_the_compiler, None, _batch(rows=12), [1, 8], lambda: calls)
    assert not result.passed
    assert result.where == [
        "compiled ran the operators",
        "compiled M=1 ran the operators",
        "compiled M=8 ran the operators",
    ]
    assert "left to the compiler" in result.detail, result.detail
    assert invariance.modes(eager, eager, None, _batch(rows=12), [1, 8], lambda: calls).passed


def test_modes_passes_when_compiled_equals_eager_at_every_m():
    def eager(b):
        return (_bucketed(b.rows["x"], b.num_rows),)

    result = invariance.modes(eager, eager, None, _batch(rows=12), ms=[1, 8])
    assert result.passed


# --- the fused host reads: one device-to-host copy per call, every tensor still checked --------


@pytest.mark.parametrize("victim", ["a", "b", "c"])
def test_inputs_untouched_names_the_one_input_written(victim):
    batch = Batch(
        {"a": torch.zeros(4, 3), "b": torch.arange(4, dtype=torch.int32)}, {"c": torch.ones(2, 5), "s": 1.0}
    )
    tensors = {**batch.rows, "c": batch.shared["c"]}
    with pytest.raises(invariance.ContractViolation, match=f"its input '{victim}'"):
        with invariance.inputs_untouched(batch):
            tensors[victim].view(-1)[-1] += 1  # the last byte of the storage only


def test_inputs_untouched_sees_a_write_into_hidden_storage_and_a_resize():
    base = torch.zeros(8)
    batch = Batch({"x": base[:4]}, {})  # a view: the storage past it is the input's too
    with pytest.raises(invariance.ContractViolation, match="'x'"):
        with invariance.inputs_untouched(batch):
            base[6] = 1.0
    batch = Batch({"x": torch.zeros(4)}, {})
    with pytest.raises(invariance.ContractViolation, match="'x'"):
        with invariance.inputs_untouched(batch):
            batch.rows["x"].untyped_storage().resize_(64)


def test_inputs_untouched_passes_an_untouched_batch():
    batch = Batch({"x": torch.randn(4, 3), "n": torch.arange(4)}, {"pool": torch.randn(3, 2)})
    with invariance.inputs_untouched(batch):
        (batch.rows["x"] * 2).sum()


def test_compare_outputs_reports_each_output_with_one_read():
    a = [torch.zeros(3, 2), torch.arange(3, dtype=torch.int32), torch.zeros(())]
    b = [a[0].clone(), a[1].clone(), a[2].clone()]
    b[1][2] = 7
    reports = invariance.compare_outputs(a, b)
    assert [r.equal for r in reports] == [True, False, True]
    assert [r.rows_total for r in reports] == [3, 3, 1]
    assert reports[1].differing_rows == [2] and reports[1].first.row == 2


def test_inputs_untouched_reads_around_a_meta_input():
    """A meta tensor has no bytes to compare; a write into the batch's other inputs is still
    named (found by a breaker: the one read per device once stopped at the meta tensor)."""
    batch = Batch({"y": torch.zeros(3), "x": torch.empty(3, device="meta")}, {})
    with pytest.raises(invariance.ContractViolation, match="'y'"):
        with invariance.inputs_untouched(batch):
            batch.rows["y"][0] = 1.0
