"""The component registry, in the spirit of PyTorch's OpInfo.

Each component (``harness/components/<name>.py``) defines one :class:`Component`: its
reference, fast kernel, unpinned baselines, case generator, error inputs, agreement kind and
lanes.  The CLI, the pytest plugin, the benchmarks and the reports all read this registry;
:data:`COMPONENT_MODULES` is the one place that lists the components.

Data model:

* a :class:`Case` is a point of the sweep: JSON-able ``axes`` (shape, dtype, bit pattern...)
  plus a ``seed``; ``Component.build(case, device)`` turns it into a :class:`Batch`
  deterministically (its own ``torch.Generator`` seeded from ``case.seed``).
* a :class:`Batch` is one launch's inputs: ``rows`` (tensors whose dim 0 is the row axis) and
  ``shared`` operands (weights, k, eps...).  ``fn(**batch.kwargs())`` calls an implementation.
* an implementation returns one tensor or a tuple of tensors, each with dim 0 = rows.

Units: a row-wise component's unit is a row; a *request-level* component (``Component.requests``
set, a :class:`RequestModel`) takes a batch of requests: dim 0 of every ``rows`` tensor and of
every output is the request axis (``Batch.num_rows`` counts requests), and ragged or paged data
(a paged KV cache) lives in ``shared`` operands that the request model knows how to take,
concatenate and relocate.  The same cases, checks, reports and repro lines serve both.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from batchinv.harness.lanes import Lane
from batchinv.reference.errors import ArgumentError

if TYPE_CHECKING:  # harness.phases imports this module
    from batchinv.harness.phases import PhaseModel

#: The one list of registered components (module names under ``batchinv.harness.components``).
COMPONENT_MODULES: tuple[str, ...] = (
    "topk",
    "matmul",
    "fp8_quant",
    "fp8_gemm",
    "rms_norm",
    "fused_add_rms_norm",
    "softmax",
    "log_softmax",
    "mean",
    "decode_attention",
    "moe_router",
    "moe_align",
    "grouped_gemm",
    "swiglu",
    "moe_combine",
    "fused_moe",
    "prefill_chunk_plan",
    "cuda_graph_buckets",
    "decode_partition_plan",
    "w4a16_nvfp4",
    "prefill_attention",
    "sdpa_attention",
    "sampler",
    "all_reduce",
    "tp_linear",
)

#: The default batch-size sweep (docs/DESIGN.md, "Sweep axes"); GPU lanes add 4096.
M_SWEEP: tuple[int, ...] = (1, 2, 7, 8, 15, 16, 17, 32, 33, 64, 65, 128, 512, 2048)
M_SWEEP_GPU_EXTRA: tuple[int, ...] = (4096,)

#: Default row offsets for the row_start check.
ROW_OFFSETS: tuple[int, ...] = (0, 1, 7, 31, 32, 33)
#: The row_start check adds one random offset drawn from ``[low, high)``: the largest offset it
#: may place a row at is ``high - 1`` (a case list keeping every row_start launch inside a fast
#: path's envelope needs that much headroom).
ROW_OFFSET_RANDOM: tuple[int, int] = (34, 300)

ALL_LANES: frozenset[Lane] = frozenset(Lane)
GPU_LANES: frozenset[Lane] = frozenset({Lane.SM90, Lane.SM100})


def m_sweep(lane: Lane, limit: int | None = None) -> tuple[int, ...]:
    """The M sweep of ``lane``, cut at ``limit`` rows (inclusive) when given."""
    values = M_SWEEP + (M_SWEEP_GPU_EXTRA if lane.is_gpu else ())
    return tuple(m for m in values if limit is None or m <= limit)


#: The row counts batch_prefix adds to :data:`M_SWEEP` (docs/DESIGN.md, "Sweep axes"): every M
#: of 1..17 and each power of two 32..256 with both neighbours, so a launcher or kernel that
#: changes anything at a row-count threshold anywhere in 1..257 is launched on both sides of it;
#: and 24, 48, 96, the tuned-config keys (vLLM's fused-MoE config files) whose nearest-key bands
#: (21..28, 41..56, 81..112) hold no other M, so a config taken only inside a band is launched.
ROW_THRESHOLD_MS: tuple[int, ...] = (
    *range(1, 18),
    24,
    31,
    32,
    33,
    48,
    63,
    64,
    65,
    96,
    127,
    128,
    129,
    255,
    256,
    257,
)
#: batch_prefix launches a threshold case's rows cycled up to this many rows when the case has
#: fewer: every threshold M on GPU lanes; on the cpu lane (the interpreter: a row kernel costs
#: milliseconds per row) the Ms 1..8, the higher thresholds running where the case has the rows.
ROW_THRESHOLD_CYCLE: int = max(ROW_THRESHOLD_MS)
ROW_THRESHOLD_CYCLE_CPU: int = 8


def threshold_cycle(lane: Lane) -> int:
    """Up to how many rows batch_prefix cycles a threshold case's rows on ``lane``."""
    return ROW_THRESHOLD_CYCLE if lane.is_gpu else ROW_THRESHOLD_CYCLE_CPU


