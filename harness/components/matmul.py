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
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from batchinv.fast import matmul as fast_matmul
from batchinv.fast.baselines import matmul as bl
from batchinv.fast.device import arch
from batchinv.fast.enable import ops
from batchinv.fast.matmul_config import Execution, MatmulConfig, executions
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


#: ``batchinv bench matmul``: F.linear layout (the production one), M per point: issue 11's table.
BENCH_M: tuple[int, ...] = (1, 8, 32, 128, 512, 1024, 4096)
BENCH_SHAPES: tuple[tuple[int, int, str, str], ...] = (
    # (N, K, input dtype, output dtype)
    (4096, 4096, "bf16", "bf16"),
    (14336, 4096, "bf16", "bf16"),
    (4096, 14336, "bf16", "bf16"),
    (2688, 4096, "bf16", "bf16"),
    (256, 7168, "bf16", "fp32"),  # router, fp32 logits from bf16
    (256, 4096, "bf16", "fp32"),
    (256, 4096, "fp32", "fp32"),  # router, IEEE fp32
    (256, 7168, "fp32", "fp32"),
)
#: The IEEE fp32 FFMA rate (TFLOP/s; docs/BENCHMARKS.md): fp32 flops are counted at it.
FP32_FFMA_FLOPS_PER_S = 60e12


def bench_bytes(batch: Batch) -> int:
    """The fewest bytes a call moves: x, the weight and the bias read once, the output written."""
    x, s = batch.rows["x"], batch.shared
    out_size = torch.finfo(s["out_dtype"] or x.dtype).bits // 8
    m, n = x.shape[0], s["weight"].numel() // x.shape[1]
    bias = s["bias"].numel() * s["bias"].element_size() if s["bias"] is not None else 0
    return (
        x.numel() * x.element_size()
        + s["weight"].numel() * s["weight"].element_size()
        + bias
        + m * n * out_size
    )


def bench_flops(batch: Batch) -> int:
    """``2 M N K``, in bf16 tensor-core flops: IEEE fp32 products run on FFMA units, so their
    count is scaled by the tensor-core peak over the FFMA rate (the floor is then their time at
    :data:`FP32_FFMA_FLOPS_PER_S`)."""
    from batchinv.harness.bench import BF16_FLOPS_PER_S

    x, w = batch.rows["x"], batch.shared["weight"]
    flops = 2 * x.shape[0] * w.numel()
    if x.dtype == torch.float32:
        return int(flops * BF16_FLOPS_PER_S / FP32_FFMA_FLOPS_PER_S)
    return flops


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


def accumulation(batch: Batch) -> tuple[int, int]:
    """``(group, chunk)`` of the fast kernel on this batch's lane: products per accumulation
    step (a K tile under the interpreter, whose products are summed in one ``tl.sum``; 16 on a
    GPU, a tensor-core MMA's k-step, and fp32's FMA, one product per step, is finer and covered)
    and products per chunk of the reduction tree."""
    x, s = batch.rows["x"], batch.shared
    w = s["weight"]
    n = w.shape[0] if s["layout"] == "linear" else w.shape[1]
    return fast_matmul.accumulation(n, x.shape[1], x.dtype, x.device)


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
    """The judged bound: :func:`batchinv.reference.matmul.tight_bound` for the kernel's
    reduction tree on this lane (its grouping and chunks)."""
    group, chunk = accumulation(batch)
    return _bound_of(ref_matmul.tight_bound, batch, reference, group=group, chunk=chunk)


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
    """Every execution the launcher may choose for ``batch``'s (arch, dtype, N), at any M, besides
    the one it ran: each row of the execution table (split-K across the grid or one program
    walking the chunks, each tile, warps and stages, TMA or pointer reads), plus on GPU lanes each
    of them with the other warps count and one stage fewer, and under the interpreter two odd
    tiles, two TMA executions and a walk of two programs per SM.  Always the
    table's reduction tree.  Named after :attr:`MatmulConfig.name`."""
    x, weight = batch.rows["x"], batch.shared["weight"]
    layout = batch.shared.get("layout", "linear")
    n = weight.shape[0] if layout == "linear" else weight.shape[1]
    m, k = x.shape
    ran = fast_matmul.plan(m, n, k, x.dtype, x.device).config
    key = arch(x.device if lane.is_gpu else None)
    interpreter_extra = [
        Execution(32, 128, group_m=1, split_k=True),
        Execution(128, 32, num_warps=8),
        Execution(64, 64, tma=True),  # TMA reads where the operands allow (else pointers)
        Execution(16, 128, split_k=True, tma=True),
        Execution(16, 32, programs_per_sm=2),  # a walk of two programs per (planned) SM
    ]
    return execution_configs(ran, executions(key, x.dtype, n), lane, interpreter_extra, fast_matmul.matmul)


