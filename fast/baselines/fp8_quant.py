"""Unpinned FP8 quantization paths, run as negative controls beside the fast kernel.

* :func:`fp8_quant_per_tensor_dynamic` -- per-tensor dynamic quantization, the torch composite
  of vLLM's ``scaled_fp8_quant(x)`` without a scale (and of ``torch.ao``'s dynamic per-tensor
  fp8 path): one scale from the amax of the *whole batch*, ``scale = amax / 448``,
  ``q = (x / scale).clamp(-448, 448).to(float8_e4m3fn)``.  A token's scale, and so its q,
  depends on every other token of the launch: the public failure class of a dynamic fp8 scale
  computed over the whole batch (docs/DESIGN.md, "Failure classes").  batch_prefix and position
  catch it on every lane (the cases draw each row's magnitude across many powers of two).  The
  scale is returned in the component's shape ([M, 1] or [M, NG], the one value repeated) so that
  the harness compares like with like.
"""

from __future__ import annotations

import torch

from batchinv.reference.fp8_quant import E4M3_MAX, MIN_AMAX, check_fp8_quant_args, num_groups


def fp8_quant_per_tensor_dynamic(
    x: torch.Tensor, *, group_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor (amax over every finite element of the batch), in torch.

    Same signature and output shapes as :func:`batchinv.fast.fp8_quant.fp8_quant`; ``scale``
    holds the one per-tensor scale in every entry.
    """
    group_size = check_fp8_quant_args(x, group_size)
    m, k = x.shape
    xf = x.to(torch.float32)
    finite = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    amax = finite.amax() if xf.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    scale = torch.clamp(amax, min=MIN_AMAX) / E4M3_MAX  # 0-d fp32
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale.expand(m, num_groups(k, group_size)).contiguous()
