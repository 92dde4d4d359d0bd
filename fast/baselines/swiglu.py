"""Unpinned SwiGLU paths, run as negative controls beside the fast kernel.

* :func:`swiglu_bf16_above_32_rows` -- a per-M config table: at more than 32 rows the launcher
  switches to a variant that rounds silu(g) to bf16 before the product (the precision of the
  unfused ``F.silu(gate) * up``), as an M-bucketed config that trades precision for bandwidth
  would.  The bits of a row then depend on the batch size (batch_prefix catches it on every
  lane).  The unfused torch path itself is a precision difference, not a batch dependence
  (elementwise torch kernels are row-local): ``tests/components/test_swiglu.py`` shows the tight bound
  rejects it, and a mutant plants it in the kernel.
"""

from __future__ import annotations

import torch

from batchinv.fast.swiglu import swiglu

#: Rows above which the baseline switches to its bf16-intermediate variant.
BF16_ABOVE_ROWS = 32


def swiglu_bf16_above_32_rows(gate_up: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`batchinv.fast.swiglu.swiglu`, with silu rounded to bf16 when M > 32."""
    return swiglu(gate_up, scale, silu_bf16=gate_up.shape[0] > BF16_ABOVE_ROWS)
