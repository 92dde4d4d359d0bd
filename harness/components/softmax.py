"""Registry entry ``softmax`` (and the shared machinery of ``log_softmax``): over the last dim.

Inputs are built from a seed and a CPU ``torch.Generator``: a background of logits of one
*value kind* (normal, cancellation around a large offset, tiny, all-equal, quantized ties,
huge), optionally with *specials*: sparse bit patterns (-inf, signed zeros, subnormals, min
normal) in every row, plus whole-row kinds cycled over the rows (a quiet NaN, a signalling NaN,
+inf, all -inf, a single finite entry, +max_normal, mostly -inf).  The *layout* (contiguous,
padded rows, a column stride) is applied last, with NaN bit patterns in every element the kernel
must not read.

The tolerance is derived, per element, from the fp64 reference, fp32's unit roundoff and the
pinned reduction's depth (see :func:`softmax_bound`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast.baselines.softmax import (
    split_float_partials_softmax,
    torch_native_softmax,
    torch_softmax_unchecked,
    torch_sum_softmax,
    triton_rows_heuristic_softmax,
)
from batchinv.fast.device import arch
from batchinv.fast.enable import ops
from batchinv.fast.softmax import (
    equivalence_executions,
    reduction_depth,
    softmax_config,
    softmax_execution,
    with_execution,
)
from batchinv.fast.softmax import softmax as fast_softmax
from batchinv.harness import bitpatterns as bp
from batchinv.harness.invariance import pack_at_offset
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    ALL_LANES,
    GPU_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    Toleranced,
    m_sweep,
)
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.softmax import K_DIV, K_EXP
from batchinv.reference.softmax import log_softmax_bound as reference_log_softmax_bound
from batchinv.reference.softmax import softmax as reference_softmax
from batchinv.reference.softmax import softmax_bound as reference_softmax_bound

NAME = "softmax"
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
#: Value kinds of a case: logits ~ N(0, 9); those plus specials (:data:`ROW_KINDS`); or each row
#: of a kind of :data:`MIXED_KINDS` (row r: (seed + r) % len).
VALUE_KINDS: tuple[str, ...] = ("normal", "specials", "mixed")
MIXED_KINDS: tuple[str, ...] = (
    "normal",
    "offset",  # +-2**(mantissa bits - 2) + N(0, 4): cancellation in x - max
    "tiny",  # ~2**-124 (fp16: 2**-12): near the smallest normals, subnormals in the tails
    "all_equal",  # a tie plateau: exactly uniform
    "quantized",  # multiples of 1/2: many ties
    "huge",  # ~2**119 (fp16: 2**7): exp underflows for all but the maximum
)
LAYOUTS: tuple[str, ...] = ("contiguous", "padded", "strided")

#: Whole-row kinds of ``specials`` cases, cycled over the rows (row r: (seed + r) % len).
ROW_KINDS: tuple[str, ...] = (
    "sparse",  # the background with sparse specials only
    "quiet_nan",  # one quiet NaN (either sign): the whole row is NaN
    "signalling_nan",  # one signalling NaN or an all-ones NaN: the whole row is NaN
    "pos_inf",  # one +inf: the whole row is NaN (inf - inf)
    "all_neg_inf",  # the whole row is NaN
    "one_finite",  # all -inf but one entry: exactly one-hot
    "max_normal",  # one +max_normal (fp16: 2**15): the others sit that far below the max
    "mostly_neg_inf",  # 90% -inf
)
SPARSE = (
    "-inf",
    "+0",
    "-0",
    "+min_subnormal",
    "-min_subnormal",
    "+max_subnormal",
    "-max_subnormal",
    "+min_normal",
    "-min_normal",
)
_QUIET = ("+quiet_nan", "-quiet_nan")
_SIGNALLING = ("+signalling_nan", "-signalling_nan", "all_ones_nan", "all_ones_minus_one_nan")

# --- inputs -----------------------------------------------------------------------------------


def _scale_of(dtype: torch.dtype, kind: str) -> float:
    """The magnitude of a row kind in ``dtype`` (fp16's range is narrower)."""
    fmt = bp.float_format(dtype)
    max_exp = 2 ** (fmt.exponent_bits - 1) - 1
    if kind == "offset":  # the spread (~N(0, 2)) sits on a grid of 1/4: cancellation around it
        return 2.0 ** (fmt.mantissa_bits - 2)
    if kind == "tiny":  # around the smallest normals, subnormals in the tails
        return 2.0 ** (3 - max_exp)
    if kind == "huge":  # logits far apart: exp underflows for all but the maximum
        return 2.0 ** (max_exp - 8)
    return 3.0


def build_row(kind: str, num_cols: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """One CPU row of ``num_cols`` values of row kind ``kind`` (see :data:`MIXED_KINDS`) in ``dtype``."""
    normal = torch.randn(num_cols, generator=gen)
    scale = _scale_of(dtype, kind)
    if kind in ("normal", "tiny", "huge"):
        values = normal * scale
    elif kind == "offset":
        sign = 1.0 if float(torch.rand(1, generator=gen)) < 0.5 else -1.0
        values = sign * scale + 2.0 * normal
    elif kind == "all_equal":
        values = torch.full((num_cols,), float(normal[0]) * scale)
    elif kind == "quantized":
        values = bp.quantized(normal * scale, 2)
    else:
        raise ValueError(f"row kind: expected one of {MIXED_KINDS}, got {kind!r}")
    return values.to(dtype)


def build_values(
    kind: str, num_rows: int, num_cols: int, dtype: torch.dtype, seed: int, gen: torch.Generator
) -> torch.Tensor:
    """A CPU (rows, cols) tensor of value kind ``kind`` (see :data:`VALUE_KINDS`)."""
    if kind in ("normal", "specials"):
        return (torch.randn(num_rows, num_cols, generator=gen) * _scale_of(dtype, "normal")).to(dtype)
    if kind == "mixed":
        rows = [
            build_row(MIXED_KINDS[(seed + r) % len(MIXED_KINDS)], num_cols, dtype, gen)
            for r in range(num_rows)
        ]
        return torch.stack(rows) if rows else torch.empty(0, num_cols, dtype=dtype)
    raise ValueError(f"value kind: expected one of {VALUE_KINDS}, got {kind!r}")


def _pats(dtype: torch.dtype, names: Sequence[str]) -> list[bp.BitPattern]:
    return [bp.pattern(dtype, n) for n in names]


def _put(row: torch.Tensor, col: int, pattern: bp.BitPattern) -> None:
    row[col] = pattern.tensor()


def add_specials(
    x: torch.Tensor,
    seed: int,
    gen: torch.Generator,
    *,
    sparse: Sequence[str] = SPARSE,
    row_kinds: Sequence[str] = ROW_KINDS,
) -> torch.Tensor:
    """``x`` (rows, V) with the ``sparse`` patterns injected at 4% everywhere and a whole-row
    kind of ``row_kinds`` per row (row r: (seed + r) % len)."""
    dtype = x.dtype
    out = bp.inject(x, _pats(dtype, sparse), 0.04, gen)
    num_rows, num_cols = out.shape
    for r in range(num_rows):
        kind = row_kinds[(seed + r) % len(row_kinds)]
        col = int(torch.randint(num_cols, (1,), generator=gen))
        row = out[r]
        if kind == "quiet_nan":
            _put(row, col, bp.pattern(dtype, _QUIET[r % len(_QUIET)]))
        elif kind == "signalling_nan":
            _put(row, col, bp.pattern(dtype, _SIGNALLING[r % len(_SIGNALLING)]))
        elif kind == "pos_inf":
            _put(row, col, bp.pattern(dtype, "+inf"))
        elif kind == "all_neg_inf":
            row.fill_(float("-inf"))
        elif kind == "one_finite":
            keep = row[col].clone()
            row.fill_(float("-inf"))
            row[col] = keep if torch.isfinite(keep) else 0.0
        elif kind == "max_normal":
            if dtype == torch.float16:
                # fp16's max_normal would push log_softmax outputs (x - 65504 - log S) past fp16's
                # range: they round to -inf while the fp64 reference stays finite.  2**15 is as
                # one-hot and keeps every output representable.
                row[col] = 2.0**15
            else:
                _put(row, col, bp.pattern(dtype, "+max_normal"))
        elif kind == "mostly_neg_inf":
            drop = torch.rand(num_cols, generator=gen) < 0.9
            row[drop] = float("-inf")
        elif kind == "inf_minus_inf":
            _put(row, col, bp.pattern(dtype, "+inf"))
            _put(row, (col + 1) % num_cols, bp.pattern(dtype, "-inf"))
        elif kind == "neg_inf":
            _put(row, col, bp.pattern(dtype, "-inf"))
        elif kind == "signed_zeros":
            zeros = torch.where(torch.rand(num_cols, generator=gen) < 0.5, 0.0, -0.0).to(dtype)
            row.copy_(zeros)
        elif kind != "sparse":
            raise ValueError(f"row kind: unknown {kind!r}")
    return out


def apply_layout(x: torch.Tensor, layout: str, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``x`` (contiguous, CPU) on ``device`` as a view laid out as ``layout``; every element of
    the underlying buffer outside the view holds a NaN pattern (a stray read poisons a row)."""
    if layout == "contiguous":
        return x.to(device)
    nan = bp.pattern(x.dtype, "+quiet_nan").tensor()
    *lead, num_cols = x.shape
    if layout == "padded":  # each row followed by 13 NaNs
        buffer = nan.expand(*lead, num_cols + 13).clone()
        buffer[..., :num_cols] = x
        return buffer.to(device)[..., :num_cols]
    if layout == "strided":  # column stride 2, NaN in between
        buffer = nan.expand(*lead, 2 * num_cols).clone()
        buffer[..., ::2] = x
        return buffer.to(device)[..., ::2]
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def build_x(case: Case, device: torch.device) -> torch.Tensor:
    """The input tensor of a softmax-family case, a function of ``case.axes`` and ``case.seed``."""
    axes = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    shape = tuple(axes["shape"])
    dtype = getattr(torch, axes["dtype"])
    kind = axes["values"]
    num_cols = shape[-1]
    num_rows = math.prod(shape[:-1])
    x = build_values(kind, num_rows, num_cols, dtype, case.seed, gen)
    if kind == "specials":
        x = add_specials(x, case.seed, gen)
    x = x.reshape(shape)
    return apply_layout(x, axes.get("layout", "contiguous"), gen, device)


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``{"x": x}``; shared ``dim=-1`` and ``half_to_float``."""
    x = build_x(case, device)
    return Batch({"x": x}, {"dim": -1, "half_to_float": bool(case.axes.get("half_to_float", False))})


# --- cases ------------------------------------------------------------------------------------


def make_case(
    name: str,
    shape: Sequence[int],
    dtype: str,
    values: str,
    layout: str = "contiguous",
    half_to_float: bool = False,
    seed: int = 0,
) -> Case:
    return Case(
        name,
        {
            "shape": list(shape),
            "dtype": dtype,
            "values": values,
            "layout": layout,
            "half_to_float": half_to_float,
        },
        seed,
    )


#: Production vocabularies of the issue, and an odd one (GPT-2's).
VOCABS: tuple[int, ...] = (32000, 128256, 151936, 50257)


def cases_for(name: str, lane: Lane, *, short: bool = False) -> list[Case]:
    """The sweep of a softmax-family component; ``short`` trims the cpu list (log_softmax runs
    the same kernel, so it needs fewer cases)."""
    c = make_case
    if not lane.is_gpu:
        # Each Triton launch costs the interpreter ~20-40 ms per program (a program is a tile of
        # 16 rows here), and a case runs ~30 launches per subject: few, dense cases.
        cpu = [
            c(name, (40, 333), "float32", "normal", seed=1),  # the M sweep up to 33
            c(name, (16, 700), "bfloat16", "specials", half_to_float=True, seed=2),
            c(name, (12, 160), "float32", "mixed", layout="padded", seed=3),
            c(name, (16, 257), "float16", "specials", layout="strided", seed=4),
            c(name, (12, 100), "bfloat16", "mixed", seed=5),
            c(name, (9, 200), "float32", "specials", layout="padded", seed=6),
            c(name, (3, 4, 150), "bfloat16", "mixed", seed=7),
            c(name, (1, 1537), "float32", "normal", seed=8),  # the vocabulary path: 1 row a program
        ]
        return cpu[:4] if short else cpu
    # Inputs are generated on the CPU (seeded), so the largest cases cost seconds to build;
    # the full M sweep runs on the 32000 vocabulary, up to 512 rows on the 151936 one.
    big = m_sweep(lane)[-1]
    gpu = [
        c(name, (big, 32000), "bfloat16", "normal", seed=1),  # the whole M sweep, 4096 included
        c(name, (1024, 151936), "float32", "normal", seed=2),
        c(name, (300, 151936), "bfloat16", "specials", half_to_float=True, seed=3),
        c(name, (257, 128256), "float32", "specials", seed=4),
        c(name, (256, 32000), "float16", "specials", layout="padded", seed=5),
        c(name, (255, 50257), "bfloat16", "mixed", half_to_float=True, seed=6),  # odd: rows misaligned
        c(name, (1, 151936), "float32", "mixed", seed=7),
        c(name, (300, 128256), "bfloat16", "mixed", layout="strided", seed=8),
        c(name, (4, 64, 50257), "float16", "mixed", seed=9),
        c(name, (257, 1000), "bfloat16", "normal", seed=10),  # short rows: one program per row
        c(name, (512, 200), "float32", "specials", seed=11),  # shorter: four rows per program
    ]
    return gpu[:6] if short else gpu


def bench_cases_for(
    name: str,
    lane: Lane,
    vocabs: Sequence[int] = (128256, 151936),
    rows: Sequence[int] = (1, 16, 128, 256, 1024),
) -> list[Case]:
    """``batchinv bench`` points: vocabularies x bf16/fp32 x ``rows`` (GPU lanes only)."""
    if not lane.is_gpu:
        return []
    return [
        make_case(name, (num_rows, vocab), dtype, "normal")
        for vocab in vocabs
        for dtype in ("bfloat16", "float32")
        for num_rows in rows
    ]


# --- tolerance --------------------------------------------------------------------------------


def _depth(x: torch.Tensor) -> tuple[int, int]:
    """``(chunks, combine)`` of the pinned reduction the kernel runs on ``x``'s lane (its config)."""
    return reduction_depth(softmax_config(arch(x.device), x.dtype, x.shape[-1]), x.shape[-1])


def out_dtypes(batch: Batch) -> tuple[torch.dtype]:
    """The contract's output dtype: fp32 under ``half_to_float``, else the input dtype."""
    return (torch.float32 if batch.shared.get("half_to_float") else batch.rows["x"].dtype,)


def softmax_bound(batch: Batch, ref_out: Outputs) -> Outputs:
    """Per-element bound on |fast - fp64 reference| for softmax:
    :func:`batchinv.reference.softmax.softmax_bound` for the pinned reduction's depth here."""
    x = batch.rows["x"]
    chunks, combine = _depth(x)
    (out_dtype,) = out_dtypes(batch)
    return (reference_softmax_bound(x, ref_out[0], out_dtype=out_dtype, chunks=chunks, combine=combine),)


def log_softmax_bound(batch: Batch, ref_out: Outputs) -> Outputs:
    """Per-element bound on |fast - fp64 reference| for log_softmax (absolute):
    :func:`batchinv.reference.softmax.log_softmax_bound` for the pinned reduction's depth here."""
    x = batch.rows["x"]
    chunks, combine = _depth(x)
    (out_dtype,) = out_dtypes(batch)
    return (reference_log_softmax_bound(x, ref_out[0], out_dtype=out_dtype, chunks=chunks, combine=combine),)


def justification(what: str) -> str:
    return (
        f"{what} is computed in fp32 with approximate exp/log/division, so it cannot equal the fp64 "
        "reference bitwise.  The bound is derived per element from the fp64 run: the arguments of "
        "exp are rounded twice (2u|x - max|), each term passes at most chunks + 1 exps of "
        f"{K_EXP:g}u and as many multiplies, the row sum has depth chunks + 2 (the lanes, then the fixed-point combine) of the "
        "pinned order (from the config table), the division/log adds "
        f"{K_DIV:g}u, and rounding to the output dtype adds its unit roundoff; an absolute floor "
        "of 2**-126 covers flushed subnormal intermediates."
    )


# --- errors -----------------------------------------------------------------------------------


def error_cases_for(device: torch.device) -> list[ErrorCase]:
    """Bad inputs shared by softmax and log_softmax."""
    f32 = torch.zeros(2, 8, device=device)
    bf16 = f32.to(torch.bfloat16)
    out = [
        ErrorCase(
            "int_dtype",
            {"x": torch.zeros(2, 8, dtype=torch.int32, device=device)},
            DTypeError,
            r"argument 'x'.*dtype",
        ),
        ErrorCase("float64", {"x": f32.double()}, DTypeError, r"argument 'x'.*float32"),
        ErrorCase("not_a_tensor", {"x": [[0.0, 1.0]]}, DTypeError, r"argument 'x'.*torch.Tensor"),
        ErrorCase("rank_1", {"x": torch.zeros(8, device=device)}, ArgumentError, r"argument 'x'.*2-D"),
        ErrorCase(
            "rank_4", {"x": torch.zeros(1, 2, 2, 8, device=device)}, ArgumentError, r"argument 'x'.*3-D"
        ),
        ErrorCase("dim_not_last", {"x": f32, "dim": 0}, ArgumentError, r"argument 'dim'.*last dim"),
        ErrorCase("dim_out_of_range", {"x": f32, "dim": 2}, ArgumentError, r"argument 'dim'.*out of range"),
        ErrorCase(
            "dim_negative_out_of_range", {"x": f32, "dim": -3}, ArgumentError, r"argument 'dim'.*out of range"
        ),
        ErrorCase("dim_not_int", {"x": f32, "dim": 1.0}, ArgumentError, r"argument 'dim'.*an int"),
        ErrorCase(
            "half_to_float_fp32",
            {"x": f32, "half_to_float": True},
            ArgumentError,
            r"argument 'half_to_float'.*float32",
        ),
        ErrorCase(
            "half_to_float_not_bool",
            {"x": bf16, "half_to_float": 1},
            ArgumentError,
            r"argument 'half_to_float'.*bool",
        ),
        ErrorCase("on_meta", {"x": f32.to("meta")}, DeviceError, r"argument 'x'.*meta"),
    ]
    if device.type == "cuda":
        out.append(
            ErrorCase(
                "cpu_tensor_on_gpu_path",
                {"x": torch.zeros(2, 8)},
                DeviceError,
                r"argument 'x'.*CUDA",
                applies_to=("fast",),
            )
        )
    return out


# --- hypothesis -------------------------------------------------------------------------------


def strategy_for(name: str, lane: Lane, device: torch.device) -> Any:
    """A hypothesis strategy of :class:`Batch`: small random softmax-family cases."""
    from hypothesis import strategies as st

    max_cols = 300 if not lane.is_gpu else 4096

    @st.composite
    def batches(draw: Callable[..., Any]) -> Batch:
        rows = draw(st.integers(1, 6))
        cols = draw(st.integers(1, max_cols))
        dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        values = draw(st.sampled_from(VALUE_KINDS))
        layout = draw(st.sampled_from(LAYOUTS))
        h2f = dtype != "float32" and draw(st.booleans())
        seed = draw(st.integers(0, 2**31 - 1))
        return build(make_case(name, (rows, cols), dtype, values, layout, h2f, seed), device)

    return batches()


# --- config_equivalence ----------------------------------------------------------------------


def configs_for(name: str) -> Callable[[Batch, Lane], dict[str, Any]]:
    """``Component.configs`` of ``softmax`` / ``log_softmax``: every execution the launcher may
    pick for the batch's (arch, dtype, row length) -- at any row count, since the execution
    table keys on it -- except the one the shipped launch ran on this batch; under the
    interpreter also every tuning candidate, on GPU lanes the first split candidate
    (:func:`batchinv.fast.softmax.equivalence_executions`).  Each keeps the table's tile
    (``block_n``, the reduction order).  On the cpu lane they split rows over 1, 2 and 4 pass-1
    programs and 1, 2 and 3 write programs, with and without a combine kernel."""
    log = name == "log_softmax"

    def configs(batch: Batch, lane: Lane) -> dict[str, Any]:
        del lane  # the executions follow the device the batch is on
        x = batch.rows["x"]
        n_cols = x.shape[-1]
        num_rows = x.numel() // n_cols if n_cols else 0
        arch_name = arch(x.device)
        ran = softmax_execution(arch_name, x.dtype, n_cols, num_rows, name)
        return {
            ex.name: functools.partial(with_execution, log=log, execution=ex)
            for ex in equivalence_executions(arch_name, x.dtype, n_cols, name)
            if ex != ran
        }

    return configs


# --- the registry entry -----------------------------------------------------------------------


def baselines_for(
    kind: str,
    native: Callable[..., Any],
    summed: Callable[..., Any],
    heuristic: Callable[..., Any],
    native_unchecked: Callable[..., Any],
    float_partials: Callable[..., Any],
) -> tuple[Baseline, ...]:
    return (
        Baseline(
            "torch_native",
            native,
            f"aten's {kind} on CUDA (cunn_SoftMaxForward, one block per row) starts each row's "
            "vectorized reduction at the row's 16-byte misalignment ('shift'): for a row length that "
            "is not a multiple of 16 bytes (the odd vocabulary 50257) the shift, hence the order of "
            "the sum, changes with the row's position in the batch; on the CPU each row is reduced "
            "alone (GPU lanes only); also the negative control of modes: torch.compile lowers it to "
            "Inductor's own reduction",
            expected_to_vary_on=GPU_LANES,
            modes=native_unchecked,
        ),
        Baseline(
            "torch_sum",
            summed,
            "the row sum is torch.sum, whose CUDA reduction picks its block shape and split from the "
            "number of output rows (the issue's 'library sum' fallback); on the CPU torch sums each "
            "short row serially, so it varies on GPU lanes only",
            expected_to_vary_on=GPU_LANES,
        ),
        Baseline(
            "triton_rows_heuristic",
            heuristic,
            "the Triton kernel as production runs it: a float tl.sum over the lanes and the column "
            "chunk sized from the number of rows (the whole row "
            "when rows < SMs, the table's chunk otherwise): the reduction order changes with M",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "split_float_partials",
            float_partials,
            "config_equivalence's negative control: each row split over 4 pass-1 programs (at every "
            "M: batch-invariant) whose combine adds each program's lanes as a float partial sum, "
            "then the 4 partials -- a non-exact sum associated by the split, unlike the pinned "
            "executions' fixed-point sum; config_equivalence compares it with them",
            expected_to_vary_on=ALL_LANES,
            config_control=True,
        ),
    )


COMPONENT = Component(
    name=NAME,
    summary="softmax over the last dim (fp32 math, bf16/fp16/fp32 in, half_to_float), vocab-sized rows",
    reference=reference_softmax,
    fast=fast_softmax,
    baselines=baselines_for(
        "softmax",
        torch_native_softmax,
        torch_sum_softmax,
        triton_rows_heuristic_softmax,
        torch_softmax_unchecked,
        split_float_partials_softmax,
    ),
    cases=lambda lane: cases_for(NAME, lane),
    build=build,
    agreement=Toleranced(softmax_bound, justification("softmax"), out_dtypes),
    shift_row_start=pack_at_offset,
    lanes=ALL_LANES,
    dtypes=DTYPES,
    error_cases=error_cases_for,
    strategy=lambda lane, device: strategy_for(NAME, lane, device),
    bench_cases=lambda lane: bench_cases_for(NAME, lane),
    torch_op=ops.softmax_subject,
    configs=configs_for(NAME),
)
