"""The torch-function layer of ``batchinv.enable()``: covered ops become ``torch.ops.batchinv``.

:class:`PinnedOps` is a ``TorchFunctionMode``: while it is active, every call of an op the
components cover -- ``F.linear``, ``torch.mm`` / ``matmul`` / ``@`` / ``bmm`` / ``addmm``
(2-D and 3-D), ``F.rms_norm``, ``softmax`` / ``log_softmax`` and ``mean`` over the last dim --
is answered by the pinned operator (:mod:`batchinv.fast.ops`).  ``torch.compile`` traces
through torch-function modes, so a model compiled inside the mode (or compiled before: Dynamo
guards on the mode stack and recompiles) holds the ``batchinv`` operators in its graph, and
Inductor runs them as opaque calls: the compiled model gets the eager bits.

A covered call the kernels cannot take (a dtype, device, dim or argument outside their
contract) is *unpinned*: with ``strict`` it raises :class:`UnpinnedOpError` naming the op and
the reason (at trace time under ``torch.compile``); without, it runs the original op and is
counted in ``fallback``.

Source: the operator-override approach of Thinking Machines' ``batch_invariant_ops`` (there an
aten library override, which Inductor bypasses -- issue 14's finding), moved up to the
torch-function level that Dynamo traces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from batchinv.fast import ops as _ops  # noqa: F401  (registers torch.ops.batchinv.*)
from batchinv.fast.device import interpreting
from batchinv.reference.errors import BatchinvError

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class UnpinnedOpError(BatchinvError, RuntimeError):
    """A covered op ran inside ``enable(strict=True)`` with arguments no pinned kernel takes."""

    def __init__(self, op: str, reason: str) -> None:
        self.op, self.reason = op, reason
        super().__init__(f"{op} cannot run pinned inside batchinv.enable(strict=True): {reason}")


class _Unpinned(Exception):
    """Internal: this call stays unpinned, for ``reason``."""


def _need(ok: bool, reason: str) -> None:
    if not ok:
        raise _Unpinned(reason)


def _check_tensors(*tensors: torch.Tensor | None) -> None:
    present = [t for t in tensors if t is not None]
    _need(all(isinstance(t, torch.Tensor) for t in present), "a non-tensor operand")
    first = present[0]
    _need(first.dtype in _DTYPES, f"dtype {first.dtype} (the kernels take bf16, fp16, fp32)")
    _need(all(t.dtype == first.dtype for t in present), "operands of different dtypes")
    _need(all(t.device == first.device for t in present), "operands on different devices")
    on_cpu_interpreted = first.device.type == "cpu" and interpreting()
    _need(first.device.type == "cuda" or on_cpu_interpreted, f"device {first.device} without the interpreter")
    _need(
        not any(t.requires_grad and torch.is_grad_enabled() for t in present), "an operand that requires grad"
    )


def _last_dim(x: torch.Tensor, dim: Any) -> None:
    _need(isinstance(dim, int) and dim in (-1, x.dim() - 1), f"dim={dim!r} (the kernels reduce the last dim)")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    _check_tensors(x, weight, bias)
    _need(weight.dim() == 2 and x.dim() >= 1, "a weight that is not 2-D")
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.batchinv.matmul(flat, weight, bias, "linear", None, "ieee")
    return out.view(*x.shape[:-1], weight.shape[0])


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_tensors(a, b)
    _need(a.dim() == 2 and b.dim() == 2, "mm operands that are not 2-D")
    return torch.ops.batchinv.matmul(a, b, None, "mm", None)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[B, M, K] @ [B, K, N]``: one pinned matmul per batch entry (each row's sum is its own)."""
    _check_tensors(a, b)
    _need(
        a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0],
        "bmm operands other than [B, M, K], [B, K, N]",
    )
    return torch.stack([torch.ops.batchinv.matmul(a[i], b[i], None, "mm", None) for i in range(a.shape[0])])


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[..., K] @ [K, N]`` (rows flattened) or a 3-D batched product."""
    _check_tensors(a, b)
    if a.dim() == 3 and b.dim() == 3:
        return _bmm(a, b)
    _need(
        a.dim() >= 2 and b.dim() == 2, "matmul operands other than [..., K] @ [K, N] or [B, M, K] @ [B, K, N]"
    )
    flat = a.reshape(-1, a.shape[-1])
    return torch.ops.batchinv.matmul(flat, b, None, "mm", None).view(*a.shape[:-1], b.shape[1])


def _addmm(
    inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    _check_tensors(inp, a, b)
    _need(a.dim() == 2 and b.dim() == 2, "addmm operands that are not 2-D")
    _need(beta == 1 and alpha == 1, "beta or alpha other than 1")
    _need(inp.dim() == 1 and inp.shape[0] == b.shape[1], "an input that is not a row bias of N")
    return torch.ops.batchinv.matmul(a, b, inp, "mm", None)


def _rms_norm(
    x: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None = None, eps: float | None = None
) -> torch.Tensor:
    _check_tensors(x, weight)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    _need(shape == (x.shape[-1],), f"normalized_shape {shape} (the kernel normalizes the last dim)")
    w = weight if weight is not None else x.new_ones(x.shape[-1])
    return torch.ops.batchinv.rms_norm(x, w, 1e-6 if eps is None else float(eps), -1)


def _softmax_like(op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def call(
        x: torch.Tensor, dim: Any = None, _stacklevel: int = 3, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        _check_tensors(x)
        _last_dim(x, dim)
        half = x.dtype in (torch.float16, torch.bfloat16)
        _need(dtype in (None, x.dtype) or (dtype == torch.float32 and half), f"dtype={dtype}")
        return op(x, -1, dtype == torch.float32 and half)

    return call


_softmax = _softmax_like(torch.ops.batchinv.softmax)
_log_softmax = _softmax_like(torch.ops.batchinv.log_softmax)


def _mean(
    x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    _check_tensors(x)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    _last_dim(x, dim)
    return torch.ops.batchinv.mean(x, -1, bool(keepdim), dtype)


#: Covered op -> (its name in stats and errors, the pinned handler).
HANDLERS: dict[Callable[..., Any], tuple[str, Callable[..., torch.Tensor]]] = {
    F.linear: ("linear", _linear),
    torch.mm: ("mm", _mm),
    torch.Tensor.mm: ("mm", _mm),
    torch.matmul: ("matmul", _matmul),
    torch.Tensor.matmul: ("matmul", _matmul),
    torch.Tensor.__matmul__: ("matmul", _matmul),
    torch.bmm: ("bmm", _bmm),
    torch.Tensor.bmm: ("bmm", _bmm),
    torch.addmm: ("addmm", _addmm),
    torch.Tensor.addmm: ("addmm", _addmm),
    F.rms_norm: ("rms_norm", _rms_norm),
    torch.rms_norm: ("rms_norm", _rms_norm),  # what Dynamo sees of F.rms_norm when it inlines it
    F.softmax: ("softmax", _softmax),
    torch.softmax: ("softmax", _softmax),
    torch.Tensor.softmax: ("softmax", _softmax),
    F.log_softmax: ("log_softmax", _log_softmax),
    torch.log_softmax: ("log_softmax", _log_softmax),
    torch.Tensor.log_softmax: ("log_softmax", _log_softmax),
    torch.mean: ("mean", _mean),
    torch.Tensor.mean: ("mean", _mean),
}


class PinnedOps(TorchFunctionMode):
    """Answers the :data:`HANDLERS` ops with the pinned operators (module docstring)."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.strict = strict
        self.fallback: Counter[str] = Counter()

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        entry = HANDLERS.get(func)
        if entry is None:
            return func(*args, **kwargs)
        name, handler = entry
        try:
            return handler(*args, **kwargs)
        except _Unpinned as why:
            if self.strict:
                raise UnpinnedOpError(name, str(why)) from None
            self.fallback[name] += 1
            return func(*args, **kwargs)
