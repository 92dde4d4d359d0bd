"""W4A16 NVFP4 linear (bf16/fp16 activations, NVFP4 weights) for the sm100 lane: not built.

The pinned kernel is future work (issue 12): no Blackwell machine has been lent to the
project, so nothing here could be run, measured or held to the component's bound.  What is
built and tested on CPU: the reference (:mod:`batchinv.reference.nvfp4`) and the kernel
selection rule of vLLM PR #62192 (:mod:`batchinv.fast.nvfp4_select`).

:func:`w4a16_nvfp4_matmul` has the component's signature, validates its arguments like the
reference (bad input raises the same typed error) and then raises
:class:`~batchinv.reference.errors.NotBuiltError`: never a silent fallback to the reference,
which would make every check compare the reference with itself.
"""

from __future__ import annotations

import torch

from batchinv.reference.errors import NotBuiltError
from batchinv.reference.nvfp4 import validate

#: Why the fast kernel does not exist yet (the text of its NotBuiltError).
NOT_BUILT_WHY = (
    "no sm100 (Blackwell) machine has been lent to the project; the pinned W4A16 NVFP4 kernel "
    "is future work (issue 12). The reference and the kernel selection logic are tested on CPU"
)


def w4a16_nvfp4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The fast W4A16 NVFP4 linear ``x @ dequantize(W).T (+ bias)``: not built.

    Shapes and dtypes as :func:`batchinv.reference.nvfp4.w4a16_nvfp4_matmul` (``x [M, K]``
    bf16/fp16, ``packed [N, K/2]`` uint8, ``block_scales [N, K/16]`` float8_e4m3fn,
    ``global_scale`` fp32 scalar; output ``[M, N]`` of ``out_dtype``).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        Bad input, as the reference (:func:`batchinv.reference.nvfp4.validate`).
    NotBuiltError
        Always, for valid input: the kernel does not exist yet.
    """
    validate(x, packed, block_scales, global_scale, bias, out_dtype)
    raise NotBuiltError("the w4a16_nvfp4 fast kernel (sm100)", NOT_BUILT_WHY)
