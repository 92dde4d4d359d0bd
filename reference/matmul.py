"""Reference matmul: ``out = x @ W (+ bias)`` in fp64, and the tolerance a fp32-accumulating
kernel is held to.

Dimension legend:
    M   rows of ``x`` (the batch axis; one row per token)
    K   reduction length (input features)
    N   output columns (output features; experts for a router)

Layouts of ``weight``:
    ``"linear"``: ``weight[N, K]``, ``out = x @ weight.T`` (``torch.nn.functional.linear``; the
    production layout).  ``"mm"``: ``weight[K, N]``, ``out = x @ weight`` (``torch.mm``).

The argument validation here is shared with the fast launcher, so bad input raises the same
typed error from both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor

INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
LAYOUTS: tuple[str, ...] = ("linear", "mm")
PRECISIONS: tuple[str, ...] = ("ieee", "tf32")

#: fp32 machine epsilon 2**-23 (twice the unit roundoff): one accumulation step's relative error
#: when an adder may truncate instead of rounding to nearest (tensor-core alignment).
FP32_EPS = 2.0**-23
#: Smallest positive normal fp32: the absolute error of one fp32 operation whose result falls in
#: the subnormal range is below it, flushed to zero or not.
FP32_MIN_NORMAL = 2.0**-126


@dataclass(frozen=True)
class MatmulArgs:
    """Validated problem sizes of one call."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _x_dtype_or_fp32(x_dtype: torch.dtype, *, note: bool = False) -> str:
    """``"<x's dtype> or float32"``, naming float32 once when it is x's dtype."""
    first = _name(x_dtype) + (" (the dtype of x)" if note else "")
    return first if x_dtype == torch.float32 else f"{first} or float32"


def validate(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layout: str,
    out_dtype: torch.dtype | None,
    precision: str,
) -> MatmulArgs:
    """Check the arguments of :func:`matmul` (and of the fast launcher).

    Raises
    ------
    DTypeError
        ``x`` not bf16 / fp16 / fp32; ``weight`` of another dtype than ``x``; ``bias`` neither
        ``x``'s dtype nor fp32; ``out_dtype`` neither ``x``'s dtype nor fp32.
    ArgumentError
        Non-2-D ``x`` or ``weight``, ``weight``'s K differing from ``x``'s, ``bias`` not ``[N]``,
        unknown ``layout`` or ``precision``, ``precision="tf32"`` with non-fp32 inputs.
    DeviceError
        ``weight`` or ``bias`` on another device than ``x``.
    """
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2)
    if layout not in LAYOUTS:
        raise ArgumentError("layout", "'linear' (weight [N, K]) or 'mm' (weight [K, N])", layout)
    if precision not in PRECISIONS:
        raise ArgumentError("precision", "'ieee' or 'tf32'", precision)
    check_tensor("weight", weight)
    if weight.dtype != x.dtype:
        raise DTypeError("weight", f"dtype {_name(x.dtype)} (the dtype of x)", _name(weight.dtype))
    check_tensor("weight", weight, ndim=2)
    check_same_device("weight", weight, x.device)
    m, k = x.shape
    shape_text = "[N, K]" if layout == "linear" else "[K, N]"
    wk = weight.shape[1] if layout == "linear" else weight.shape[0]
    n = weight.shape[0] if layout == "linear" else weight.shape[1]
    if wk != k:
        raise ArgumentError(
            "weight",
            f"shape {shape_text} with K = {k} (x.shape[1]) for layout {layout!r}",
            tuple(weight.shape),
        )
    if bias is not None:
        check_bias(bias, n, x.device, (x.dtype, torch.float32), _x_dtype_or_fp32(x.dtype))
    if out_dtype is None:
        out_dtype = x.dtype
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in (x.dtype, torch.float32):
        raise DTypeError("out_dtype", _x_dtype_or_fp32(x.dtype, note=True), out_dtype)
    if precision == "tf32" and x.dtype != torch.float32:
        raise ArgumentError(
            "precision", "'ieee' for bf16/fp16 inputs ('tf32' applies to fp32 only)", precision
        )
    return MatmulArgs(m, n, k, out_dtype)


