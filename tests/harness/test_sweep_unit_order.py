"""The sweep's unit order and its compile figures: a GPU lane's worker pool interleaves the
components (workers that start together compile different kernels), and the compile stats of
several workers add up to what the pool compiled more than once."""

from __future__ import annotations

import dataclasses
import pickle

from toy_component import scale, toy

from batchinv.harness import compile_stats
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Baseline, Case
from batchinv.harness.sweep import SweepOutcome, _units
from batchinv.harness.sweep_table import compile_line, time_line


def _components():
    first = toy(baselines=[Baseline("b1", scale, "planted", expected_to_vary_on=frozenset())])
    second = dataclasses.replace(
        toy(),
        name="second",
        cases=lambda lane: [Case("second", {"rows": 4, "cols": 8}, seed=s) for s in range(3)],
    )
    return [first, second]


def _order(units):
    return [(u.component, u.case_index) for u in units]


def test_component_order_keeps_each_component_together():
    units = _units(_components(), Lane.CPU, include_baselines=True)
    assert _order(units) == [
        ("toy", None),
        ("toy", 0),
        ("toy", 1),
        ("second", 0),
        ("second", 1),
        ("second", 2),
    ]


def test_interleaved_order_of_equal_components_takes_one_unit_of_each_in_turn():
    units = _units(_components(), Lane.CPU, include_baselines=True, interleave=True)
    assert _order(units) == [
        ("toy", None),
        ("second", 0),
        ("toy", 0),
        ("second", 1),
        ("toy", 1),
        ("second", 2),
    ]
    # the same units, none lost or repeated
    assert sorted(map(str, _order(units))) == sorted(map(str, _order(_units(_components(), Lane.CPU, True))))


def test_interleaved_order_spreads_a_component_of_many_units_over_the_whole_sweep():
    """A component of many units (the attention components, whose checks are the GPU's heavy
    work) is spread evenly, not left to the end alone: unit i of n at i / n of the way."""
    many = dataclasses.replace(
        toy(),
        name="many",
        cases=lambda lane: [Case("many", {"rows": 4, "cols": 8}, seed=s) for s in range(6)],
    )
    few = dataclasses.replace(
        toy(), name="few", cases=lambda lane: [Case("few", {"rows": 4, "cols": 8}, seed=s) for s in range(2)]
    )
    units = _units([few, many], Lane.CPU, include_baselines=False, interleave=True)
    assert _order(units) == [
        ("few", 0),
        ("many", 0),
        ("many", 1),
        ("many", 2),
        ("few", 1),  # 1/2 of the way, as many's unit 3 (ties in component order)
        ("many", 3),
        ("many", 4),
        ("many", 5),
    ]


def _stats(*compiled):
    return compile_stats.CompileStats(
        len(compiled), sum(s for _, _, s in compiled), 0, True, {h: (n, s) for h, n, s in compiled}
    )


def test_two_workers_compiling_one_kernel_count_as_a_repeat():
    a = _stats(("h1", "topk_kernel", 4.0), ("h2", "mean_kernel", 1.0))
    b = _stats(("h1", "topk_kernel", 3.5), ("h3", "topk_kernel", 2.0))
    total = compile_stats.CompileStats() + a + b
    assert (total.compilations, total.seconds, total.repeated, total.repeated_seconds) == (4, 10.5, 1, 3.5)
    assert total.by_kernel() == [("topk_kernel", 2, 6.0), ("mean_kernel", 1, 1.0)]
    assert pickle.loads(pickle.dumps(total)) == total  # it travels from a worker through a pipe
    outcome = SweepOutcome([], [], [], wall_seconds=5.0, compile=total, jobs=2)
    assert "1 of them (3.5 s) compiled a kernel another worker had compiled" in time_line(outcome)
    assert compile_line(outcome) == "compile by kernel: topk_kernel 6.0 s (2), mean_kernel 1.0 s (1)"
    summary = total.summary()
    assert summary["distinct"] == 3 and summary["repeated"] == 1
    assert summary["by_kernel"][0] == {"kernel": "topk_kernel", "compilations": 2, "seconds": 6.0}


def test_a_worker_reports_only_what_it_compiled_since_its_snapshot():
    before = _stats(("h1", "k", 1.0))
    after = before + _stats(("h2", "k", 2.0))
    unit = after - before
    assert (unit.compilations, dict(unit.compiled)) == (1, {"h2": ("k", 2.0)})
    assert unit.repeated == 0


def test_no_repeat_clause_without_repeats():
    outcome = SweepOutcome([], [], [], wall_seconds=5.0, compile=_stats(("h1", "k", 1.0)), jobs=1)
    assert "another worker" not in time_line(outcome)
    assert compile_line(SweepOutcome([], [], [])) == ""
