"""Registry entry ``mean``: the mean over the last dim of a 2-D or 3-D input, with ``keepdim``
and ``dtype``.

Inputs come from the softmax family's builders (:mod:`batchinv.harness.components.softmax`):
a seeded background (normal, or per row: cancellation around an offset, tiny values with
subnormals, all-equal, quantized, huge), optionally with specials suited to a sum: sparse
signed zeros, subnormals and min normals everywhere, and whole-row kinds cycled over the rows
(quiet / signalling NaN, +inf, -inf, +inf and -inf together, all -inf, +max_normal, signed
zeros).  The layout (contiguous, padded rows, a column stride) is applied last, with NaNs in
every element the kernel must not read.

Agreement is bitwise where the kernel promises one rounding of an exactly computed value: on
every row whose elements its pinned order (fp64 lanes of ``block_n`` columns, the fixed-point
lane combine, the int64 -> fp64 total) adds without a rounding error, the output must equal the
exact mean (:func:`batchinv.reference.mean.mean`: exact integer sum, one rounding to fp64)
rounded once to the output dtype, bit for bit (see :func:`mean_exact`).  Outside that envelope
(fp32 rows whose exponents spread over more than fp64 holds, subnormals beside normal values)
the tolerance is derived per row from the sum of |x|, fp64's unit roundoff, the pinned
reduction's depth, the fixed-point combine's truncation and the output dtype's unit roundoff
(see :func:`mean_bound`).

The value kind ``lane_cancel`` (mean only) builds rows against the lane width ``block_n`` of
this lane's config: runs of positive lanes, each followed by its exact negation, and one tiny
element at the grid of the largest lane, so the exact sum is that tiny value, the pinned kernel
computes it exactly, and a float sum of the lanes that adds 256 or more same-signed lanes first
(numpy's pairwise sum, a GPU's per-warp tree) rounds it away (see :func:`lane_cancel_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast.baselines.mean import (
    autotuned_mean,
    torch_mean_unchecked,
    torch_native_mean,
    triton_rows_heuristic_mean,
)
from batchinv.fast.device import arch
from batchinv.fast.enable import ops
from batchinv.fast.mean import COMBINE_LOSS, mean_config, reduction_depth
from batchinv.fast.mean import mean as fast_mean
from batchinv.harness.components.softmax import (
    LAYOUTS,
    VALUE_KINDS,
    add_specials,
    apply_layout,
    build_values,
)
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
from batchinv.reference.exact import quantum_exponent
from batchinv.reference.mean import mean as reference_mean
from batchinv.reference.mean import mean_bound as reference_mean_bound

NAME = "mean"
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

#: Sparse specials of a sum (no infinities: one in every row would make every row infinite).
MEAN_SPARSE: tuple[str, ...] = (
    "+0",
    "-0",
    "+min_subnormal",
    "-min_subnormal",
    "+max_subnormal",
    "-max_subnormal",
    "+min_normal",
    "-min_normal",
)
#: Whole-row kinds of ``specials`` cases, cycled over the rows.
MEAN_ROW_KINDS: tuple[str, ...] = (
    "sparse",
    "quiet_nan",  # NaN
    "signalling_nan",  # NaN
    "pos_inf",  # +inf
    "neg_inf",  # -inf
    "inf_minus_inf",  # NaN
    "all_neg_inf",  # -inf
    "max_normal",  # one +max_normal among N(0, 9): large but finite in fp32
    "signed_zeros",  # a row of +-0: +0
)


#: Sign period of ``lane_cancel`` lanes (at most): lanes j with ``j mod P < P / 2`` are positive.
LANE_CANCEL_PERIOD = 1024


def lane_cancel_rows(
    num_rows: int, num_cols: int, dtype: torch.dtype, block_n: int, gen: torch.Generator
) -> torch.Tensor:
    """(rows, cols) CPU values whose lanes (columns ``j mod block_n``) cancel in pairs.

    With ``c = num_cols // block_n`` full chunks, ``P = min(block_n, 1024)`` and ``h = P / 2``:
    column ``t block_n + j`` holds ``b[t, j]`` where ``j mod P < h`` and ``-b[t, j - h]`` where
    not, each ``b`` in ``[1, 1.9) 2**E / c`` with ``E = ceil(log2 c)`` (every lane lies in
    ``[2**E, 2**(E+1))``); the tail is zero.  In each row one ``b[0, j0]`` is replaced by
    ``2**(E - 45)`` -- the fixed-point grid of the largest lane -- and its partner by 0, so the
    exact sum is ``2**(E - 45)``.  The lanes and their combine are exact, so the pinned kernel
    returns that value; a float sum of the lanes that adds 256 positive ones first needs 54 bits
    there and rounds it to 0 or twice itself.  Positive lanes come in runs of ``h`` >= 256 (numpy's
    pairwise sum adds two 128-lane blocks of one run) and a lane shares its sign with the lanes
    a multiple of P away (a GPU thread's registers hold lanes block_n / 2, block_n / 4... apart).
    fp32 and bf16 only (fp16 has no 2**(E - 45)).
    """
    if dtype == torch.float16 or num_cols < block_n or block_n < 512:
        raise ValueError(
            f"lane_cancel: needs fp32 or bf16 and num_cols >= block_n = {block_n} >= 512, "
            f"got {dtype}, {num_cols}"
        )
    chunks = num_cols // block_n
    period = min(block_n, LANE_CANCEL_PERIOD)
    half = period // 2
    top = math.ceil(math.log2(chunks))
    scale = 2.0**top / chunks
    groups = block_n // period
    b = ((1.0 + 0.9 * torch.rand(num_rows, chunks, groups, half, generator=gen)) * scale).to(dtype)
    x = torch.zeros(num_rows, num_cols, dtype=dtype)
    body = x[:, : chunks * block_n].view(num_rows, chunks, groups, period)
    body[..., :half] = b
    body[..., half:] = -b
    lane = torch.randint(half, (num_rows,), generator=gen)
    rows = torch.arange(num_rows)
    x[rows, lane] = 2.0 ** (top - 45)
    x[rows, lane + half] = 0.0
    return x


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``{"x": x}``; shared ``dim=-1``, ``keepdim`` and ``dtype``."""
    axes = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    shape = tuple(axes["shape"])
    dtype = getattr(torch, axes["dtype"])
    kind = axes["values"]
    num_cols = shape[-1]
    if kind == "lane_cancel":
        block_n = mean_config(arch(device), dtype, num_cols).block_n  # this lane's pinned lanes
        x = lane_cancel_rows(math.prod(shape[:-1]), num_cols, dtype, block_n, gen)
    else:
        x = build_values(kind, math.prod(shape[:-1]), num_cols, dtype, case.seed, gen)
    if kind == "specials":
        x = add_specials(x, case.seed, gen, sparse=MEAN_SPARSE, row_kinds=MEAN_ROW_KINDS)
    x = apply_layout(x.reshape(shape), axes.get("layout", "contiguous"), gen, device)
    out_dtype = axes.get("out_dtype")
    return Batch(
        {"x": x},
        {
            "dim": -1,
            "keepdim": bool(axes.get("keepdim", False)),
            "dtype": None if out_dtype is None else getattr(torch, out_dtype),
        },
    )


def make_case(
    shape: Sequence[int],
    dtype: str,
    values: str,
    layout: str = "contiguous",
    keepdim: bool = False,
    out_dtype: str | None = None,
    seed: int = 0,
) -> Case:
    return Case(
        NAME,
        {
            "shape": list(shape),
            "dtype": dtype,
            "values": values,
            "layout": layout,
            "keepdim": keepdim,
            "out_dtype": out_dtype,
        },
        seed,
    )


def cases(lane: Lane) -> list[Case]:
    c = make_case
    if not lane.is_gpu:
        # Interpreter launches are costly per program: few, dense cases (see softmax).
        return [
            c((40, 1000), "float32", "normal", seed=1),  # the M sweep up to 33
            c((16, 700), "bfloat16", "specials", keepdim=True, out_dtype="float32", seed=2),
            c((12, 257), "float32", "mixed", layout="padded", out_dtype="bfloat16", seed=3),
            c((3, 4, 150), "float16", "specials", layout="strided", keepdim=True, seed=4),
            c((1, 1537), "bfloat16", "mixed", out_dtype="float16", seed=5),  # 1 row a program
            # 512-lane rows that cancel: exact for the pinned combine, not for a float lane sum
            c((4, 1536), "float32", "lane_cancel", seed=6),
        ]
    big = m_sweep(lane)[-1]
    return [
        c((big, 4096), "bfloat16", "normal", seed=1),  # the whole M sweep, 4096 included
        c((1024, 151936), "float32", "mixed", seed=2),
        c((300, 8192), "float32", "specials", seed=3),
        c((257, 5120), "bfloat16", "mixed", keepdim=True, out_dtype="float32", seed=4),
        c((256, 14336), "float16", "specials", layout="padded", seed=5),
        c((255, 4096), "float32", "mixed", layout="strided", out_dtype="bfloat16", seed=6),
        c((1, 151936), "bfloat16", "mixed", seed=7),
        c((4, 64, 4096), "bfloat16", "specials", keepdim=True, seed=8),
        c((300, 1000), "float32", "normal", seed=9),
        c((512, 200), "bfloat16", "normal", out_dtype="float16", seed=10),  # eight rows per program
        # lanes that cancel in halves (4096 fp32 lanes, 8192 bf16 ones): exact for the pinned
        # combine; a float sum of the lanes (a warp adds 256 same-signed lanes) is not
        c((64, 8192), "float32", "lane_cancel", seed=11),
        c((64, 16384), "bfloat16", "lane_cancel", out_dtype="float32", seed=12),
    ]


def bench_cases(lane: Lane) -> list[Case]:
    """``batchinv bench`` points: row lengths x bf16/fp32 x num_rows (GPU lanes only)."""
    if not lane.is_gpu:
        return []
    return [
        make_case((rows, n), dtype, "normal")
        for n in (4096, 151936)
        for dtype in ("bfloat16", "float32")
        for rows in (1, 16, 128, 256, 1024)
    ]


def mean_bound(batch: Batch, ref_out: Outputs) -> Outputs:
    """Per-row bound on |fast - fp64 reference|: :func:`batchinv.reference.mean.mean_bound` for
    the pinned order's lane depth on this lane (the config table) and the fixed-point combine's
    :data:`batchinv.fast.mean.COMBINE_LOSS`."""
    x = batch.rows["x"]
    n = x.shape[-1]
    chunks = reduction_depth(mean_config(arch(x.device), x.dtype, n), n)
    bound = reference_mean_bound(
        x,
        ref_out[0],
        keepdim=bool(batch.shared.get("keepdim")),
        dtype=batch.shared.get("dtype"),
        chunks=chunks,
        combine_loss=COMBINE_LOSS,
    )
    return (bound,)


#: Below this magnitude an fp32 value is subnormal: a GPU may flush it (rows with such elements
#: or results are left to the tolerance there).
FP32_MIN_NORMAL = 2.0**-126


def mean_exact(batch: Batch, ref_out: Outputs) -> Outputs:
    """The rows the pinned kernel computes as one rounding of the exact mean (a bool per output).

    With e the row's elements rounded to the output dtype, 2**q the largest power of two
    dividing every nonzero e (:func:`batchinv.reference.exact.quantum_exponent`), block_n the
    lane width of the config table and L_j the lane sums (columns j mod block_n), every step of
    the kernel is exact when

    * sum_t |e[j + t block_n]| < 2**(q + 53) for every lane j: each lane's fp64 partial sums are
      multiples of 2**q below 2**(q + 53), so representable;
    * max_j |L_j| < 2**(q + 46): the largest lane's exponent is at most q + 45, so the fixed-point
      grid 2**(exponent - 45) divides every lane and the truncation drops nothing;
    * |S| < 2**(q + 53) for the row sum S: the int64 total converts to fp64 exactly;

    and then the kernel's value is fp64(S / N) -- what the reference returns -- rounded once to
    the output dtype.  Non-finite rows (NaN, +-inf) are in the envelope too: their class is exact.
    A row of zeros gives +0.  On a GPU, rows holding a subnormal element, or whose mean is
    subnormal in fp32, are left out (the hardware may flush them).  The lane sums are formed here
    in fp64 and compared with a 2**-40 margin, so a borderline row falls outside, never inside.
    """
    x = batch.rows["x"]
    ref = ref_out[0]
    dtype = batch.shared.get("dtype")
    out_dtype = x.dtype if dtype is None else dtype
    n = x.shape[-1]
    e = x.to(out_dtype).reshape(math.prod(x.shape[:-1]), n).to(ref.device, torch.float64)  # (R, N)
    rows = e.shape[0]
    finite_row = torch.isfinite(e).all(dim=-1)  # (R,)
    q = quantum_exponent(e).amin(dim=-1) if n else torch.full((rows,), math.inf, device=e.device)
    block_n = mean_config(arch(x.device), x.dtype, n).block_n
    chunks = max(1, math.ceil(n / block_n))
    padded = torch.zeros(rows, chunks * block_n, dtype=torch.float64, device=e.device)
    padded[:, :n] = torch.where(torch.isfinite(e), e, torch.zeros_like(e))
    lanes = padded.view(rows, chunks, block_n)
    margin = 1.0 + 2.0**-40
    lane_abs = lanes.abs().sum(dim=1).amax(dim=-1) * margin  # (R,)
    lane_max = lanes.sum(dim=1).abs().amax(dim=-1) * margin  # exact when lane_abs passes
    total = ref.reshape(-1).abs() * n * margin  # |S| from the exact reference
    limit = torch.exp2(torch.clamp(q, max=1000.0))  # 2**q (rows of zeros: q = inf, no limit)
    exact = (lane_abs < limit * 2.0**53) & (lane_max < limit * 2.0**46) & (total < limit * 2.0**53)
    exact = exact | torch.isinf(q)  # a row of zeros (or no elements)
    if x.device.type == "cuda":
        tiny = ((e != 0) & (e.abs() < FP32_MIN_NORMAL)).any(dim=-1)
        mean = ref.reshape(-1).abs()
        exact = exact & ~tiny & ~((mean > 0) & (mean < FP32_MIN_NORMAL))
    exact = exact | ~finite_row
    return (exact.reshape(ref.shape),)


EXACT_JUSTIFICATION = (
    "mean promises one rounding of an exactly computed value: the elements rounded to the output "
    "dtype are widened to fp64 exactly, summed in fp64 lanes, combined on an int64 fixed-point grid, "
    "divided in fp64 (correctly rounded) and rounded once.  Where the lanes, the grid and the int64 -> "
    "fp64 total lose nothing (see mean_exact: every partial lane sum and the total below 2**53 units of "
    "the row's smallest bit, the largest lane below 2**46 of them) the output must be the exact mean "
    "rounded to fp64, then once to the output dtype, bit for bit.  Outside (fp32 rows whose values "
    "span more than fp64 holds, subnormals beside normal values; on a GPU also subnormal elements or "
    "means) the tolerance applies."
)

JUSTIFICATION = (
    "mean accumulates in fp64 in the pinned order (lanes over chunks, then an order-free fixed-point "
    "combine that truncates under 2**-29 of the largest lane), divides in fp64 and rounds once to the "
    "output dtype, so it can differ from the fp64 reference by that one rounding and the sum's error. "
    "The bound is derived per row from the fp64 run: (gamma_c + 2**-29) * mean|x| with c = chunks per "
    "lane from the config table, plus a few fp64 ulps of |y| (total, division, the reference's own fp64 "
    "rounding), plus the output dtype's unit roundoff of |y|, plus floors: half its smallest "
    "subnormal and 2 * 2**-126 for flushed subnormals.  Like every summation bound it scales with "
    "mean|x|, not |y|: on a row that cancels (1e30, -1e30 and small values) the relative error of the "
    "mean can be large while the absolute error stays inside the bound."
)


def error_cases(device: torch.device) -> list[ErrorCase]:
    f32 = torch.zeros(2, 8, device=device)
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
        ErrorCase(
            "dim_not_last_3d",
            {"x": torch.zeros(2, 3, 8, device=device), "dim": 1},
            ArgumentError,
            r"argument 'dim'.*last dim",
        ),
        ErrorCase("dim_out_of_range", {"x": f32, "dim": 2}, ArgumentError, r"argument 'dim'.*out of range"),
        ErrorCase(
            "dim_negative_out_of_range", {"x": f32, "dim": -3}, ArgumentError, r"argument 'dim'.*out of range"
        ),
        ErrorCase("dim_tuple", {"x": f32, "dim": (1,)}, ArgumentError, r"argument 'dim'.*an int"),
        ErrorCase("keepdim_not_bool", {"x": f32, "keepdim": 1}, ArgumentError, r"argument 'keepdim'.*bool"),
        ErrorCase("dtype_int", {"x": f32, "dtype": torch.int32}, DTypeError, r"argument 'dtype'"),
        ErrorCase("dtype_float64", {"x": f32, "dtype": torch.float64}, DTypeError, r"argument 'dtype'"),
        ErrorCase("dtype_string", {"x": f32, "dtype": "float32"}, DTypeError, r"argument 'dtype'"),
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


def strategy(lane: Lane, device: torch.device) -> Any:
    """A hypothesis strategy of :class:`Batch`: small random mean cases (2-D and 3-D)."""
    from hypothesis import strategies as st

    max_cols = 300 if not lane.is_gpu else 8192

    @st.composite
    def batches(draw: Callable[..., Any]) -> Batch:
        lead = draw(
            st.sampled_from([(draw(st.integers(1, 6)),), (draw(st.integers(1, 3)), draw(st.integers(1, 3)))])
        )
        cols = draw(st.integers(1, max_cols))
        dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        values = draw(st.sampled_from(VALUE_KINDS))
        layout = draw(st.sampled_from(LAYOUTS))
        keepdim = draw(st.booleans())
        out_dtype = draw(st.sampled_from([None, "float32", "bfloat16", "float16"]))
        seed = draw(st.integers(0, 2**31 - 1))
        return build(make_case((*lead, cols), dtype, values, layout, keepdim, out_dtype, seed), device)

    return batches()


COMPONENT = Component(
    name=NAME,
    summary="mean over the last dim of a 2-D/3-D input (fp64 accumulation), keepdim and dtype",
    reference=reference_mean,
    fast=fast_mean,
    baselines=(
        Baseline(
            "torch_native",
            torch_native_mean,
            "torch.mean: its CUDA reduction picks threads per output and the split across blocks from "
            "the number of output rows; on the CPU each short row is summed serially (GPU lanes only); "
            "also the negative control of modes: torch.compile lowers it to Inductor's own reduction",
            expected_to_vary_on=GPU_LANES,
            modes=torch_mean_unchecked,
        ),
        Baseline(
            "triton_rows_heuristic",
            triton_rows_heuristic_mean,
            "the Triton kernel as production runs it: fp32 lanes, a float tl.sum over them and the "
            "column chunk sized from the number of rows (the whole row "
            "when rows < SMs, the table's chunk otherwise): the order of the additions changes with M",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "autotune_hash_ties",
            autotuned_mean,
            "an autotuner timed once per process: two tiles of equal work and different lane widths "
            "(fp32 lanes, a float lane sum) tie, and the tie goes to the first name in a set's "
            "iteration order, which follows PYTHONHASHSEED; every launch in a process takes the "
            "same config (batch-invariant there), another process may take the other: the "
            "negative control of cross_process (required on the cpu lane, where the two tiles tie "
            "by construction; on GPU lanes the timings may not tie)",
            expected_to_vary_on=frozenset({Lane.CPU}),
            caught_by=("cross_process",),
            timed=False,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        mean_bound,
        JUSTIFICATION,
        lambda batch: (batch.shared["dtype"] or batch.rows["x"].dtype,),
        exact=mean_exact,
        exact_justification=EXACT_JUSTIFICATION,
    ),
    shift_row_start=pack_at_offset,
    lanes=ALL_LANES,
    dtypes=DTYPES,
    error_cases=error_cases,
    strategy=strategy,
    bench_cases=bench_cases,
    torch_op=ops.mean_subject,
)
