"""Registry entry ``matmul``: the batch-invariant persistent GEMM (``F.linear`` and ``a @ b``).

Axes of a case: ``layout`` (linear: weight [N, K]; mm: weight [K, N]), ``dtype`` of the inputs,
``out`` dtype, ``n``, ``k``, ``rows`` (the full batch; the M sweep takes prefixes of it),
``bias``, and ``values`` (``normal``, ``special`` = bit patterns injected sparsely into x,
``relu`` = an exact-zero plateau in x).

The weight (and bias) are drawn from a seed derived from the axes, not from the case seed, so
the position driver's neighbour batch (same axes, another seed) shares them, as the rows of a
real batch share a layer's weight.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from batchinv.fast import matmul as fast_matmul
from batchinv.fast import matmul_baselines as bl
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
    Toleranced,
)
from batchinv.reference import matmul as ref_matmul
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

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
    weight = (torch.randn(w_shape, generator=wgen) / k**0.5).to(dtype)  # a layer's init scale
    bias = torch.randn(n, generator=wgen).to(dtype) if a["bias"] else None
    xgen = torch.Generator().manual_seed(case.seed)
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


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """The derived fp32-accumulation bound of :func:`batchinv.reference.matmul.tolerance_bound`."""
    s = batch.shared
    return (
        ref_matmul.tolerance_bound(
            batch.rows["x"],
            s["weight"],
            s["bias"],
            layout=s["layout"],
            out_dtype=s["out_dtype"],
            reference=reference[0],
        ),
    )


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
            "pin_lt_ws0",
            bl.torch_default,
            "pin candidate: CUBLAS_WORKSPACE_CONFIG=:0:0 with preferred BLAS cuBLASLt (measured: "
            "'OOM trying to allocate workspace for cublaslt'; expected to be an error row)",
            expected_to_vary_on=frozenset(),
            lanes=GPU_LANES,
            env={"CUBLAS_WORKSPACE_CONFIG": ":0:0", bl.PREFERRED_BLAS_ENV: "cublaslt"},
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "fp32 accumulation cannot equal the fp64 reference; per element the bound is "
        "gamma_K * (|x| @ |W|) with gamma_K = K eps / (1 - K eps), eps = 2**-23 (fp32, allowing a "
        "truncating tensor-core adder), plus K * 2**-126 for underflow, plus the fp32 bias add "
        "(2**-24 * |ref|) and one rounding to the output dtype (unit roundoff * |ref| + half its "
        "smallest subnormal; none for fp32 output). |x| @ |W| and |ref| come from the fp64 run.",
        out_dtypes=lambda batch: (batch.shared["out_dtype"] or batch.rows["x"].dtype,),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    error_cases=error_cases,
    partition_arg="num_sms",
    strategy=_strategy,
    bench_cases=bench_cases,
)