def prefix_sweep(lane: Lane, limit: int | None = None, *, thresholds: bool = True) -> tuple[int, ...]:
    """The Ms of the batch_prefix check on ``lane``, ascending, cut at ``limit`` rows (inclusive).

    ``thresholds``: :func:`m_sweep` with :data:`ROW_THRESHOLD_MS` added (every GPU-lane case,
    and one case per component on the cpu lane); without it, :func:`m_sweep` alone.
    """
    values = set(m_sweep(lane)) | (set(ROW_THRESHOLD_MS) if thresholds else set())
    return tuple(m for m in sorted(values) if limit is None or m <= limit)


Outputs = tuple[torch.Tensor, ...]


def as_outputs(result: Any) -> Outputs:
    """Normalize an implementation's return value to a tuple of tensors."""
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise TypeError(
        f"an implementation must return a tensor or a tuple of tensors, got {type(result).__name__}"
    )


@dataclass(frozen=True)
class Batch:
    """One launch's inputs.

    Attributes:
        rows: tensors whose dim 0 is the row axis (all with the same number of rows).
        shared: operands every row sees (weights, ``k``, ``eps``...), passed through unchanged.
    """

    rows: Mapping[str, torch.Tensor]
    shared: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return next(iter(self.rows.values())).shape[0]

    def kwargs(self) -> dict[str, Any]:
        return {**self.rows, **self.shared}

    def take(self, index: torch.Tensor | Sequence[int] | slice) -> Batch:
        """The rows at ``index`` (a slice keeps views; an index list copies)."""
        if isinstance(index, slice):
            return Batch({k: v[index] for k, v in self.rows.items()}, self.shared)
        idx = torch.as_tensor(index, dtype=torch.long)
        return Batch({k: v.index_select(0, idx.to(v.device)) for k, v in self.rows.items()}, self.shared)

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Rows of ``parts`` stacked in order; shared operands of the first part."""
        keys = parts[0].rows.keys()
        return Batch({k: torch.cat([p.rows[k] for p in parts]) for k in keys}, parts[0].shared)


@dataclass(frozen=True)
class Case:
    """A point of the sweep: JSON-able ``axes`` and a ``seed``.  ``id`` is the pytest id."""

    component: str
    axes: Mapping[str, Any]
    seed: int = 0

    @property
    def id(self) -> str:
        parts = [f"{k}={_fmt_axis(v)}" for k, v in self.axes.items()]
        return "-".join([*parts, f"seed={self.seed}"])

    def with_seed(self, seed: int) -> Case:
        return replace(self, seed=seed)

    def axes_json(self) -> str:
        return json.dumps(dict(self.axes), sort_keys=True, separators=(",", ":"))


def _fmt_axis(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class Baseline:
    """An unpinned production path, run as a negative control.

    Attributes:
        name: short id (used in test ids and the CLI).
        fn: same signature as the component's fast function (partition kwarg only if
            ``accepts_partition``).
        why: what it leaves unpinned, i.e. why invariance should fail.
        expected_to_vary_on: lanes where the negative control must fail (a strict xfail in
            pytest); elsewhere the sweep still runs it and reports "detected" or "inconclusive".
        lanes: lanes it can run on at all.
        env: for a *pin candidate*, environment variables the check runs under (in a subprocess,
            since libraries read them at handle creation); its invariance is reported, not assumed.
        accepts_partition: ``fn`` takes the component's partition keyword.
        timed: ``batchinv bench`` times it beside the fast kernel (False: a construction for
            negative controls only, e.g. one that syncs with the host, not a production path).
        modes: the baseline's torch path without its argument checks (Dynamo does not trace
            them), which the ``modes`` check runs eager, compiled and in a CUDA graph: a torch
            path whose compiled kernels may differ from its eager ones, the negative control of
            ``modes``.  None: the check skips this baseline.
        config_control: the baseline is the component's own kernel under another config (another
            BLOCK_K, a split sum): the negative control of ``config_equivalence``, which compares
            it with the component's configs.  False: the check skips this baseline -- its bits
            differ from the pinned kernel's by construction (another library, another formula),
            which is no variance, and a detection there would hide the check that finds its real
            one.
        caught_by: the checks designed to detect it, tried first by the quick profile (the
            verdict does not depend on the order; see :mod:`batchinv.harness.profiles`).
    """

    name: str
    fn: Callable[..., Any]
    why: str
    expected_to_vary_on: frozenset[Lane] = ALL_LANES
    lanes: frozenset[Lane] = ALL_LANES
    env: Mapping[str, str] | None = None
    accepts_partition: bool = False
    timed: bool = True
    modes: Callable[..., Any] | None = None
    config_control: bool = False
    #: the checks designed to detect this baseline (its ``why``): the sweep's quick profile tries
    #: them first, over every case, then the rest -- the same (case, check) pairs as the full
    #: profile in another order, so the same verdict (a control ends at its first detection).  A
    #: ``config_control`` baseline is caught by ``config_equivalence`` without saying so.
    caught_by: tuple[str, ...] = ()

    @property
    def is_pin_candidate(self) -> bool:
        return self.env is not None


@dataclass(frozen=True)
class Exact:
    """Agreement is bitwise: fast == reference on every bit."""

    justification: str = "the computation is exact (selection, integer keys, or one fixed fp sequence)"


@dataclass(frozen=True)
class PrecisionModel:
    """A known precision flaw, modelled, so that an agreement failure can say what it looks like.

    Attributes:
        name: what the flaw is called in the message (``"TF32"``).
        fn: a model of a kernel with the flaw, with the reference's signature and outputs (fp64):
            e.g. the reference on operands first rounded to TF32.  It may raise where the flaw
            cannot occur (TF32 on bf16 inputs): the model is then not considered.
        diagnosis: the sentence an agreement failure gets when the output meets the judged bound
            around the model's outputs (while it missed the reference's): what the subject
            probably does.
    """

    name: str
    fn: Callable[..., Any]
    diagnosis: str


@dataclass(frozen=True)
class Toleranced:
    """Agreement within a derived bound, and bitwise where the result is one rounding of an
    exactly computed value.

    Attributes:
        bound: ``bound(batch, reference_outputs) -> tuple`` of float64 tensors (one per output,
            broadcastable), the largest allowed absolute error per element: the rigorous
            worst-case bound, a hard limit.  Derived from the fp64 reference, dtype epsilon and
            the reduction length, never guessed.
        justification: why the math cannot be exact and how the bound is derived.
        out_dtypes: ``out_dtypes(batch)`` -> the dtype each fast output must have by contract
            (the fp64 reference cannot say it); a fast output of another dtype fails agreement,
            so a missing final rounding or a returned fp64 cannot pass within the bound.
        tight_bound: like ``bound``, a tighter bound that is judged instead (never above
            ``bound``: the smaller of the two applies): one that follows the fast kernel's
            documented order of operations, so that a precision downgrade (TF32 operands, a
            16-bit rounding, 16-bit accumulation) exceeds it.  None: ``bound`` is judged.
        tight_justification: how ``tight_bound`` is derived and why the kernel cannot exceed it.
        exact: ``exact(batch, reference_outputs) -> tuple`` of bool tensors (one per output,
            broadcastable): the elements where the fast output must equal the reference rounded
            once to the output's dtype (:func:`batchinv.reference.exact.round_once`), bit for bit
            (a NaN matches any NaN); there the reference must be that exact value to fp64.  The
            tolerance applies to the other elements.  None: no element is held bitwise.
        exact_justification: the envelope of ``exact`` and why the kernel is exact inside it.
        precision_models: known precision flaws (:class:`PrecisionModel`) an agreement failure is
            compared with: one whose outputs the failing output meets within the judged bound is
            named in the failure's detail ("the error is TF32-sized: ...").  It never changes a
            verdict.
    """

    bound: Callable[[Batch, Outputs], Outputs]
    justification: str
    out_dtypes: Callable[[Batch], tuple[torch.dtype, ...]] | None = None
    tight_bound: Callable[[Batch, Outputs], Outputs] | None = None
    tight_justification: str = ""
    exact: Callable[[Batch, Outputs], Outputs] | None = None
    exact_justification: str = ""
    precision_models: tuple[PrecisionModel, ...] = ()


@dataclass(frozen=True)
class ErrorCase:
    """A bad input and the exception it must raise (from fast and reference alike)."""

    name: str
    kwargs: Mapping[str, Any]
    error: type[BaseException]
    match: str  # regex the message must match (it names the argument)
    applies_to: tuple[str, ...] = ("fast", "reference")  # e.g. ("fast",) for a GPU-path-only error


#: The row checks' invariance checks, in sweep order ("partition" and "repeat" also serve requests).
ROW_CHECKS: tuple[str, ...] = ("batch_prefix", "position", "row_start", "partition", "repeat")
#: The request-level invariance checks (components with ``requests``), after the row checks.
REQUEST_CHECKS: tuple[str, ...] = ("co_batch", "slot", "placement")
#: The check of request-level attention components with a phase model (``Component.phase``),
#: after the request checks: a query row's bits do not depend on the phase that computed it
#: (full prefill, chunked prefill over a cached prefix, decode, speculative verify).
PHASE_CHECKS: tuple[str, ...] = ("phase",)
#: The check of dense (SDPA-style) request-level components with a padding model
#: (``Component.padding``): a sequence's bits do not depend on how much padding its launch puts
#: before or after it.
PADDING_CHECKS: tuple[str, ...] = ("padding",)
#: The check of components with floating-point inputs (``Component.dtypes``), row-wise and
#: request-level alike: a victim row's (request's) bits do not move when only the *other* units'
#: contents change (scaled by 1e3 and 1e-3, +-inf, NaN, zeros, max-normal, subnormal;
#: ``harness/neighbours.py``): a batch-wide statistic (a dynamic FP8 scale, an eps scaled by the
#: batch max) cannot hide behind neighbours that happen to look alike.
NEIGHBOUR_CHECKS: tuple[str, ...] = ("neighbours",)
#: The checks of components with several executions (``Component.configs``): every config the
#: launcher may pick gives the shipped one's bits.
CONFIG_CHECKS: tuple[str, ...] = ("config_equivalence",)
#: The checks of components with a torch operator (``Component.torch_op``): eager, compiled and
#: CUDA-graph runs give the same bits, and rows stay invariant along M in the compiled graph.
MODE_CHECKS: tuple[str, ...] = ("modes",)
#: The check of collectives with a tensor-parallel degree (``Component.tp_degrees``): every TP
#: degree of the same leaves gives the single-rank (TP 1) bits.
TP_CHECKS: tuple[str, ...] = ("tp_degree",)
#: The check of every component: the same case gives the same bits in a fresh process (another
#: PYTHONHASHSEED, an empty Triton cache; ``harness/cross_process.py``).  *Deterministic at
#: fixed shape*, reported apart from batch invariance: a component can have it and not be
#: batch-invariant, or (an autotuner timed once per process) the reverse.
PROCESS_CHECKS: tuple[str, ...] = ("cross_process",)
#: The batch-invariance checks, in sweep order: a row's (request's) bits do not depend on its
#: batch, position, layout, partition, phase, padding, neighbours, config or mode.
BATCH_INVARIANCE_CHECKS: tuple[str, ...] = (
    *ROW_CHECKS,
    *REQUEST_CHECKS,
    *PHASE_CHECKS,
    *PADDING_CHECKS,
    *NEIGHBOUR_CHECKS,
    *CONFIG_CHECKS,
    *MODE_CHECKS,
    *TP_CHECKS,
)
#: Every invariance check, in sweep order: the batch-invariance checks, then cross_process.
INVARIANCE_CHECKS: tuple[str, ...] = (*BATCH_INVARIANCE_CHECKS, *PROCESS_CHECKS)
#: Every check, in sweep order (the column order of the sweep's table and the report).  Each has
#: exactly one driver in ``harness.checks.DRIVERS``, which names these in this order (checked when
#: ``harness.checks`` is imported: that module imports this one, never the reverse).
CHECKS: tuple[str, ...] = ("agreement", *INVARIANCE_CHECKS)

#: Co-batch sizes (other requests sharing the launch) of the co_batch check; ``--max-m`` cuts them.
CO_BATCH_SIZES: tuple[int, ...] = (1, 2, 7, 31, 255)
#: The cpu lane stops at 7 other requests: the interpreter runs a 256-request launch for minutes.
CO_BATCH_SIZES_CPU: tuple[int, ...] = (1, 2, 7)


#: Other requests beside a target for token-level components (a request = one token: MoE) on
#: GPU lanes: launches of 2 to 4096 tokens, so an expert flooded by the others has an M from 1
#: to thousands.
TOKEN_CO_BATCH_SIZES: tuple[int, ...] = (1, 7, 63, 511, 4095)


def token_co_batch_sizes(lane: Lane) -> tuple[int, ...]:
    """A token-level ``RequestModel.co_batch_sizes``: :data:`TOKEN_CO_BATCH_SIZES` on GPU lanes,
    the lane's :func:`co_batch_sizes` on the cpu lane (the interpreter)."""
    return TOKEN_CO_BATCH_SIZES if lane.is_gpu else co_batch_sizes(lane)


