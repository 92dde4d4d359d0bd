"""Registry entry ``fp8_gemm``: the batch-invariant FP8 scaled GEMM (issue 12).

Axes of a case: ``scales`` (the scale layout: ``tensor``, ``token``, ``block``), ``out`` dtype
(bf16, or fp32 for router-like uses), ``n``, ``k``, ``rows`` (the full batch; the M sweep takes
prefixes of it), ``bias`` (bf16), and ``values``: ``normal`` (random e4m3 values across its range, random
fp32 scales), ``special`` (e4m3 bit patterns injected sparsely into x: NaN, +-0, subnormals, +-448),
``exact`` (small integers and power-of-two scales, so every product, partial sum and scaled
total is exact in fp32 and in the Hopper tensor core's 13-bit accumulator).

Agreement: bitwise where the result is one rounding of an exactly computed value
(:func:`exact`: every element of the ``exact`` cases), elsewhere within the kernel-order bound
:func:`batchinv.reference.fp8_gemm.tight_bound` (judged), never above the any-order
:func:`batchinv.reference.fp8_gemm.tolerance_bound` (a hard limit).

The weight, its scales, the bias and (tensor layout) the activation scale are drawn from a seed
of the axes, not the case seed: the position driver's neighbour batch shares them, as the rows of
a real batch share a layer.  Row scales (token and block layouts) are row tensors: they travel
with their rows through every check.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from batchinv.fast import fp8_gemm as fast_fp8
from batchinv.fast import matmul as fast_matmul
from batchinv.fast.baselines import fp8_gemm as bl
from batchinv.fast.device import arch
from batchinv.fast.matmul_config import Execution, MatmulConfig, ReductionTree, executions
from batchinv.harness.bitpatterns import catalogue, inject
from batchinv.harness.components.matmul import execution_configs
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
from batchinv.reference import fp8_gemm as ref
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.exact import quantum_exponent
from batchinv.reference.matmul import FP32_EPS

NAME = "fp8_gemm"
FP8 = torch.float8_e4m3fn
OUT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Special e4m3 values injected into x for ``values="special"`` (the whole catalogue: e4m3fn
#: has no infinity, and 448 * 448 * K stays far inside fp32).
SPECIAL_DENSITY = 0.003
#: ``exact`` operands: integers in [-7, 7] (products <= 49: a 32-product group stays below
#: 2**11, a 128-product one below 2**13, and K = 7168 below 2**19) and power-of-two scales.
EXACT_INT = 7
#: 2**128: fp32 values (and exact sums of multiples of 2**q below 2**(q + 24)) stay finite below it.
FP32_OVERFLOW = 2.0**128


def _case(
    n: int,
    k: int,
    rows: int,
    *,
    scales: str = "tensor",
    out: str = "bf16",
    bias: bool = False,
    values: str = "normal",
    seed: int = 0,
) -> Case:
    axes = {"scales": scales, "out": out, "n": n, "k": k, "rows": rows, "bias": bias, "values": values}
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> list[Case]:
    """Small cases in the interpreter (K across partial 128-blocks, N across partial weight
    blocks); the issue's production shapes on GPU lanes."""
    if not lane.is_gpu:
        return [
            # fp32 out: the negative controls' other associations show (bf16 hides most of them)
            _case(64, 200, 40, scales="tensor", out="fp32", bias=True),  # K: a block and a partial one
            _case(48, 160, 33, scales="token", out="fp32", bias=True, values="exact"),  # router-like, bitwise
            _case(136, 264, 24, scales="block", bias=True, values="special"),  # 2 N blocks, 3 K blocks
            _case(64, 288, 17, scales="block", values="exact"),  # bitwise
        ]
    return [
        _case(4096, 4096, 4096, scales="tensor"),  # the seed's shape; FlashInfer's bmm_fp8 takes it
        _case(2688, 4096, 2048, scales="token"),
        _case(4608, 2688, 2048, scales="tensor", values="special"),  # K = 21 blocks of 128
        _case(7168, 2048, 2048, scales="block"),  # DeepSeek-V3 style
        _case(14336, 4096, 1024, scales="token", bias=True),
        _case(256, 7168, 2048, scales="token", out="fp32"),  # router-like
        _case(4096, 4096, 1024, scales="block", values="exact"),
        _case(2688, 4096, 512, scales="tensor", bias=True, values="exact"),
    ]