def execution_configs(
    ran: MatmulConfig,
    table: Sequence[Execution],
    lane: Lane,
    interpreter_extra: Sequence[Execution],
    fn: Callable[..., Any],
) -> dict[str, Any]:
    """``{config name: fn pinned to it}`` for every execution of ``table`` with ``ran``'s tree
    but ``ran`` itself; on GPU lanes each also with the other warps count (4 <-> 8) and one stage
    fewer, under the interpreter ``interpreter_extra`` too (the matmul's and fp8_gemm's
    ``configs``)."""
    variants: list[Execution] = []
    for ex in table:
        variants.append(ex)
        if lane.is_gpu:
            variants.append(
                replace(ex, num_warps=8 if ex.num_warps == 4 else 4, num_stages=max(2, ex.num_stages - 1))
            )
    if not lane.is_gpu:
        variants += interpreter_extra
    out = {}
    for ex in dict.fromkeys(variants):
        cfg = MatmulConfig(ran.tree, ex)
        if cfg != ran:
            out[cfg.name] = functools.partial(fn, config=cfg)
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
    summary=(
        "batch-invariant GEMM (F.linear / a @ b): one reduction tree per (arch, dtype, N, K), "
        "its execution (split-K or walk, TMA) per M bucket"
    ),
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
            "torch_then_cast",
            bl.torch_then_cast,
            "issue 11's speed comparator: F.linear in the input dtype (cuBLAS, TF32 off), then a cast to "
            "the output dtype (bf16 router logits rounded to bf16 first); varies with M as cuBLAS does",
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
            timed=False,  # a config_equivalence control, not a production speed baseline
            config_control=True,
        ),
        Baseline(
            "other_chunk_k",
            bl.other_chunk_k,
            "config_equivalence's negative control on every lane: the table's execution with another "
            "chunk size (twice the table's chunk_k, or half of a single chunk): batch-invariant, another "
            "association of the chunk sums",
            expected_to_vary_on=ALL_LANES,
            timed=False,  # a config_equivalence control, not a production speed baseline
            config_control=True,
        ),
        Baseline(
            "two_k_slices",
            bl.two_k_slices,
            "config_equivalence's negative control on every lane: K always in two slices whose fp32 partials "
            "are added after (batch-invariant, another summation tree)",
            expected_to_vary_on=ALL_LANES,
            timed=False,  # a config_equivalence control, not a production speed baseline
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
            "the kernel's reduction tree: K in chunks (fast.matmul_config.reduction_tree, from arch, dtype, "
            "N, K), each summed from zero in increasing k, a group of G products at a time (G = 16, a "
            "tensor-core MMA's k-step, on GPUs; BLOCK_K under the interpreter), the chunk sums added in "
            "chunk order; each step errs by at most gamma_(G+2) (eps = 2**-23, truncating adders allowed) of "
            "|accumulator| + the group's sum |x w|, each chunk addition by eps of the running total.  Summed "
            "with the exact partial sums from fp64: gamma_(G+2) (sum_(c,g) |Q_(c,g)| + S) + eps sum_c |T_c| "
            "plus second-order terms, then the bias and output roundings.  The partial sums grow like "
            "sqrt(k) for random signs where S grows like k, so at K = 4096 this is a few % of the any-order "
            "bound: TF32 operands, a bf16 rounding of fp32 logits, 16-bit accumulation and a dropped "
            "product exceed it."
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
    bench_bytes=bench_bytes,
    bench_flops=bench_flops,
)
