"""Unpinned W4A16 NVFP4 paths: the negative controls of ``w4a16_nvfp4`` (sm100 only): not built.

* ``flashinfer_cute_dsl_autotuned``: FlashInfer's CuTe-DSL W4A16 NVFP4 GEMM (vLLM's
  ``FlashInferCuteDslNvFp4W4A16LinearKernel``) after autotune.  The tuner picks a tactic per M
  bucket, so different batch sizes may run different tile schedules -- the failure class vLLM
  PR #62192 measured for FlashInfer's FP8 bmm after autotune (its W4A16 sweep, without
  autotune, found 0 rows differing).  No adapter exists and no sm100 machine has run it: the
  callable raises :class:`~batchinv.reference.errors.NotBuiltError`.  A crash is an ``error``,
  never a detection, so this control cannot make anything pass.
"""

from __future__ import annotations

import torch

from batchinv.reference.errors import NotBuiltError
from batchinv.reference.nvfp4 import validate


def flashinfer_cute_dsl_autotuned(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """FlashInfer CuTe-DSL W4A16 NVFP4 GEMM after autotune (the component's signature): not built.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        Bad input, as the reference.
    NotBuiltError
        Always, for valid input: the FlashInfer adapter is not written (needs sm100 and flashinfer).
    """
    validate(x, packed, block_scales, global_scale, bias, out_dtype)
    raise NotBuiltError(
        "the flashinfer_cute_dsl_autotuned baseline of w4a16_nvfp4",
        "no adapter to FlashInfer's CuTe-DSL W4A16 NVFP4 GEMM is written and no sm100 machine has run it",
    )
