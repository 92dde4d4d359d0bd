"""Reference NVFP4 weights (e2m1 values, e4m3 block scales, fp32 global scale) and the W4A16
GEMM ``out = x @ dequantize(W).T (+ bias)`` in fp64, with the tolerance a fp32-accumulating
kernel is held to.

Dimension legend:
    M   rows of ``x`` (the batch axis; one row per token)
    K   reduction length (input features); a multiple of 16 (:data:`BLOCK`)
    N   output columns (output features): rows of the weight
    B   blocks per weight row, ``K / 16``

The format (NVIDIA NVFP4: two-level scaling of FP4 values)::

    w[n, k] = e2m1(code[n, k]) * block_scales[n, k // 16] * global_scale

* ``e2m1``: FP4 with a sign bit, 2 exponent bits (bias 1) and 1 mantissa bit (OCP Microscaling
  Formats (MX) v1.0, section 5.3.3): exponent 0 is subnormal, ``m * 0.5``; otherwise
  ``2**(e - 1) * (1 + m / 2)``; no infinity, no NaN.  Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  Code bits: ``s e1 e0 m`` (bit 3 the sign).
* ``packed [N, K/2] uint8``: two codes per byte along K, the **low nibble the even k**
  (``packed[n, j] = code[n, 2j] | code[n, 2j + 1] << 4``): the layout of vLLM's NVFP4 test
  helpers (``tests/kernels/quantization/nvfp4_utils.py``, ``break_fp4_bytes``: low nibble first)
  and of CUDA's ``__nv_fp4x2`` storage (the first element in the low 4 bits).
* ``block_scales [N, K/16] float8_e4m3fn``: one scale per 16 consecutive k of a row, in the
  plain row-major layout (production kernels keep them swizzled into 128x4 tiles; the layout is
  the kernel's business, not the format's).
* ``global_scale``: a fp32 scalar tensor, the *dequantization* multiplier (a ModelOpt
  checkpoint's ``weight_scale_2``; vLLM's helpers carry its inverse, ``448 * 6 / amax``, and
  divide by it).

Exactness: every dequantized weight is exact in fp64.  An e2m1 magnitude has at most 2
significant bits, an e4m3 value at most 4, a fp32 value 24: a product has at most 30 <= 53.
Magnitudes stay inside fp64's normal range: at least ``0.5 * 2**-9 * 2**-149 = 2**-159`` (when
not zero) and at most ``6 * 448 * 2**128 < 2**140``.  So both multiplications are exact, in
any order.  The GEMM's products ``x * w`` (bf16 8 bits or fp16 11 bits, times <= 30) are exact
too; only the fp64 sum of K products rounds (relative ``K * 2**-53`` of ``|x| @ |w|``, as
:func:`batchinv.reference.matmul.matmul`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.reference import matmul as ref_matmul
from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor
from batchinv.reference.exact import power_of_two, round_once

#: Consecutive K elements of a weight row sharing one e4m3 block scale.
BLOCK = 16
#: Activation dtypes of W4A16 (16-bit activations).
INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
#: Largest e2m1 magnitude and largest finite e4m3fn value.
E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: e2m1 magnitudes in code order (codes 0..7); code ``8 + c`` is ``-E2M1_MAGNITUDES[c]``.
E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Nvfp4Args:
    """Validated problem sizes of one call."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_weight(
    packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor
) -> tuple[int, int]:
    """Check an NVFP4 weight; return ``(N, K)``.

    Raises
    ------
    DTypeError
        ``packed`` not uint8, ``block_scales`` not float8_e4m3fn, ``global_scale`` not a fp32 tensor.
    ArgumentError
        ``packed`` not 2-D or its ``K = 2 * packed.shape[1]`` not a multiple of 16;
        ``block_scales`` not ``[N, K/16]``; ``global_scale`` not one element, not finite or not > 0.
    DeviceError
        ``block_scales`` on another device than ``packed``.
    """
    check_tensor("packed", packed, dtypes=(torch.uint8,), ndim=2)
    n, half_k = packed.shape
    k = 2 * half_k
    if k % BLOCK != 0:
        raise ArgumentError(
            "packed",
            f"shape [N, K/2] with K = 2 * packed.shape[1] a multiple of {BLOCK} (one e4m3 scale per {BLOCK} k)",
            tuple(packed.shape),
        )
    check_tensor("block_scales", block_scales, dtypes=(torch.float8_e4m3fn,), ndim=2)
    check_same_device("block_scales", block_scales, packed.device)
    if tuple(block_scales.shape) != (n, k // BLOCK):
        raise ArgumentError(
            "block_scales",
            f"shape [N, K/{BLOCK}] = [{n}, {k // BLOCK}] (from packed)",
            tuple(block_scales.shape),
        )
    check_tensor("global_scale", global_scale, dtypes=(torch.float32,))
    if global_scale.numel() != 1 or global_scale.dim() > 1:
        raise ArgumentError("global_scale", "a fp32 scalar (shape () or (1,))", tuple(global_scale.shape))
    g = float(global_scale.reshape(()).item())
    if not (g > 0.0 and g < float("inf")):
        raise ArgumentError("global_scale", "a finite value > 0", g)
    return n, k


def validate(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None,
) -> Nvfp4Args:
    """Check the arguments of :func:`w4a16_nvfp4_matmul` (shared with the fast launcher).

    Raises
    ------
    DTypeError
        ``x`` not bf16 / fp16; ``bias`` neither ``x``'s dtype nor fp32; ``out_dtype`` neither
        ``x``'s dtype nor fp32; the weight's dtypes (:func:`check_weight`).
    ArgumentError
        ``x`` not 2-D, its K odd, not a multiple of 16 or not the weight's K; ``bias`` not
        ``[N]``; the weight's shapes (:func:`check_weight`).
    DeviceError
        an operand on another device than ``x``.
    """
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2)
    m, k = x.shape
    if k % 2 != 0:
        raise ArgumentError("x", "an even K (two e2m1 codes per byte of packed)", tuple(x.shape))
    if k % BLOCK != 0:
        raise ArgumentError("x", f"K a multiple of {BLOCK} (NVFP4 blocks of {BLOCK})", tuple(x.shape))
    check_tensor("packed", packed)
    check_same_device("packed", packed, x.device)
    n, wk = check_weight(packed, block_scales, global_scale)
    if wk != k:
        raise ArgumentError(
            "packed", f"shape [N, K/2] with K/2 = {k // 2} (x.shape[1] / 2)", tuple(packed.shape)
        )
    if bias is not None:
        ref_matmul.check_bias(bias, n, x.device, (x.dtype, torch.float32), f"{_name(x.dtype)} or float32")
    if out_dtype is None:
        out_dtype = x.dtype
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in (x.dtype, torch.float32):
        raise DTypeError("out_dtype", f"{_name(x.dtype)} (the dtype of x) or float32", out_dtype)
    return Nvfp4Args(m, n, k, out_dtype)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """``packed [N, K/2] uint8`` -> ``codes [N, K] uint8`` (0..15): low nibble = even k."""
    check_tensor("packed", packed, dtypes=(torch.uint8,), ndim=2)
    n, half_k = packed.shape
    codes = torch.empty(n, 2 * half_k, dtype=torch.uint8, device=packed.device)  # [N, K]
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return codes


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """``codes [N, K] uint8`` (each 0..15, K even) -> ``packed [N, K/2] uint8``, low nibble = even k.

    Raises ``ArgumentError`` (``codes``) for an odd K or a code above 15."""
    check_tensor("codes", codes, dtypes=(torch.uint8,), ndim=2)
    if codes.shape[1] % 2 != 0:
        raise ArgumentError("codes", "an even K (two codes per byte)", tuple(codes.shape))
    if codes.numel() and int(codes.max()) > 15:
        raise ArgumentError("codes", "4-bit codes (0..15)", int(codes.max()))
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15, any shape) -> fp64 values, from the bit fields: sign bit 3,
    exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0 subnormal (``m / 2``).  Code 8 is -0."""
    c = codes.to(torch.int64)
    sign, exponent, mantissa = (c >> 3) & 1, (c >> 1) & 3, c & 1
    mant = mantissa.to(torch.float64)
    normal = (1.0 + mant / 2.0) * power_of_two(exponent - 1)  # 2**(e-1) * (1 + m/2), exact on CUDA too
    magnitude = torch.where(exponent == 0, mant / 2.0, normal)
    return torch.where(sign == 1, -magnitude, magnitude)


def dequantize_nvfp4(
    packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor
) -> torch.Tensor:
    """The exact NVFP4 weight ``w[n, k] = e2m1(code[n, k]) * block_scales[n, k // 16] * global_scale``.

    Parameters
    ----------
    packed : Tensor [N, K/2], uint8
        Two e2m1 codes per byte along K, low nibble = even k.
    block_scales : Tensor [N, K/16], float8_e4m3fn
        Row-major (not swizzled).  A NaN scale (0x7f / 0xff) makes its 16 weights NaN.
    global_scale : Tensor (), fp32
        Finite, > 0.

    Returns
    -------
    Tensor [N, K], float64
        Exact (see the module docstring); ``-0`` codes give ``-0`` (times a positive scale).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`check_weight`.
    """
    n, k = check_weight(packed, block_scales, global_scale)
    values = decode_e2m1(unpack_e2m1(packed))  # [N, K]
    scales = block_scales.to(torch.float64)  # [N, B]; every e4m3 value is a fp64 value
    g = float(global_scale.reshape(()).item())  # a fp32 value, exact as a Python float
    w = (values.view(n, k // BLOCK, BLOCK) * scales[:, :, None]) * g  # [N, B, 16], exact
    return w.reshape(n, k)


def _round_to_grid(magnitude: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Codes of ``magnitude`` rounded to nearest, ties to the even code, on a grid whose code
    ``i`` and ``i + 1`` meet at ``thresholds[..., i]`` (sorted along the last dim, broadcast
    against ``magnitude[..., None]``).  Beyond the last threshold: the last code (saturation)."""
    t = thresholds
    steps = torch.arange(1, t.shape[-1] + 1, device=magnitude.device)  # the code above each threshold
    up = (magnitude[..., None] > t) | ((magnitude[..., None] == t) & (steps % 2 == 0))
    return up.sum(dim=-1)


def _e4m3_magnitudes(device: torch.device) -> torch.Tensor:
    """Finite non-negative e4m3fn values in code order (codes 0x00..0x7e), fp64, increasing."""
    return torch.arange(0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).to(torch.float64)


def quantize_nvfp4(
    w: torch.Tensor, global_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w [N, K]`` to NVFP4 exactly (for building test inputs): ``(packed, block_scales, global_scale)``.

    * ``global_scale`` (when not given): ``amax(|w|) / (6 * 448)`` rounded once to fp32 (1.0
      for an all-zero ``w``; at least ``2**-149``), so that the largest block scale fits e4m3;
    * each block's scale: ``amax_block / 6 / global_scale`` rounded to nearest e4m3fn, ties to
      even, saturating at 448 (the block's largest element maps to 6 or below);
    * each element: ``w / (scale * global_scale)`` rounded to nearest e2m1, ties to even,
      saturating at +-6; the sign kept (``-0`` -> code 8); a block whose scale rounds to 0
      gets codes +-0.

    Every rounding decision is exact: instead of dividing, ``|w|`` (read exactly as fp64) is
    compared with the grid's midpoints times the scales, products of at most 3 + 4 + 24 (e2m1
    midpoints, e4m3 scale, fp32 global) or 5 + 2 + 24 (e4m3 midpoints, 6, fp32 global)
    significant bits, exact in fp64.  Values already on the grid (each block holding an
    element of magnitude ``6 * scale * global_scale`` with a positive e4m3 ``scale``) come back
    with the same codes and scales.

    Raises
    ------
    DTypeError
        ``w`` not a floating tensor; ``global_scale`` not a fp32 tensor.
    ArgumentError
        ``w`` not 2-D, its K odd or not a multiple of 16, a non-finite element;
        ``global_scale`` not a finite fp32 scalar > 0.
    """
    check_tensor("w", w, dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16), ndim=2)
    n, k = w.shape
    if k % 2 != 0:
        raise ArgumentError("w", "an even K (two e2m1 codes per byte)", tuple(w.shape))
    if k % BLOCK != 0:
        raise ArgumentError("w", f"K a multiple of {BLOCK} (NVFP4 blocks of {BLOCK})", tuple(w.shape))
    w64 = w.to(torch.float64)
    if not bool(torch.isfinite(w64).all()):
        raise ArgumentError("w", "finite values", "a NaN or an infinity")
    magnitude = w64.abs().view(n, k // BLOCK, BLOCK)  # [N, B, 16]
    if global_scale is None:
        amax = float(magnitude.max()) if magnitude.numel() else 0.0
        g64 = round_once(torch.tensor(amax / (E2M1_MAX * E4M3_MAX), dtype=torch.float64), torch.float32)
        global_scale = torch.clamp(g64, min=2.0**-149) if amax > 0 else torch.tensor(1.0)
        global_scale = global_scale.to(torch.float32)
    check_tensor("global_scale", global_scale, dtypes=(torch.float32,))
    if global_scale.numel() != 1 or global_scale.dim() > 1:
        raise ArgumentError("global_scale", "a fp32 scalar (shape () or (1,))", tuple(global_scale.shape))
    g = float(global_scale.reshape(()).item())
    if not (g > 0.0 and g < float("inf")):
        raise ArgumentError("global_scale", "a finite value > 0", g)

    grid8 = _e4m3_magnitudes(w.device)  # [127]
    mid8 = (grid8[:-1] + grid8[1:]) / 2  # exact: <= 5 significant bits
    block_amax = magnitude.amax(dim=-1)  # [N, B]
    scale_codes = _round_to_grid(block_amax, mid8 * (E2M1_MAX * g))  # [N, B], 0..126
    block_scales = scale_codes.to(torch.uint8).view(torch.float8_e4m3fn)
    s = grid8[scale_codes]  # [N, B], fp64

    grid4 = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64, device=w.device)
    mid4 = (grid4[:-1] + grid4[1:]) / 2  # [7]: 0.25 .. 5, exact
    sg = (s * g)[:, :, None, None]  # [N, B, 1, 1]
    mag_codes = _round_to_grid(magnitude, mid4 * sg)  # [N, B, 16]
    mag_codes = torch.where(s[:, :, None] == 0, 0, mag_codes)
    sign = torch.signbit(w64).view(n, k // BLOCK, BLOCK).to(torch.int64) << 3
    codes = (mag_codes | sign).to(torch.uint8).reshape(n, k)
    return pack_e2m1(codes), block_scales, global_scale.reshape(()).clone()


def w4a16_nvfp4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Reference W4A16 NVFP4 linear ``out = x @ dequantize_nvfp4(W).T (+ bias)`` in fp64.

    Parameters
    ----------
    x : Tensor [M, K], bf16 or fp16
    packed, block_scales, global_scale
        The NVFP4 weight ``[N, K]`` (see :func:`dequantize_nvfp4`).
    bias : Tensor [N], optional
        ``x``'s dtype or fp32.
    out_dtype : torch.dtype, optional
        Validated like the fast path's (``x``'s dtype or fp32); the reference output is fp64
        and the harness rounds it once (:func:`batchinv.reference.exact.round_once`).

    Returns
    -------
    Tensor [M, N], float64
        The weight is dequantized exactly; each product is exact in fp64; the K-sum is one fp64
        dot product (error about ``K * 2**-53`` of ``|x| @ |w|``).  Row ``m`` depends on
        ``x[m]`` alone.  NaN and infinity follow IEEE products and sums.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`validate`.
    """
    args = validate(x, packed, block_scales, global_scale, bias, out_dtype)
    w = dequantize_nvfp4(packed, block_scales, global_scale)  # [N, K]
    out = x.to(torch.float64) @ w.t()  # [M, N]
    if bias is not None:
        out = out + bias.to(torch.float64)[None, :]
    assert tuple(out.shape) == (args.m, args.n)
    return out


def tolerance_bound(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest absolute error allowed for the W4A16 kernel this component specifies.

    The kernel model (the order of operations the sm100 kernel must keep to meet it):

    1. dequantize ``v = e2m1 * block_scale`` into ``x``'s 16-bit dtype -- exact: at most 2 + 4
       = 6 significant bits, magnitudes in ``[2**-10, 2688]``, inside bf16's and fp16's normal
       ranges (a NaN scale stays NaN);
    2. ``acc = x @ v.T`` with exact products and fp32 accumulation in any order: exactly
       :func:`batchinv.reference.matmul.tolerance_bound` on ``(x, v)`` with fp32 output,
       ``e_acc = gamma_K * (|x| @ |v|) + K * 2**-126``;
    3. ``acc * global_scale`` once, in fp32 (the epilogue's alpha): ``|g| e_acc`` carried, plus
       ``2**-24 * (|g acc_ref| + |g| e_acc) + 2**-149``;
    4. the bias added in fp32 and the rounding to ``out_dtype``, as in
       :func:`batchinv.reference.matmul.tolerance_bound`.

    A kernel that folds ``global_scale`` into the 16-bit weight (rounding ``v * g`` per
    element) is outside this model; its bound would need its own derivation.

    Returns
    -------
    Tensor [M, N], float64 (NaN where the reference is NaN).
    """
    args = validate(x, packed, block_scales, global_scale, bias, out_dtype)
    n, k = args.n, args.k
    v64 = (
        decode_e2m1(unpack_e2m1(packed)).view(n, k // BLOCK, BLOCK)
        * block_scales.to(torch.float64)[:, :, None]
    )
    v64 = v64.reshape(n, k)  # [N, K], exact
    v16 = v64.to(x.dtype)
    same = (v16.to(torch.float64) == v64) | torch.isnan(v64)
    assert bool(same.all()), "e2m1 * e4m3 must be exact in the 16-bit dtype"
    g = float(global_scale.reshape(()).item())
    acc_ref = x.to(torch.float64) @ v64.t()  # [M, N]
    e_acc = ref_matmul.tolerance_bound(x, v16, None, out_dtype=torch.float32, reference=acc_ref)
    if reference is None:
        reference = w4a16_nvfp4_matmul(x, packed, block_scales, global_scale, bias, out_dtype=out_dtype)
    u32 = ref_matmul.unit_roundoff(torch.float32)
    e_scaled = g * e_acc
    e_scale = e_scaled + u32 * (g * acc_ref.abs() + e_scaled) + 2.0**-149
    v = reference.to(torch.float64).abs()  # [M, N]
    e_bias = u32 * (v + e_scale) + ref_matmul.FP32_MIN_NORMAL if bias is not None else 0.0 * v
    if args.out_dtype == torch.float32:
        e_out = 0.0 * v
    else:
        fin = torch.finfo(args.out_dtype)
        e_out = (
            ref_matmul.unit_roundoff(args.out_dtype) * (v + e_scale + e_bias)
            + fin.smallest_normal * fin.eps / 2
        )
    return e_scale + e_bias + e_out