def co_batch_sizes(lane: Lane) -> tuple[int, ...]:
    """How many other requests the co_batch check puts beside the target on ``lane``."""
    return CO_BATCH_SIZES if lane.is_gpu else CO_BATCH_SIZES_CPU


@dataclass(frozen=True)
class RequestModel:
    """How a request-level component's batch splits into requests and joins again.

    Dim 0 of every ``rows`` tensor is the request axis; ragged or paged data shared by the
    requests (a paged KV cache and its page pool) is in ``shared`` and rewritten by these.

    Attributes:
        take: ``take(batch, requests) -> Batch``: a batch of just those requests, in that order
            (an index may repeat: the co_batch check cycles through a small batch's requests).
            It may keep the whole shared pool (a paged KV cache) or copy the pages it needs.
        concat: ``concat(parts) -> Batch``: the requests of every part, in order, in one launch
            (for paged KV: page pools concatenated, block tables offset).
        relocate: ``relocate(batch, generator) -> Batch``: the same logical requests with their
            data in other physical places (other pages, pages in another order, other table
            padding); every byte no request references is NaN.
        neighbours: ``neighbours(case, lane) -> {mix: Case}``: the cases whose requests are the
            *other* requests of the co_batch and slot checks, one per length mix (e.g. short,
            long, equal, one huge), each with the target case's shape axes so that ``concat``
            joins them (same heads, head size, page size, dtype...), seeds derived from the
            case's seed.  co_batch spreads the mixes round-robin over its (target, size) pairs;
            slot uses the first mix.  None: one pool, the same case with another seed.
        co_batch_sizes: ``co_batch_sizes(lane)`` -> the numbers of other requests co_batch puts
            beside a target (each its own launch); None: the lane's :func:`co_batch_sizes`.  A
            token-level component (a request = one token) asks for thousands on GPU lanes.
        local: ``local(outputs) -> outputs``: the part of the outputs that is each request's own
            work (every tensor keeping dim 0 = request), which the request checks (co_batch,
            slot, placement) and partition compare; the rest says where the launch put the
            request -- a plan's partition id moves with the batch size and the partition count
            by design -- and is judged by agreement and repeat alone.  None: every output is
            the request's own.
        rewrite_others: ``rewrite_others(batch, keep, transform, content_rows=None) -> (Batch,
            changed)``: the same launch (shapes, layout, tables) with the contents of every
            request not in ``keep`` rewritten by the ``neighbours`` check's ``transform``
            (:class:`batchinv.harness.neighbours.Transform`), wherever the model keeps them
            (a paged model: the pool tokens only those requests reference); ``changed``: whether
            anything changed.  ``content_rows`` is the component's :attr:`Component.content_rows`
            (the check passes it only when the component sets it).  None:
            :func:`batchinv.harness.neighbours.rewrite_rows` (the floating-point ``rows`` of the
            other requests, or the component's ``content_rows``; ``shared`` is configuration).
    """

    take: Callable[[Batch, Sequence[int]], Batch]
    concat: Callable[[Sequence[Batch]], Batch]
    relocate: Callable[[Batch, torch.Generator], Batch]
    neighbours: Callable[[Case, Lane], Mapping[str, Case]] | None = None
    co_batch_sizes: Callable[[Lane], tuple[int, ...]] | None = None
    local: Callable[[Outputs], Outputs] | None = None
    rewrite_others: Callable[[Batch, Sequence[int], Any], tuple[Batch, bool]] | None = None


