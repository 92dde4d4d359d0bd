"""The torch-function layer of ``batchinv.enable()``: covered ops become ``torch.ops.batchinv``.

:class:`PinnedOps` is a ``TorchFunctionMode``: while it is active, every call of an op the
components cover -- ``F.linear``, ``torch.mm`` / ``addmm`` (2-D), ``bmm`` (3-D), ``matmul`` / ``@`` (2-D and
batched N-D, broadcast), ``F.grouped_mm`` (2-D x 3-D with ``offs``: MoE experts), two-operand ``einsum`` (as one
batched product), ``F.rms_norm``, ``softmax`` / ``log_softmax`` and ``mean`` over the last dim,
``F.scaled_dot_product_attention`` (each query row over its own visible keys) --
is answered by the pinned operator (:mod:`batchinv.fast.enable.ops`).  ``torch.compile`` traces
through torch-function modes, so a model compiled inside the mode (or compiled before: Dynamo
guards on the mode stack and recompiles) holds the ``batchinv`` operators in its graph, and
Inductor runs them as opaque calls: the compiled model gets the eager bits.

A covered call the kernels cannot take (a dtype, device, dim or argument outside their
contract) is *unpinned*: with ``strict`` it raises :class:`UnpinnedOpError` naming the op and
the reason (at trace time under ``torch.compile``); without, it runs the original op and is
counted once in ``fallback``, when it returned (the aten calls it makes are pinned where the
aten layer can, and not counted again: :func:`batchinv.fast.enable.state.in_fallback`).

Source: the operator-override approach of Thinking Machines' ``batch_invariant_ops`` (there an
aten library override, which Inductor bypasses -- issue 14's finding), moved up to the
torch-function level that Dynamo traces.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from batchinv.fast.device import interpreting
from batchinv.fast.enable import ops as _ops  # noqa: F401  (registers torch.ops.batchinv.*)
from batchinv.fast.enable import state as _state
from batchinv.reference.errors import ArgumentError, BatchinvError

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
    _need(
        first.device.type == "cuda" or on_cpu_interpreted,
        f"device {first.device} without the interpreter (on a CPU set TRITON_INTERPRET=1 before triton is imported)",
    )
    _need(
        not any(t.requires_grad and torch.is_grad_enabled() for t in present), "an operand that requires grad"
    )


def _last_dim(x: torch.Tensor, dim: Any) -> None:
    _need(isinstance(dim, int) and dim in (-1, x.dim() - 1), f"dim={dim!r} (the kernels reduce the last dim)")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    _check_tensors(x, weight, bias)
    _need(weight.dim() == 2 and x.dim() >= 1, "a weight that is not 2-D")
    _need(x.shape[-1] > 0, "an empty reduction dim (K = 0)")
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.batchinv.matmul(flat, weight, bias, "linear", None, "ieee")
    return out.view(*x.shape[:-1], weight.shape[0])


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_tensors(a, b)
    _need(a.dim() == 2 and b.dim() == 2, "mm operands that are not 2-D")
    return torch.ops.batchinv.matmul(a, b, None, "mm", None)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[B, M, K] @ [B, K, N]``: the pinned matmul of each batch entry (``batchinv::bmm``)."""
    _check_tensors(a, b)
    _need(
        a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1],
        "bmm operands other than [B, M, K], [B, K, N]",
    )
    return torch.ops.batchinv.bmm(a, b)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[..., K] @ [K, N]`` (rows flattened into one matmul) or a batched product
    ``[..., M, K] @ [..., K, N]`` (batch dims broadcast as ``torch.matmul`` does, flattened into
    one ``batchinv::bmm``).  1-D operands stay unpinned."""
    _check_tensors(a, b)
    _need(a.dim() >= 2 and b.dim() >= 2, "a 1-D matmul operand (a vector product)")
    _need(a.shape[-1] == b.shape[-2], f"shapes {tuple(a.shape)} @ {tuple(b.shape)} that do not chain")
    _need(a.shape[-1] > 0, "an empty reduction dim (K = 0)")
    if b.dim() == 2:
        flat = a.reshape(-1, a.shape[-1])
        return torch.ops.batchinv.matmul(flat, b, None, "mm", None).view(*a.shape[:-1], b.shape[1])
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return torch.ops.batchinv.bmm(a3, b3).view(*batch, a.shape[-2], b.shape[-1])


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.grouped_mm`` / ``torch._grouped_mm`` of ``[S, K]`` rows grouped by ``offs`` times
    ``[G, K, N]`` (the MoE expert GEMM, as Hugging Face's ``grouped_mm`` experts call it)."""
    _check_tensors(a, b)
    _need(
        a.dim() == 2 and b.dim() == 3 and a.shape[1] == b.shape[1],
        "grouped_mm operands other than [S, K], [G, K, N]",
    )
    _need(
        isinstance(offs, torch.Tensor)
        and offs.dim() == 1
        and offs.shape[0] == b.shape[0]
        and offs.dtype == torch.int32,
        "offs other than int32 [G] group ends",
    )
    _need(bias is None and out_dtype in (None, a.dtype), "a bias or an out_dtype")
    return torch.ops.batchinv.grouped_mm(a, b, offs)


