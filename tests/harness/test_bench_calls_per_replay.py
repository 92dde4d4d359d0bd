"""``batchinv bench``'s calls per replay: one count per case, sized as the outside kit sizes it
(issue 26), from the fastest implementation's captured device time."""

from __future__ import annotations

import math

import pytest

from batchinv.harness import bench


@pytest.mark.parametrize(
    ("call_us", "calls"),
    [
        (0.0, 20),  # under a microsecond counts as one: the most calls
        (2.16, 20),  # torch.mean of 4096 bf16 columns at one row (run 68): 92 calls' worth, capped
        (9.9, 20),
        (10.1, 19),  # 200 // 10.1
        (18.8, 10),  # batchinv's matmul 4096^2 at M = 128 (run 66)
        (66.7, 2),
        (200.0, 1),
        (5000.0, 1),
    ],
)
def test_a_replay_holds_about_200_us_of_calls_1_to_20(call_us: float, calls: int) -> None:
    assert bench.calls_per_replay(call_us) == calls
    assert calls * max(call_us, 1.0) <= bench.REPLAY_DEVICE_US or calls == 1


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_time_that_is_not_a_finite_non_negative_number_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="call_microseconds: expected a finite time >= 0"):
        bench.calls_per_replay(bad)


def test_the_case_count_follows_the_fastest_capturable_implementation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    times = {"slow": 40.0, "fast": 12.5, "eager": None}

    def fake_captured(fn):
        if fn == "raises":
            raise RuntimeError("the implementation fails: its timing reports it")
        return times[fn]

    released: list[object] = []
    monkeypatch.setattr(bench, "captured_call_microseconds", fake_captured)
    monkeypatch.setattr(bench, "_release", released.append)  # no device here to give memory back to
    # 12.5 us is the fastest: 200 // 12.5 = 16 calls for every implementation of the case (the
    # slow one alone would get 5)
    assert bench.case_calls_per_replay(["slow", "fast", "eager", "raises"]) == 16
    assert len(released) == 1  # the failing one's leftovers given back before the next
    assert bench.case_calls_per_replay(["slow"]) == 5
    # nothing capturable: the default count
    assert bench.case_calls_per_replay(["eager", "raises"]) == bench.DEFAULT_CALLS_PER_REPLAY


def test_time_call_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="calls and reps: expected >= 1, got calls=0"):
        bench.time_call(lambda: None, 5, calls=0)


def test_the_html_page_shows_each_points_calls_per_replay_and_a_dash_for_older_reports() -> None:
    pytest.importorskip("matplotlib")
    from batchinv.harness.html_report import _bench_section

    def points(**extra: int) -> list[dict]:
        common = {"component": "mean", "case": "c", "mode": "graph", "floor_microseconds": 1.0, **extra}
        return [
            {**common, "implementation": "fast", "microseconds": 2.5, "ratio_to_fast": None},
            {**common, "implementation": "torch_native", "microseconds": 2.0, "ratio_to_fast": 1.25},
        ]

    page = _bench_section({"environment": {}, "points": points(calls_per_replay=17)})
    assert "<th>calls / replay</th>" in page and page.count("<td>17</td><td>graph</td>") == 2
    older = _bench_section({"environment": {}, "points": points()})
    assert older.count("<td>-</td><td>graph</td>") == 2  # reports from before the count was recorded
