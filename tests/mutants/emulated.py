"""Precision downgrades of the matmul, emulated in torch (any lane, the interpreter included).

Each one is what a kernel that silently computes in lower precision returns:

* :func:`tf32_operands`: fp32 operands rounded to TF32 (10 mantissa bits, to nearest even) and
  then the shipped kernel: a kernel running its dots with ``input_precision="tf32"``;
* :func:`bf16_logits`: the shipped kernel's fp32 output rounded through bf16 (router logits
  stored in bf16 somewhere on the way);
* :func:`low_precision_accumulation`: the accumulator kept in 16 bits (fp16 for fp16 inputs,
  bf16 otherwise), rounded after every group of 16 products (one tensor-core MMA k-step, each
  group's sum formed in fp32), the way an fp16-accumulating GEMM mode works.
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.fast import matmul as matmul_launcher
from batchinv.reference.matmul import validate, weight_kn

#: Products per accumulation step of :func:`low_precision_accumulation`.
GROUP = 16


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 ``t`` rounded to 10 mantissa bits (TF32), to nearest, ties to even; inf and NaN kept."""
    bits = t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(torch.float32)
    return torch.where(torch.isfinite(t), rounded.view(t.shape), t)


def tf32_operands(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, **kw: Any) -> Any:
    if x.dtype == torch.float32:
        x, weight = round_to_tf32(x), round_to_tf32(weight)
    return matmul_launcher.matmul(x, weight, bias, **kw)


def bf16_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, **kw: Any) -> Any:
    out = matmul_launcher.matmul(x, weight, bias, **kw)
    return out.to(torch.bfloat16).to(torch.float32) if out.dtype == torch.float32 else out


def low_precision_accumulation(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    config: Any = None,
) -> torch.Tensor:
    del num_sms, config  # no grid here: every row is computed alike
    args = validate(x, weight, bias, layout, out_dtype, precision)
    acc_dtype = torch.float16 if x.dtype == torch.float16 else torch.bfloat16
    w = weight_kn(weight, layout).to(torch.float64)  # [K, N]
    x64 = x.to(torch.float64)  # [M, K]
    acc = torch.zeros(args.m, args.n, dtype=torch.float32, device=x.device)
    for start in range(0, args.k, GROUP):
        step = (x64[:, start : start + GROUP] @ w[start : start + GROUP]).to(torch.float32)
        acc = (acc + step).to(acc_dtype).to(torch.float32)  # the accumulator in 16 bits
    if bias is not None:
        acc = acc + bias.to(torch.float32)[None, :]
    result = acc.to(args.out_dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result
