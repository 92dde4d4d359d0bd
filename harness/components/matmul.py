"""Registry entry ``matmul``: the batch-invariant persistent GEMM (``F.linear`` and ``a @ b``).

Axes of a case: ``layout`` (linear: weight [N, K]; mm: weight [K, N]), ``dtype`` of the inputs,
``out`` dtype, ``n``, ``k``, ``rows`` (the full batch; the M sweep takes prefixes of it),
``bias``, and ``values`` (``normal``, ``special`` = bit patterns injected sparsely into x,
``relu`` = an exact-zero plateau in x, ``exact`` = small integers, scaled by powers of two, whose
products and every partial sum fp32 holds exactly: x with the full significand of its dtype
(12 bits for fp32, one more than TF32 keeps, the lowest set) so any rounding of an operand, of
a partial sum or of the result shows).

Agreement: bitwise where fp32 accumulation is exact in any order (:func:`exact`: the ``exact``
cases, and any element whose products and partial sums fit fp32's 24 bits), elsewhere within
the order-aware :func:`batchinv.reference.matmul.tight_bound` (judged), never above the rigorous
any-order :func:`batchinv.reference.matmul.tolerance_bound` (a hard limit).

The weight (and bias) are drawn from a seed derived from the axes, not from the case seed, so
the position driver's neighbour batch (same axes, another seed) shares them, as the rows of a
real batch share a layer's weight.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import replace
from typing import Any

import torch

from batchinv.fast import matmul as fast_matmul
from batchinv.fast import matmul_baselines as bl
from batchinv.fast import ops
from batchinv.harness.bitpatterns import catalogue, inject, relu_plateau
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
    PrecisionModel,
    Toleranced,
)
from batchinv.reference import matmul as ref_matmul
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.exact import quantum_exponent

NAME = "matmul"

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: Special values injected into x for ``values="special"``: everything but +-max_normal, whose
#: products overflow fp32 (or the fp16 output) where the fp64 reference stays finite.
SPECIAL_DENSITY = 0.002


def _special_patterns(dtype: torch.dtype) -> list[Any]:
    return [p for p in catalogue(dtype) if "max_normal" not in p.name]


def _case(
    n: int,
    k: int,
    rows: int,
    *,
    layout: str = "linear",
    dtype: str = "bf16",
    out: str | None = None,
    bias: bool = False,
    values: str = "normal",
    seed: int = 0,
) -> Case:
    axes = {
        "layout": layout,
        "dtype": dtype,
        "out": out or dtype,
        "n": n,
        "k": k,
        "rows": rows,
        "bias": bias,
        "values": values,
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> list[Case]:
    """Small cases in the interpreter; the production shapes of the issue on GPU lanes."""
    if not lane.is_gpu:
        return [
            # First: the router-like case, where split-K (5 K tiles) is caught at once.
            _case(64, 160, 64, dtype="bf16", out="fp32", bias=True),  # fp32 logits from bf16
            _case(80, 96, 64, dtype="fp32", values="special"),  # IEEE fp32; masks on N and K
            _case(96, 144, 64, dtype="bf16", bias=True),
            _case(80, 72, 65, layout="mm", dtype="fp16", bias=True, values="relu"),
            # integers whose sums fp32 holds: bitwise; 200 = a full K tile and a partial one
            _case(48, 200, 33, dtype="fp32", bias=True, values="exact"),
        ]
    return [
        _case(256, 4096, 4096, dtype="fp32"),  # router, IEEE fp32
        _case(256, 4096, 4096, dtype="bf16", out="fp32"),  # router, fp32 logits from bf16
        _case(4096, 4096, 4096, dtype="bf16", bias=True),
        _case(257, 1000, 2048, dtype="bf16", bias=True),  # odd shape where the cuBLAS pin fails
        _case(14336, 4096, 1024, dtype="bf16"),
        # 1408 = 11 column tiles of 128: 12 row tiles at 1536 rows is 132 tiles = the H200's SM
        # count; the M sweep's 1024 gives 88 (below).  a @ b layout, fp16, special values.
        _case(1408, 1024, 1536, layout="mm", dtype="fp16", values="special"),
        # The router shapes with integer operands whose products and sums fp32 holds exactly:
        # bitwise agreement, so any operand rounding (TF32), 16-bit rounding of the logits or of
        # a partial sum, or a dropped product changes bits.
        _case(256, 4096, 512, dtype="fp32", values="exact"),
        _case(256, 4096, 512, dtype="bf16", out="fp32", values="exact"),
        _case(1408, 1024, 256, layout="mm", dtype="fp16", bias=True, values="exact"),
    ]


#: ``batchinv bench matmul``: F.linear layout (the production one), M per point.
BENCH_M: tuple[int, ...] = (1, 8, 32, 128, 512, 1024, 4096)
BENCH_SHAPES: tuple[tuple[int, int, str, str], ...] = (
    # (N, K, input dtype, output dtype)
    (256, 4096, "fp32", "fp32"),  # router fp32 IEEE
    (256, 4096, "bf16", "fp32"),  # router bf16 -> fp32 logits
    (4096, 4096, "bf16", "bf16"),
    (14336, 4096, "bf16", "bf16"),
    (2688, 4096, "bf16", "bf16"),
    (4608, 2688, "bf16", "bf16"),
    (257, 1000, "bf16", "bf16"),
)


def bench_cases(lane: Lane) -> list[Case]:
    """One case per (shape, M): ``rows`` is the M being timed."""
    if not lane.is_gpu:
        return [_case(n, k, m, dtype=d, out=o) for n, k, d, o in BENCH_SHAPES[:2] for m in (1, 32)]
    return [_case(n, k, m, dtype=d, out=o) for n, k, d, o in BENCH_SHAPES for m in BENCH_M]


def build(case: Case, device: torch.device) -> Batch:
    """Inputs of ``case``: x from ``case.seed``; weight and bias from a seed of the axes."""
    a = case.axes
    dtype = DTYPES[a["dtype"]]
    n, k, rows = int(a["n"]), int(a["k"]), int(a["rows"])
    weight_seed = zlib.crc32(repr(sorted((key, a[key]) for key in a if key != "rows")).encode())
    wgen = torch.Generator().manual_seed(weight_seed)
    w_shape = (n, k) if a["layout"] == "linear" else (k, n)
    xgen = torch.Generator().manual_seed(case.seed)
    if a["values"] == "exact":
        x, weight, bias = _exact_operands(rows, k, n, w_shape, bool(a["bias"]), dtype, wgen, xgen)
    else:
        weight = (torch.randn(w_shape, generator=wgen) / k**0.5).to(dtype)  # a layer's init scale
        bias = torch.randn(n, generator=wgen).to(dtype) if a["bias"] else None
        x = torch.randn((rows, k), generator=xgen).to(dtype)  # [M, K]
    if a["values"] == "special":
        x = inject(x, _special_patterns(dtype), SPECIAL_DENSITY, xgen)
    elif a["values"] == "relu":
        x = relu_plateau(x)
    shared: dict[str, Any] = {
        "weight": weight.to(device),
        "bias": bias.to(device) if bias is not None else None,
        "layout": a["layout"],
        "out_dtype": DTYPES[a["out"]],
    }
    return Batch({"x": x.to(device)}, shared)


#: Significant bits of x in ``exact`` cases: the dtype's full significand, at most 12 (TF32
#: keeps 11, so every fp32 x changes under a TF32 rounding).
_EXACT_X_BITS: dict[torch.dtype, int] = {torch.float32: 12, torch.bfloat16: 8, torch.float16: 11}


def _exact_operands(
    rows: int,
    k: int,
    n: int,
    w_shape: tuple[int, int],
    with_bias: bool,
    dtype: torch.dtype,
    wgen: torch.Generator,
    xgen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Operands of an ``exact`` case: x = +-odd integers of ``b_x`` bits (the lowest bit set)
    times 2**-b_x, W and bias = integers of ``b_w`` bits times 2**-b_w (bias in the products'
    units, 2**-(b_x + b_w)), with ``b_x + b_w + log2 K < 24``: every product and partial sum is
    an integer number of units below 2**24, so fp32 holds them all (the sweep checks each element
    anyway, see :func:`exact`)."""
    bits_x = _EXACT_X_BITS[dtype]
    bits_w = max(1, 24 - max(1, (k - 1).bit_length()) - bits_x - 1)
    odd = torch.randint(2 ** (bits_x - 2), 2 ** (bits_x - 1), (rows, k), generator=xgen) * 2 + 1
    sign = torch.randint(0, 2, (rows, k), generator=xgen) * 2 - 1
    x = (odd * sign).double() * 2.0**-bits_x
    top = 2**bits_w - 1
    weight = torch.randint(-top, top + 1, w_shape, generator=wgen).double() * 2.0**-bits_w
    bias = None
    if with_bias:
        bias = torch.randint(-(2**12), 2**12 + 1, (n,), generator=wgen)
        bias = bias.double() * 2.0 ** -(bits_x + bits_w)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def accumulation_group(batch: Batch) -> int:
    """Products per accumulation step of the fast kernel on this batch's lane: a K tile under
    the interpreter (its products are summed in one ``tl.sum``), 16 on a GPU (a tensor-core
    MMA's k-step; fp32's FMA, one product per step, is finer and covered)."""
    x, s = batch.rows["x"], batch.shared
    w = s["weight"]
    n = w.shape[0] if s["layout"] == "linear" else w.shape[1]
    p = fast_matmul.plan(x.shape[0], n, x.shape[1], x.dtype, x.device)
    return p.config.block_k if p.interpreted else 16


