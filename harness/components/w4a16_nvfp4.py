"""Registry entry ``w4a16_nvfp4``: a linear layer with bf16/fp16 activations and NVFP4 weights
(e2m1 codes, one e4m3 scale per 16 k, one fp32 global scale), on the **sm100 lane only**.

Status: the reference (:mod:`batchinv.reference.nvfp4`) and the kernel selection rule of vLLM
PR #62192 (:mod:`batchinv.fast.nvfp4_select`) are built and tested on CPU
(``tests/components/test_nvfp4.py``, ``tests/components/test_nvfp4_select.py``).  The fast kernel is future work: no
Blackwell machine has been lent, so :func:`batchinv.fast.w4a16_nvfp4.w4a16_nvfp4_matmul`
validates its input and raises ``NotBuiltError``.  Off sm100 the sweep reports the component
as "not run on this lane" and the pytest plugin skips its tests with that reason; on sm100
every check of ``fast`` is an ``error`` until the kernel exists (never a pass).

Negative control: ``flashinfer_cute_dsl_autotuned`` (sm100 only) describes the unpinned
production path, FlashInfer's CuTe-DSL W4A16 GEMM after autotune; it has no adapter yet and
raises ``NotBuiltError``, which the harness counts as an ``error``, never a detection, so it
cannot make anything pass.

Axes of a case: ``dtype`` of x, ``out`` dtype, ``n``, ``k``, ``rows``, ``bias``.  The weight is
drawn from a seed of the axes (without ``rows``), x from the case seed, as for ``matmul``.

Agreement: toleranced, :func:`batchinv.reference.nvfp4.tolerance_bound`: the kernel model is
``e2m1 * e4m3`` dequantized exactly into x's 16-bit dtype (at most 6 significant bits, inside
bf16's and fp16's normal range), exact 16-bit products accumulated in fp32 in any order (the
``matmul`` component's rigorous bound on ``(x, e2m1 * e4m3)``), the fp32 global scale applied
once to the fp32 accumulator, the bias added in fp32, one rounding to the output dtype.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from batchinv.fast import w4a16_nvfp4 as fast_nvfp4
from batchinv.fast.baselines import w4a16_nvfp4 as bl
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Baseline, Batch, Case, Component, ErrorCase, Outputs, Toleranced
from batchinv.reference import nvfp4 as ref_nvfp4
from batchinv.reference.errors import ArgumentError, DTypeError

NAME = "w4a16_nvfp4"
LANES: frozenset[Lane] = frozenset({Lane.SM100})

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _case(
    n: int, k: int, rows: int, *, dtype: str = "bf16", out: str | None = None, bias: bool = False
) -> Case:
    axes = {"dtype": dtype, "out": out or dtype, "n": n, "k": k, "rows": rows, "bias": bias}
    return Case(NAME, axes, 0)


def cases(lane: Lane) -> list[Case]:
    """The production shapes of the seed (vLLM PR #62192's W4A16 sweep: 4096x4096, 2688x4096,
    4608x2688) on GPU lanes; small shapes elsewhere (never swept off sm100, built by the CPU tests)."""
    if not lane.is_gpu:
        return [_case(48, 64, 9, bias=True), _case(32, 96, 8, dtype="fp16", out="fp32")]
    return [
        _case(4096, 4096, 2048),
        _case(2688, 4096, 2048),
        _case(4608, 2688, 2048, bias=True),
        _case(4096, 4096, 2048, dtype="fp16", out="fp32", bias=True),
    ]


def build(case: Case, device: torch.device) -> Batch:
    """Inputs of ``case``: an NVFP4 weight quantized (:func:`batchinv.reference.nvfp4.quantize_nvfp4`)
    from a normal draw scaled as a layer's init, from a seed of the axes; x from ``case.seed``."""
    a = case.axes
    dtype = DTYPES[a["dtype"]]
    n, k, rows = int(a["n"]), int(a["k"]), int(a["rows"])
    weight_seed = zlib.crc32(repr(sorted((key, a[key]) for key in a if key != "rows")).encode())
    wgen = torch.Generator().manual_seed(weight_seed)
    w = torch.randn((n, k), generator=wgen, dtype=torch.float64) / k**0.5
    packed, block_scales, global_scale = ref_nvfp4.quantize_nvfp4(w)
    bias = torch.randn(n, generator=wgen).to(dtype) if a["bias"] else None
    xgen = torch.Generator().manual_seed(case.seed)
    x = torch.randn((rows, k), generator=xgen).to(dtype)  # [M, K]
    shared: dict[str, Any] = {
        "packed": packed.to(device),
        "block_scales": block_scales.to(device),
        "global_scale": global_scale.to(device),
        "bias": bias.to(device) if bias is not None else None,
        "out_dtype": DTYPES[a["out"]],
    }
    return Batch({"x": x.to(device)}, shared)


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """:func:`batchinv.reference.nvfp4.tolerance_bound` on the batch's operands."""
    s = batch.shared
    return (
        ref_nvfp4.tolerance_bound(
            batch.rows["x"],
            s["packed"],
            s["block_scales"],
            s["global_scale"],
            s["bias"],
            out_dtype=s["out_dtype"],
            reference=reference[0],
        ),
    )


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs: each raises a typed error naming the argument (fast and reference alike)."""

    def t(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    def ok(n: int = 8, k: int = 32) -> dict[str, Any]:
        return {
            "packed": t(n, k // 2, dtype=torch.uint8),
            "block_scales": t(n, k // 16, dtype=torch.float8_e4m3fn),
            "global_scale": torch.ones((), dtype=torch.float32, device=device),
        }

    return [
        ErrorCase("k_odd", {"x": t(4, 31), **ok()}, ArgumentError, "'x'.*even K"),
        ErrorCase("k_not_multiple_of_16", {"x": t(4, 24), **ok(k=24)}, ArgumentError, "'x'.*multiple of 16"),
        ErrorCase("k_mismatch", {"x": t(4, 64), **ok()}, ArgumentError, "'packed'.*K/2 = 32"),
        ErrorCase(
            "packed_k_not_multiple_of_16",
            {"x": t(4, 32), **ok(), "packed": t(8, 12, dtype=torch.uint8)},
            ArgumentError,
            "'packed'.*multiple of 16",
        ),
        ErrorCase("x_fp32", {"x": t(4, 32, dtype=torch.float32), **ok()}, DTypeError, "'x'.*float32"),
        ErrorCase(
            "packed_not_uint8",
            {"x": t(4, 32), **ok(), "packed": t(8, 16, dtype=torch.int8)},
            DTypeError,
            "'packed'",
        ),
        ErrorCase(
            "block_scales_dtype",
            {"x": t(4, 32), **ok(), "block_scales": t(8, 2, dtype=torch.float16)},
            DTypeError,
            "'block_scales'.*float8_e4m3fn",
        ),
        ErrorCase(
            "block_scales_shape",
            {"x": t(4, 32), **ok(), "block_scales": t(8, 3, dtype=torch.float8_e4m3fn)},
            ArgumentError,
            r"'block_scales'.*\[8, 2\]",
        ),
        ErrorCase(
            "global_scale_dtype",
            {"x": t(4, 32), **ok(), "global_scale": t(1, dtype=torch.float64)},
            DTypeError,
            "'global_scale'",
        ),
        ErrorCase(
            "global_scale_not_scalar",
            {"x": t(4, 32), **ok(), "global_scale": t(2, dtype=torch.float32)},
            ArgumentError,
            "'global_scale'.*scalar",
        ),
        ErrorCase(
            "global_scale_zero",
            {"x": t(4, 32), **ok(), "global_scale": t(1, dtype=torch.float32)},
            ArgumentError,
            "'global_scale'.*> 0",
        ),
        ErrorCase("bias_shape", {"x": t(4, 32), **ok(), "bias": t(7)}, ArgumentError, r"'bias'.*\[8\]"),
        ErrorCase(
            "out_dtype_fp16_from_bf16",
            {"x": t(4, 32), **ok(), "out_dtype": torch.float16},
            DTypeError,
            "'out_dtype'",
        ),
    ]


COMPONENT = Component(
    name=NAME,
    summary=(
        "W4A16 NVFP4 linear (bf16/fp16 x, e2m1 weights, e4m3 block scales per 16 k, fp32 global scale); "
        "sm100 only: fast kernel future work"
    ),
    reference=ref_nvfp4.w4a16_nvfp4_matmul,
    fast=fast_nvfp4.w4a16_nvfp4_matmul,
    baselines=(
        Baseline(
            "flashinfer_cute_dsl_autotuned",
            bl.flashinfer_cute_dsl_autotuned,
            "FlashInfer CuTe-DSL W4A16 NVFP4 GEMM after autotune: a tactic per M bucket; not run: no sm100 "
            "machine, no adapter (raises NotBuiltError: an error, never a detection)",
            expected_to_vary_on=LANES,
            lanes=LANES,
            timed=False,  # nothing to time until the adapter exists
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "fp32 accumulation cannot equal the fp64 reference. Kernel model: e2m1 * e4m3 dequantized exactly "
        "into x's 16-bit dtype (<= 6 significant bits, magnitudes in [2**-10, 2688]), exact 16-bit products "
        "summed in fp32 in any order: gamma_K * (|x| @ |e2m1 * e4m3|) + K * 2**-126 (matmul's rigorous "
        "bound), times the fp32 global scale applied once to the accumulator (+ 2**-24 of the scaled value "
        "+ 2**-149), plus the fp32 bias add (2**-24 * |ref|) and one rounding to the output dtype (unit "
        "roundoff * |ref| + half its smallest subnormal; none for fp32). |x| @ |v| and |ref| from fp64.",
        out_dtypes=lambda batch: (batch.shared["out_dtype"] or batch.rows["x"].dtype,),
    ),
    lanes=LANES,
    dtypes=(torch.bfloat16, torch.float16),
    error_cases=error_cases,
)
