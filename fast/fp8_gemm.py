"""Batch-invariant FP8 scaled GEMM: the matmul's kernel and tables, with FP8 operands and scales.

Launcher only: validate (the reference's checks, typed errors), allocate, take the reduction
tree from (arch, scale layout, N, K) and the execution from the M bucket
(:mod:`batchinv.fast.matmul_config`: the same two tables as the 16-bit matmul, FP8 rows), size
the grid, launch :func:`batchinv.fast.kernels.matmul.chunked_matmul_kernel` (the same kernel,
with its ``SCALES`` and ``PROMOTE_K`` constants).  No split-K: every FP8 execution is a walk.
"""

from __future__ import annotations

import torch

from batchinv.fast.device import check_launch_device, check_no_grad, interpreter_quiet, kernel_operand
from batchinv.fast.matmul import SCALE_CODES, ScaleOperands, _arch_key, _descriptors, _launch, check_out, plan
from batchinv.fast.matmul_config import MatmulConfig, reduction_tree
from batchinv.reference.fp8_gemm import validate
from batchinv.reference.matmul import MatmulArgs


def _scale_operands(x_scale: torch.Tensor, weight_scale: torch.Tensor, scale_layout: str) -> ScaleOperands:
    """The scales as the kernel reads them (2-D fp32; a one-element scale as ``[1, 1]``)."""
    if scale_layout == "tensor":
        x_scale, weight_scale = x_scale.reshape(1, 1), weight_scale.reshape(1, 1)
    return ScaleOperands(SCALE_CODES[scale_layout], kernel_operand(x_scale), kernel_operand(weight_scale))


