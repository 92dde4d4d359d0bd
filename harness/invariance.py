"""Invariance drivers: generic checks that a row's (or a request's) bits depend on it alone.

Each driver takes an implementation as ``fn(batch) -> Outputs`` (see
:mod:`batchinv.harness.registry`) and returns a :class:`DriverResult`.  They know nothing about
components, so the harness tests can hand them planted functions that depend on M, on
position, on row_start or on the partition count, and watch each driver catch its own.
The request drivers (:func:`co_batch`, :func:`slot`, :func:`placement`) also take the
component's :class:`~batchinv.harness.registry.RequestModel`, which splits, joins and relocates
requests; they compare a request's every output with the request's own outputs alone.
:func:`phase` takes a :class:`~batchinv.harness.phases.PhaseModel`, which re-launches query rows
in other phases (full and chunked prefill, decode, speculative verify).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from batchinv.harness import phases, provenance
from batchinv.harness.compare import BitwiseReport, bitwise_equal, compare_bitwise, host_bools
from batchinv.harness.lanes import Lane
from batchinv.harness.neighbours import Transform
from batchinv.harness.phases import PhaseModel, Piece
from batchinv.harness.registry import CO_BATCH_SIZES, Batch, Outputs, PaddingModel, RequestModel, as_outputs

Impl = Callable[[Batch], Outputs]

#: The sweep points a :class:`DriverResult` keeps for the report (:attr:`DriverResult.points`),
#: and the differing row ids it keeps per point: enough for the HTML report's heatmap, bounded
#: so that a GPU sweep's report stays small.
MAX_POINTS = 96
MAX_POINT_ROWS = 256


class ContractViolation(Exception):
    """A subject broke the component's calling contract (it wrote into its inputs, or returned
    another number of outputs, shape or dtype than before): an error of the check, never a
    detection of variance and never a pass."""


@contextmanager
def inputs_untouched(batch: Batch) -> Iterator[None]:
    """Raise :class:`ContractViolation` if the code inside writes into any tensor of ``batch``
    (every byte of each tensor's storage is compared, hidden padding included)."""
    tensors = {**batch.rows, **{k: v for k, v in batch.shared.items() if isinstance(v, torch.Tensor)}}
    before = {k: t.untyped_storage().clone() for k, t in tensors.items()}
    yield
    resized = {name for name in tensors if before[name].nbytes() != tensors[name].untyped_storage().nbytes()}
    # a meta tensor has no bytes to compare
    compared = [n for n, t in tensors.items() if n not in resized and t.device.type != "meta"]

    def differs(name: str) -> torch.Tensor:
        t = tensors[name]
        a = torch.empty(0, dtype=torch.uint8, device=t.device).set_(before[name])
        b = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        return (a != b).any()

    # one host read per device for all the inputs (host_bools)
    written = resized | {
        n for n, bad in zip(compared, host_bools([differs(n) for n in compared]), strict=True) if bad
    }
    if written:
        raise ContractViolation(
            f"the subject wrote into its input {next(n for n in tensors if n in written)!r}"
        )


class VarianceDetected(AssertionError):
    """An invariance check found different bits: what a negative control must produce.

    The harness raises this one type, and only for variance, so a negative control can be a
    strict expected failure that only variance satisfies (``xfail(strict=True,
    raises=VarianceDetected)``): a baseline that crashes raises something else and fails the
    test, and one that never varies passes it, which a strict xfail turns red.
    """


@dataclass
class DriverResult:
    """The outcome of one invariance check on one case.

    Attributes:
        passed: every comparison was bitwise equal.
        rows_total: rows compared (per sweep point).
        rows_differing: distinct rows that differed at any sweep point.
        worst_ulp: the largest ULP distance seen (None if all equal or not a float).
        where: the sweep points that failed, e.g. ``["M=7", "M=15"]``.
        detail: the first failing comparison's report.
        first_difference: the first failing sweep point and its first differing (row, col).
        points: each sweep point compared, in order (at most :data:`MAX_POINTS`): ``label``,
            ``compared`` (the row ids compared, as ``[start, stop)`` runs), ``differing`` (the
            row ids whose bits differed there, at most :data:`MAX_POINT_ROWS`) and
            ``rows_differing`` (their count): the report's heatmap of rows against M,
            co-batch size, offset...
        first: the first differing element: ``point`` (its sweep point), ``output`` (index),
            ``row`` (the row id), ``col`` (flat column within the row), ``expected_bits`` /
            ``actual_bits`` (hex) and ``expected_value`` / ``actual_value`` (``repr``) of the
            two launches compared (expected: the reference launch of the check, e.g. the
            largest M or the request alone), and ``launched``: what each side ran
            (:func:`provenance.contrast`; "" where unknown); None without one (no difference,
            or a dtype or shape mismatch).
        launches: every subject call's launches by sweep point (:class:`provenance.Tally`:
            the report row's ``launches``).
    """

    passed: bool = True
    rows_total: int = 0
    rows_differing: int = 0
    worst_ulp: float | None = None
    where: list[str] = field(default_factory=list)
    detail: str = ""
    first_difference: str = ""
    comparisons: int = 0
    vacuous: str = "the case has no rows"
    points: list[dict[str, Any]] = field(default_factory=list)
    first: dict[str, Any] | None = None
    launches: provenance.Tally = field(default_factory=provenance.Tally, repr=False)
    _rows: set[int] = field(default_factory=set, repr=False)

    def record(
        self,
        label: str,
        reports: Sequence[BitwiseReport],
        row_ids: Sequence[int] | None = None,
        *,
        meaningful: bool = True,
    ) -> None:
        """Fold in the per-output reports of one sweep point (``row_ids`` maps local rows to ids).

        ``meaningful=False`` marks a comparison that cannot show variance (a launch compared
        with itself, e.g. M equal to the batch's rows); a check with no meaningful comparison
        is reported ``skip``, never ``pass``."""
        if meaningful and any(r.rows_total for r in reports):
            self.comparisons += 1
        sides = getattr(reports, "sides", None)  # compare_outputs: both sides' launches
        if sides is not None:
            expected_calls, actual_calls, names = sides
            self.launches.add(actual_calls, label)
            self.launches.add(expected_calls, names[0] if names else f"{label} (expected)")
        rows_here = max((r.rows_total for r in reports), default=0)
        self.rows_total = max(self.rows_total, rows_here)
        bad = [r for r in reports if not r.equal]
        differing: set[int] = set()
        for r in bad:
            rows = r.differing_rows or list(range(r.rows_differing))
            differing.update(row_ids[i] if row_ids is not None else i for i in rows)
        if len(self.points) < MAX_POINTS:
            compared = list(row_ids) if row_ids is not None else list(range(rows_here))
            self.points.append(
                {
                    "label": label,
                    "compared": _runs(compared),
                    "differing": sorted(differing)[:MAX_POINT_ROWS],
                    "rows_differing": len(differing),
                }
            )
        if not bad:
            return
        self.passed = False
        self.where.append(label)
        self._rows.update(differing)
        for r in bad:
            if r.worst_ulp is not None:
                self.worst_ulp = max(self.worst_ulp or 0.0, r.worst_ulp)
        self.rows_differing = len(self._rows)
        if not self.detail:
            self.detail = f"{label}: {bad[0]}"
            ran = ""
            if sides is not None:
                ran = provenance.contrast(sides[0], sides[1], sides[2] or ("expected", "got"))
                if ran:
                    self.detail += f"; {ran}"
            first = bad[0].first
            if first is not None:
                row = row_ids[first.row] if row_ids is not None else first.row
                self.first_difference = f"{label}: (row {row}, col {first.col})"
                self.first = {
                    "point": label,
                    "output": next(i for i, r in enumerate(reports) if r is bad[0]),
                    "row": row,
                    "col": first.col,
                    "expected_bits": first.expected_bits,
                    "actual_bits": first.actual_bits,
                    "expected_value": first.expected_value,
                    "actual_value": first.actual_value,
                    "launched": ran,
                }


def _runs(ids: Sequence[int]) -> list[list[int]]:
    """Sorted distinct ``ids`` as ``[start, stop)`` runs of consecutive integers."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


class _Compared(list):
    """:func:`compare_outputs`' reports, with ``sides``: (expected's launches, actual's, names)."""

    sides: tuple[Any, Any, tuple[str, str] | None] | None = None


def compare_outputs(
    expected: Outputs, actual: Outputs, names: tuple[str, str] | None = None
) -> list[BitwiseReport]:
    """Bitwise reports of each output pair; ``names``: which launch each side is (``("alone",
    "in a batch of 17")``), named in a report's first difference instead of "expected / got".
    Where both sides carry their launches (:func:`provenance.attach`, as :func:`_call` leaves
    them), the reports carry them too, for :meth:`DriverResult.record`.

    Raises:
        ContractViolation: another number of outputs, or an output of another dtype or shape:
            the subject broke its contract (an error), which is not different bits (variance).
    """
    if len(expected) != len(actual):
        raise ContractViolation(f"{len(actual)} outputs, expected {len(expected)} as in the other launch")
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if e.dtype != a.dtype or e.shape != a.shape:
            raise ContractViolation(
                f"output {i}: {a.dtype} {tuple(a.shape)}, expected {e.dtype} {tuple(e.shape)} as in the other launch"
            )
    pairs = list(zip(expected, actual, strict=True))
    reports = _Compared(
        compare_bitwise(e, a) if not same else BitwiseReport(True, e.shape[0] if e.dim() else 1)
        for (e, a), same in zip(pairs, bitwise_equal(pairs), strict=True)
    )
    if names is not None:
        for r in reports:
            if r.first is not None:
                r.first.names = names
    if provenance.of(expected) is not None or provenance.of(actual) is not None:
        reports.sides = (provenance.of(expected), provenance.of(actual), names)
    return reports


def _rows(outputs: Outputs, index: slice | int) -> Outputs:
    if isinstance(index, int):
        index = slice(index, index + 1)
    return provenance.carry(outputs, [o[index] for o in outputs])


def _captured(thunk: Callable[[], Any]) -> Outputs:
    """``thunk()``'s outputs, cloned, carrying what the call launched (:mod:`provenance`)."""
    with provenance.recording() as rec:
        out = as_outputs(thunk())
    return provenance.attach([o.detach().clone() for o in out], rec.calls())


def _call(fn: Impl, batch: Batch) -> Outputs:
    return _captured(lambda: fn(batch))


def _select(outputs: Outputs, index: Sequence[int]) -> Outputs:
    idx = torch.as_tensor(list(index), dtype=torch.long)
    return provenance.carry(outputs, [o.index_select(0, idx.to(o.device)) for o in outputs])


def prefix_launches(num_rows: int, ms: Sequence[int], cycle_to: int = 0) -> list[tuple[int, list[int]]]:
    """The launches :func:`batch_prefix` makes besides its largest one: ``(M, input rows)``.

    Each ``M`` of ``ms`` below ``num_rows`` takes a window of consecutive rows; the windows
    advance through the case in ascending M (M=1 row 0, M=2 rows 1-2, M=3 rows 3-5, ...),
    starting again at row 0 when the next would run past the last row, so the small launches
    together compare many distinct rows rather than rows 0 and 1 over and over.  Each ``M`` of
    ``ms`` above ``num_rows`` and at most ``cycle_to`` takes the case's rows cycled (launch row
    ``j`` is input row ``(start + j) mod num_rows``, the start advancing the same way); when any
    does, the case's own launch (M = ``num_rows``) is one of these too.
    """
    if num_rows <= 0:
        return []
    sizes = sorted({m for m in ms if m < num_rows or num_rows < m <= cycle_to})
    if sizes and sizes[-1] > num_rows:
        sizes = sorted({*sizes[:-1], num_rows})  # the largest cycled M is the largest launch
    launches: list[tuple[int, list[int]]] = []
    start = 0
    for m in sizes:
        if m < num_rows:
            if start + m > num_rows:
                start = 0
            launches.append((m, list(range(start, start + m))))
            start += m
        elif m == num_rows:
            launches.append((m, list(range(m))))  # the case's own launch
        else:
            launches.append((m, [(start + j) % num_rows for j in range(m)]))
            start = (start + m) % num_rows
    return launches


def batch_prefix(fn: Impl, batch: Batch, ms: Sequence[int], *, cycle_to: int = 0) -> DriverResult:
    """Every row of a launch of ``M`` rows gives the bits of the same input row in the largest
    launch, for every ``M`` in ``ms`` (launches as :func:`prefix_launches` lays them out).

    The largest launch is the case itself, or, when ``ms`` has Ms above the case's rows up to
    ``cycle_to``, the case's rows cycled to the largest such M (its repeated rows are compared
    with their first occurrence too).  A window launch is a slice of the case (its layout and
    strides kept); a cycled launch is a copy.  Every row of every launch is compared, under
    the input row's id, so a subject whose bits change at a row-count threshold is caught on
    any row that changes, not only on rows 0 and 1.
    """
    n = batch.num_rows
    result = DriverResult(vacuous=f"no M of the sweep is below the case's {n} rows")
    launches = prefix_launches(n, ms, cycle_to)
    cycled = [m for m in ms if n < m <= cycle_to]
    if cycled:
        largest = max(cycled)
        big = _call(fn, batch.take([i % n for i in range(largest)]))
        repeats = list(range(n, largest))
        result.record(
            f"M={largest} (case rows cycled: repeats vs first occurrence)",
            compare_outputs(
                _select(big, [i % n for i in repeats]),
                _select(big, repeats),
                ("first occurrence", "repeated row"),
            ),
            [i % n for i in repeats],
        )
    else:
        big = _call(fn, batch)
    for m, rows in launches:
        window = m <= n  # consecutive rows: a slice (m == n: the case itself)
        part = _call(fn, batch.take(slice(rows[0], rows[0] + m) if window else rows))
        names = (f"in the launch of {big[0].shape[0]} rows", f"in a launch of {m}")
        result.record(f"M={m}", compare_outputs(_select(big, rows), part, names), rows)
    return result


def position(
    fn: Impl,
    batch: Batch,
    neighbours: Batch,
    targets: Sequence[int],
    positions: Sequence[int],
) -> DriverResult:
    """Row ``t`` of ``batch`` gives the same bits at any position among ``neighbours``' rows.

    For each target row ``t``: its output inside ``batch`` is the expectation; then row ``p`` of
    ``neighbours`` is replaced by row ``t`` for each ``p`` in ``positions`` and the output at ``p``
    must be bitwise equal.
    """
    result = DriverResult(vacuous="one row: there is no other position")
    alone = _call(fn, batch)
    n = neighbours.num_rows
    for t in targets:
        expected = _rows(alone, t)
        for p in positions:
            if not 0 <= p < n:
                continue
            placed = Batch.concat(
                [neighbours.take(slice(0, p)), batch.take([t]), neighbours.take(slice(p + 1, n))]
            )
            got = _rows(_call(fn, placed), p)
            result.record(
                f"row {t} at position {p}/{n}",
                compare_outputs(expected, got, (f"at position {t}", f"at position {p}")),
                [t],
                meaningful=n > 1,
            )
    return result


def row_start(
    fn: Impl,
    batch: Batch,
    shift: Callable[[Batch, int, torch.Generator], Batch],
    offsets: Sequence[int],
    generator: torch.Generator,
) -> DriverResult:
    """The same logical rows placed at each ``row_start`` offset give the same row-local bits."""
    result = DriverResult()
    expected = _call(fn, batch)
    for off in offsets:
        got = _call(fn, shift(batch, off, generator))
        result.record(
            f"row_start+={off}", compare_outputs(expected, got, ("at row_start 0", f"at row_start {off}"))
        )
    return result


def pack_at_offset(batch: Batch, offset: int, generator: torch.Generator) -> Batch:
    """The same rows, contiguous, starting ``offset`` elements into a NaN-filled flat buffer: a
    packed buffer whose ``row_start`` is ``offset`` (unaligned for most offsets).  A
    ``shift_row_start`` for components whose rows are dense tensors of any rank.  The fill is NaN,
    not random (``generator`` is unused): a read outside the rows poisons the output."""
    del generator
    rows = {}
    for name, t in batch.rows.items():
        n = t.numel()
        flat = torch.full((offset + n + 5,), float("nan"), dtype=t.dtype, device=t.device)
        flat[offset : offset + n] = t.reshape(-1)
        rows[name] = flat[offset : offset + n].view(t.shape)
    return Batch(rows, batch.shared)


def partition(
    fn: Callable[[Batch, int | None], Outputs], batch: Batch, counts: Sequence[int], name: str = "partitions"
) -> DriverResult:
    """Any planned partition / SM count gives the same bits as the default plan (``None``);
    ``name`` labels the axis in the report (``partitions=3``, ``tp_degree=2``)."""
    result = DriverResult()
    expected = _captured(lambda: fn(batch, None))
    for count in counts:
        got = _captured(lambda count=count: fn(batch, count))  # type: ignore[misc]
        result.record(f"{name}={count}", compare_outputs(expected, got, ("default plan", f"{name}={count}")))
    return result


def tp_degree(fn: Callable[[Batch, int], Outputs], batch: Batch, degrees: Sequence[int]) -> DriverResult:
    """Every tensor-parallel degree of ``degrees`` gives the bits of degree 1 (the single-rank
    tree over the same leaves)."""
    result = DriverResult(vacuous="the case's leaves have no TP degree but 1")
    expected = _captured(lambda: fn(batch, 1))
    for degree in degrees:
        if degree == 1:
            continue
        got = _captured(lambda degree=degree: fn(batch, degree))  # type: ignore[misc]
        result.record(
            f"tp_degree={degree}", compare_outputs(expected, got, ("tp_degree=1", f"tp_degree={degree}"))
        )
    return result


def repeat(
    fn: Impl,
    batch: Batch,
    times: int = 3,
    take: Callable[[Batch, Sequence[int]], Batch] | None = None,
) -> DriverResult:
    """Repeated calls give the same bits, also after a call of another shape in between (the
    first half of the rows; of the requests through ``take``, a request model's, when given:
    a request-level batch whose shared operands index its requests cannot be sliced blindly)."""
    result = DriverResult()
    first = _call(fn, batch)
    for i in range(1, times):
        if batch.num_rows > 1:
            half = max(1, batch.num_rows // 2)
            _call(fn, batch.take(slice(0, half)) if take is None else take(batch, list(range(half))))
        result.record(f"call {i + 1}", compare_outputs(first, _call(fn, batch), ("call 1", f"call {i + 1}")))
    return result


def cross_process(fn: Impl, batch: Batch, others: Callable[[], Mapping[str, Outputs]]) -> DriverResult:
    """The same case gives this process's bits in other processes: ``fn`` runs ``batch`` here,
    then ``others()`` gives the outputs other processes computed from the same case, by label
    (``fresh process PYTHONHASHSEED=1``; called after this process's launch, so processes
    started before it run beside it), each compared bitwise with this process's over every
    output (moved to this process's device first).  A differing process is named in ``where``
    with its first differing (row, col) and both values' bits.

    Raises:
        ContractViolation: another process gave another number of outputs, dtype or shape.
    """
    result = DriverResult(vacuous="no other process computed the case")
    expected = _call(fn, batch)
    for label, outputs in others().items():
        moved = tuple(o.to(e.device) for e, o in zip(expected, outputs, strict=False))
        moved += tuple(outputs[len(moved) :])  # a count mismatch stays one for compare_outputs
        result.record(label, compare_outputs(expected, moved, ("this process", label)))
    return result


def sm_partition_counts(sm_count: int) -> tuple[int, ...]:
    """The partition axis (docs/DESIGN.md, "Sweep axes"): 1, 2, 3, SMs, SMs + 1, 2 * SMs + 1
    (deduplicated)."""
    return tuple(dict.fromkeys((1, 2, 3, sm_count, sm_count + 1, 2 * sm_count + 1)))


def config_equivalence(fn: Impl, batch: Batch, variants: Mapping[str, Impl]) -> DriverResult:
    """Every execution in ``variants`` (a config the launcher may pick: other tiles, warps,
    stages, grid) gives ``fn``'s bits on ``batch``; a differing one is named in ``where``
    (``config <name>``) with its first differing (row, col)."""
    result = DriverResult(vacuous="the component declares no other config for this case")
    expected = _call(fn, batch)
    result.launches.add(provenance.of(expected), "shipped config")  # proved too, with no variant
    for name, variant in variants.items():
        result.record(
            f"config {name}",
            compare_outputs(expected, _call(variant, batch), ("shipped config", f"config {name}")),
        )
    return result


def modes(
    eager: Impl,
    compiled: Impl,
    graphed: Impl | None,
    batch: Batch,
    ms: Sequence[int],
    runtime_calls: Callable[[], Mapping[str, int]] | None = None,
) -> DriverResult:
    """The same bits in every execution mode: ``compiled(batch)`` (``torch.compile``) and
    ``graphed(batch)`` (CUDA-graph replay, GPU lanes) equal ``eager(batch)``, and in the compiled
    graph ``compiled(batch[:M])`` equals ``compiled(batch)[:M]`` for each M in ``ms`` below the
    row count, and equals ``eager(batch[:M])`` (a compiled graph must not freeze a
    shape-dependent choice at trace time: vLLM's compiled batch-invariant matmul looked its M
    bucket up once, with the traced M, and kept it for every runtime M).

    ``runtime_calls`` (the operators' run-time call counter of the calling thread, for an
    operator subject): each compiled call must run, at run time, the operators its eager call
    runs, as many times each (issue 25: an operator left to the compiler may give the kernel's
    bits on a case and still be unpinned; bits alone do not show it)."""
    result = DriverResult(vacuous="no other execution mode on this lane")

    def counted(fn: Impl, b: Batch) -> tuple[Outputs, Counter[str]]:
        before = Counter(runtime_calls()) if runtime_calls is not None else Counter()
        out = _call(fn, b)
        return out, (Counter(runtime_calls()) - before if runtime_calls is not None else Counter())

    def ran(label: str, want: Counter[str], got: Counter[str]) -> None:
        if runtime_calls is None or (want == got and want):
            return
        reason = (
            f"the compiled call ran the pinned operators {dict(got)} at run time, the eager call "
            f"{dict(want)}: an operator left to the compiler"
            if want
            else "the eager call ran no pinned operator at run time"
        )
        rows = batch.num_rows
        result.record(label, [BitwiseReport(False, rows, rows, reason=reason)], meaningful=False)

    want, want_calls = counted(eager, batch)
    full, full_calls = counted(compiled, batch)
    result.record("compiled", compare_outputs(want, full, ("eager", "compiled")))
    ran("compiled ran the operators", want_calls, full_calls)
    if graphed is not None:
        result.record("cuda graph", compare_outputs(want, _call(graphed, batch), ("eager", "cuda graph")))
    for m in ms:
        if m < batch.num_rows:
            prefix = batch.take(slice(0, m))
            part, part_calls = counted(compiled, prefix)
            result.record(
                f"compiled M={m}",
                compare_outputs(_rows(full, slice(0, m)), part, ("compiled whole", f"compiled M={m}")),
            )
            eager_part, eager_calls = counted(eager, prefix)
            result.record(
                f"compiled M={m} vs eager",
                compare_outputs(eager_part, part, (f"eager M={m}", f"compiled M={m}")),
            )
            ran(f"compiled M={m} ran the operators", eager_calls, part_calls)
    return result


def neighbours(
    fn: Impl,
    batch: Batch,
    victims: Sequence[int],
    rewrite: Callable[[Batch, Sequence[int], Transform], tuple[Batch, bool]],
    transforms: Sequence[Transform],
    unit: str = "row",
) -> DriverResult:
    """A victim unit's bits do not move when only the other units' *contents* change.

    For each victim ``v``: its outputs in ``fn(batch)`` (the original neighbours) are the
    expectation; for each transform ``t``, ``rewrite(batch, [v], t)`` is the same launch -- same
    shapes, layout and victim -- with every other unit's contents rewritten by ``t`` (scaled by
    1e3, set to NaN...: :mod:`batchinv.harness.neighbours`), and ``v``'s outputs there must be
    bitwise equal.  A transform that changes nothing (no other unit, or no data the transform
    can express) is not compared.  A failure names the victim, the transform and the first
    differing position: ``victim row 3 beside neighbours scaled by 1e3 vs original neighbours``.
    """
    result = DriverResult(vacuous=f"no other {unit} with floating-point contents to rewrite")
    base = _call(fn, batch)
    for v in victims:
        want = _rows(base, v)
        for t in transforms:
            rewritten, changed = rewrite(batch, [v], t)
            if not changed:
                continue
            got = _rows(_call(fn, rewritten), v)
            label = f"victim {unit} {v} beside neighbours {t.label} vs original neighbours"
            result.record(label, compare_outputs(want, got), [v])
    return result


# --- request-level drivers --------------------------------------------------------------------


def request_targets(num_requests: int, generator: torch.Generator) -> list[int]:
    """The target requests of the request checks: the first, the last and one at random."""
    if num_requests <= 0:
        return []
    pick = int(torch.randint(num_requests, (1,), generator=generator))
    return sorted({0, num_requests - 1, pick})


def _cycled(num: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` request indices among ``num``: random permutations of ``range(num)`` one after
    another (each request once before any repeats), so a small batch fills a large co-batch."""
    out: list[int] = []
    while len(out) < count:
        out += torch.randperm(num, generator=generator).tolist()
    return out[:count]


def co_batch(
    fn: Impl,
    batch: Batch,
    others: Batch | Mapping[str, Batch],
    model: RequestModel,
    sizes: Sequence[int] = CO_BATCH_SIZES,
    generator: torch.Generator | None = None,
) -> DriverResult:
    """A request's outputs are the same bits alone and in any co-batch.

    For each target request ``t`` of ``batch`` (first, last, random): ``fn(take(batch, [t]))`` is
    the expectation; ``t`` first in ``concat([take(batch, [t]), take(pool, k requests)])`` for
    each co-batch size ``k`` in ``sizes`` (the pool's requests cycled in random order when it has
    fewer than ``k``), and ``t`` inside the whole ``batch``, must give the same bits.

    ``others`` is one pool of other requests, or several named by their length mix
    (:attr:`RequestModel.neighbours`).  Mixes are dealt round-robin over the (target, size)
    pairs, so a case costs as many launches as with one pool; a mix left over (fewer pairs than
    mixes: one target, or sizes cut by ``--max-m``) runs with the first target at the largest
    size.  Each comparison's label names its mix, e.g. ``request 3 with 7 others (one_huge)``.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    result = DriverResult(vacuous="no other request: neither the batch nor the co-batches have one")
    pools = {"": others} if isinstance(others, Batch) else dict(others)
    mixes = [name for name, pool in pools.items() if pool.num_rows > 0]
    n = batch.num_rows
    full = _call(fn, batch)
    targets = request_targets(n, g)
    expected: dict[int, tuple[Batch, Outputs]] = {}
    for t in targets:
        alone_batch = model.take(batch, [t])
        expected[t] = (alone_batch, _call(fn, alone_batch))
        result.record(
            f"request {t} in its batch of {n}",
            compare_outputs(expected[t][1], _rows(full, t), ("alone", f"in its batch of {n}")),
            [t],
            meaningful=n > 1,
        )
    if not mixes or not sizes:
        return result
    pairs = [(t, k, mixes[i % len(mixes)]) for i, (t, k) in enumerate((t, k) for t in targets for k in sizes)]
    used = {mix for _, _, mix in pairs}
    if targets:
        pairs += [(targets[0], max(sizes), mix) for mix in mixes if mix not in used]
    for t, k, mix in pairs:
        alone_batch, want = expected[t]
        pool = pools[mix]
        mixed = model.concat([alone_batch, model.take(pool, _cycled(pool.num_rows, k, g))])
        got = _rows(_call(fn, mixed), 0)
        label = f"request {t} with {k} other{'' if k == 1 else 's'}" + (f" ({mix})" if mix else "")
        result.record(label, compare_outputs(want, got, ("alone", f"in a batch of {k + 1}")), [t])
    return result


def slot(
    fn: Impl, batch: Batch, others: Batch, model: RequestModel, generator: torch.Generator | None = None
) -> DriverResult:
    """A request's outputs are the same bits at any slot of the same co-batch.

    For each target request ``t`` of ``batch`` (first, last, random), ``t`` is inserted among all
    of ``others``' requests at slot 0 (the expectation) and at slots 1, the middle, the last and
    one at random; the co-batch is the same requests each time, only ``t``'s slot moves.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    result = DriverResult(vacuous="no other request: there is no other slot")
    n, m = batch.num_rows, others.num_rows
    if m == 0:
        return result
    rest = list(range(m))
    slots = sorted({1, m // 2, m, int(torch.randint(m + 1, (1,), generator=g))} - {0})
    for t in request_targets(n, g):
        alone = model.take(batch, [t])

        def at(s: int, alone: Batch = alone) -> Batch:
            parts = [model.take(others, rest[:s]), alone, model.take(others, rest[s:])]
            return model.concat([p for p in parts if p.num_rows])

        expected = _rows(_call(fn, at(0)), 0)
        for s in slots:
            got = _rows(_call(fn, at(s)), s)
            result.record(
                f"request {t} at slot {s}/{m + 1}",
                compare_outputs(expected, got, ("at slot 0", f"at slot {s}")),
                [t],
            )
    return result


def placement(
    fn: Impl, batch: Batch, model: RequestModel, generator: torch.Generator, times: int = 3
) -> DriverResult:
    """The same logical requests with their data in other physical places (other pages, pages
    in another order, other table padding; NaN wherever no request points) give the same bits,
    request by request."""
    result = DriverResult()
    expected = _call(fn, batch)
    for i in range(times):
        got = _call(fn, model.relocate(batch, generator))
        result.record(
            f"relocation {i + 1}",
            compare_outputs(expected, got, ("original placement", f"relocation {i + 1}")),
        )
    return result


# --- the phase driver -------------------------------------------------------------------------


def _element(out_name: str, shape: Sequence[int], col: int) -> str:
    """``"o head 2, column 5"`` for flat column ``col`` of a row of trailing ``shape``."""
    if len(shape) == 0:
        return out_name
    if len(shape) == 1:
        return f"{out_name} head {col}"
    inner = math.prod(shape[1:])
    return f"{out_name} head {col // inner}, column {col % inner}"


def phase(fn: Impl, batch: Batch, model: PhaseModel, targets: Sequence[int], seed: int) -> DriverResult:
    """A query row's bits do not depend on the phase that computed it.

    For the requests ``targets`` of ``batch``, :func:`batchinv.harness.phases.plan` gives the
    launches (at most :data:`~batchinv.harness.phases.MAX_LAUNCHES`): the base phase (a full
    prefill of each request; decode steps, q_len 1, for a model with one q_len per launch) and the
    others (chunked prefills cut at page boundaries, split multiples +-1 and seeded points; decode
    steps; speculative verifies of q_len 2 and 4; a mixed launch of prefills and decode steps),
    all over the same KV cache.  Each row of every other launch, by (request, position), must
    equal the base's row bitwise, every output.  A failure names the request, the position, both
    phases and the first differing element (head, column) with both values' bits."""
    result = DriverResult(vacuous="no row has another phase (every request too short to re-launch)")
    plan = phases.plan(model, batch, targets, seed)
    rows = model.queries(batch, phases.used_positions(plan), torch.Generator().manual_seed(seed + 4049))
    expected: dict[tuple[int, int], Outputs] = {}
    base_calls: dict[tuple[int, int], Outputs] = {}  # the base launch of each row (its launches)
    for launch in plan.base:
        outs = _call(fn, model.pack(batch, rows, launch.pieces))
        for piece, got in zip(launch.pieces, model.unpack(outs, launch.pieces), strict=True):
            for i in range(piece.q_len):
                expected[(piece.request, piece.first + i)] = tuple(o[i : i + 1] for o in got)
                base_calls[(piece.request, piece.first + i)] = outs
    compared: set[tuple[int, int]] = set()
    for launch in plan.others:
        outs = _call(fn, model.pack(batch, rows, launch.pieces))
        for piece, got in zip(launch.pieces, model.unpack(outs, launch.pieces), strict=True):
            at = [piece.first + i for i in range(piece.q_len) if (piece.request, piece.first + i) in expected]
            if not at:
                continue
            local = [p - piece.first for p in at]
            want = provenance.carry(
                base_calls[(piece.request, at[0])],
                [torch.cat([expected[(piece.request, p)][k] for p in at]) for k in range(len(got))],
            )
            have = provenance.carry(outs, [o[local] for o in got])
            reports = compare_outputs(want, have, (plan.base_phase, piece.phase))
            compared.update((piece.request, p) for p in at)
            span = f"position {at[0]}" if len(at) == 1 else f"positions {at[0]}..{at[-1]}"
            label = f"request {piece.request}, {span}: {plan.base_phase} vs {piece.phase}"
            first_bad = not result.detail
            result.record(label, reports, [piece.request * 1_000_003 + p for p in at])
            if first_bad and result.detail:
                k, report = next((k, r) for k, r in enumerate(reports) if not r.equal)
                result.detail = _phase_detail(model, plan.base_phase, piece, at, k, report, want[k])
                ran = provenance.contrast(
                    provenance.of(want), provenance.of(have), (plan.base_phase, piece.phase)
                )
                result.detail += f"; {ran}" if ran else ""
                if report.first is not None:
                    pos = at[report.first.row]
                    result.first_difference = (
                        f"request {piece.request}, position {pos}: {plan.base_phase} vs {piece.phase}"
                    )
                    if result.first is not None:
                        result.first.update(row=pos, request=piece.request)
    result.rows_total = len(compared)
    return result


def _phase_detail(
    model: PhaseModel,
    base_phase: str,
    piece: Piece,
    at: Sequence[int],
    k: int,
    report: BitwiseReport,
    want: torch.Tensor,
) -> str:
    """The first failure of :func:`phase`: where, which phases, which element, both bits."""
    names = model.output_names
    name = names[k] if k < len(names) else f"output {k}"
    where = f"request {piece.request}"
    if report.first is None:  # a dtype or shape mismatch
        return f"{where}: {base_phase} vs {piece.phase}: {name}: {report}"
    first = report.first
    element = _element(name, tuple(want.shape[1:]), first.col)
    return (
        f"{where}, position {at[first.row]}: {base_phase} vs {piece.phase}: {element}: "
        f"{base_phase} {first.expected_bits} ({first.expected_value}), "
        f"{piece.phase} {first.actual_bits} ({first.actual_value}) "
        f"[{report.rows_differing}/{report.rows_total} rows of the piece differ"
        + ("" if report.worst_ulp is None else f", worst {report.worst_ulp:g} ULP")
        + "]"
    )


def padding(
    fn: Impl,
    batch: Batch,
    model: PaddingModel,
    requests: RequestModel,
    others: Mapping[str, Batch],
    lane: Lane,
    generator: torch.Generator | None = None,
) -> DriverResult:
    """A sequence's outputs are the same bits whatever padding its launch puts around it.

    For each target request ``t`` (first, last, random) the expectation is ``t`` alone with no
    padding (``repad(take(batch, [t]), "right", [0])``).  Then, on each side of ``model.sides``:
    ``t`` alone padded by every amount of ``model.amounts(lane)``; and ``t`` first inside a batch
    with the first requests of each pool of other lengths (``others``), padded by the amounts in
    turn -- so its offset moves with its neighbours' lengths as well.  Each must equal the
    expectation bitwise (the model keeps outputs canonical: real rows first).  A failure names the
    request, the side, the amount and the neighbours."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    result = DriverResult(vacuous="no request to pad")
    amounts = model.amounts(lane)
    pools = [(mix, pool) for mix, pool in others.items() if pool.num_rows > 0]
    for t in request_targets(batch.num_rows, g):
        alone = requests.take(batch, [t])
        want = _call(fn, model.repad(alone, "right", [0]))
        for side in model.sides:
            for amount in amounts:
                got = _call(fn, model.repad(alone, side, [amount]))
                names = ("alone, unpadded", f"{side}-padded by {amount}")
                result.record(
                    f"request {t}, {side}-padded by {amount}", compare_outputs(want, got, names), [t]
                )
            for i, (mix, pool) in enumerate(pools):
                k = min(pool.num_rows, 3)
                mixed = requests.concat([alone, requests.take(pool, list(range(k)))])
                for amount in (amounts[i % len(amounts)] if amounts else 0,):
                    got = _rows(_call(fn, model.repad(mixed, side, [amount] + [0] * k)), 0)
                    label = f"request {t}, {side}-padded by {amount} with {k} others" + (
                        f" ({mix})" if mix else ""
                    )
                    names = ("alone, unpadded", f"{side}-padded by {amount} with {k} others")
                    result.record(label, compare_outputs(want, got, names), [t])
    return result
