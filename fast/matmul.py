"""Batch-invariant matmul: a Triton persistent kernel with one fixed reduction order.

Launcher only: validate (typed errors), allocate, pick the config from the (arch, dtype, N, K)
table, size the persistent grid from the planned SM count, launch.  The kernel is
:func:`batchinv.fast.kernels.matmul.persistent_matmul_kernel`.

The config is looked up without M on purpose: the BLOCK sizes fix the order of each output's
fp32 sum, so keying them on the batch size would make the bits a function of the batch (see
:mod:`batchinv.fast.matmul_config`).  No autotuning either, for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.fast.device import (
    arch,
    check_launch_device,
    interpreter_quiet,
    interpreting,
    kernel_operand,
    sm_count,
)
from batchinv.fast.matmul_config import MatmulConfig, select_config
from batchinv.reference.errors import ArgumentError, check_tensor
from batchinv.reference.matmul import MatmulArgs, validate, weight_kn


@dataclass(frozen=True)
class LaunchPlan:
    """What a call launches: the config (from N, K, dtype, arch only) and the grid."""

    config: MatmulConfig
    num_tiles: int
    grid: int
    interpreted: bool


def plan(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device,
    num_sms: int | None = None,
    config: MatmulConfig | None = None,
) -> LaunchPlan:
    """The launch plan of an ``[M, K] @ [K, N]`` problem of input ``dtype`` on ``device``.

    ``config`` overrides the table (for tests and tuning only; production callers leave it None).
    M only sizes the grid (how many tiles there are), never the config.
    """
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1):
        raise ArgumentError(
            "num_sms", "a positive int (the SM count the persistent grid plans for) or None", num_sms
        )
    on_gpu = device.type == "cuda" and not interpreting()
    cfg = config if config is not None else select_config(arch(device if on_gpu else None), dtype, n, k)
    tiles = -(m // -cfg.block_m) * -(n // -cfg.block_n)  # ceil(M / BLOCK_M) * ceil(N / BLOCK_N)
    planned = num_sms if num_sms is not None else sm_count(device if device.type == "cuda" else None)
    # Under the interpreter the kernel avoids numpy's matmul (row-position-dependent BLAS order,
    # raw-bit bf16) and the truncating bf16 cast; see the kernel's INTERPRETED flag.
    return LaunchPlan(cfg, tiles, max(1, min(planned, tiles)), interpreting())


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """Batch-invariant ``out = x @ W (+ bias)``: fp32 accumulation, one rounding at the end.

    Each output element is the fp32 sum of its K products formed in increasing k inside one
    program (no split-K), plus ``bias`` in fp32, rounded once to ``out_dtype``.

    Parameters
    ----------
    x : Tensor [M, K]
        bf16, fp16 or fp32, any strides.
    weight : Tensor [N, K] (``layout="linear"``, as ``F.linear``) or [K, N] (``layout="mm"``)
        Same dtype as ``x``, any strides.
    bias : Tensor [N], optional
        ``x``'s dtype or fp32, any stride (0 included); added to the fp32 accumulator before
        the final rounding.  Operands with the negative (or conjugate) bit set, such as
        ``z.conj().imag``, are materialized first (:func:`batchinv.fast.device.kernel_operand`).
    layout : {"linear", "mm"}
    out_dtype : torch.dtype, optional
        ``x``'s dtype (default) or fp32.  fp32 from bf16/fp16 inputs returns the fp32
        accumulator itself (router logits never round through bf16).
    precision : {"ieee", "tf32"}
        fp32 inputs only: ``"ieee"`` (default) computes true fp32 products; ``"tf32"`` must be
        asked for explicitly (operands rounded to 10 mantissa bits, faster on tensor cores).
    num_sms : int, optional
        The SM count the persistent grid plans for (default: the device's).  Any value gives
        the same bits: it decides which program computes a tile, never how (partition axis).
    out : Tensor [M, N], optional
        Preallocated output of ``out_dtype`` on ``x``'s device (tests prefill it with NaN so an
        unwritten tile shows).  Any strides whose elements do not overlap (row- or
        column-major, padded rows); never in the storage of ``x``, ``weight`` or ``bias`` (tiles
        would read inputs other tiles already overwrote), never an expanded (stride-0) view,
        never a view with the negative bit set.
    config : MatmulConfig, optional
        Overrides the (arch, dtype, N, K) table; for tests and tuning only.

    Returns
    -------
    Tensor [M, N] of ``out_dtype``
        Bitwise invariant along M (any batch size), row position and neighbours, the planned SM
        count, and repeated calls: the config depends on (arch, dtype, N, K) only.  NaN / inf propagate as IEEE products and sums (``inf * 0`` is NaN); the
        sign of an exactly-zero result is not specified (+0 or -0), but it is invariant too.

    Raises
    ------
    DTypeError
        Unsupported dtype or dtype mix (argument named); ``out`` not a tensor.
    ArgumentError
        Non-2-D operands, mismatched K, bad ``bias`` shape, ``layout``, ``precision``,
        ``num_sms``; ``out`` of the wrong shape, dtype or device, requiring grad, sharing
        storage with an input, with overlapping elements, or with the negative bit set.
    DeviceError
        Operands on different devices, on the meta device, or CPU tensors without the Triton
        interpreter.

    Source
    ------
    Persistent tile walk after Triton tutorial 09 (persistent matmul); the fixed-config,
    no-split-K pinning follows the batch-invariant matmul of Thinking Machines' "Defeating
    Nondeterminism in LLM Inference" (2025) and vLLM's ``batch_invariant.py``.
    """
    args = validate(x, weight, bias, layout, out_dtype, precision)
    check_launch_device("x", x)
    if out is None:
        out = torch.empty((args.m, args.n), device=x.device, dtype=args.out_dtype)
    else:
        check_out(out, args, x.device, (("x", x), ("weight", weight), ("bias", bias)))
    if args.m == 0 or args.n == 0:
        return out
    x, weight = kernel_operand(x), kernel_operand(weight)
    bias = kernel_operand(bias) if bias is not None else None
    b = weight_kn(weight, layout)  # [K, N]
    p = plan(args.m, args.n, args.k, x.dtype, x.device, num_sms, config)
    _launch(x, b, bias, out, args.m, args.n, args.k, p, precision)
    return out


def _elements_overlap(t: torch.Tensor) -> bool:
    """Whether two indices of ``t`` may address the same element (stride 0 on a dimension of
    size > 1 included).  Conservative: sorted by stride, each dimension must step past the whole
    extent of the smaller ones; layouts that interleave otherwise count as overlapping."""
    extent = 1  # elements spanned by the dimensions seen so far
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1):
        if stride < extent:
            return True
        extent += stride * (size - 1)
    return False


def check_out(
    out: object,
    args: MatmulArgs,
    device: torch.device,
    inputs: tuple[tuple[str, torch.Tensor | None], ...],
) -> None:
    """Validate a preallocated ``out`` of :func:`matmul`.

    Raises
    ------
    DTypeError
        ``out`` is not a tensor.
    ArgumentError
        Wrong shape, dtype or device; ``requires_grad`` set (the kernel writes it outside
        autograd; ``torch.mm(out=)`` refuses it too); the negative or conjugate bit set (the
        kernel writes raw memory); elements that overlap (an expanded view: tiles would race on them); the same
        storage as one of ``inputs`` (tiles would read values other tiles already wrote).  The
        storage test is conservative: disjoint slices of one buffer are refused too.
    """
    check_tensor("out", out)
    assert isinstance(out, torch.Tensor)
    if out.requires_grad:
        raise ArgumentError(
            "out",
            "a tensor that does not require grad (the kernel writes it outside autograd; "
            "torch.mm(out=) refuses it too)",
            "a tensor with requires_grad=True",
        )
    if tuple(out.shape) != (args.m, args.n) or out.dtype != args.out_dtype or out.device != device:
        raise ArgumentError(
            "out",
            f"a [{args.m}, {args.n}] {args.out_dtype} tensor on {device}",
            f"{tuple(out.shape)} {out.dtype} on {out.device}",
        )
    if out.is_neg() or out.is_conj():
        raise ArgumentError(
            "out",
            "a tensor without the negative or conjugate bit set (the kernel writes raw memory)",
            f"a view with is_neg()={out.is_neg()}, is_conj()={out.is_conj()}",
        )
    if _elements_overlap(out):
        raise ArgumentError(
            "out",
            "a tensor whose elements do not overlap (no expanded, stride-0 dimension)",
            f"strides {tuple(out.stride())}",
        )
    if out.numel() == 0:
        return
    out_storage = out.untyped_storage().data_ptr()
    for name, t in inputs:
        if t is not None and t.numel() > 0 and t.untyped_storage().data_ptr() == out_storage:
            raise ArgumentError(
                "out", f"a tensor that does not share storage with the input {name!r}", f"a view of {name}"
            )


def _launch(
    x: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    m: int,
    n: int,
    k: int,
    p: LaunchPlan,
    precision: str,
) -> None:
    from batchinv.fast.kernels.matmul import persistent_matmul_kernel

    cfg = p.config
    with interpreter_quiet():
        persistent_matmul_kernel[(p.grid,)](
            x,
            b,
            bias if bias is not None else out,  # never read when HAS_BIAS is False
            out,
            m,
            n,
            k,
            x.stride(0),
            x.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            out.stride(1),
            bias.stride(0) if bias is not None else 0,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            HAS_BIAS=bias is not None,
            INPUT_PRECISION=precision,
            INTERPRETED=p.interpreted,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-invariant ``F.linear(x, weight, bias)``: :func:`matmul` with ``layout="linear"``.

    ``x`` [M, K], ``weight`` [N, K], ``bias`` [N] -> [M, N]; see :func:`matmul` for dtypes,
    invariance, NaN behaviour and errors.
    """
    return matmul(x, weight, bias, layout="linear", out_dtype=out_dtype, num_sms=num_sms)


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-invariant ``a @ b``: :func:`matmul` with ``layout="mm"`` (``a`` [M, K], ``b`` [K, N]).

    Errors name ``x`` for ``a`` and ``weight`` for ``b`` (the arguments of :func:`matmul`).
    """
    return matmul(a, b, layout="mm", out_dtype=out_dtype, num_sms=num_sms)