def accumulation(n: int, k: int, scale_layout: str, device: torch.device) -> tuple[int, float]:
    """``(group, group_eps)`` of the kernel's accumulation on this device, as
    :func:`batchinv.reference.fp8_gemm.tight_bound` takes them: on a GPU the tree's
    ``promote_k`` products summed by the FP8 tensor core (``2**-13``); under the interpreter a
    K tile summed by one fp32 ``tl.sum`` (``2**-23``)."""
    from batchinv.fast.device import interpreting
    from batchinv.reference.fp8_gemm import TENSOR_CORE_FP8_EPS
    from batchinv.reference.matmul import FP32_EPS

    tree = reduction_tree(_arch_key(device), torch.float8_e4m3fn, n, k, scale_layout)
    if interpreting() or not tree.promote_k:
        return tree.block_k, FP32_EPS
    return tree.promote_k, TENSOR_CORE_FP8_EPS


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """Batch-invariant FP8 scaled GEMM: ``out = (x * x_scale) @ (weight * weight_scale).T + bias``.

    The fixed formula (fp32, IEEE round to nearest, no fused multiply-add): the unscaled products
    ``x[m, k] * w[n, k]`` (exact) are summed along the reduction tree of (arch, scale layout, N,
    K) (:func:`batchinv.fast.matmul_config.reduction_tree`): on an H100/H200 the FP8 tensor core
    sums the tree's ``promote_k`` products at a time (128 on sm90: four wgmma k-steps of 32, in
    its own accumulator of 13 truncating fraction bits, from zero) and each such sum is added to
    an fp32 accumulator in increasing k; under the Triton interpreter (the cpu lane) each K step
    of ``block_k`` products is summed by one fp32 ``tl.sum`` instead; then

    * ``"tensor"`` / ``"token"``: one accumulator over all of K, ``y = fl(A * fl(xs * ws))``
      once at the end (``xs`` the token's or the tensor's scale, ``ws`` the channel's or tensor's);
    * ``"block"``: an accumulator per 128-wide K block ``c`` (from zero), each scaled once and
      added in block order, ``T = fl(T + fl(A_c * fl(xs[m, c] * ws[n // 128, c])))`` from
      ``T = 0`` (DeepSeek-V3's promotion with the scales, arXiv:2412.19437 3.3.2);

    then ``fl(y + bias)`` in fp32 and one rounding to ``out_dtype``.  M picks only the execution
    (tile, warps, stages; always a walk, no split-K), which never changes the bits
    (``config_equivalence`` runs every execution of the table on every sweep case).

    Parameters
    ----------
    x : Tensor [M, K], float8_e4m3fn, any strides
    weight : Tensor [N, K], float8_e4m3fn (``F.linear``'s layout), any strides
    x_scale, weight_scale : fp32 dequantization scales (real value = stored * scale):
        ``"tensor"``: one element each (any shape); ``"token"``: ``[M, 1]`` and ``[N, 1]``;
        ``"block"``: ``[M, ceil(K/128)]`` and ``[ceil(N/128), ceil(K/128)]``.
        :func:`batchinv.fast.fp8_quant.fp8_quant` gives ``(x, x_scale)`` for ``"token"``
        (``group_size=None``) and ``"block"`` (``group_size=128``), and ``(weight,
        weight_scale)`` for ``"token"`` (one scale per output channel); a 128 x 128 block
        weight scale is not one of its layouts (README, "FP8 from Python", has a recipe).
    bias : Tensor [N], bf16 or fp32, optional
    scale_layout : {"tensor", "token", "block"}
    out_dtype : bf16 (default) or fp32 (router-like uses: the fp32 result unrounded)
    num_sms : int, optional
        The SM count the persistent grid plans for; any value gives the same bits.
    out : Tensor [M, N] of ``out_dtype``, optional
        Preallocated output (as :func:`batchinv.fast.matmul.matmul`'s ``out``).
    config : MatmulConfig, optional
        Overrides both tables (tests, tuning, ``config_equivalence``); a walk only, and for
        block scales a tree with ``chunk_k = 128``.

    Returns
    -------
    Tensor [M, N] of ``out_dtype``
        Bitwise invariant along M, row position and neighbours, the planned SM count, the
        execution and repeated calls.  A NaN operand (e4m3fn 0x7F / 0xFF) makes its outputs
        NaN; the sign of an exactly-zero result is not specified but invariant.  The reference
        is matched for finite scales whose fp32 products ``xs * ws`` and scaled partial totals
        stay finite; beyond that (an infinite scale, ``2**100 * 2**100``) the output is the
        fixed formula's (``fl(A * inf)``: +-inf, NaN where ``A = 0``; ``inf - inf``: NaN), still
        invariant, where the reference's ``x * inf`` makes every zero operand NaN.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As :func:`batchinv.reference.fp8_gemm.validate`; ``out`` as the matmul's; a split-K
        ``config``, or for block scales a ``config`` whose tree's ``chunk_k`` is not 128 (the
        chunks must be the scale blocks) (ArgumentError naming ``config``); DeviceError for CPU
        tensors without the Triton interpreter (``TRITON_INTERPRET=1`` set before triton is
        imported).

    Source
    ------
    The 16-bit matmul's persistent walk (:mod:`batchinv.fast.matmul`), Triton's
    ``max_num_imprecise_acc`` for the fp32 promotion, DeepSeek-V3's block scaling; scale
    convention of ``torch._scaled_mm`` and vLLM.
    """
    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    check_launch_device("x", x)
    for name, t in (("weight", weight), ("x_scale", x_scale), ("weight_scale", weight_scale), ("bias", bias)):
        if t is not None:
            check_no_grad(name, t)
    matmul_args = MatmulArgs(args.m, args.n, args.k, args.out_dtype)
    if out is None:
        out = torch.empty((args.m, args.n), device=x.device, dtype=args.out_dtype)
    else:
        inputs = (
            ("x", x),
            ("weight", weight),
            ("x_scale", x_scale),
            ("weight_scale", weight_scale),
            ("bias", bias),
        )
        check_out(out, matmul_args, x.device, inputs)
    if args.m == 0 or args.n == 0:
        return out
    x, weight = kernel_operand(x), kernel_operand(weight)
    bias = kernel_operand(bias) if bias is not None else None
    scales = _scale_operands(x_scale, weight_scale, scale_layout)
    p = plan(args.m, args.n, args.k, x.dtype, x.device, num_sms, config, scale_layout)
    descriptors = _descriptors(x, weight, "linear", p) if p.config.execution.tma else None
    with interpreter_quiet():
        _launch(x, weight.t(), bias, out, args.m, args.n, args.k, p, "ieee", descriptors, True, scales)
    return out