#: ``batchinv bench fp8_gemm``: issue 12's table, (N, K, scale layout), M per point.
BENCH_M: tuple[int, ...] = (1, 8, 32, 128, 512, 2048)
BENCH_SHAPES: tuple[tuple[int, int, str], ...] = (
    (4096, 4096, "tensor"),
    (2688, 4096, "tensor"),
    (4608, 2688, "tensor"),
    (14336, 4096, "tensor"),
    (4096, 4096, "token"),
    (7168, 2048, "block"),
)


def bench_cases(lane: Lane) -> list[Case]:
    """One case per (shape, M): ``rows`` is the M being timed."""
    if not lane.is_gpu:
        return [_case(n, k, m, scales=s) for n, k, s in BENCH_SHAPES[:1] for m in (1, 32)]
    return [_case(n, k, m, scales=s) for n, k, s in BENCH_SHAPES for m in BENCH_M]


def bench_bytes(batch: Batch) -> int:
    """The fewest bytes a call moves: x, the weight, the scales and the bias read once, the
    output written once (the decode floor is the weight's bytes)."""
    x, s = batch.rows["x"], batch.shared
    out_size = torch.finfo(s["out_dtype"]).bits // 8
    m, n = x.shape[0], s["weight"].shape[0]
    tensors = [x, s["weight"], _x_scale(batch), s["weight_scale"], s["bias"]]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None) + m * n * out_size


def bench_flops(batch: Batch) -> int:
    """``2 M N K`` FP8 flops in bf16 tensor-core flops: the FP8 rate is twice the bf16 rate."""
    x, w = batch.rows["x"], batch.shared["weight"]
    return x.shape[0] * w.numel()


def _x_scale(batch: Batch) -> torch.Tensor:
    return batch.rows["x_scale"] if "x_scale" in batch.rows else batch.shared["x_scale"]


def _pow2(
    exponent_low: int, exponent_high: int, shape: tuple[int, ...], gen: torch.Generator
) -> torch.Tensor:
    e = torch.randint(exponent_low, exponent_high + 1, shape, generator=gen)
    return torch.ldexp(torch.ones(shape), e).to(torch.float32)