def _bound_of(fn: Any, batch: Batch, reference: Outputs, **extra: Any) -> Outputs:
    """``fn`` (a bound of :mod:`batchinv.reference.matmul`) on the batch's operands."""
    s = batch.shared
    return (
        fn(
            batch.rows["x"],
            s["weight"],
            s["bias"],
            layout=s["layout"],
            out_dtype=s["out_dtype"],
            reference=reference[0],
            **extra,
        ),
    )


def tight(batch: Batch, reference: Outputs) -> Outputs:
    """The judged bound: :func:`batchinv.reference.matmul.tight_bound` in this lane's grouping."""
    return _bound_of(ref_matmul.tight_bound, batch, reference, group=accumulation_group(batch))


def exact(batch: Batch, reference: Outputs) -> Outputs:
    """The elements fp32 accumulation computes exactly, in any order (a bool [M, N]).

    With 2**q dividing every x[m, k] w[k, n] and the bias (q from the row's smallest and the
    column's smallest lowest set bit, :func:`batchinv.reference.exact.quantum_exponent`): every
    product, partial sum and the biased total is a multiple of 2**q, and when
    ``sum_k |x w| + |bias| < 2**(q + 24)`` each fits fp32's 24 bits, so no addition rounds,
    whatever the order or the adder (truncating tensor cores included), and q >= -149 (-126 on
    a GPU, which may flush subnormals) keeps them representable.  There the fp64 reference is
    the exact value too, and the output is its one rounding to the output dtype.
    """
    x, s = batch.rows["x"], batch.shared
    ref = reference[0]
    w = ref_matmul.weight_kn(s["weight"], s["layout"]).to(ref.device, torch.float64)  # [K, N]
    x64 = x.to(ref.device, torch.float64)  # [M, K]
    q = quantum_exponent(x64).amin(dim=1)[:, None] + quantum_exponent(w).amin(dim=0)[None, :]  # [M, N]
    total = x64.abs() @ w.abs()
    bias = s["bias"]
    if bias is not None:
        b = bias.to(ref.device, torch.float64)
        q = torch.minimum(q, quantum_exponent(b)[None, :])
        total = total + b.abs()[None, :]
    floor = -126.0 if x.device.type == "cuda" else -149.0
    limit = torch.exp2(torch.clamp(q, min=-1000.0, max=1000.0) + 24.0)
    fits = (total * (1.0 + 2.0**-40) < limit) & (q >= floor) & torch.isfinite(q)
    return (fits & torch.isfinite(ref),)


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """The derived fp32-accumulation bound of :func:`batchinv.reference.matmul.tolerance_bound`."""
    return _bound_of(ref_matmul.tolerance_bound, batch, reference)


