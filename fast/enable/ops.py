"""The fast kernels as torch operators: ``torch.ops.batchinv.<name>`` (issue 14, first step).

Each operator is a ``torch.library.custom_op`` with a fake (meta) implementation, so it runs
in eager mode, is captured by CUDA graphs, and is traced by ``torch.compile`` (Dynamo, AOT
autograd, Inductor) as one opaque call: Inductor never lowers it to a kernel of its own, so a
compiled graph runs exactly the pinned kernel the eager call runs and gets its bits.

Operators (``torch.ops.batchinv``):

* ``matmul(x, weight, bias, layout, out_dtype, precision)`` -- :func:`batchinv.fast.matmul.matmul`
* ``bmm(a, b)`` -- ``[B, M, K] @ [B, K, N]``: the pinned matmul of each batch entry
* ``grouped_mm(a, b, offs)`` -- rows of ``a`` grouped by ``offs``, group ``g`` times ``b[g]``
* ``rms_norm(x, weight, eps, dim)`` -- :func:`batchinv.fast.rms_norm.rms_norm`
* ``fused_add_rms_norm(x, residual, weight, eps, dim)`` -- ``(out, residual_out)``:
  :func:`batchinv.fast.rms_norm.fused_add_rms_norm`
* ``softmax(x, dim, half_to_float)`` / ``log_softmax(...)`` -- :mod:`batchinv.fast.softmax`
* ``mean(x, dim, keepdim, dtype)`` -- :func:`batchinv.fast.mean.mean`
* ``topk(scores, row_starts, row_ends, k)`` -- :func:`batchinv.fast.topk.topk` (the indexer top-k)
* ``sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)`` -- ``[B, Lq, Hq, D]``:
  :func:`batchinv.fast.sdpa_attention.sdpa_attention_rows` (``F.scaled_dot_product_attention``)

The arguments and their errors are the functions' (a dim other than the last raises their
ArgumentError).  The ``*_subject`` functions below give each operator with its component's fast
signature; they are the components' ``torch_op`` (the registry check ``modes`` runs them eager,
compiled and in a CUDA graph).

Inference only: the kernels carry no autograd formula, so a call that needs a gradient raises
(torch's own error, at trace time under ``torch.compile``).  :data:`RUNTIME_CALLS` counts the
calls that ran a kernel, by operator: a compiled graph's calls are counted when it runs, never
when it is traced (fake tensors do not reach the kernels); :func:`thread_calls` counts the
calling thread's alone (what ``EnableStats.pinned`` and the ``modes`` check read: a run-time proof
that a compiled graph ran the operator, issue 25).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch

#: Calls that ran a pinned path to the end (a kernel, or the launcher's own invariant fallback:
#: topk's reference outside its envelope; not traces, not calls that raised), by operator name;
#: callers reset or diff it.
RUNTIME_CALLS: Counter[str] = Counter()


class _ThreadCalls(threading.local):
    def __init__(self) -> None:
        self.counter: Counter[str] = Counter()


_THREAD_CALLS = _ThreadCalls()


def thread_calls() -> Counter[str]:
    """The calling thread's :data:`RUNTIME_CALLS` (the counter itself, never reset: callers diff
    it).  A compiled graph runs its operators in the thread that calls it, so a graph's calls
    count here when it runs, and another thread's calls never do.

    Returns
    -------
    Counter[str]
        Completed operator calls of this thread, by operator name (``matmul``, ``bmm``, ...).
    """
    return _THREAD_CALLS.counter


def _ran(name: str) -> None:
    """Count one completed call of operator ``name`` (process-wide and for this thread)."""
    RUNTIME_CALLS[name] += 1
    _THREAD_CALLS.counter[name] += 1


def _unrouted() -> Any:
    """A context without torch-function handling: inside an operator's kernel call no
    ``enable()`` mode may route the launcher's own torch calls (a compiled graph runs the
    operators with the mode still on the stack)."""
    return torch._C.DisableTorchFunction()


@torch.library.custom_op("batchinv::matmul", mutates_args=())
def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """:func:`batchinv.fast.matmul.matmul` (``[M, K] x W -> [M, N]``, ``layout`` "linear": W
    ``[N, K]``; "mm": ``[K, N]``) as an operator; shapes, dtypes, errors and the invariance
    contract are that function's."""
    from batchinv.fast.matmul import matmul as pinned

    with _unrouted():
        out = pinned(x, weight, bias, layout=layout, out_dtype=out_dtype, precision=precision)
    _ran("matmul")
    return out


@matmul.register_fake
def _matmul_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    n = weight.shape[0] if layout == "linear" else weight.shape[1]
    return x.new_empty((x.shape[0], n), dtype=out_dtype or x.dtype)