#: Left and right padding amounts of the padding check on GPU lanes: 0..300 with every tile and
#: split boundary of the tables (16, 32, 64, 128, 256) +-1.
PADDING_AMOUNTS: tuple[int, ...] = (
    0,
    1,
    2,
    7,
    15,
    16,
    17,
    31,
    32,
    33,
    63,
    64,
    65,
    127,
    128,
    129,
    255,
    256,
    257,
    300,
)
#: The cpu lane's: one past the interpreter's chunk (16) and split (32); the interpreter pays per
#: padded row, so the lane keeps the two shifts that regroup a row's keys.
PADDING_AMOUNTS_CPU: tuple[int, ...] = (17, 33)


@dataclass(frozen=True)
class PaddingModel:
    """How a dense (SDPA-style) request-level component's sequences are padded in a launch.

    Attributes:
        repad: ``repad(batch, side, pads) -> Batch``: the same requests laid out with ``side``
            ("left" or "right") padding, request r given ``pads[r]`` extra padding positions
            beyond what the launch's longest request needs (so a request's offset moves with its
            neighbours' lengths and with ``pads``).  Outputs keep the canonical layout (each
            request's real rows first), so any two layouts compare row for row.
        amounts: ``amounts(lane) -> tuple`` of the extra padding amounts the check tries (on
            each side, alone and inside a batch of other lengths).
        sides: the padding sides the component's layout has.
    """

    repad: Callable[[Batch, str, Sequence[int]], Batch]
    amounts: Callable[[Lane], tuple[int, ...]] = lambda lane: (
        PADDING_AMOUNTS if lane.is_gpu else PADDING_AMOUNTS_CPU
    )
    sides: tuple[str, ...] = ("left", "right")


