"""Reference FP8 scaled GEMM: ``out = dequant(x) @ dequant(W).T (+ bias)`` in fp64, and the
bounds an fp32-accumulating FP8 kernel is held to.

Dimension legend:
    M   rows of ``x`` (the batch axis; one row per token)
    K   reduction length (input features)
    N   output columns (output features)
    KB  K blocks of :data:`SCALE_BLOCK` (``ceil(K / 128)``; the last one may be short)
    NB  N blocks of :data:`SCALE_BLOCK`

Operands: ``x [M, K]`` and ``weight [N, K]`` (``F.linear``'s layout) in ``float8_e4m3fn``, fp32
*dequantization* scales (a stored value times its scale is the real value: the convention of
``torch._scaled_mm``, vLLM and DeepSeek-V3), an optional bias (bf16 or fp32), output bf16 or
fp32.  Scale layouts (:data:`SCALE_LAYOUTS`):

* ``"tensor"``: one scale for ``x`` and one for the weight (``x_scale``, ``weight_scale`` of one
  element each; static per-tensor FP8);
* ``"token"``: ``x_scale [M, 1]`` (one per token) and ``weight_scale [N, 1]`` (one per output
  channel);
* ``"block"``: ``x_scale [M, KB]`` (1 x 128 groups of a token) and ``weight_scale [NB, KB]``
  (128 x 128 weight blocks), DeepSeek-V3's fine-grained scaling (arXiv:2412.19437, 3.3.2).

The dequantized operands are exact in fp64 (an e4m3 value has 4 significant bits, an fp32 scale
24, their product 28 < 53) and the GEMM is an fp64 dot product; the fast kernel's fixed formula
(:mod:`batchinv.fast.fp8_gemm`) and the bounds below are stated here so both trees share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor
from batchinv.reference.matmul import (
    FP32_EPS,
    FP32_MIN_NORMAL,
    _gamma,
    _partial_sums,
    check_bias,
    unit_roundoff,
)

FP8_DTYPE = torch.float8_e4m3fn
SCALE_LAYOUTS: tuple[str, ...] = ("tensor", "token", "block")
#: The block edge of the ``"block"`` layout: 1 x 128 activation groups, 128 x 128 weight blocks.
SCALE_BLOCK = 128
OUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
BIAS_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
#: The relative error of a sum the Hopper FP8 tensor core forms before the fp32 promotion: its
#: accumulator keeps 13 fraction bits and truncates (e8m13; DeepSeek-V3 3.3.2 measured about
#: 14 bits; PyTorch's "Accelerating FP8 GEMM" notes).  A truncation to 13 fraction bits errs by
#: less than 2**-13 of the value.
TENSOR_CORE_FP8_EPS = 2.0**-13


@dataclass(frozen=True)
class Fp8GemmArgs:
    """Validated problem sizes of one call."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype
    scale_layout: str


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def blocks(length: int) -> int:
    """``ceil(length / SCALE_BLOCK)``: the scale blocks along a dimension of ``length``."""
    return -(-length // SCALE_BLOCK)


def scale_shapes(scale_layout: str, m: int, n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of ``x_scale`` and ``weight_scale`` for ``scale_layout`` (``"tensor"``: one
    element each, any shape of one element is accepted: ``[]``, ``[1]``, ``[1, 1]``)."""
    if scale_layout == "tensor":
        return (), ()
    if scale_layout == "token":
        return (m, 1), (n, 1)
    return (m, blocks(k)), (blocks(n), blocks(k))


def validate(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scale_layout: str,
    out_dtype: torch.dtype,
) -> Fp8GemmArgs:
    """Check the arguments of :func:`fp8_gemm` (shared with the fast launcher).

    Raises
    ------
    DTypeError
        ``x`` or ``weight`` not ``float8_e4m3fn``; a scale not fp32; ``bias`` not bf16 / fp32;
        ``out_dtype`` not bf16 / fp32.
    ArgumentError
        Non-2-D ``x`` / ``weight``, either with the negative bit set (``torch._neg_view``: torch
        has no float8 negation to materialize it), K differing, unknown ``scale_layout``, a scale of the wrong
        shape for the layout, ``bias`` not ``[N]``.
    DeviceError
        An operand on another device than ``x``, or on the meta device.
    """
    check_tensor("x", x, dtypes=(FP8_DTYPE,), ndim=2)
    check_tensor("weight", weight, dtypes=(FP8_DTYPE,), ndim=2)
    for name, t in (("x", x), ("weight", weight)):
        if t.is_neg():
            # torch has no float8 negation to resolve the bit with (``neg_cpu`` / ``neg_cuda``)
            raise ArgumentError(
                name, "a tensor without the negative bit set (torch cannot negate float8)", "a negative view"
            )
    check_same_device("weight", weight, x.device)
    if scale_layout not in SCALE_LAYOUTS:
        raise ArgumentError("scale_layout", f"one of {SCALE_LAYOUTS}", scale_layout)
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ArgumentError("weight", f"shape [N, K] with K = {k} (x.shape[1])", tuple(weight.shape))
    xs_shape, ws_shape = scale_shapes(scale_layout, m, n, k)
    for name, scale, shape in (("x_scale", x_scale, xs_shape), ("weight_scale", weight_scale, ws_shape)):
        check_tensor(name, scale, dtypes=(torch.float32,))
        check_same_device(name, scale, x.device)
        ok = scale.numel() == 1 if scale_layout == "tensor" else tuple(scale.shape) == shape
        if not ok:
            want = "one element" if scale_layout == "tensor" else f"shape {list(shape)}"
            raise ArgumentError(name, f"{want} for scale_layout {scale_layout!r}", tuple(scale.shape))
    if bias is not None:
        check_bias(bias, n, x.device, BIAS_DTYPES, "bfloat16 or float32")
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in OUT_DTYPES:
        raise DTypeError("out_dtype", "bfloat16 or float32", out_dtype)
    return Fp8GemmArgs(m, n, k, out_dtype, scale_layout)


def _expand_k(scale: torch.Tensor, k: int) -> torch.Tensor:
    """``[R, KB]`` block scales repeated to ``[R, K]`` (each over its 128 columns)."""
    return scale.repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]


def x_scales(x_scale: torch.Tensor, scale_layout: str, m: int, k: int) -> torch.Tensor:
    """``x``'s scale of every element as fp64 ``[M, K]`` (a broadcast view where it can be)."""
    s = x_scale.to(torch.float64)
    if scale_layout == "tensor":
        return s.reshape(1, 1).expand(m, k)
    if scale_layout == "token":
        return s.expand(m, k)
    return _expand_k(s, k)


def weight_scales(weight_scale: torch.Tensor, scale_layout: str, n: int, k: int) -> torch.Tensor:
    """The weight's scale of every element as fp64 ``[N, K]``."""
    s = weight_scale.to(torch.float64)
    if scale_layout == "tensor":
        return s.reshape(1, 1).expand(n, k)
    if scale_layout == "token":
        return s.expand(n, k)
    return _expand_k(s.repeat_interleave(SCALE_BLOCK, dim=0)[:n], k)


def dequantize(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_layout: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x * x_scale, weight * weight_scale)`` in fp64, exact (``[M, K]``, ``[N, K]``): an e4m3
    value (4 significant bits; NaN stays NaN) times an fp32 scale (24) fits fp64's 53."""
    m, k = x.shape
    n = weight.shape[0]
    xd = x.to(torch.float64) * x_scales(x_scale, scale_layout, m, k)
    wd = weight.to(torch.float64) * weight_scales(weight_scale, scale_layout, n, k)
    return xd, wd


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Reference FP8 scaled GEMM in fp64: ``dequant(x) @ dequant(weight).T + bias``.

    Parameters
    ----------
    x : Tensor [M, K], float8_e4m3fn
    weight : Tensor [N, K], float8_e4m3fn (``F.linear``'s layout)
    x_scale, weight_scale : fp32 dequantization scales, shaped by ``scale_layout`` (module
        docstring, :func:`scale_shapes`)
    bias : Tensor [N], bf16 or fp32, optional
    scale_layout : {"tensor", "token", "block"}
    out_dtype : bf16 or fp32
        Validated like the fast path's; the reference output is fp64.

    Returns
    -------
    Tensor [M, N], float64
        The operands dequantized exactly (:func:`dequantize`), one fp64 dot product per output
        (error about K * 2**-53 of ``|x_d| @ |w_d|``, inside the bounds below).  Row ``m``
        depends on ``x[m]`` and its own scales alone.  A NaN operand (e4m3fn's 0x7F / 0xFF)
        makes its outputs NaN; e4m3fn has no infinity.  An infinite scale makes each zero
        operand it scales NaN (``0 * inf``), unlike the fast kernel, which scales the sums:
        the two are compared on finite scales only (:mod:`batchinv.fast.fp8_gemm`).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`validate`.
    """
    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    xd, wd = dequantize(x, weight, x_scale, weight_scale, scale_layout)
    out = xd @ wd.T  # [M, N]
    if bias is not None:
        out = out + bias.to(torch.float64)[None, :]
    assert tuple(out.shape) == (args.m, args.n)
    return out


#: Products per FP8 wgmma k-step (m64nNk32): the tensor core aligns them and the accumulator.
WGMMA_K = 32


def group_terms(group: int, group_eps: float) -> int:
    """``n`` such that a group of ``group`` products, summed from zero, errs by at most
    ``gamma_n(group_eps)`` of its absolute sum ``S_g``.

    fp32 (``group_eps`` = 2**-23, the interpreter's ``tl.sum``): any order of G + 1 additions,
    ``n = G + 2``.  The FP8 tensor core (2**-13): each wgmma k-step aligns its 32 products and
    the running partial sum to the largest exponent and keeps 13 fraction bits, so each of the
    33 addends errs by less than 2**-13 of the largest term (<= ``S_g``), and the result is cut
    once more: ``34`` per k-step, ``n = 34 G / 32`` (seen on the H200, run 35: 32 products of
    225 added to a partial of 2**14 each lost 1).
    """
    if group_eps <= FP32_EPS:
        return group + 2
    return max(group + 2, (WGMMA_K + 2) * -(-group // WGMMA_K))


def _rounding_tail(
    e_acc: torch.Tensor, reference: torch.Tensor, has_bias: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    """``e_acc`` plus the fp32 bias add and the final rounding to ``out_dtype`` (as
    :func:`batchinv.reference.matmul.tolerance_bound`)."""
    v = reference.to(torch.float64).abs()
    zero = 0.0 * e_acc
    e_bias = unit_roundoff(torch.float32) * (v + e_acc) + FP32_MIN_NORMAL if has_bias else zero
    if out_dtype == torch.float32:
        e_out = zero
    else:
        fin = torch.finfo(out_dtype)
        e_out = unit_roundoff(out_dtype) * (v + e_acc + e_bias) + fin.smallest_normal * fin.eps / 2
    return e_acc + e_bias + e_out


def _scale_product(
    x_scale: torch.Tensor, weight_scale: torch.Tensor, scale_layout: str, n: int, chunk: int | None
) -> torch.Tensor:
    """The exact ``x_scale * weight_scale`` of every output (fp64 ``[M, N]``, or ``[1, 1]`` for
    the tensor layout), of K block ``chunk`` for the block layout."""
    xs, ws = x_scale.to(torch.float64), weight_scale.to(torch.float64)
    if scale_layout == "tensor":
        return (xs.reshape(1, 1) * ws.reshape(1, 1)).reshape(1, 1)
    if scale_layout == "token":
        return xs.reshape(-1, 1) * ws.reshape(1, -1)
    assert chunk is not None
    w_cols = ws[:, chunk].repeat_interleave(SCALE_BLOCK)[:n]  # [N]
    return xs[:, chunk : chunk + 1] * w_cols[None, :]


def tight_bound(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    reference: torch.Tensor | None = None,
    group: int = 32,
    group_eps: float = TENSOR_CORE_FP8_EPS,
) -> torch.Tensor:
    """An a-posteriori bound for the fast kernel's order of operations, per output element.

    The kernel (:mod:`batchinv.fast.fp8_gemm`): the unscaled products ``p_k = x_k w_k`` (exact:
    4 + 4 significant bits) are summed ``G = group`` at a time from zero -- by the FP8 tensor core
    on a GPU, whose sum errs by less than ``gamma_n(group_eps)`` (:func:`group_terms`) of the group's ``S_g =
    sum |p|`` (any order of truncating additions, or the alignment model: every addend cut to
    13 fraction bits of the largest, then one truncation); by one ``tl.sum`` of fp32 products
    under the interpreter (``group_eps = 2**-23``) -- and each group sum is added to an fp32
    accumulator in increasing k (error <= ``eps = 2**-23`` of the new partial ``|Q_g|``).  The
    accumulation runs over the whole K for the tensor and token layouts and over each 128-wide
    K block for the block layout.  Then the fixed formula (fp32, no fused multiply-add):

    * tensor / token: ``y = fl(A * fl(xs * ws))``;
    * block: ``T_c = fl(T_(c-1) + fl(A_c * fl(xs_c * ws_c)))`` over the K blocks in order
      from ``T_0 = 0``;

    then ``fl(y + bias)`` and one rounding to ``out_dtype``.  With ``s`` the exact scale product:

        e_A <= gamma_n(group_eps) S + eps (sum_(g<last) |Q_g| + |P|) + second order
        e_y <= s (e_A + 2 u |P|)                       (the two fp32 multiplications)
        block: sum over blocks of the above + eps sum_(c >= 2) |T_c|

    plus ``K 2**-126`` scaled (underflow) and the fp64 reference's own ``gamma_K(2**-53)`` of
    ``|x_d| @ |w_d|``, then the bias and output roundings of
    :func:`batchinv.reference.matmul.tolerance_bound`.  Rigorous for that order of operations.

    Returns
    -------
    Tensor [M, N], float64 (NaN where the reference is NaN)
    """
    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ArgumentError("group", "a positive int (products per accumulation step)", group)
    if not (0.0 < group_eps < 1.0):
        raise ArgumentError("group_eps", "a relative error in (0, 1)", group_eps)
    if reference is None:
        reference = fp8_gemm(
            x, weight, x_scale, weight_scale, bias, scale_layout=scale_layout, out_dtype=out_dtype
        )
    x64 = x.to(torch.float64)  # [M, K]
    w64 = weight.to(torch.float64).T  # [K, N]
    u = unit_roundoff(torch.float32)
    k = args.k
    spans = (
        [(c * SCALE_BLOCK, min(k, (c + 1) * SCALE_BLOCK)) for c in range(blocks(k))]
        if scale_layout == "block"
        else [(0, k)]
    )
    e_total = torch.zeros(args.m, args.n, dtype=torch.float64, device=x64.device)
    running = torch.zeros_like(e_total)  # T_c, the exact scaled running total
    across = torch.zeros_like(e_total)  # sum_(c >= 2) |T_c|
    for c, (k0, k1) in enumerate(spans):
        xc, wc = x64[:, k0:k1], w64[k0:k1]
        steps = max(1, -(-(k1 - k0) // group))
        within, _ = _partial_sums(xc, wc, group, steps, steps)
        p = xc @ wc  # P_c, unscaled
        s_abs = xc.abs() @ wc.abs()  # S_c
        g = _gamma(group_terms(group, group_eps), group_eps)
        e_a = g * s_abs + FP32_EPS * (within + p.abs())
        e_a = e_a * (1.0 + steps * FP32_EPS) + steps * FP32_EPS * g * s_abs  # the carried error
        s = _scale_product(x_scale, weight_scale, scale_layout, args.n, c).to(x64.device).abs()
        e_total = e_total + s * (e_a + 2.0 * u * p.abs()) + (k1 - k0 + 2) * FP32_MIN_NORMAL * (1.0 + s)
        running = running + s * p
        if c > 0:
            across = across + running.abs()
    xd, wd = dequantize(x, weight, x_scale, weight_scale, scale_layout)
    fp64_error = _gamma(k, 2.0**-53) * (xd.abs() @ wd.abs().T)
    e_acc = e_total + FP32_EPS * across + fp64_error
    return _rounding_tail(e_acc, reference, bias is not None, args.out_dtype)


#: The coarsest promotion interval the bounds allow: products the tensor core sums before each
#: fp32 addition (DeepSeek-V3 promotes every 128; the kernel's trees use at most this).
MAX_TENSOR_CORE_GROUP = 128


def _max_scale_product(
    x_scale: torch.Tensor, weight_scale: torch.Tensor, scale_layout: str, m: int, n: int, k: int
) -> torch.Tensor:
    """The largest ``|x_scale * weight_scale|`` any product of each output sees (fp64 ``[M, N]``)."""
    xs = x_scales(x_scale, scale_layout, m, k).abs().amax(dim=1)  # [M]
    ws = weight_scales(weight_scale, scale_layout, n, k).abs().amax(dim=1)  # [N]
    return xs[:, None] * ws[None, :]


def tolerance_bound(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """The any-order bound (a hard limit): groups of at most :data:`MAX_TENSOR_CORE_GROUP`
    products summed by the FP8 tensor core (``gamma_136(2**-13)`` of their ``sum |p|``), added
    in fp32 in any order (``gamma_K(2**-23)``), then the scaling (two fp32 multiplications), the
    block totals (``gamma_KB(2**-23)``), the bias and the output rounding:

        e_acc <= (gamma_136(2**-13) + gamma_(K + KB + 2)(2**-23)) S_d + (K + KB) 2**-126 s_max

    with ``S_d = |x_d| @ |w_d|.T`` (the dequantized products' absolute sum).  About 1.6% of
    ``S_d``: it catches gross errors (a wrong scale, a dropped block, a 16-bit accumulator);
    :func:`tight_bound` is the one judged.

    Returns
    -------
    Tensor [M, N], float64 (NaN where the reference is NaN)
    """
    args = validate(x, weight, x_scale, weight_scale, bias, scale_layout, out_dtype)
    if reference is None:
        reference = fp8_gemm(
            x, weight, x_scale, weight_scale, bias, scale_layout=scale_layout, out_dtype=out_dtype
        )
    xd, wd = dequantize(x, weight, x_scale, weight_scale, scale_layout)
    s = xd.abs() @ wd.abs().T  # [M, N]
    k, kb = args.k, blocks(args.k)
    gamma = _gamma(group_terms(MAX_TENSOR_CORE_GROUP, TENSOR_CORE_FP8_EPS), TENSOR_CORE_FP8_EPS)
    gamma += _gamma(k + kb + 2, FP32_EPS)
    s_max = _max_scale_product(x_scale, weight_scale, scale_layout, args.m, args.n, k)
    e_acc = gamma * s + (k + kb) * FP32_MIN_NORMAL * (1.0 + s_max)
    return _rounding_tail(e_acc, reference, bias is not None, args.out_dtype)