def _wide(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """A power of two per element, 2**-6 .. 2**6 (then times a normal draw: |values| from e4m3's
    subnormals to about 2**8)."""
    return torch.ldexp(torch.ones(rows, cols), torch.randint(-6, 7, (rows, cols), generator=gen))


def build(case: Case, device: torch.device) -> Batch:
    """Inputs of ``case``: x and its row scales from ``case.seed``; the weight, its scales, the
    bias and a tensor-layout x scale from a seed of the axes (shared by every batch of them)."""
    a = case.axes
    n, k, rows, layout = int(a["n"]), int(a["k"]), int(a["rows"]), str(a["scales"])
    weight_seed = zlib.crc32(repr(sorted((key, a[key]) for key in a if key != "rows")).encode())
    wgen = torch.Generator().manual_seed(weight_seed)
    xgen = torch.Generator().manual_seed(case.seed)
    xs_shape, ws_shape = ref.scale_shapes(layout, rows, n, k)
    xs_shape = xs_shape or (1,)
    ws_shape = ws_shape or (1,)
    row_scales = layout != "tensor"
    if a["values"] == "exact":
        x = torch.randint(-EXACT_INT, EXACT_INT + 1, (rows, k), generator=xgen).to(FP8)
        weight = torch.randint(-EXACT_INT, EXACT_INT + 1, (n, k), generator=wgen).to(FP8)
        x_scale = _pow2(-8, -6, xs_shape, xgen if row_scales else wgen)
        weight_scale = _pow2(-7, -5, ws_shape, wgen)
        # in the products' smallest unit (2**-15), 8 bits: exact in bf16 and in the fp32 total
        bias = torch.randint(-127, 128, (n,), generator=wgen).double() * 2.0**-15 if a["bias"] else None
    else:
        # e4m3 values over most of its range (a random power of two per element): the products'
        # sums then need more than fp32's 24 bits, so another association shows in the bits
        # (with values of one binade the fp32 sums of e4m3 products are exact in any order).
        x = (torch.randn((rows, k), generator=xgen) * _wide(rows, k, xgen)).to(FP8)
        weight = (torch.randn((n, k), generator=wgen) * _wide(n, k, wgen)).to(FP8)
        x_scale = (torch.rand(xs_shape, generator=xgen if row_scales else wgen) + 0.5) * 2.0**-4
        weight_scale = (torch.rand(ws_shape, generator=wgen) + 0.5) * 2.0**-4 / k**0.5
        bias = torch.randn(n, generator=wgen) if a["bias"] else None
    if a["values"] == "special":
        x = inject(x, catalogue(FP8), SPECIAL_DENSITY, xgen)
    shared: dict[str, Any] = {
        "weight": weight.to(device),
        "weight_scale": weight_scale.to(device),
        "bias": bias.to(torch.bfloat16).to(device) if bias is not None else None,
        "scale_layout": layout,
        "out_dtype": OUT_DTYPES[a["out"]],
    }
    row_tensors = {"x": x.to(device)}
    if row_scales:
        row_tensors["x_scale"] = x_scale.to(device)
    else:
        shared["x_scale"] = x_scale.to(device)
    return Batch(row_tensors, shared)


def _operands(batch: Batch) -> dict[str, Any]:
    s = batch.shared
    return {
        "x": batch.rows["x"],
        "weight": s["weight"],
        "x_scale": _x_scale(batch),
        "weight_scale": s["weight_scale"],
        "bias": s["bias"],
        "scale_layout": s["scale_layout"],
        "out_dtype": s["out_dtype"],
    }


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """:func:`batchinv.reference.fp8_gemm.tolerance_bound`, the any-order hard limit."""
    return (ref.tolerance_bound(**_operands(batch), reference=reference[0]),)


def tight(batch: Batch, reference: Outputs) -> Outputs:
    """:func:`batchinv.reference.fp8_gemm.tight_bound` for the kernel's accumulation on this lane
    (the tree's promotion interval at 2**-13 on a GPU; a K tile at fp32 under the interpreter)."""
    x, w = batch.rows["x"], batch.shared["weight"]
    group, group_eps = fast_fp8.accumulation(w.shape[0], x.shape[1], batch.shared["scale_layout"], x.device)
    return (ref.tight_bound(**_operands(batch), reference=reference[0], group=group, group_eps=group_eps),)


def _is_power_of_two(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: a positive power of two (its lowest set bit is its highest)."""
    _, e = torch.frexp(t)
    return (t > 0) & torch.isfinite(t) & (quantum_exponent(t) == (e.to(torch.float64) - 1.0))


def exact(batch: Batch, reference: Outputs) -> Outputs:
    """The elements the kernel computes exactly (a bool [M, N]): every scale of the row and of
    the column a power of two (so each scale product and each scaling is exact), every scale
    product at least 2**-126, and, with 2**q dividing every dequantized product and the bias and
    2**q_p every unscaled e4m3 product: the scaled total ``sum |x_d w_d| + |bias| < 2**(q + 24)``
    (fp32 holds every scaled partial total), the unscaled ``sum |x w| < 2**(q_p + 24)`` (and every
    unscaled accumulator) and ``G * max|x| * max|w| < 2**(q_p + b)`` for the lane's accumulation group G
    summed in b significant bits (14 in the Hopper tensor core's accumulator, 24 under the
    interpreter).  Every scale product and that scaled total below 2**128 (no fp32 step of the
    scaling overflows: ``fl(A * inf)`` or ``inf - inf`` would make a NaN of an exact value).
    There the fp64 reference is exact and the output is its one rounding."""
    ops = _operands(batch)
    x, w, layout = ops["x"], ops["weight"], ops["scale_layout"]
    ref_out = reference[0]
    dev = ref_out.device
    m, k = x.shape
    n = w.shape[0]
    xsk = ref.x_scales(ops["x_scale"].to(dev), layout, m, k)
    wsk = ref.weight_scales(ops["weight_scale"].to(dev), layout, n, k)
    pow2 = _is_power_of_two(xsk).all(dim=1)[:, None] & _is_power_of_two(wsk).all(dim=1)[None, :]
    min_scale = xsk.amin(dim=1)[:, None] * wsk.amin(dim=1)[None, :]
    max_scale = xsk.amax(dim=1)[:, None] * wsk.amax(dim=1)[None, :]
    xd, wd = ref.dequantize(x.to(dev), w.to(dev), ops["x_scale"].to(dev), ops["weight_scale"].to(dev), layout)
    q = quantum_exponent(xd).amin(dim=1)[:, None] + quantum_exponent(wd).amin(dim=1)[None, :]
    # The tensor core and the fp32 accumulators sum the unscaled e4m3 products.
    xu, wu = x.to(dev, torch.float64), w.to(dev, torch.float64)
    q_products = quantum_exponent(xu).amin(dim=1)[:, None] + quantum_exponent(wu).amin(dim=1)[None, :]
    unscaled_total = xu.abs() @ wu.abs().T
    total = xd.abs() @ wd.abs().T
    if ops["bias"] is not None:
        b = ops["bias"].to(dev, torch.float64)
        q = torch.minimum(q, quantum_exponent(b)[None, :])
        total = total + b.abs()[None, :]
    group, group_eps = fast_fp8.accumulation(n, k, layout, x.device)
    bits = 24.0 if group_eps <= FP32_EPS else 14.0
    group_max = group * xu.abs().amax(dim=1)[:, None] * wu.abs().amax(dim=1)[None, :]
    qp = torch.clamp(q_products, min=-1000.0, max=1000.0)
    qc = torch.clamp(q, min=-1000.0, max=1000.0)
    fits = (
        (total * (1.0 + 2.0**-40) < torch.exp2(qc + 24.0))
        & (group_max * (1.0 + 2.0**-40) < torch.exp2(qp + bits))
        & (unscaled_total * (1.0 + 2.0**-40) < torch.exp2(qp + 24.0))
        & (q >= -126.0)
        & torch.isfinite(q)
        & pow2
        & (min_scale >= 2.0**-126)
        & (max_scale < FP32_OVERFLOW)
        & (total < FP32_OVERFLOW)
    )
    return (fits & torch.isfinite(ref_out),)


def configs(batch: Batch, lane: Lane) -> dict[str, Any]:
    """Every execution the launcher may choose for the batch's (arch, N) at any M besides the
    one it ran (all walks), plus on GPU lanes each with the other warps count and one stage
    fewer, and under the interpreter odd tiles and TMA reads.  Always the table's tree."""
    x, weight = batch.rows["x"], batch.shared["weight"]
    layout = batch.shared["scale_layout"]
    m, k = x.shape
    n = weight.shape[0]
    ran = fast_matmul.plan(m, n, k, FP8, x.device, scale_layout=layout).config
    key = arch(x.device if lane.is_gpu else None)
    interpreter_extra = [Execution(32, 128, group_m=1), Execution(16, 32, tma=True)]
    return execution_configs(ran, executions(key, FP8, n), lane, interpreter_extra, fast_fp8.fp8_gemm)


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs: each raises a typed error naming the argument (fast and reference alike)."""

    def t(*shape: int, dtype: torch.dtype = FP8, dev: torch.device | str = device) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=dev)

    def s(*shape: int) -> torch.Tensor:
        return torch.ones(shape, dtype=torch.float32, device=device)

    ok = {"x": t(4, 256), "weight": t(16, 256), "x_scale": s(1), "weight_scale": s(1)}
    return [
        ErrorCase("x_bf16", {**ok, "x": t(4, 256, dtype=torch.bfloat16)}, DTypeError, "'x'.*float8"),
        ErrorCase(
            "weight_e5m2", {**ok, "weight": t(16, 256, dtype=torch.float8_e5m2)}, DTypeError, "'weight'"
        ),
        ErrorCase("k_mismatch", {**ok, "weight": t(16, 128)}, ArgumentError, "'weight'.*K = 256"),
        ErrorCase("x_not_2d", {**ok, "x": t(2, 4, 256)}, ArgumentError, "'x'"),
        ErrorCase("layout_unknown", {**ok, "scale_layout": "channel"}, ArgumentError, "'scale_layout'"),
        ErrorCase("tensor_scale_two", {**ok, "x_scale": s(2)}, ArgumentError, "'x_scale'.*one element"),
        ErrorCase(
            "token_scale_shape",
            {**ok, "x_scale": s(4), "weight_scale": s(16, 1), "scale_layout": "token"},
            ArgumentError,
            r"'x_scale'.*\[4, 1\]",
        ),
        ErrorCase(
            "block_weight_scale_shape",
            {**ok, "x_scale": s(4, 2), "weight_scale": s(1, 1), "scale_layout": "block"},
            ArgumentError,
            r"'weight_scale'.*\[1, 2\]",
        ),
        ErrorCase(
            "scale_bf16",
            {**ok, "x_scale": torch.ones(1, dtype=torch.bfloat16, device=device)},
            DTypeError,
            "'x_scale'",
        ),
        ErrorCase("bias_shape", {**ok, "bias": torch.zeros(15, device=device)}, ArgumentError, "'bias'.*16"),
        ErrorCase(
            "bias_fp16",
            {**ok, "bias": torch.zeros(16, dtype=torch.float16, device=device)},
            DTypeError,
            "'bias'",
        ),
        ErrorCase("out_fp16", {**ok, "out_dtype": torch.float16}, DTypeError, "'out_dtype'"),
        ErrorCase("weight_on_meta", {**ok, "weight": t(16, 256, dev="meta")}, DeviceError, "'weight'"),
        ErrorCase(
            "x_negative_bit",
            {**ok, "x": torch._neg_view(t(4, 256))},
            ArgumentError,
            "'x'.*negative bit",
        ),
        ErrorCase(
            "block_config_other_chunks",
            {
                **ok,
                "x_scale": s(4, 2),
                "weight_scale": s(1, 2),
                "scale_layout": "block",
                "config": MatmulConfig(ReductionTree(32, 64), Execution(16, 64)),
            },
            ArgumentError,
            "'config'.*chunk_k = 128",
            applies_to=("fast",),
        ),
        ErrorCase(
            "split_config",
            {**ok, "config": MatmulConfig(ref_tree(), Execution(16, 64, split_k=True))},
            ArgumentError,
            "'config'.*walk",
            applies_to=("fast",),
        ),
    ]


def ref_tree() -> Any:
    """A valid reduction tree for the split-config error case."""
    return ReductionTree(32, 1 << 30)


def _strategy(lane: Lane, device: torch.device) -> Any:
    """Hypothesis strategy of small batches (shapes, layouts, bias, out dtype, values, seed)."""
    from hypothesis import strategies as st

    @st.composite
    def batches(draw: Any) -> Batch:
        case = _case(
            draw(st.integers(1, 160)),
            draw(st.integers(1, 300)),
            draw(st.integers(1, 24)),
            scales=draw(st.sampled_from(list(ref.SCALE_LAYOUTS))),
            out=draw(st.sampled_from(list(OUT_DTYPES))),
            bias=draw(st.booleans()),
            values=draw(st.sampled_from(["normal", "special", "exact"])),
            seed=draw(st.integers(0, 2**31 - 1)),
        )
        return build(case, device)

    return batches()


COMPONENT = Component(
    name=NAME,
    summary=(
        "batch-invariant FP8 (e4m3) scaled GEMM: per-tensor, per-token x per-channel and 1x128 / 128x128 "
        "block scales; the matmul's tree with fp32 promotion of the tensor core's sums"
    ),
    reference=ref.fp8_gemm,
    fast=fast_fp8.fp8_gemm,
    baselines=(
        Baseline(
            "torch_scaled_mm",
            bl.torch_scaled_mm,
            "torch._scaled_mm (cuBLASLt FP8, no fast accumulation): the library picks its kernel per M; "
            "issue 12's speed comparator",
            expected_to_vary_on=frozenset(),
            lanes=GPU_LANES,
        ),
        Baseline(
            "split_k_small_m",
            bl.split_k_small_m,
            "the pinned kernel with split-K at M <= 16 (K in two halves added in fp32 after): a production "
            "split-K heuristic for small batches",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "block_k_by_m",
            bl.block_k_by_m,
            "the pinned kernel with BLOCK_K halved at M <= 16 (a config table keyed on M): another grouping "
            "of each K step's sum under the interpreter, shorter 13-bit tensor-core sums on a GPU (detected on "
            "the H200, run 36)",
            expected_to_vary_on=ALL_LANES,
            timed=False,
        ),
        Baseline(
            "other_accumulation_group",
            bl.other_accumulation_group,
            "config_equivalence's negative control: the table's execution with another accumulation group "
            "(an fp32 promotion every 32 products, one wgmma k-step, instead of the tree's 128 on a GPU; "
            "half the K step under the interpreter): batch-invariant, other bits",
            expected_to_vary_on=ALL_LANES,
            timed=False,
            config_control=True,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "the kernel sums exact FP8 products in fp32 with the tensor core's partial sums (13-bit, "
        "truncating, at most 128 products) promoted in between, then applies fp32 scales and rounds once: "
        "per element gamma_136(2**-13) + gamma_(K+KB+2)(2**-23) of sum |x_d w_d|, plus underflow, the "
        "bias add and the output rounding (reference.fp8_gemm.tolerance_bound).",
        out_dtypes=lambda batch: (batch.shared["out_dtype"],),
        tight_bound=tight,
        tight_justification=(
            "the kernel's order (reference.fp8_gemm.tight_bound): groups of G products (the tree's promote_k "
            "on a GPU, a K tile under the interpreter) summed from zero at gamma_n (n = 34 G/32 at 2**-13 on a GPU, G + 2 at "
            "2**-23 interpreted) of their absolute sum, each added to the fp32 accumulator at 2**-23 of the "
            "new partial sum (which grows like sqrt(k) on random signs), per 128-wide block for block scales; "
            "the two fp32 multiplications of the scaling, the block totals' additions, the bias and one "
            "rounding.  A kernel that never promotes (the whole K in the tensor core's 13 bits) or rounds "
            "to bf16 in between exceeds it on the exact cases' bits first."
        ),
        exact=exact,
        exact_justification=(
            "with power-of-two scales, every dequantized product a multiple of 2**q, the scaled total below "
            "2**(q + 24) and each tensor-core group below 2**(q + 14), no addition or scaling rounds: the "
            "output is the exact value rounded once (the exact cases are built so for every element)."
        ),
    ),
    lanes=ALL_LANES,
    dtypes=(FP8,),
    error_cases=error_cases,
    partition_arg="num_sms",
    strategy=_strategy,
    bench_cases=bench_cases,
    configs=configs,
    bench_bytes=bench_bytes,
    bench_flops=bench_flops,
)