def check_bias(
    bias: torch.Tensor, n: int, device: torch.device, dtypes: tuple[torch.dtype, ...], expected: str
) -> None:
    """Check a GEMM's ``bias``: a dense tensor of one of ``dtypes`` (``expected`` names them in the
    message), on ``device``, of shape ``[N]`` (shared by the matmul, FP8 GEMM and NVFP4 references).

    Raises ``DTypeError`` (not a tensor, another dtype), ``ArgumentError`` (another shape) or
    ``DeviceError`` (another device), each naming ``bias``."""
    check_tensor("bias", bias)
    if bias.dtype not in dtypes:
        raise DTypeError("bias", f"dtype {expected}", _name(bias.dtype))
    check_same_device("bias", bias, device)
    if tuple(bias.shape) != (n,):
        raise ArgumentError("bias", f"shape [N] = [{n}]", tuple(bias.shape))


def weight_kn(weight: torch.Tensor, layout: str) -> torch.Tensor:
    """``weight`` viewed as ``[K, N]`` (a transpose view for the linear layout)."""
    return weight.t() if layout == "linear" else weight


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """Reference ``out = x @ W (+ bias)`` computed in fp64.

    Parameters
    ----------
    x : Tensor [M, K]
        bf16, fp16 or fp32.
    weight : Tensor [N, K] (``layout="linear"``) or [K, N] (``layout="mm"``)
        Same dtype as ``x``.
    bias : Tensor [N], optional
        ``x``'s dtype or fp32.
    layout : {"linear", "mm"}
    out_dtype : torch.dtype, optional
        Validated like the fast path's (``x``'s dtype or fp32); the reference output is fp64.
    precision : {"ieee", "tf32"}
        Validated only; the reference is fp64 either way.

    Returns
    -------
    Tensor [M, N], float64
        Every operand is converted exactly to fp64; each output is a fp64 dot product (error
        about K * 2**-53 relative to ``|x| @ |W|``, negligible next to fp32 accumulation).
        Row ``m`` depends on ``x[m]`` alone.  NaN and infinity follow IEEE products and sums
        (``inf * 0`` is NaN; a NaN in ``x[m]`` makes row ``m`` NaN).

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`validate`.
    """
    args = validate(x, weight, bias, layout, out_dtype, precision)
    w = weight_kn(weight, layout).to(torch.float64)  # [K, N]
    assert tuple(w.shape) == (args.k, args.n)
    out = x.to(torch.float64) @ w  # [M, N]
    if bias is not None:
        out = out + bias.to(torch.float64)[None, :]  # [M, N]
    assert tuple(out.shape) == (args.m, args.n)
    return out


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next representable value of ``dtype``."""
    return torch.finfo(dtype).eps / 2


def tolerance_bound(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest absolute error allowed for a fp32-accumulating kernel, per output element.

    Derivation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1):

    * products: exact in fp32 for bf16/fp16 inputs (8 + 8 or 11 + 11 significant bits fit in
      24), fused into the add (FMA) for fp32 inputs under IEEE precision;
    * accumulation: K fp32 additions, each with relative error at most ``eps = 2**-23`` (twice
      the unit roundoff, allowing a tensor-core adder that truncates instead of rounding):
      ``e_acc = gamma_K * S + K * 2**-126`` with ``S = |x| @ |W|`` in fp64,
      ``gamma_K = K eps / (1 - K eps)``, and ``2**-126`` per operation for underflow;
    * bias, added in fp32 with round-to-nearest: ``e_bias = 2**-24 * (|ref| + e_acc)``;
    * one rounding to ``out_dtype`` (none when it is fp32, the accumulator's own type):
      ``e_out = u_out * (|ref| + e_acc + e_bias) + min_subnormal(out_dtype) / 2``.

    ``bound = e_acc + e_bias + e_out``.  It holds for any order of the additions, so it grows as
    ``K eps S``: at K = 4096 about 2**-11 of ``S``, above a TF32 operand rounding (``2**-11`` per
    product, random signs) and near one product's size.  :func:`tight_bound` is the one judged.

    Parameters
    ----------
    reference : Tensor [M, N], float64, optional
        :func:`matmul`'s output for these arguments (computed when not given).

    Returns
    -------
    Tensor [M, N], float64
        NaN where the reference is NaN (the comparator then requires a NaN).
    """
    args = validate(x, weight, bias, layout, out_dtype, "ieee")
    if reference is None:
        reference = matmul(x, weight, bias, layout=layout, out_dtype=out_dtype)
    w_abs = weight_kn(weight, layout).to(torch.float64).abs()  # [K, N]
    s = x.to(torch.float64).abs() @ w_abs  # [M, N]
    assert tuple(s.shape) == tuple(reference.shape) == (args.m, args.n)
    k = args.k
    gamma = k * FP32_EPS / (1.0 - k * FP32_EPS)
    v = reference.to(torch.float64).abs()  # [M, N]
    e_acc = gamma * s + k * FP32_MIN_NORMAL
    e_bias = unit_roundoff(torch.float32) * (v + e_acc) + FP32_MIN_NORMAL if bias is not None else 0.0 * s
    if args.out_dtype == torch.float32:
        e_out = 0.0 * s
    else:
        fin = torch.finfo(args.out_dtype)
        e_out = unit_roundoff(args.out_dtype) * (v + e_acc + e_bias) + fin.smallest_normal * fin.eps / 2
    return e_acc + e_bias + e_out


