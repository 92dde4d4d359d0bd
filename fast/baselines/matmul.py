"""Unpinned matmul paths, run as negative controls and pin candidates beside the fast kernel.

* :func:`torch_default` — ``F.linear`` / ``torch.mm`` as PyTorch dispatches them: cuBLAS(Lt) on a
  GPU, whose heuristics pick a different algorithm (split-K, tile) per M; the CPU BLAS
  (MKL / oneDNN) on the cpu lane.  Run under a cuBLAS environment recipe it is a *pin
  candidate*: the env is set before the library creates its handles, and
  ``BATCHINV_PREFERRED_BLAS`` selects ``torch.backends.cuda.preferred_blas_library``.
* :func:`split_k` — a Triton split-K matmul whose split count is chosen from M the way
  production heuristics do (small batches get more K splits to fill the machine), so the fp32
  partial sums of one row are associated differently at different M.
* :func:`two_k_slices`, :func:`other_block_k`, :func:`other_chunk_k` — batch-invariant, but
  another reduction tree than the table's: the negative controls of ``config_equivalence``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from batchinv.fast.device import check_launch_device, interpreter_quiet, interpreting, kernel_operand
from batchinv.fast.matmul_config import ReductionTree
from batchinv.reference.errors import ArgumentError
from batchinv.reference.matmul import validate, weight_kn

#: Environment variable read by :func:`torch_default`: ``cublas``, ``cublaslt`` or ``default``.
PREFERRED_BLAS_ENV = "BATCHINV_PREFERRED_BLAS"
_PREFERRED_BLAS_CHOICES = ("cublas", "cublaslt", "default")
_applied_blas: list[str] = []


def apply_preferred_blas() -> str | None:
    """Apply ``$BATCHINV_PREFERRED_BLAS`` once per process (GPU only); returns the value or None."""
    value = os.environ.get(PREFERRED_BLAS_ENV, "").strip().lower()
    if not value:
        return None
    if value not in _PREFERRED_BLAS_CHOICES:
        raise ArgumentError(PREFERRED_BLAS_ENV, " or ".join(_PREFERRED_BLAS_CHOICES), value)
    if not _applied_blas and torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library(value)
        _applied_blas.append(value)
    return value


def torch_default(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (layout "linear") or ``torch.mm``/``addmm`` (layout "mm").

    fp32 output from bf16/fp16 inputs is computed as an fp32 GEMM of the exactly upcast operands
    (what a caller writes to get fp32 router logits from PyTorch).  ``precision`` is accepted
    for signature compatibility; PyTorch's own TF32 setting applies (off by default).
    Not batch-invariant on GPUs (cuBLAS picks its algorithm per M).
    """
    args = validate(x, weight, bias, layout, out_dtype, precision)
    compute = args.out_dtype if args.out_dtype == torch.float32 else x.dtype
    return _torch_product(x, weight, bias, layout, compute).to(args.out_dtype)


def _torch_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str, compute: torch.dtype
) -> torch.Tensor:
    """``F.linear`` (layout "linear") or ``torch.mm`` / ``addmm`` (layout "mm") of the operands
    converted to ``compute``, under ``$BATCHINV_PREFERRED_BLAS``."""
    apply_preferred_blas()
    xc, wc = x.to(compute), weight.to(compute)
    bc = bias.to(compute) if bias is not None else None
    if layout == "linear":
        return F.linear(xc, wc, bc)
    if bc is not None:
        return torch.addmm(bc, xc, wc)
    return torch.mm(xc, wc)