def _einsum(equation: Any, *operands: Any) -> torch.Tensor:
    """A two-operand ``torch.einsum`` as one batched product: the output's indices shared by
    both operands are the batch, the indices of one operand only are its rows (left) or columns
    (right), the indices of both that the output drops are the contraction K; the operands are
    permuted to ``[batch, left, K]`` and ``[batch, K, right]`` and multiplied by
    ``batchinv::bmm``.  Ellipses, diagonals (a repeated index), sums inside one operand and
    size-1 broadcasting stay unpinned."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    _need(isinstance(equation, str) and len(operands) == 2, "an einsum of other than two operands")
    a, b = operands
    _check_tensors(a, b)
    spec = equation.replace(" ", "")
    _need("..." not in spec, "an einsum with an ellipsis")
    inputs, _, out = spec.partition("->")
    _need(inputs.count(",") == 1, f"subscripts {equation!r} for two operands")
    ia, ib = inputs.split(",")
    if "->" not in spec:  # implicit output: the indices seen once, sorted
        out = "".join(sorted([c for c in ia + ib if (ia + ib).count(c) == 1]))
    _need(len(ia) == a.dim() and len(ib) == b.dim(), f"subscripts {equation!r} that do not match the ranks")
    _need(all(len(set(i)) == len(i) for i in (ia, ib, out)), "a repeated index (a diagonal)")
    _need(all(c in ia + ib for c in out), f"output index not in the inputs of {equation!r}")
    _need(
        all(c in ib or c in out for c in ia) and all(c in ia or c in out for c in ib),
        "a sum inside one operand",
    )
    _need(
        all(a.shape[ia.index(c)] == b.shape[ib.index(c)] for c in ia if c in ib),
        "shared indices of unequal size",
    )
    batch = [c for c in out if c in ia and c in ib]
    left = [c for c in out if c in ia and c not in ib]
    right = [c for c in out if c in ib and c not in ia]
    contracted = [c for c in ia if c in ib and c not in out]

    def size(t: torch.Tensor, subs: str, idx: list[str]) -> int:
        return math.prod([t.shape[subs.index(c)] for c in idx])  # a list: Dynamo traces it (fullgraph)

    a3 = a.permute([ia.index(c) for c in batch + left + contracted]).reshape(
        size(a, ia, batch), size(a, ia, left), size(a, ia, contracted)
    )
    b3 = b.permute([ib.index(c) for c in batch + contracted + right]).reshape(
        size(b, ib, batch), size(b, ib, contracted), size(b, ib, right)
    )
    order = batch + left + right
    dims = [a.shape[ia.index(c)] if c in ia else b.shape[ib.index(c)] for c in order]
    return torch.ops.batchinv.bmm(a3, b3).view(dims).permute([order.index(c) for c in out])


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
    eps = torch.finfo(x.dtype).eps if eps is None else float(eps)  # torch's default for None
    return torch.ops.batchinv.rms_norm(x, w, eps, -1)


def _softmax_like(op: Callable[..., torch.Tensor], functional: bool) -> Callable[..., torch.Tensor]:
    """The handler of one spelling: ``F.softmax(input, dim, _stacklevel, dtype)`` (functional)
    or ``torch.softmax(input, dim, dtype)`` / ``Tensor.softmax(dim, dtype)``, whose third
    positional argument is the dtype."""

    def pinned(x: torch.Tensor, dim: Any, dtype: torch.dtype | None) -> torch.Tensor:
        _check_tensors(x)
        _last_dim(x, dim)
        half = x.dtype in (torch.float16, torch.bfloat16)
        _need(dtype in (None, x.dtype) or (dtype == torch.float32 and half), f"dtype={dtype}")
        _need(x.dim() >= 1 and x.shape[-1] > 0, "a 0-D tensor or an empty last dim")
        rows = x.reshape(-1, x.shape[-1])  # any leading dims: rows are independent
        return op(rows, -1, dtype == torch.float32 and half).view(x.shape)

    def functional_call(
        x: torch.Tensor, dim: Any = None, _stacklevel: int = 3, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        return pinned(x, dim, dtype)

    def torch_call(x: torch.Tensor, dim: Any = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        return pinned(x, dim, dtype)

    return functional_call if functional else torch_call


_softmax_f, _log_softmax_f, _softmax, _log_softmax = (
    _softmax_like(op, functional)
    for functional in (True, False)
    for op in (torch.ops.batchinv.softmax, torch.ops.batchinv.log_softmax)
)


def _mean(
    x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    _check_tensors(x)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    _last_dim(x, dim)
    _need(x.dim() >= 1 and x.shape[-1] > 0, "a 0-D tensor or an empty last dim")
    rows = x.reshape(-1, x.shape[-1])  # any leading dims: rows are independent
    out = torch.ops.batchinv.mean(rows, -1, False, dtype)
    return out.view(*x.shape[:-1], 1) if keepdim else out.view(x.shape[:-1])


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of 4-D ``[B, H, L, D]`` operands (GQA by
    ``enable_gqa``), a boolean or 0/-inf additive mask of head dim 1, or ``is_causal``, no
    dropout: ``batchinv::sdpa``, each query row over its own visible keys.  The shape checks run
    here (at trace time under ``torch.compile``); the mask's values are read in the operator."""
    from batchinv.fast.sdpa_attention import check_sdpa_arguments

    _check_tensors(query, key, value)
    _need(
        not (isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad and torch.is_grad_enabled()),
        "a mask that requires grad",
    )
    _need(dropout_p == 0, f"dropout_p={dropout_p!r} (a pinned kernel draws no dropout)")
    _need(
        attn_mask is None or (isinstance(attn_mask, torch.Tensor) and attn_mask.device == query.device),
        "a mask on another device",
    )
    check_sdpa_arguments(query, key, value, attn_mask, is_causal, scale, enable_gqa)  # ArgumentError
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    decode_attention_config(arch(query.device), query.shape[-1], query.dtype)  # ArgumentError: D
    out = torch.ops.batchinv.sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    return out.transpose(1, 2)