@dataclass(frozen=True)
class Component:
    """A registry entry.

    Attributes:
        name: one name across trees (``reference/<name>.py``, ``fast/<name>.py``, test ids, CLI).
        summary: one line.
        reference: the obviously correct torch implementation (fp64 outputs when toleranced).
        fast: the pinned production kernel.
        baselines: the unpinned production paths (negative controls) and pin candidates.
        cases: ``cases(lane)`` -> the sweep's cases on that lane (small shapes on cpu).
        build: ``build(case, device)`` -> :class:`Batch`, a deterministic function of the case.
        agreement: :class:`Exact` or :class:`Toleranced`.
        lanes: lanes the component runs on.
        dtypes: input dtypes covered.
        error_cases: ``error_cases(device)`` -> bad inputs and their exceptions.
        shift_row_start: ``shift_row_start(batch, offset, generator)`` -> the same logical rows placed
            at ``row_start = offset`` inside wider rows (outputs must be bitwise equal); None when
            the component has no row window.
        partition_arg: name of the fast keyword that sets the planned SM / partition count, if any.
        strategy: ``strategy(lane, device)`` -> a hypothesis strategy of :class:`Batch` for property
            tests, or None.
        bench_cases: ``bench_cases(lane)`` -> cases for ``batchinv bench``.
        bench_bytes: ``bench_bytes(batch)`` -> the fewest bytes a call on ``batch`` must move
            (inputs read once, outputs written once): ``batchinv bench`` reports the floor, these
            bytes over the copy bandwidth, and the fast kernel's share of it.  None: no floor.
        bench_flops: ``bench_flops(batch)`` -> the fewest bf16 tensor-core flops a call needs: the
            floor is the larger of the bytes' and the flops' times.  None: bytes only.
        reference_device: where the reference runs ("same" as the inputs, or "cpu" to force CPU).
        fast_path: ``fast_path(batch)`` -> True when ``fast`` runs its own kernel on ``batch``,
            False when it dispatches to the reference (outside the kernel's envelope).  None: the
            fast callable always runs its kernel.  A check of ``fast`` with any launch off the
            fast path is reported ``reference path``, never ``pass``.
        oracle: an implementation independent of the reference (another algorithm, simple and
            obviously correct; same signature and outputs as ``reference``).  Agreement on a
            batch off the fast path compares ``fast`` with it, since comparing with the reference
            would compare the reference with itself.  Required when ``fast_path`` is given.
        requests: set for a request-level component: its :class:`RequestModel`.  Its outputs
            have dim 0 = request (e.g. ``o [R, Q, Hq, D]``, ``lse [R, Q, Hq]``) and its checks are
            agreement, co_batch, slot, placement, phase (with ``phase``), partition (with
            ``partition_arg``), repeat and neighbours, never batch_prefix, position or row_start.
        checks: None (the default): the checks follow from the fields above (see
            :meth:`applicable_checks`).  Otherwise the explicit set of checks that apply, a
            subset of :data:`CHECKS` with "agreement"; for a *global* component whose output
            rows are not functions of their own input rows alone (``moe_align``: a pair's
            position depends on every other token's experts), where the row checks
            (batch_prefix, position, row_start) would compare things the contract never
            promised equal; or for a composition whose row checks another component runs
            (``tp_linear`` at its default degree is the pinned matmul).  It can only narrow:
            "row_start" still needs ``shift_row_start``,
            "partition" ``partition_arg``, the request checks ``requests``.
        torch_op: the component's ``torch.ops.batchinv`` operator behind the fast signature
            (:mod:`batchinv.fast.enable.ops`): the subject of the ``modes`` check.  None: no operator.
        configs: ``configs(batch, lane) -> {name: fn}``: every other execution the launcher may
            choose for the batch's problem class (weight shape, dtype) on ``lane`` -- each tile
            config of a table row, each num_warps / num_stages variant, a split grid -- as a
            callable with the fast signature.  The ``config_equivalence`` check runs each on
            the batch and requires the subject's bits (the shipped launch's, for ``fast``).
            Only configs that are *supposed* to be equivalent belong here (the same reduction
            order: e.g. the same BLOCK_K).  Its negative control reuses the baseline machinery:
            a :class:`Baseline` with ``config_control=True`` whose ``fn`` is the launcher pinned
            to a config with another reduction order (another BLOCK_K) must be detected by
            ``config_equivalence`` (``checks.negative_control`` raises ``VarianceDetected``
            naming the config); the check skips the other baselines.
            None: the component has one execution; the check does not apply.
        phase: a request-level attention component's :class:`~batchinv.harness.phases.PhaseModel`:
            how its query rows are re-launched, over the same KV cache, in other phases (a full
            prefill, a chunked prefill over a cached prefix cut at page boundaries and split
            multiples +-1, decode steps at q_len 1, speculative verifies at q_len 2 and 4, mixed
            launches; a model with one q_len per launch -- decode -- the q_len 1, 2, 4 ones).  It
            turns on the ``phase`` check: each row's outputs, by (request, position), bitwise equal
            in every phase.  None: the check does not apply (a direct run skips it, saying so).
        padding: a dense request-level component's :class:`PaddingModel`: it turns on the
            ``padding`` check (a sequence left- and right-padded by every amount, alone and in
            batches of other lengths, gives the same bits).  None: the check does not apply.
        tp_degrees: ``tp_degrees(batch) -> tuple`` of the tensor-parallel degrees the batch can be
            spread over (a collective's: the divisors of its leaf count; ``tp_linear``'s: 1, 2,
            4, 8 ranks holding slices of K): it turns on the ``tp_degree`` check, which calls the
            subject with ``tp_degree=T`` for each and requires the bits of ``tp_degree=1`` (the
            single-rank tree).  None: no TP degree.
        quick_cases: ``quick_cases(lane)`` -> the indices into ``cases(lane)`` of the cases the
            sweep's ``quick`` profile runs the fast kernel on (:mod:`batchinv.harness.profiles`;
            index 0, the batch_prefix threshold case, always among them).  None: ``(0,)``.  The
            ``full`` profile, pytest and the mutants run every case.
        content_rows: the names of the ``rows`` tensors that are the units' *contents*, which
            the ``neighbours`` check rewrites at the other units (each must be a floating-point
            tensor of every batch the component builds; the check raises ``ValueError`` naming
            the row otherwise).  The other floating-point rows are per-unit *parameters* with a
            documented range (the sampler's ``temperature`` and ``top_p``): a rewrite to 1e3,
            NaN or +inf would put them out of range, and the subject would raise or change
            semantics, which is no batch statistic.  None (the default): every floating-point
            ``rows`` tensor is contents.
    """

    name: str
    summary: str
    reference: Callable[..., Any]
    fast: Callable[..., Any]
    baselines: tuple[Baseline, ...]
    cases: Callable[[Lane], Sequence[Case]]
    build: Callable[[Case, torch.device], Batch]
    agreement: Exact | Toleranced = Exact()
    lanes: frozenset[Lane] = ALL_LANES
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    error_cases: Callable[[torch.device], Sequence[ErrorCase]] = lambda device: ()
    shift_row_start: Callable[[Batch, int, torch.Generator], Batch] | None = None
    partition_arg: str | None = None
    strategy: Callable[[Lane, torch.device], Any] | None = None
    bench_cases: Callable[[Lane], Sequence[Case]] = lambda lane: ()
    bench_bytes: Callable[[Batch], int] | None = None
    bench_flops: Callable[[Batch], int] | None = None
    fast_path: Callable[[Batch], bool] | None = None
    oracle: Callable[..., Any] | None = None
    requests: RequestModel | None = None
    checks: tuple[str, ...] | None = None
    configs: Callable[[Batch, Lane], Mapping[str, Callable[..., Any]]] | None = None
    torch_op: Callable[..., Any] | None = None
    phase: PhaseModel | None = None
    padding: PaddingModel | None = None
    tp_degrees: Callable[[Batch], tuple[int, ...]] | None = None
    quick_cases: Callable[[Lane], Sequence[int]] | None = None
    content_rows: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.content_rows is not None and (
            not isinstance(self.content_rows, tuple)
            or not self.content_rows
            or not all(isinstance(n, str) for n in self.content_rows)
        ):
            raise ValueError(
                f"component {self.name!r}: content_rows must be None or a non-empty tuple of rows "
                f"names; got {self.content_rows!r}"
            )
        if self.checks is not None:
            unknown = [c for c in self.checks if c not in CHECKS]
            if unknown or "agreement" not in self.checks:
                raise ValueError(
                    f"component {self.name!r}: checks must name known checks ({', '.join(CHECKS)}) "
                    f"and include 'agreement'; got {self.checks!r}"
                )
        if self.fast_path is not None and self.oracle is None:
            raise ValueError(
                f"component {self.name!r}: fast_path needs an oracle (agreement off the fast path "
                "would otherwise compare the reference with itself)"
            )

    def baseline(self, name: str) -> Baseline:
        for b in self.baselines:
            if b.name == name:
                return b
        raise KeyError(
            f"component {self.name!r} has no baseline {name!r}; known: {[b.name for b in self.baselines]}"
        )

    @property
    def is_request_level(self) -> bool:
        return self.requests is not None

    def applicable_checks(self) -> tuple[str, ...]:
        """The checks that apply to this component (row_start and partition are optional; a
        request-level component has the request checks instead of the row checks; neighbours
        needs a floating-point dtype in ``dtypes``; cross_process, the last, applies to every
        component; ``checks``, when set, narrows them to its members)."""
        derived = self._derived_checks()
        if self.checks is None:
            return derived
        return tuple(c for c in derived if c in self.checks)

    def _derived_checks(self) -> tuple[str, ...]:
        configs = CONFIG_CHECKS if self.configs is not None else ()
        modes = MODE_CHECKS if self.torch_op is not None else ()
        phase = PHASE_CHECKS if self.phase is not None else ()
        padding = PADDING_CHECKS if self.padding is not None else ()
        tp = TP_CHECKS if self.tp_degrees is not None else ()
        floating = any(d.is_floating_point for d in self.dtypes)  # integer plans have no contents to vary
        neighbours = NEIGHBOUR_CHECKS if floating else ()
        if self.requests is not None:
            partition = ("partition",) if self.partition_arg is not None else ()
            modes = (*modes, *tp)  # tp_degree, the last batch-invariance check
            return (
                "agreement", *REQUEST_CHECKS, *phase, *padding, *partition, "repeat", *neighbours, *configs, *modes,
                *PROCESS_CHECKS,
            )  # fmt: skip
        skip = set(REQUEST_CHECKS) | set(PHASE_CHECKS) | set(PADDING_CHECKS)
        if self.tp_degrees is None:
            skip.update(TP_CHECKS)
        if not floating:
            skip.update(NEIGHBOUR_CHECKS)
        if self.configs is None:
            skip.update(CONFIG_CHECKS)
        if self.torch_op is None:
            skip.update(MODE_CHECKS)
        if self.shift_row_start is None:
            skip.add("row_start")
        if self.partition_arg is None:
            skip.add("partition")
        return tuple(c for c in CHECKS if c not in skip)