def batched_matmul(a: torch.Tensor, b: torch.Tensor, num_sms: int | None = None) -> torch.Tensor:
    """``[B, M, K] @ [B, K, N] -> [B, M, N]``, entry ``i`` by the pinned
    ``matmul(a[i], b[i], layout="mm")`` into one output (the ``bmm`` operator's and the aten
    ``bmm`` override's kernel; ``num_sms`` as the matmul's, any value the same bits)."""
    from batchinv.fast.matmul import matmul as pinned

    out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
    for i in range(a.shape[0]):
        pinned(a[i], b[i], layout="mm", num_sms=num_sms, out=out[i])
    return out


@torch.library.custom_op("batchinv::bmm", mutates_args=())
def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched ``[B, M, K] @ [B, K, N] -> [B, M, N]``: entry ``i`` is
    ``matmul(a[i], b[i], layout="mm")`` (:func:`batchinv.fast.matmul.matmul`), so every output
    row has the bits of its own row of ``a`` times ``b[i]``, whatever B and M are (invariant
    along B and M).  The entries are launched one after the other into one output; one
    operator keeps a compiled graph's size independent of B (``torch.compile(dynamic=True)``
    traces one call for every batch count).  Dtypes and errors are the matmul's."""
    from batchinv.reference.errors import ArgumentError

    if a.dim() != 3:
        raise ArgumentError("a", "a 3-D [B, M, K] tensor", f"shape {tuple(a.shape)}")
    if b.dim() != 3 or b.shape[0] != a.shape[0]:
        raise ArgumentError("b", f"a 3-D [B={a.shape[0]}, K, N] tensor", f"shape {tuple(b.shape)}")
    with _unrouted():
        out = batched_matmul(a, b)
    _ran("bmm")
    return out


@bmm.register_fake
def _bmm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


@torch.library.custom_op("batchinv::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Grouped ``[S, K] x [G, K, N] -> [S, N]`` (``F.grouped_mm``'s 2-D x 3-D form, the MoE
    expert GEMM): rows ``offs[g-1]:offs[g]`` of ``a`` (``offs`` int32 [G], cumulative ends,
    non-decreasing) are multiplied by ``b[g]`` with the pinned matmul
    (:func:`batchinv.fast.matmul.matmul`, ``layout="mm"``), so a row's bits depend on the row
    and its group's weights only, never on how many rows the group or the batch holds.  Rows
    past ``offs[-1]`` (no group) are zero.  ``offs`` is read on the host (one sync), so the
    operator is not CUDA-graph capturable.  Raises ``ArgumentError`` (``offs``) when the ends
    decrease or pass S."""
    from batchinv.fast.matmul import matmul as pinned
    from batchinv.reference.errors import ArgumentError

    if a.dim() != 2:
        raise ArgumentError("a", "a 2-D [S, K] tensor", f"shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ArgumentError("b", "a 3-D [G, K, N] tensor", f"shape {tuple(b.shape)}")
    if offs.dim() != 1 or offs.shape[0] != b.shape[0] or offs.dtype != torch.int32:
        raise ArgumentError("offs", f"int32 [G={b.shape[0]}] group ends", f"{offs.dtype} {tuple(offs.shape)}")
    ends = [int(e) for e in offs.tolist()]
    if any(e < s for s, e in zip([0, *ends], ends, strict=False)) or (ends and ends[-1] > a.shape[0]):
        raise ArgumentError("offs", f"non-decreasing group ends <= S={a.shape[0]}", str(ends))
    out = a.new_zeros((a.shape[0], b.shape[2]))
    with _unrouted():
        for g, (start, end) in enumerate(zip([0, *ends], ends, strict=False)):
            if end > start:
                pinned(a[start:end], b[g], layout="mm", out=out[start:end])
    _ran("grouped_mm")
    return out


@grouped_mm.register_fake
def _grouped_mm_fake(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[2]))


@torch.library.custom_op("batchinv::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """:func:`batchinv.fast.rms_norm.rms_norm` as an operator."""
    from batchinv.fast.rms_norm import rms_norm as pinned

    with _unrouted():
        out = pinned(x, weight, eps, dim)
    _ran("rms_norm")
    return out


@rms_norm.register_fake
def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("batchinv::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batchinv.fast.rms_norm.fused_add_rms_norm` as an operator: ``(out, residual_out)``."""
    from batchinv.fast.rms_norm import fused_add_rms_norm as pinned

    with _unrouted():
        out, residual_out = pinned(x, residual, weight, eps, dim)
    _ran("fused_add_rms_norm")
    return out, residual_out


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        x, memory_format=torch.contiguous_format
    )


