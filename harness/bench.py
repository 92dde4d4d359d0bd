"""``batchinv bench``: CUDA-graph replay timed with CUDA events, fast vs baselines.

For every bench case of a component, each implementation (the fast kernel and every baseline
that runs in-process on this lane) is warmed up, captured ``calls`` times into one CUDA graph,
and the graph is replayed ``reps`` times, each replay bracketed by events; the time per call is
the median replay time over ``calls``.  An implementation that cannot be captured (it syncs
with the host, say) is timed eagerly the same way and marked ``eager``.  The ratio is
fast / baseline: below 1 the fast kernel is quicker.

Calls per replay: one count per case, the same for every implementation of that case (issue 26:
never compare times taken with different counts; a replay's own launch cost, several
microseconds, is shared by its calls).  It follows the outside measurement's rule
(``side_by_side3.py`` in the project's tools): from the *device* time of one captured call, never
from an eager call, whose host cost would give a launcher with a slow host path fewer calls and
leave it the replay's launch cost alone; about :data:`REPLAY_DEVICE_US` of work a replay, 1 to
:data:`MAX_CALLS_PER_REPLAY` calls.  Where the kit sizes each implementation by its own time,
bench takes the fastest implementation's for all of them: the two tools hold the same count
wherever the implementations' times give the same count (every point under 10 us, and where
they are within a few percent), and bench more calls for a much slower implementation (fast
10 us, a baseline 60 us: 20 calls in bench, 3 in the kit, whose replays then carry a larger
share of launch cost).  The count is in every point and in the report.

Caveat, stated in every report: operands are not rotated, so a case whose operands fit in L2
(50 MB on an H200) is timed warm for every implementation alike.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchinv.harness.lanes import Lane

#: A replay holds calls for about this many microseconds of device time (the outside kit's rule).
REPLAY_DEVICE_US = 200.0
#: ... and at most this many calls.
MAX_CALLS_PER_REPLAY = 20
#: The count of :func:`time_call` when the caller gives none (the tuners: every candidate of a
#: point alike).
DEFAULT_CALLS_PER_REPLAY = 10
#: The copy bandwidth the floors are computed with (bytes read + written per second): the H200's
#: measured device-to-device copy rate (docs/BENCHMARKS.md, "Ceilings used").
COPY_BYTES_PER_S = 4.3e12
#: The dense bf16 tensor-core rate the flops floors use: the H200's (H100 SXM's) datasheet peak,
#: 989 TFLOP/s without sparsity (docs/BENCHMARKS.md, "Ceilings used").
BF16_FLOPS_PER_S = 989e12


@dataclass
class BenchPoint:
    component: str
    case: str
    implementation: str
    microseconds: float
    mode: str  # "graph" or "eager"
    ratio_to_fast: float | None = None
    floor_microseconds: float | None = None  # bench_bytes / COPY_BYTES_PER_S, or flops / rate if larger
    #: the case's calls per replay, every implementation alike (:func:`case_calls_per_replay`)
    calls_per_replay: int = field(kw_only=True)

    @property
    def share_of_floor(self) -> float | None:
        """floor / time: 1.0 runs at the floor -- the copy bandwidth or the bf16 peak, whichever
        bounds the call (None: no floor)."""
        if self.floor_microseconds is None or self.microseconds <= 0:
            return None
        return self.floor_microseconds / self.microseconds


def calls_per_replay(call_microseconds: float) -> int:
    """The calls one replay holds for a call of ``call_microseconds`` of device time: about
    :data:`REPLAY_DEVICE_US` of work, 1 to :data:`MAX_CALLS_PER_REPLAY` (calls under 1 us count as 1 us).

    Raises:
        ValueError: ``call_microseconds`` is not a finite number >= 0.
    """
    if not math.isfinite(call_microseconds) or call_microseconds < 0:
        raise ValueError(f"call_microseconds: expected a finite time >= 0, got {call_microseconds!r}")
    return int(max(1, min(MAX_CALLS_PER_REPLAY, REPLAY_DEVICE_US // max(call_microseconds, 1.0))))


def captured_call_microseconds(fn: Callable[[], Any]) -> float | None:
    """The device time of one call of ``fn``: the fastest of 5 replays of a graph holding that one
    call (microseconds), or None when ``fn`` cannot be captured (then it is timed eagerly and the
    caller sizes the count from the other implementations)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    try:
        graph = _capture(fn, 1)
    except Exception:  # not capturable: no device time to size from
        torch.cuda.synchronize()
        return None
    fastest = min(_replay_microseconds(graph.replay, 5))
    del graph
    return fastest