_CACHE: dict[str, Component] = {}


class UnknownComponent(ArgumentError, KeyError):
    """A component name that is not registered (the message lists the registered ones).  Also
    a ``KeyError``, what a name lookup raised before it had a type of its own."""

    def __init__(self, given: Any) -> None:
        super().__init__("component", f"a registered component, one of {list(COMPONENT_MODULES)}", given)
        self.args = (f"unknown component(s) {given!r}; registered: {list(COMPONENT_MODULES)}",)

    def __str__(self) -> str:
        return str(self.args[0])


def components(names: Sequence[str] | None = None) -> list[Component]:
    """The registered components, in registry order, optionally only those named.

    Raises:
        UnknownComponent: a name that is not registered.
    """
    wanted = list(COMPONENT_MODULES) if not names else list(names)
    unknown = [n for n in wanted if n not in COMPONENT_MODULES]
    if unknown:
        raise UnknownComponent(unknown if len(unknown) > 1 else unknown[0])
    out = []
    for name in wanted:
        if name not in _CACHE:
            module = importlib.import_module(f"batchinv.harness.components.{name}")
            component = module.COMPONENT
            if component.name != name:
                raise RuntimeError(
                    f"module components/{name}.py registers {component.name!r}, expected {name!r}"
                )
            _CACHE[name] = component
        out.append(_CACHE[name])
    return out


def get(name: str) -> Component:
    """The registered component ``name``.

    Raises:
        UnknownComponent: ``name`` is not registered (a ``KeyError`` too; the message lists the
            registered names).
    """
    if not isinstance(name, str):
        raise UnknownComponent(name)
    return components([name])[0]