def torch_then_cast(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """``F.linear`` / ``torch.mm`` in the input dtype, then cast to ``out_dtype``: issue 11's
    speed comparator for fp32 router logits from bf16 (a bf16 GEMM, then ``.float()``, so the
    logits carry a bf16 rounding).  TF32 follows PyTorch's setting (off by default).  Not
    batch-invariant on GPUs (cuBLAS picks its algorithm per M)."""
    args = validate(x, weight, bias, layout, out_dtype, precision)
    return _torch_product(x, weight, bias, layout, x.dtype).to(args.out_dtype)


#: Split-K tiles: fixed (the variance comes from the split count, not the tile).
_SPLITK_BLOCK = {"interp": (64, 64, 32), "gpu": (64, 64, 64)}


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def split_k_count(m: int, k: int, block_k: int) -> int:
    """The production-style split count: more K slices for small batches (never more than the
    number of K tiles).  A function of M: exactly what makes this path batch-variant."""
    wanted = 4 if m <= 16 else 2 if m <= 64 else 1
    return max(1, min(wanted, _cdiv(k, block_k)))


def split_k(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """Split-K matmul: fp32 partial sums over ``split_k_count(M)`` K slices, added in slice
    order, plus bias, rounded once.  Agrees with the reference within the same bound as the
    fast kernel, but the bits of a row change with M (negative control)."""
    return _split_k_matmul(x, weight, bias, layout, out_dtype, precision, split_k_count)


def two_k_slices(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
) -> torch.Tensor:
    """The split-K matmul with K always in two slices (one when K fits one BLOCK_K): invariant
    along every batch axis, but another summation tree than the pinned kernel's -- the negative
    control of ``config_equivalence`` on GPU lanes, where halving BLOCK_K (:func:`other_block_k`)
    changed no bit on the H200 (tensor-core and FMA dots add their k-steps in order whatever the
    tile).  ``num_sms`` is accepted and ignored."""
    del num_sms
    return _split_k_matmul(
        x, weight, bias, layout, out_dtype, precision, lambda m, k, block_k: min(2, _cdiv(k, block_k))
    )


def _split_k_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layout: str,
    out_dtype: torch.dtype | None,
    precision: str,
    split_count: Callable[[int, int, int], int],
) -> torch.Tensor:
    """fp32 partial sums over ``split_count(M, K, BLOCK_K)`` K slices, added in slice order,
    plus bias, rounded once."""
    from batchinv.fast.kernels.matmul_splitk import splitk_partial_kernel

    args = validate(x, weight, bias, layout, out_dtype, precision)
    check_launch_device("x", x)
    m, n, k = args.m, args.n, args.k
    x = kernel_operand(x)
    b = kernel_operand(weight_kn(weight, layout))  # [K, N]
    if m == 0 or n == 0:
        return torch.empty((m, n), device=x.device, dtype=args.out_dtype)
    block_m, block_n, block_k = _SPLITK_BLOCK["interp" if interpreting() else "gpu"]
    splits = split_count(m, k, block_k)
    k_per_split = _cdiv(_cdiv(k, splits), block_k) * block_k  # ceil(K / splits), up to BLOCK_K
    ws = torch.zeros((splits, m, n), device=x.device, dtype=torch.float32)  # [S, M, N]
    grid = (_cdiv(m, block_m) * _cdiv(n, block_n), splits)
    with interpreter_quiet():
        splitk_partial_kernel[grid](
            x,
            b,
            ws,
            m,
            n,
            k,
            k_per_split,
            x.stride(0),
            x.stride(1),
            b.stride(0),
            b.stride(1),
            ws.stride(0),
            ws.stride(1),
            ws.stride(2),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            INTERPRETED=interpreting(),
        )
    acc = ws[0]  # [M, N]
    for s in range(1, splits):
        acc = acc + ws[s]
    if bias is not None:
        acc = acc + bias.to(torch.float32)[None, :]
    return acc.to(args.out_dtype)


def _other_tree(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layout: str,
    out_dtype: torch.dtype | None,
    precision: str,
    num_sms: int | None,
    change: Callable[[ReductionTree, int], ReductionTree],
) -> torch.Tensor:
    """The pinned kernel with the table's execution and ``change(tree, K)`` as its tree."""
    from batchinv.fast.matmul import matmul, plan

    args = validate(x, weight, bias, layout, out_dtype, precision)
    cfg = plan(args.m, args.n, args.k, x.dtype, x.device).config
    config = replace(cfg, tree=change(cfg.tree, args.k))
    return matmul(
        x,
        weight,
        bias,
        layout=layout,
        out_dtype=out_dtype,
        precision=precision,
        num_sms=num_sms,
        config=config,
    )


def other_block_k(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
) -> torch.Tensor:
    """The pinned kernel with the table's tree but half its BLOCK_K: a negative control of
    ``config_equivalence``.  Invariant along every batch axis (the tree is still keyed on
    (arch, dtype, N, K) only), but each K step's partial sum covers half as many products, so
    the fp32 accumulation is associated differently under the interpreter (on the H200 the
    bits did not change: tensor cores add their 16-wide k-steps in order whatever the step).
    Shapes, dtypes and errors as :func:`batchinv.fast.matmul.matmul`."""
    return _other_tree(
        x,
        weight,
        bias,
        layout,
        out_dtype,
        precision,
        num_sms,
        lambda tree, k: ReductionTree(max(16, tree.block_k // 2), tree.chunk_k),
    )


def other_chunk_k(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
) -> torch.Tensor:
    """The pinned kernel with the table's execution and another chunk size: twice the table's
    ``chunk_k`` when K has several chunks, else half of it (at least one BLOCK_K).  Invariant
    along every batch axis, another association of the chunk sums: the negative control of
    ``config_equivalence`` on every lane (issue 11: "a variant with another BLOCK_K or chunk
    size, which must be detected").  Shapes, dtypes and errors as
    :func:`batchinv.fast.matmul.matmul`."""

    def change(tree: ReductionTree, k: int) -> ReductionTree:
        if tree.num_chunks(k) > 1:
            return ReductionTree(tree.block_k, 2 * tree.chunk_k)
        half = -(-min(k, tree.chunk_k) // 2)
        return ReductionTree(tree.block_k, max(tree.block_k, -(-half // tree.block_k) * tree.block_k))

    return _other_tree(x, weight, bias, layout, out_dtype, precision, num_sms, change)