def _gamma(n: int, eps: float) -> float:
    return n * eps / (1.0 - n * eps)


#: Elements of the [ng, rows, N] group sums formed at once by :func:`_partial_sums`.
_PARTIAL_CHUNK = 1 << 24


def _partial_sums(
    x64: torch.Tensor, w: torch.Tensor, group: int, steps: int, chunk_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial sums a chunked accumulation adds to, per output (x64 [M, K], w [K, N],
    float64; each [M, N]):

    * ``sum |Q_(c,g)|`` over every chunk ``c`` and every group ``g`` but the chunk's last, with
      ``Q_(c,g)`` the fp64 sum of the chunk's first ``g`` groups of ``group`` products (the
      accumulator a step adds to; the chunk's first step adds to zero);
    * ``sum |T_c|`` over the chunks but the first, ``T_c`` the fp64 sum of the first ``c``
      chunks (what the chunk-order additions produce).

    ``chunk_groups`` groups per chunk; one chunk covering all ``steps`` groups is the plain
    increasing-k accumulation (the second sum is then 0)."""
    m, k = x64.shape
    n = w.shape[1]
    chunks = -(-steps // chunk_groups)
    padded = chunks * chunk_groups * group
    xp = torch.zeros(m, padded, dtype=torch.float64, device=x64.device)
    xp[:, :k] = x64
    wp = torch.zeros(padded, n, dtype=torch.float64, device=w.device)
    wp[:k] = w
    total_groups = chunks * chunk_groups
    wg = wp.view(total_groups, group, n)  # [G_all, group, N]
    within = torch.zeros(m, n, dtype=torch.float64, device=x64.device)
    across = torch.zeros(m, n, dtype=torch.float64, device=x64.device)
    rows = max(1, _PARTIAL_CHUNK // max(1, total_groups * n))
    for r0 in range(0, m, rows):
        xg = xp[r0 : r0 + rows].view(-1, total_groups, group).transpose(0, 1)  # [G_all, r, group]
        sums = torch.bmm(xg, wg).view(chunks, chunk_groups, -1, n)  # group sums, [C, Gc, r, N]
        q = sums.cumsum(dim=1)  # Q_(c,1) .. Q_(c,Gc)
        within[r0 : r0 + rows] = q[:, :-1].abs().sum(dim=(0, 1))
        t = q[:, -1].cumsum(dim=0)  # T_1 .. T_C
        across[r0 : r0 + rows] = t[1:].abs().sum(dim=0)
    return within, across


def tight_bound(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    reference: torch.Tensor | None = None,
    group: int = 16,
    chunk: int | None = None,
) -> torch.Tensor:
    """An a-posteriori bound for fp32 accumulation in increasing ``k`` by groups of ``group``,
    in chunks of ``chunk`` products whose sums are added in chunk order.

    The kernel's order (``batchinv.fast.kernels.matmul``): one fp32 accumulator per output walks
    ``k = 0 .. K-1`` in order; each step adds a group of ``G = group`` consecutive products
    (groups aligned at ``k = 0``): a tensor-core MMA's k-step (16), an FMA per product (any G
    covers it), or one interpreter K tile (``BLOCK_K`` products summed in any order).  A step
    sums G + 1 terms (the accumulator and G products) in some order, each addition with relative
    error <= ``eps = 2**-23`` (a truncating adder allowed); the tensor-core alignment model (every
    addend truncated to the grid of the largest, then one truncation) stays within
    ``gamma_(G+2)`` of the terms' absolute sum.  So, with ``P_g`` the exact partial sum after
    ``g`` groups (``P_0 = 0``), ``S_g`` the group's ``sum |x_k w_k|`` and ``S = sum_g S_g``:

        |acc - P| <= gamma_(G+2) * (sum_(g < ng) |P_g| + S)             (first order)
                     + ng * gamma_(G+2) * (gamma_K + gamma_K^(fp64)) * S  (the accumulator's own
                       error carried into later steps; the fp64 partial sums' error)
                     + u * S for fp32 inputs (the interpreter rounds each fp32 product; a GPU's
                       FMA does not) + K * 2**-126 (underflow)

    With chunks (``chunk``: a multiple of ``group``; None or ``>= K``: one chunk), the
    kernel's reduction tree (``batchinv.fast.matmul_config.ReductionTree``): each chunk is the
    accumulation above from zero, so ``sum |P_g|`` becomes the sum over chunks of the partial
    sums ``|Q_(c,g)|`` inside each chunk, and the chunk sums are added in order to a total:
    ``C - 1`` fp32 additions whose results are the exact ``T_c`` (first ``c`` chunks) up to the
    error so far, adding ``eps * (sum_(c >= 2) |T_c| + (C - 1) gamma_K S)``.

    then the bias and output roundings as :func:`tolerance_bound`.  The bound is rigorous for
    that order of operations, not a probabilistic estimate; it is far below
    :func:`tolerance_bound` on ordinary data because ``|P_g|`` is the size of the partial sum,
    not of ``S``: for random-sign products it grows like ``sqrt(k)``, so at K = 4096 the bound
    is 2-6% of the rigorous one (G = 16).  A TF32 operand rounding (a random ``2**-11`` of each
    product), a bf16 rounding of fp32 logits (up to ``2**-8 |ref|``), 16-bit accumulation (up to ``2**-8`` or
    ``2**-11`` of each partial sum, per step) and a dropped product all exceed it.

    ``group`` must be the lane's grouping or coarser-aligned: the caller
    (``harness/components/matmul.py``) passes 16 on GPU lanes and ``BLOCK_K`` on the
    interpreter.

    Returns
    -------
    Tensor [M, N], float64 (NaN where the reference is NaN, as :func:`tolerance_bound`).
    """
    args = validate(x, weight, bias, layout, out_dtype, "ieee")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ArgumentError("group", "a positive int (products per accumulation step)", group)
    if chunk is not None and (
        isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1 or chunk % group
    ):
        raise ArgumentError("chunk", f"None or a positive multiple of group = {group}", chunk)
    if reference is None:
        reference = matmul(x, weight, bias, layout=layout, out_dtype=out_dtype)
    w = weight_kn(weight, layout).to(torch.float64)  # [K, N]
    x64 = x.to(torch.float64)  # [M, K]
    s = x64.abs() @ w.abs()  # [M, N]
    k = args.k
    steps = max(1, -(-k // group))  # ng
    chunk_groups = steps if chunk is None else min(steps, chunk // group)
    partial_sum, chunk_totals = _partial_sums(x64, w, group, steps, chunk_groups)
    chunks = -(-steps // chunk_groups)
    g = _gamma(group + 2, FP32_EPS)
    carried = (steps * g + (chunks - 1) * FP32_EPS) * (_gamma(k, FP32_EPS) + _gamma(k, 2.0**-53)) * s
    across = FP32_EPS * chunk_totals
    products = unit_roundoff(torch.float32) * s if x.dtype == torch.float32 else 0.0 * s
    e_acc = g * (partial_sum + s) + across + carried + products + k * FP32_MIN_NORMAL
    v = reference.to(torch.float64).abs()  # [M, N]
    e_bias = unit_roundoff(torch.float32) * (v + e_acc) + FP32_MIN_NORMAL if bias is not None else 0.0 * s
    if args.out_dtype == torch.float32:
        e_out = 0.0 * s
    else:
        fin = torch.finfo(args.out_dtype)
        e_out = unit_roundoff(args.out_dtype) * (v + e_acc + e_bias) + fin.smallest_normal * fin.eps / 2
    return e_acc + e_bias + e_out


#: TF32's explicit mantissa bits (fp32 has 23; TF32 keeps the fp32 exponent and 10 of them).
TF32_MANTISSA_BITS = 10
#: How hardware rounds fp32 operands to TF32: to nearest even (the usual model), to nearest with
#: ties away from zero (PTX ``cvt.rna.tf32.f32``, what Triton's ``tf32`` emits) or toward zero
#: (tensor cores fed raw fp32 bits, the low 13 ignored).
TF32_ROUNDINGS: tuple[str, ...] = ("nearest_even", "nearest_away", "toward_zero")


def round_to_tf32(t: torch.Tensor, rounding: str = "nearest_even") -> torch.Tensor:
    """fp32 ``t`` rounded to TF32 (10 explicit mantissa bits, fp32's exponent range), as fp32.

    ``rounding`` is one of :data:`TF32_ROUNDINGS`; infinities and NaN are kept; a finite value
    may round up to infinity, as the hardware's does.  Raises ``ArgumentError`` for another
    ``rounding`` and ``DTypeError`` for a non-fp32 tensor.
    """
    if rounding not in TF32_ROUNDINGS:
        raise ArgumentError("rounding", f"one of {TF32_ROUNDINGS}", rounding)
    check_tensor("t", t, dtypes=(torch.float32,))
    drop = 23 - TF32_MANTISSA_BITS  # low bits that TF32 drops
    bits = t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # raw bits, unsigned
    half = 1 << (drop - 1)
    if rounding == "nearest_even":
        bits = bits + (half - 1) + ((bits >> drop) & 1)
    elif rounding == "nearest_away":
        bits = bits + half  # the sign is bit 31: magnitudes round away from zero
    bits = bits & ~((1 << drop) - 1)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return torch.where(torch.isfinite(t), bits.view(torch.float32).view(t.shape), t)


def tf32_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    rounding: str = "nearest_even",
) -> torch.Tensor:
    """A model of a kernel that computes fp32 matmuls in TF32: :func:`matmul` (fp64, [M, N]) of
    fp32 ``x`` and ``weight`` first rounded to TF32 (:func:`round_to_tf32`); the bias is kept.

    Agreement uses it to say *why* an fp32 output is off: an output that misses the IEEE
    reference's bound but meets the same bound around this model is TF32-sized.  Raises
    ``ArgumentError`` (via :func:`validate`) for non-fp32 inputs: TF32 touches fp32 only.
    """
    validate(x, weight, bias, layout, out_dtype, precision)
    if x.dtype != torch.float32:
        raise ArgumentError("x", "float32 (TF32 rounds fp32 operands only)", x.dtype)
    rx, rw = round_to_tf32(x, rounding), round_to_tf32(weight, rounding)
    return matmul(rx, rw, bias, layout=layout, out_dtype=out_dtype, precision=precision)
