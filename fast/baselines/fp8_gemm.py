"""Unpinned FP8 GEMM paths, run as negative controls beside the pinned kernel.

* :func:`torch_scaled_mm` -- ``torch._scaled_mm`` (cuBLASLt FP8 GEMM, the production default in
  PyTorch and vLLM's fallback), whose heuristics pick the kernel per M; the speed comparator.
* :func:`block_k_by_m` -- the pinned kernel with a per-M-bucket BLOCK_K (half of it at
  M <= :data:`SMALL_M`), as a table keyed on M would choose.
* :func:`split_k_small_m` -- the pinned kernel with split-K at M <= :data:`SMALL_M`: K in two
  halves (at a 128 boundary) whose fp32 results are added after, as production split-K
  heuristics do for small batches.
* :func:`other_accumulation_group` -- batch-invariant, but another accumulation group than the
  table's (a promotion every 32 products on a GPU, half the K step under the interpreter):
  the negative control of ``config_equivalence``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from batchinv.fast.matmul_config import MatmulConfig, ReductionTree
from batchinv.reference.errors import Unsupported
from batchinv.reference.fp8_gemm import SCALE_BLOCK, blocks, validate

#: Batches of at most this many rows take the small-M bucket of the M-keyed baselines.
SMALL_M = 16


def _pinned(**kwargs: object) -> torch.Tensor:
    from batchinv.fast.fp8_gemm import fp8_gemm

    return fp8_gemm(**kwargs)  # type: ignore[arg-type]


def _table_config(x: torch.Tensor, weight: torch.Tensor, scale_layout: str) -> MatmulConfig:
    from batchinv.fast.matmul import plan

    return plan(x.shape[0], weight.shape[0], x.shape[1], x.dtype, x.device, scale_layout=scale_layout).config


def torch_scaled_mm(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``torch._scaled_mm(x, weight.T, ...)`` (cuBLASLt; ``use_fast_accum=False``, PyTorch's
    default, which promotes the tensor core's partial sums to fp32).  Tensor scales: one scalar
    each; token scales: cuBLASLt's row-wise scaling (``x_scale [M, 1]``, ``weight_scale`` as
    ``[1, N]``), bf16 output only, the rows padded with zeros to a multiple of 16 where cuBLASLt
    refuses their count (``CUBLAS_STATUS_NOT_SUPPORTED``; seen at N 2688, M 2 on the H200); block scales: ``torch.nn.functional.scaled_mm`` with the
    1x128 / 128x128 block-wise recipes where this PyTorch has them.  A case cuBLASLt cannot
    express raises :class:`~batchinv.reference.errors.Unsupported` (a ``skip``).  GPU only."""

    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    if x.device.type != "cuda":
        raise Unsupported("torch._scaled_mm needs CUDA")
    if bias is not None and bias.dtype != out_dtype:
        bias = bias.to(out_dtype) if out_dtype == torch.bfloat16 else bias
    b = weight.t()  # [K, N], column-major as cuBLASLt wants
    if scale_layout == "tensor":
        return torch._scaled_mm(
            x, b, x_scale.reshape(()), weight_scale.reshape(()), bias=bias, out_dtype=out_dtype
        )
    if scale_layout == "token":
        if out_dtype != torch.bfloat16:
            raise Unsupported("row-wise scaled torch._scaled_mm gives bf16 output only")
        w_scale = weight_scale.reshape(1, args.n)
        try:
            return torch._scaled_mm(x, b, x_scale, w_scale, bias=bias, out_dtype=out_dtype)
        except RuntimeError as exc:
            if "CUBLAS_STATUS_NOT_SUPPORTED" not in str(exc):
                raise
        # cuBLASLt refuses some row counts (the H200 sweep: N 2688, M 2); a serving engine pads
        # the batch: zero rows (scale 1) up to a multiple of 16, cut off again
        rows = x.shape[0]
        pad = -rows % 16
        x_padded = torch.cat([x, x.new_zeros((pad, x.shape[1]))])
        scale_padded = torch.cat([x_scale.reshape(rows, 1), x_scale.new_ones((pad, 1))])
        return torch._scaled_mm(x_padded, b, scale_padded, w_scale, bias=bias, out_dtype=out_dtype)[:rows]
    scaled_mm = getattr(torch.nn.functional, "scaled_mm", None)
    if scaled_mm is None or not hasattr(torch.nn.functional, "ScalingType"):
        raise Unsupported(f"torch {torch.__version__} has no block-wise scaled_mm")
    st = torch.nn.functional.ScalingType
    try:
        out = scaled_mm(
            x,
            b,
            x_scale.t().contiguous().t(),  # cuBLASLt reads the 1x128 scales column-major
            st.BlockWise1x128,
            weight_scale.t(),  # as [KB, NB] with unit stride along KB (b is [K, N])
            st.BlockWise128x128,
            output_dtype=out_dtype,
        )
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        raise Unsupported(f"block-wise scaled_mm: {str(exc).splitlines()[0]}") from None
    return out + bias.to(out_dtype)[None, :] if bias is not None else out


