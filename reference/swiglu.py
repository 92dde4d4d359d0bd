"""Reference SwiGLU activation of the MoE expert (docs/MOE.md section 4): fp64, obviously correct.

Dimension legend:
    M: rows ((token, slot) pairs of the grouped GEMM's output); dim 0, the row axis.
    I: the intermediate size; ``gate_up`` holds ``[gate | up]``, 2 I columns.

Formula (exact real arithmetic, evaluated in fp64)::

    g = gate_up[m, j], u = gate_up[m, I + j], s = scale[m] (1 when scale is None)
    silu(g) = g / (1 + exp(-g))            for g >= 0 (and NaN)
            = g * exp(g) / (1 + exp(g))    for g < 0  (the same value; exp never overflows)
    out[m, j] = silu(g) * (u * s)

The fast kernel evaluates the same formula in fp32 with one final rounding to gate_up's dtype
(the scale last when |s| > 1); this reference evaluates it in fp64 (every input is exact there,
and ``u * s`` is exact: no fp64 overflow or underflow) and is within a few fp64 ULPs of the
exact value.  IEEE semantics: NaN anywhere gives NaN; silu(+inf) = +inf, silu(-inf) = -inf * 0
= NaN (the formula, as ``F.silu``); +-0 keep their sign (silu(-0) = -0); an exact zero factor
(g = +-0, u = +-0 or s = +-0) times an infinite one is NaN.  silu(g) of a finite nonzero g is
nonzero, but below g ~ -745 fp64's exp(-|g|) underflows and silu64 gives -0: times an infinite
``u * s`` that would be NaN, so there the output is the exact limit, the signed infinity
sign(g) * (u * s).  (Times a finite ``u * s`` the lost value is below 2^-700, far under half of
any output dtype's smallest subnormal.)
Argument validation is shared with the fast launcher (:func:`check_swiglu_args`).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, DTypeError, check_same_device, check_tensor

#: Dtypes of gate_up (the grouped GEMM's output); scale is fp32.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


def check_swiglu_args(gate_up: Any, scale: Any) -> None:
    """Validate the arguments of :func:`swiglu`.

    Raises:
        DTypeError: gate_up not a bf16 / fp16 tensor; scale not None nor an fp32 tensor.
        ArgumentError: gate_up not 2-D, or its last dim odd or 0; scale not 1-D of length M.
        DeviceError: scale on another device than gate_up; a meta tensor.
    """
    check_tensor("gate_up", gate_up, dtypes=SUPPORTED_DTYPES, ndim=2)
    if gate_up.shape[1] == 0 or gate_up.shape[1] % 2:
        raise ArgumentError(
            "gate_up", "a last dimension 2 I with I >= 1 (gate then up)", f"shape {tuple(gate_up.shape)}"
        )
    if scale is None:
        return
    if not isinstance(scale, torch.Tensor):
        raise DTypeError("scale", "None or a torch.Tensor", type(scale).__name__)
    check_tensor("scale", scale, dtypes=(torch.float32,), ndim=1)
    if scale.shape[0] != gate_up.shape[0]:
        raise ArgumentError("scale", f"shape ({gate_up.shape[0]},), one per row", tuple(scale.shape))
    check_same_device("scale", scale, gate_up.device)


def silu64(g: torch.Tensor) -> torch.Tensor:
    """silu of fp64 ``g`` in the overflow-free form of the module docstring (fp64 out)."""
    e = torch.exp(-g.abs())  # (0, 1], NaN for NaN
    num = torch.where(g < 0, g * e, g)
    return num / (1.0 + e)


def swiglu(gate_up: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * (up * scale)`` per element, in fp64 (signed infinity where silu
    underflows fp64 and ``up * scale`` is infinite: see the module docstring).

    Parameters
    ----------
    gate_up : Tensor [M, 2 I], bfloat16 or float16 (gate = columns :I, up = columns I:)
    scale : Tensor [M], float32, optional (the routing weight applied at the activation)

    Returns
    -------
    Tensor [M, I], float64, on gate_up's device.  Row-local (a row reads only itself and its
    scale), hence bitwise invariant along every batch axis.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see :func:`check_swiglu_args`.
    """
    check_swiglu_args(gate_up, scale)
    m, two_i = gate_up.shape
    i = two_i // 2
    x = gate_up.to(torch.float64)
    g, u = x[:, :i], x[:, i:]  # [M, I] each
    if scale is not None:
        u = u * scale.to(torch.float64)[:, None]  # [M, I]
    silu = silu64(g)
    out = silu * u
    # silu underflowed fp64 (g < ~-745, finite): the exact limit times an infinite u * s
    lost = (silu == 0) & (g != 0) & torch.isinf(u)
    out = torch.where(lost, u * torch.sign(g), out)
    assert out.shape == (m, i)
    return out