def _replay_microseconds(run: Callable[[], Any], reps: int) -> list[float]:
    """Microseconds of each of ``reps`` calls of ``run``, each between CUDA events on the current stream."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return times


def _capture(fn: Callable[[], Any], calls: int) -> Any:
    """A CUDA graph of ``calls`` calls of ``fn``, warmed on a side stream first (torch's recipe)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_call(fn: Callable[[], Any], reps: int, calls: int = DEFAULT_CALLS_PER_REPLAY) -> tuple[float, str]:
    """Median microseconds per call of ``fn`` on the current CUDA stream over ``reps`` replays of a
    graph of ``calls`` calls, and the mode used ("graph", or "eager (why)" when capture fails).

    Raises:
        ValueError: ``calls`` or ``reps`` below 1.
    """
    import torch

    if calls < 1 or reps < 1:
        raise ValueError(f"calls and reps: expected >= 1, got calls={calls!r}, reps={reps!r}")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    mode = "graph"
    try:
        graph = _capture(fn, calls)

        def run() -> None:
            graph.replay()

    except Exception as exc:  # any capture failure: time eagerly, and say why
        mode = f"eager ({type(exc).__name__} in capture)"
        del exc
        torch.cuda.synchronize()

        def run() -> None:
            for _ in range(calls):
                fn()

    return statistics.median(_replay_microseconds(run, reps)) / calls, mode


def case_calls_per_replay(fns: Sequence[Callable[[], Any]]) -> int:
    """One count for every implementation of a case: :func:`calls_per_replay` of the fastest
    captured call among ``fns`` (:data:`DEFAULT_CALLS_PER_REPLAY` if none can be captured)."""
    import torch

    times = []
    for fn in fns:
        try:
            us = captured_call_microseconds(fn)
        except Exception:  # an implementation that fails is reported by its timing, not here
            us = None
            _release(torch)  # what it left (an out-of-memory's blocks) is not the next one's
        if us is not None:
            times.append(us)
    return calls_per_replay(min(times)) if times else DEFAULT_CALLS_PER_REPLAY


def bench_component(component: Any, lane: Lane, reps: int) -> list[BenchPoint]:
    """Time fast and every in-process baseline on each of ``component.bench_cases(lane)``."""
    import torch

    points: list[BenchPoint] = []
    device = torch.device("cuda")
    for case in component.bench_cases(lane):
        try:
            batch = component.build(case, device)
        except torch.OutOfMemoryError as exc:
            print(f"bench {component.name} [{case.id}]: operands do not fit: {str(exc).splitlines()[0]}")
            _release(torch)
            continue
        kwargs = batch.kwargs()
        floor = floor_microseconds(component, batch)
        impls = [("fast", component.fast)] + [
            (b.name, b.fn)
            for b in component.baselines
            if lane in b.lanes and not b.is_pin_candidate and b.timed
        ]
        calls = case_calls_per_replay([functools.partial(fn, **kwargs) for _, fn in impls])
        fast_us = None
        for name, fn in impls:
            try:
                us, mode = time_call(functools.partial(fn, **kwargs), reps, calls)
            except Exception as exc:  # report and go on
                print(
                    f"bench {component.name} {name} [{case.id}]: error {type(exc).__name__}: {str(exc).splitlines()[0]}"
                )
                del exc
                _release(torch)
                continue
            if name == "fast":
                fast_us = us
            ratio = None if fast_us is None or name == "fast" else fast_us / us
            point = BenchPoint(component.name, case.id, name, us, mode, ratio, floor, calls_per_replay=calls)
            points.append(point)
            print(_point_line(point), flush=True)  # as it goes: a later crash keeps what was timed
        del batch, kwargs
        _release(torch)  # the next case's operands may need the room (GBs of KV cache)
    return points


def floor_microseconds(component: Any, batch: Any) -> float | None:
    """The larger of the bytes' time at the copy bandwidth and the flops' time at the bf16
    tensor-core peak (either term only where the component gives it; None without both)."""
    times = []
    if component.bench_bytes is not None:
        times.append(component.bench_bytes(batch) / COPY_BYTES_PER_S * 1e6)
    if component.bench_flops is not None:
        times.append(component.bench_flops(batch) / BF16_FLOPS_PER_S * 1e6)
    return max(times) if times else None


def _release(torch: Any) -> None:
    """Give cached and failed-capture memory back before the next point."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _point_line(p: BenchPoint) -> str:
    ratio = "-" if p.ratio_to_fast is None else f"{p.ratio_to_fast:.2f}x"
    floor, share = _floor_cells(p)
    return (
        f"bench {p.component} {p.implementation} [{p.case}]: {p.microseconds:.1f} us ({p.mode}, "
        f"{p.calls_per_replay} calls per replay), fast/this {ratio}, floor {floor} us, {share} of floor"
    )


def _floor_cells(p: BenchPoint) -> tuple[str, str]:
    if p.floor_microseconds is None:
        return "-", "-"
    share = p.share_of_floor
    return f"{p.floor_microseconds:.1f}", "-" if share is None else f"{100 * share:.0f}%"


def main(lane: Lane, names: Sequence[str], out: Path | None, reps: int) -> int:
    """Entry point of ``batchinv bench``; prints a rich table, optionally writes JSON + markdown."""
    from rich.table import Table

    from batchinv.harness.console import wide_console
    from batchinv.harness.registry import components
    from batchinv.harness.report import environment

    console = wide_console()
    if not lane.is_gpu:
        console.print(
            "batchinv bench needs a GPU lane (CUDA graphs and events); this is the cpu lane: nothing to time."
        )
        return 0
    env = environment(lane)
    points: list[BenchPoint] = []
    for comp in components(list(names) or None):
        points += bench_component(comp, lane, reps)
    table = Table(title=f"batchinv bench — {env['device']} — torch {env['torch']}, triton {env['triton']}")
    for col in (
        "component",
        "case",
        "implementation",
        "us/call",
        "fast/baseline",
        "floor us",
        "of floor",
        "calls/replay",
        "mode",
    ):
        table.add_column(col)
    for p in points:
        ratio = "-" if p.ratio_to_fast is None else f"{p.ratio_to_fast:.2f}x"
        table.add_row(
            p.component,
            p.case,
            p.implementation,
            f"{p.microseconds:.1f}",
            ratio,
            *_floor_cells(p),
            str(p.calls_per_replay),
            p.mode,
        )
    console.print(table)
    console.print(
        "operands are not rotated between replays: cases that fit in L2 are timed warm for all alike."
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(
            json.dumps({"environment": env, "points": [asdict(p) for p in points]}, indent=1),
            encoding="utf-8",
        )
        lines = [
            f"Bench {env['date']} on {env['device']} (torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}); "
            f"CUDA graph of 'calls/replay' calls (one count per case, every implementation alike: about "
            f"{REPLAY_DEVICE_US:.0f} us of the fastest one's device time, 1 to {MAX_CALLS_PER_REPLAY}), "
            f"median of {reps} replays.",
            "",
            f"Floor: bytes moved / {COPY_BYTES_PER_S / 1e12:.1f} TB/s where the component gives them, or "
            f"bf16 flops / {BF16_FLOPS_PER_S / 1e12:.0f} TFLOP/s where larger; 'of floor' = floor / time.",
            "",
            "| component | case | implementation | us/call | fast/baseline | floor us | of floor | calls/replay | mode |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in points:
            ratio = "-" if p.ratio_to_fast is None else f"{p.ratio_to_fast:.2f}x"
            lines.append(
                f"| {p.component} | {p.case} | {p.implementation} | {p.microseconds:.1f} | {ratio} | "
                f"{' | '.join(_floor_cells(p))} | {p.calls_per_replay} | {p.mode} |"
            )
        out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0