def block_k_by_m(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
) -> torch.Tensor:
    """The pinned kernel, but at M <= :data:`SMALL_M` the tree's BLOCK_K is halved (a table keyed
    on M), its promotion interval with it where the halved K step is shorter.  Under the
    interpreter a K step's products are one ``tl.sum``; on a GPU the tensor core's 13-bit sums
    then cover fewer products: the bits move with M on both."""
    validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    config = _table_config(x, weight, scale_layout)
    if x.shape[0] <= SMALL_M:
        tree = config.tree
        block_k = max(32 if tree.promote_k else 16, tree.block_k // 2)
        config = replace(config, tree=replace(tree, block_k=block_k, promote_k=min(tree.promote_k, block_k)))
    return _pinned(
        x=x,
        weight=weight,
        x_scale=x_scale,
        weight_scale=weight_scale,
        bias=bias,
        scale_layout=scale_layout,
        out_dtype=out_dtype,
        num_sms=num_sms,
        config=config,
    )


def split_k_small_m(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
) -> torch.Tensor:
    """The pinned kernel above :data:`SMALL_M` rows; at or below, split-K: the two halves of K
    (cut at a multiple of 128, so block scales split with them) each through the pinned kernel
    to fp32 without bias, added in fp32, then the bias and one rounding.  K of one block is not
    split."""
    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    kb = blocks(args.k)
    if args.m > SMALL_M or kb < 2:
        return _pinned(
            x=x,
            weight=weight,
            x_scale=x_scale,
            weight_scale=weight_scale,
            bias=bias,
            scale_layout=scale_layout,
            out_dtype=out_dtype,
            num_sms=num_sms,
        )
    cut_blocks = kb // 2
    cut = cut_blocks * SCALE_BLOCK
    halves = []
    for ks, bs in ((slice(0, cut), slice(0, cut_blocks)), (slice(cut, args.k), slice(cut_blocks, kb))):
        xs, ws = x_scale, weight_scale
        if scale_layout == "block":
            xs, ws = x_scale[:, bs], weight_scale[:, bs]
        part = _pinned(
            x=x[:, ks],
            weight=weight[:, ks],
            x_scale=xs,
            weight_scale=ws,
            scale_layout=scale_layout,
            out_dtype=torch.float32,
            num_sms=num_sms,
        )
        halves.append(part)
    total = halves[0] + halves[1]
    if bias is not None:
        total = total + bias.to(torch.float32)[None, :]
    return total.to(out_dtype)


def other_accumulation_group(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
) -> torch.Tensor:
    """The pinned kernel with the table's execution and another accumulation group, the
    products summed per step before the fp32 addition: on a GPU a promotion every 32 products
    (one wgmma k-step) instead of the tree's 128 (or four times a shorter interval), and half
    the BLOCK_K under the interpreter.  Batch-invariant, other bits: the
    negative control of ``config_equivalence``."""
    from batchinv.fast.device import interpreting

    validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    config = _table_config(x, weight, scale_layout)
    tree = config.tree
    if interpreting() or not tree.promote_k:
        other = ReductionTree(
            max(16, tree.block_k // 2), tree.chunk_k, tree.promote_k and min(tree.promote_k, 32)
        )
    else:
        other = replace(tree, promote_k=32 if tree.promote_k > 32 else min(tree.block_k, 4 * tree.promote_k))
    return _pinned(
        x=x,
        weight=weight,
        x_scale=x_scale,
        weight_scale=weight_scale,
        bias=bias,
        scale_layout=scale_layout,
        out_dtype=out_dtype,
        num_sms=num_sms,
        config=replace(config, tree=other),
    )