def configs(batch: Batch, lane: Lane) -> dict[str, Any]:
    """The executions the launcher may choose for ``batch``'s (dtype, N, K), besides the table's:
    other BLOCK_M / BLOCK_N / GROUP_M tiles and num_warps / num_stages, always the table's
    BLOCK_K (the reduction order: every output is the same fp32 sum over the same K tiles).
    Named ``BMxBNxBK gG wW sS``.  Under the interpreter warps and stages are ignored but the
    tile shapes run; on GPU lanes the variants keep shared memory under the H200's 227 KB."""
    x, weight = batch.rows["x"], batch.shared["weight"]
    layout = batch.shared.get("layout", "linear")
    n = weight.shape[0] if layout == "linear" else weight.shape[1]
    cfg = fast_matmul.plan(x.shape[0], n, x.shape[1], x.dtype, x.device).config
    if not lane.is_gpu:
        variants = [
            replace(cfg, block_m=32, block_n=128, group_m=1),
            replace(cfg, block_m=128, block_n=32, num_warps=8, num_stages=2),
        ]
    else:
        variants = [
            replace(cfg, block_m=16, num_stages=2),
            replace(cfg, block_n=64 if cfg.block_n != 64 else 128, num_warps=8 if cfg.num_warps == 4 else 4),
            replace(cfg, block_m=64 if cfg.block_m != 64 else 128, block_n=64, group_m=1, num_stages=2),
        ]
    out = {}
    for v in variants:
        if v == cfg:
            continue
        name = f"{v.block_m}x{v.block_n}x{v.block_k} g{v.group_m} w{v.num_warps} s{v.num_stages}"
        out[name] = functools.partial(fast_matmul.matmul, config=v)
    return out


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs: each raises a typed error naming the argument (fast and reference alike)."""

    def t(*shape: int, dtype: torch.dtype = torch.bfloat16, dev: torch.device | str = device) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=dev)

    return [
        ErrorCase("k_mismatch", {"x": t(4, 32), "weight": t(16, 24)}, ArgumentError, "weight.*K = 32"),
        ErrorCase(
            "k_mismatch_mm", {"x": t(4, 32), "weight": t(24, 16), "layout": "mm"}, ArgumentError, "weight"
        ),
        ErrorCase("x_not_2d", {"x": t(2, 4, 32), "weight": t(16, 32)}, ArgumentError, "'x'.*2-D"),
        ErrorCase("weight_not_2d", {"x": t(4, 32), "weight": t(32)}, ArgumentError, "'weight'.*2-D"),
        ErrorCase(
            "dtype_mix",
            {"x": t(4, 32), "weight": t(16, 32, dtype=torch.float16)},
            DTypeError,
            "'weight'.*bfloat16",
        ),
        ErrorCase(
            "dtype_unsupported",
            {"x": t(4, 32, dtype=torch.float64), "weight": t(16, 32, dtype=torch.float64)},
            DTypeError,
            "'x'.*float64",
        ),
        ErrorCase(
            "int_input",
            {"x": t(4, 32, dtype=torch.int32), "weight": t(16, 32, dtype=torch.int32)},
            DTypeError,
            "'x'",
        ),
        ErrorCase(
            "out_dtype_fp16_from_bf16",
            {"x": t(4, 32), "weight": t(16, 32), "out_dtype": torch.float16},
            DTypeError,
            "'out_dtype'",
        ),
        ErrorCase(
            "out_dtype_bf16_from_fp32",
            {
                "x": t(4, 32, dtype=torch.float32),
                "weight": t(16, 32, dtype=torch.float32),
                "out_dtype": torch.bfloat16,
            },
            DTypeError,
            "'out_dtype'",
        ),
        ErrorCase(
            "bias_shape", {"x": t(4, 32), "weight": t(16, 32), "bias": t(15)}, ArgumentError, "'bias'.*16"
        ),
        ErrorCase(
            "bias_dtype",
            {"x": t(4, 32), "weight": t(16, 32), "bias": t(16, dtype=torch.float16)},
            DTypeError,
            "'bias'",
        ),
        ErrorCase(
            "weight_wrong_device",
            {"x": t(4, 32), "weight": t(16, 32, dev="meta")},
            DeviceError,
            "'weight'.*meta",
        ),
        ErrorCase(
            "layout_unknown", {"x": t(4, 32), "weight": t(16, 32), "layout": "nt"}, ArgumentError, "'layout'"
        ),
        ErrorCase(
            "tf32_on_bf16",
            {"x": t(4, 32), "weight": t(16, 32), "precision": "tf32"},
            ArgumentError,
            "'precision'",
        ),
        ErrorCase(
            "all_on_meta",
            {"x": t(4, 32, dev="meta"), "weight": t(16, 32, dev="meta"), "bias": t(16, dev="meta")},
            DeviceError,
            "'x'.*meta",
        ),
        # ``out`` exists on the fast path only (the reference returns a fresh fp64 tensor).
        ErrorCase(
            "out_requires_grad",
            {"x": t(4, 32), "weight": t(16, 32), "out": t(4, 16).requires_grad_()},
            ArgumentError,
            "'out'.*requires_grad",
            applies_to=("fast",),
        ),
        ErrorCase(
            "out_on_meta",
            {"x": t(4, 32), "weight": t(16, 32), "out": t(4, 16, dev="meta")},
            DeviceError,
            "'out'.*meta",
            applies_to=("fast",),
        ),
    ]


def _strategy(lane: Lane, device: torch.device) -> Any:
    """Hypothesis strategy of small batches (shapes, dtypes, layouts, bias, out dtype, seed)."""
    from hypothesis import strategies as st

    @st.composite
    def batches(draw: Any) -> Batch:
        dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
        case = _case(
            draw(st.integers(1, 80)),
            draw(st.integers(1, 96)),
            draw(st.integers(1, 40)),
            layout=draw(st.sampled_from(["linear", "mm"])),
            dtype=dtype,
            out=draw(st.sampled_from([dtype, "fp32"])),
            bias=draw(st.booleans()),
            seed=draw(st.integers(0, 2**31 - 1)),
        )
        return build(case, device)

    return batches()


COMPONENT = Component(
    name=NAME,
    summary="batch-invariant GEMM (F.linear / a @ b): persistent Triton kernel, one config per (arch, dtype, N, K)",
    reference=ref_matmul.matmul,
    fast=fast_matmul.matmul,
    baselines=(
        Baseline(
            "torch_default",
            bl.torch_default,
            "F.linear / torch.mm as dispatched: cuBLAS(Lt) picks algorithm and split-K per M on a GPU "
            "(on the cpu lane: MKL/oneDNN, which may or may not vary)",
            expected_to_vary_on=GPU_LANES,
        ),
        Baseline(
            "split_k",
            bl.split_k,
            "Triton split-K with the split count chosen from M (4 slices at M<=16, 2 at M<=64): "
            "fp32 partial sums associated differently per batch size",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "pin_lt_ws1",
            bl.torch_default,
            "pin candidate: CUBLAS_WORKSPACE_CONFIG=:16:8, CUBLASLT_WORKSPACE_SIZE=1, preferred BLAS "
            "cuBLASLt (measured: pins bf16/fp16 on large shapes, not fp32 at M<=16 nor N=257,K=1000)",
            expected_to_vary_on=frozenset(),
            lanes=GPU_LANES,
            env={
                "CUBLAS_WORKSPACE_CONFIG": ":16:8",
                "CUBLASLT_WORKSPACE_SIZE": "1",
                bl.PREFERRED_BLAS_ENV: "cublaslt",
            },
        ),
        Baseline(
            "pin_ws1",
            bl.torch_default,
            "pin candidate: CUBLAS_WORKSPACE_CONFIG=:16:8, CUBLASLT_WORKSPACE_SIZE=1, default BLAS "
            "library (measured: bf16 256x4096 still varies at M<=33)",
            expected_to_vary_on=frozenset(),
            lanes=GPU_LANES,
            env={"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"},
        ),
        Baseline(
            "other_block_k",
            bl.other_block_k,
            "config_equivalence's negative control: the table's config with half its BLOCK_K (another "
            "association of each fp32 sum under the interpreter; identical bits on the H200, 2026-11-30: dots "
            "add their k-steps in order whatever the tile)",
            expected_to_vary_on=frozenset({Lane.CPU}),
            config_control=True,
        ),
        Baseline(
            "two_k_slices",
            bl.two_k_slices,
            "config_equivalence's negative control on every lane: K always in two slices whose fp32 partials "
            "are added after (batch-invariant, another summation tree)",
            expected_to_vary_on=ALL_LANES,
            config_control=True,
        ),
        # The :0:0 + cuBLASLt recipe is not swept: it crashes ("OOM trying to allocate workspace
        # for cublaslt") on every case without a bias, and a crashing baseline fails the sweep.
        # `batchinv audit cublas` still audits it (pin_lt_ws0) and reports the crash per shape.
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "fp32 accumulation cannot equal the fp64 reference; per element the rigorous (any-order) bound is "
        "gamma_K * (|x| @ |W|) with gamma_K = K eps / (1 - K eps), eps = 2**-23 (fp32, allowing a "
        "truncating tensor-core adder), plus K * 2**-126 for underflow, plus the fp32 bias add "
        "(2**-24 * |ref|) and one rounding to the output dtype (unit roundoff * |ref| + half its "
        "smallest subnormal; none for fp32 output). |x| @ |W| and |ref| come from the fp64 run.",
        out_dtypes=lambda batch: (batch.shared["out_dtype"] or batch.rows["x"].dtype,),
        tight_bound=tight,
        tight_justification=(
            "the kernel adds its K products to one fp32 accumulator in increasing k, a group of G at a "
            "time (G = 16, a tensor-core MMA's k-step, on GPUs; BLOCK_K under the interpreter); each "
            "step errs by at most gamma_(G+2) (eps = 2**-23, truncating adders allowed) of |accumulator| "
            "+ the group's sum |x w|.  Summed over the steps with the exact partial sums P_g from fp64: "
            "gamma_(G+2) (sum_g |P_g| + S) plus second-order terms, then the bias and output roundings. "
            "|P_g| grows like sqrt(k) for random signs where S grows like k, so at K = 4096 this is 2-6% "
            "of the any-order bound: TF32 operands, a bf16 rounding of fp32 logits, 16-bit accumulation "
            "and a dropped product exceed it."
        ),
        precision_models=tuple(
            PrecisionModel(
                "TF32",
                functools.partial(ref_matmul.tf32_matmul, rounding=rounding),
                "the error is TF32-sized: the output meets the bound around the reference computed on "
                f"fp32 operands rounded to TF32 (10 mantissa bits, {rounding.replace('_', ' ')}), so "
                "the subject computes fp32 products in TF32 (torch.backends.cuda.matmul.allow_tf32, "
                "Triton's input_precision='tf32', a TF32 cuBLAS math mode)",
            )
            for rounding in ref_matmul.TF32_ROUNDINGS
        ),
        exact=exact,
        exact_justification=(
            "where every product, partial sum and the biased total is a multiple of 2**q below 2**(q + 24) "
            "fp32 accumulation is exact in any order, so the output is the exact value rounded once: "
            "bitwise (the exact cases, built so for every element; in other cases the odd element)."
        ),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=error_cases,
    partition_arg="num_sms",
    strategy=_strategy,
    bench_cases=bench_cases,
    configs=configs,
    torch_op=ops.matmul_subject,
)