def _softmax_fake(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    dtype = torch.float32 if half_to_float and x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


@torch.library.custom_op("batchinv::softmax", mutates_args=())
def softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """:func:`batchinv.fast.softmax.softmax` as an operator."""
    from batchinv.fast.softmax import softmax as pinned

    with _unrouted():
        out = pinned(x, dim, half_to_float)
    _ran("softmax")
    return out


@torch.library.custom_op("batchinv::log_softmax", mutates_args=())
def log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """:func:`batchinv.fast.softmax.log_softmax` as an operator."""
    from batchinv.fast.softmax import log_softmax as pinned

    with _unrouted():
        out = pinned(x, dim, half_to_float)
    _ran("log_softmax")
    return out


softmax.register_fake(_softmax_fake)
log_softmax.register_fake(_softmax_fake)


@torch.library.custom_op("batchinv::mean", mutates_args=())
def mean(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """:func:`batchinv.fast.mean.mean` as an operator."""
    from batchinv.fast.mean import mean as pinned

    with _unrouted():
        out = pinned(x, dim, keepdim, dtype)
    _ran("mean")
    return out


@mean.register_fake
def _mean_fake(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    shape = (*x.shape[:-1], 1) if keepdim else tuple(x.shape[:-1])
    return x.new_empty(shape, dtype=dtype or x.dtype)


@torch.library.custom_op("batchinv::topk", mutates_args=())
def topk(scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`batchinv.fast.topk.topk` (int32 ``[R, k]``: each row's ``k`` best in-window columns,
    ascending, row-local, -1 padded) as an operator.  The launcher picks its config from the
    runtime row count at every call, inside the operator, so a compiled graph never freezes
    the row count it was traced with."""
    from batchinv.fast.topk import topk as pinned

    with _unrouted():
        out = pinned(scores, row_starts, row_ends, k)
    _ran("topk")
    return out


@topk.register_fake
def _topk_fake(
    scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int
) -> torch.Tensor:
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@torch.library.custom_op("batchinv::sdpa", mutates_args=())
def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """:func:`batchinv.fast.sdpa_attention.sdpa_attention_rows` (``[B, Lq, Hq, D]``, contiguous:
    ``scaled_dot_product_attention``'s output transposed) as an operator.  The mask's values are
    checked on every call outside a CUDA-graph capture (a capture cannot read them on the host)."""
    from batchinv.fast.sdpa_attention import sdpa_attention_rows

    with _unrouted():
        out = sdpa_attention_rows(
            query, key, value, attn_mask, is_causal, scale, enable_gqa, validate=not _capturing()
        )
    _ran("sdpa")
    return out


@sdpa.register_fake
def _sdpa_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    b, hq, lq, d = query.shape
    return query.new_empty((b, lq, hq, d))


# --- the operators with their components' fast signatures (the ``modes`` check's subjects) ----


def matmul_subject(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
) -> torch.Tensor:
    """``torch.ops.batchinv.matmul`` with :func:`batchinv.fast.matmul.matmul`'s signature."""
    return torch.ops.batchinv.matmul(x, weight, bias, layout, out_dtype, precision)


def rms_norm_subject(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """``torch.ops.batchinv.rms_norm`` with :func:`batchinv.fast.rms_norm.rms_norm`'s signature."""
    return torch.ops.batchinv.rms_norm(x, weight, eps, dim)


def fused_add_rms_norm_subject(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.batchinv.fused_add_rms_norm`` with the fast function's signature."""
    out, residual_out = torch.ops.batchinv.fused_add_rms_norm(x, residual, weight, eps, dim)
    return out, residual_out


def softmax_subject(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.ops.batchinv.softmax`` with :func:`batchinv.fast.softmax.softmax`'s signature."""
    return torch.ops.batchinv.softmax(x, dim, half_to_float)


def log_softmax_subject(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.ops.batchinv.log_softmax`` with :func:`batchinv.fast.softmax.log_softmax`'s signature."""
    return torch.ops.batchinv.log_softmax(x, dim, half_to_float)


def mean_subject(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.ops.batchinv.mean`` with :func:`batchinv.fast.mean.mean`'s signature."""
    return torch.ops.batchinv.mean(x, dim, keepdim, dtype)


def topk_subject(
    scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int
) -> torch.Tensor:
    """``torch.ops.batchinv.topk`` with :func:`batchinv.fast.topk.topk`'s signature."""
    return torch.ops.batchinv.topk(scores, row_starts, row_ends, k)


def sdpa_subject(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.ops.batchinv.sdpa`` with :func:`batchinv.fast.sdpa_attention.sdpa_attention`'s
    signature (``[B, Hq, Lq, D]``)."""
    return torch.ops.batchinv.sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa).transpose(1, 2)
