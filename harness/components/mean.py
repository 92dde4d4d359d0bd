"""Registry entry ``mean``: the mean over the last dim of a 2-D or 3-D input, with ``keepdim``
and ``dtype``.

Inputs come from the softmax family's builders (:mod:`batchinv.harness.components.softmax`):
a seeded background (normal, or per row: cancellation around an offset, tiny values with
subnormals, all-equal, quantized, huge), optionally with specials suited to a sum: sparse
signed zeros, subnormals and min normals everywhere, and whole-row kinds cycled over the rows
(quiet / signalling NaN, +inf, -inf, +inf and -inf together, all -inf, +max_normal, signed
zeros).  The layout (contiguous, padded rows, a column stride) is applied last, with NaNs in
every element the kernel must not read.

The tolerance is derived per row from the fp64 sum of |x|, fp64's unit roundoff, the pinned
reduction's depth, the fixed-point combine's truncation and the output dtype's unit roundoff
(see :func:`mean_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast.device import arch
from batchinv.fast.mean import COMBINE_LOSS, mean_config, reduction_depth
from batchinv.fast.mean import mean as fast_mean
from batchinv.fast.mean_baselines import torch_native_mean, triton_rows_heuristic_mean
from batchinv.harness.components.softmax import (
    FTZ_FLOOR,
    LAYOUTS,
    VALUE_KINDS,
    add_specials,
    apply_layout,
    build_values,
    conversion_error,
    half_min_subnormal,
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
from batchinv.reference.mean import mean as reference_mean

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


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``{"x": x}``; shared ``dim=-1``, ``keepdim`` and ``dtype``."""
    axes = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    shape = tuple(axes["shape"])
    dtype = getattr(torch, axes["dtype"])
    kind = axes["values"]
    num_cols = shape[-1]
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


#: fp64's unit roundoff.
U64 = 2.0**-53


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u) for fp64: the relative bound of k roundings in sequence."""
    return k * U64 / (1.0 - k * U64)


def mean_bound(batch: Batch, ref_out: Outputs) -> Outputs:
    """Per-row bound on |fast - fp64 reference|.

    With e_n the elements rounded to the output dtype (exact in fp64; the reference casts the
    same way, bit for bit), A = mean|e|, y = mean(e) exact and c = ceil(N / block_n) from the
    config table (the pinned order):

    * lanes: each adds its <= c elements in sequence in fp64 from +0: in all, at most gamma_c * N A;
    * combine: truncation under COMBINE_LOSS (2**-29) of the largest lane <= (1 + gamma_c) N A;
    * the int64 -> fp64 total and the fp64 division: two roundings, under 3u64 (|y| + err);
    * so the fp64 quotient q has |q - y| <= d := (gamma_c + 2**-29 (1 + gamma_c)) A (1 + 3u64)
      + 3u64 |y|;
    * one rounding of q to the output dtype (bf16/fp16 via fp32 rounded to odd: a single
      rounding): u_out |q| <= u_out (|y| + d), or half the smallest subnormal below the normal
      range;
    * the fp64 reference is itself an fp64 sum (torch's order) and division: gamma_N A + u64 |y|;
    * a GPU may flush subnormal elements (the mean moves under 2**-126) and a subnormal fp32
      result (under 2**-126): 2 * FTZ_FLOOR.
    """
    x = batch.rows["x"]
    ref = ref_out[0]
    dtype = batch.shared.get("dtype")
    out_dtype = x.dtype if dtype is None else dtype
    n = x.shape[-1]
    elements = x.to(out_dtype).to(ref.device, torch.float64)  # the values the reference sums
    mean_abs = elements.abs().mean(dim=-1, keepdim=True)
    if not batch.shared.get("keepdim"):
        mean_abs = mean_abs.squeeze(-1)
    mean_abs = torch.where(torch.isfinite(mean_abs), mean_abs, torch.zeros_like(mean_abs))
    chunks = reduction_depth(mean_config(arch(x.device), x.dtype, n), n)
    y = torch.where(torch.isfinite(ref), ref.abs(), torch.zeros_like(ref))
    g = gamma(chunks)
    fast_q = (g + COMBINE_LOSS * (1.0 + g)) * mean_abs * (1.0 + 3 * U64) + 3 * U64 * y
    u_out = conversion_error(out_dtype, x.device)
    fast_err = fast_q * (1.0 + u_out) + u_out * y + half_min_subnormal(out_dtype)
    ref_err = gamma(max(n, 1)) * mean_abs + U64 * y
    return (fast_err + ref_err + 2 * FTZ_FLOOR,)


JUSTIFICATION = (
    "mean accumulates in fp64 in the pinned order (lanes over chunks, then an order-free fixed-point "
    "combine that truncates under 2**-29 of the largest lane), divides in fp64 and rounds once to the "
    "output dtype, so it can differ from the fp64 reference by that one rounding and the sum's error. "
    "The bound is derived per row from the fp64 run: (gamma_c + 2**-29) * mean|x| with c = chunks per "
    "lane from the config table, plus a few fp64 ulps of |y| (total, division, the reference's own fp64 "
    "sum gamma_N * mean|x|), plus the output dtype's unit roundoff of |y|, plus floors: half its smallest "
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
            "the number of output rows; on the CPU each short row is summed serially (GPU lanes only)",
            expected_to_vary_on=GPU_LANES,
        ),
        Baseline(
            "triton_rows_heuristic",
            triton_rows_heuristic_mean,
            "the Triton kernel as production runs it: fp32 lanes, a float tl.sum over them and the "
            "column chunk sized from the number of rows (the whole row "
            "when rows < SMs, the table's chunk otherwise): the order of the additions changes with M",
            expected_to_vary_on=ALL_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        mean_bound, JUSTIFICATION, lambda batch: (batch.shared["dtype"] or batch.rows["x"].dtype,)
    ),
    shift_row_start=pack_at_offset,
    lanes=ALL_LANES,
    dtypes=DTYPES,
    error_cases=error_cases,
    strategy=strategy,
    bench_cases=bench_cases,
)