def _with_out(handler: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The handler with torch's ``out=`` (resized to the result, then written)."""

    def call(*args: Any, out: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        result = handler(*args, **kwargs)
        if out is None:
            return result
        _need(isinstance(out, torch.Tensor) and out.dtype == result.dtype, "an out= of another dtype")
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)

    return call


_mm, _bmm, _matmul, _addmm = (_with_out(h) for h in (_mm, _bmm, _matmul, _addmm))
_softmax_f, _log_softmax_f, _softmax, _log_softmax, _mean = (
    _with_out(h) for h in (_softmax_f, _log_softmax_f, _softmax, _log_softmax, _mean)
)

#: Covered op -> (its name in stats and errors, the pinned handler).
HANDLERS: dict[Callable[..., Any], tuple[str, Callable[..., torch.Tensor]]] = {
    F.linear: ("linear", _linear),
    torch.mm: ("mm", _mm),
    torch.Tensor.mm: ("mm", _mm),
    torch.matmul: ("matmul", _matmul),
    torch.Tensor.matmul: ("matmul", _matmul),
    torch.Tensor.__matmul__: ("matmul", _matmul),
    torch.bmm: ("bmm", _bmm),
    torch.einsum: ("einsum", _einsum),
    torch.Tensor.bmm: ("bmm", _bmm),
    torch.addmm: ("addmm", _addmm),
    **({F.grouped_mm: ("grouped_mm", _grouped_mm)} if hasattr(F, "grouped_mm") else {}),
    **({torch._grouped_mm: ("grouped_mm", _grouped_mm)} if hasattr(torch, "_grouped_mm") else {}),
    torch.Tensor.addmm: ("addmm", _addmm),
    F.rms_norm: ("rms_norm", _rms_norm),
    torch.rms_norm: ("rms_norm", _rms_norm),  # what Dynamo sees of F.rms_norm when it inlines it
    F.softmax: ("softmax", _softmax_f),
    torch.softmax: ("softmax", _softmax),
    torch.Tensor.softmax: ("softmax", _softmax),
    F.log_softmax: ("log_softmax", _log_softmax_f),
    torch.log_softmax: ("log_softmax", _log_softmax),
    torch.Tensor.log_softmax: ("log_softmax", _log_softmax),
    torch.mean: ("mean", _mean),
    torch.Tensor.mean: ("mean", _mean),
    F.scaled_dot_product_attention: ("scaled_dot_product_attention", _sdpa),
}


#: Ops whose kernels plan their reduction from the whole launch (batch-variant) and that no
#: pinned kernel answers yet: ``strict`` refuses them by name, otherwise they run unpinned and
#: are counted in ``fallback``.  (Empty today: ``scaled_dot_product_attention`` is pinned.)
UNCOVERED: dict[Callable[..., Any], tuple[str, str]] = {}


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
        if entry is None and func not in UNCOVERED:
            # not covered (elementwise ops, the batchinv operators themselves): its own errors
            # are its own -- a compiled graph runs the operators with this mode still active
            return func(*args, **kwargs)
        try:
            if entry is None:
                name, reason = UNCOVERED[func]
                raise _Unpinned(reason)
            name, handler = entry
            return handler(*args, **kwargs)
        except (_Unpinned, ArgumentError) as why:  # ArgumentError: a kernel's own contract
            if self.strict:
                raise UnpinnedOpError(name, str(why)) from None
        if torch.compiler.is_compiling():  # traced into the graph: counted at trace time
            self.fallback[name] += 1
            return func(*args, **kwargs)
        with _state.fallback():  # its own aten calls are not counted again
            out = func(*args, **kwargs)
        self.fallback[name] += 1  # once, when it returned
        return out
