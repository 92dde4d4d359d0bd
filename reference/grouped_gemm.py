"""Reference grouped GEMM of a fused MoE layer (docs/MOE.md, section 3), in fp64.

Dimension legend:
    T   tokens (the request axis: one request = one token)
    k   ``top_k``: slots per token; a token's slot j is its j-th routed expert
    E   experts (``w.shape[0]``)
    N   output columns
    K   reduction length
    L   ``len(sorted_ids)`` = ``T * k + E * (block_m - 1)`` (the align's static upper bound)
    B   ``len(block_expert)`` = ``ceil(L / block_m)``

Inputs (the ``moe_align`` layout): ``sorted_ids [L]`` int32 holds the flat indices ``t * k + j``
grouped by expert, each group padded with the sentinel ``T * k`` to a multiple of ``block_m``;
``block_expert [B]`` int32 the expert of each ``block_m`` block (-1 past ``num_padded``);
``num_padded [1]`` int32 the used length.  ``block_m`` is not an argument: it is a property of
the input, ``(L - T * k) / E + 1``.

The argument validation here is shared with the fast launcher (same typed errors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.reference import matmul as ref_matmul
from batchinv.reference.errors import ArgumentError, DTypeError, check_int, check_same_device, check_tensor

INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16,)


@dataclass(frozen=True)
class GroupedGemmArgs:
    """Validated sizes of one call."""

    t: int
    k: int  # top_k
    e: int
    n: int
    kdim: int  # K
    block_m: int
    num_padded: int


def _is_capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def validate(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool,
) -> GroupedGemmArgs:
    """Check the arguments of :func:`grouped_gemm` (and of the fast launcher).

    ``a`` is ``[T, K]``, or with ``a_per_slot`` ``[T * k, K]`` (or its ``[T, k, K]`` view).
    Values are checked too (a host sync; skipped while a CUDA graph is being captured): the
    first ``num_padded`` ids in ``[0, T * k]``, every flat index ``0 .. T*k - 1`` exactly once,
    ``num_padded`` a multiple of ``block_m`` within ``L``, each used block's expert in
    ``[0, E)``, -1 past ``num_padded``.

    Raises
    ------
    DTypeError
        ``a`` or ``w`` not bf16; the index tensors not int32; ``top_k`` not a host integer (:func:`~batchinv.reference.errors.check_int`);
        ``a_per_slot`` not a bool.
    ArgumentError
        ``w`` not 3-D; K of ``w`` differing from ``a``'s; K = 0; ``a`` of the wrong rank or rows;
        ``top_k < 1``; lengths of ``sorted_ids`` / ``block_expert`` / ``num_padded`` that no
        ``block_m`` explains; ids or experts out of range; a flat index missing or repeated.
    DeviceError
        any tensor on another device than ``a`` (or on ``meta``).
    """
    top_k = check_int("top_k", top_k, 1)
    if not isinstance(a_per_slot, bool):
        raise DTypeError("a_per_slot", "a bool", type(a_per_slot).__name__)
    check_tensor("a", a, dtypes=INPUT_DTYPES)
    check_tensor("w", w, dtypes=INPUT_DTYPES)
    check_tensor("w", w, ndim=3)
    check_same_device("w", w, a.device)
    e, n, kdim = (int(s) for s in w.shape)
    if a_per_slot and a.dim() == 3:
        if a.shape[1] != top_k:
            raise ArgumentError("a", f"shape [T, top_k = {top_k}, K] (a_per_slot)", tuple(a.shape))
        t = int(a.shape[0])
    elif a.dim() == 2:
        rows = int(a.shape[0])
        if a_per_slot and rows % top_k:
            raise ArgumentError("a", f"[T * top_k, K] rows, a multiple of top_k = {top_k}", tuple(a.shape))
        t = rows // top_k if a_per_slot else rows
    else:
        want = "a 2-D [T * top_k, K] or 3-D [T, top_k, K] tensor" if a_per_slot else "a 2-D [T, K] tensor"
        raise ArgumentError("a", want, f"{a.dim()}-D tensor of shape {tuple(a.shape)}")
    if int(a.shape[-1]) != kdim:
        raise ArgumentError("w", f"shape [E, N, K] with K = {int(a.shape[-1])} (a.shape[-1])", tuple(w.shape))
    if kdim == 0:
        # an empty reduction: refused (as fused_moe refuses H = 0) rather than a raw reshape error
        raise ArgumentError(
            "a", "K = a.shape[-1] >= 1 (an empty reduction is not a grouped GEMM)", tuple(a.shape)
        )
    for name, value in (
        ("sorted_ids", sorted_ids),
        ("block_expert", block_expert),
        ("num_padded", num_padded),
    ):
        check_tensor(name, value, dtypes=(torch.int32,), ndim=1)
        check_same_device(name, value, a.device)
    valid = t * top_k
    length = int(sorted_ids.shape[0])
    if e < 1 or length < valid or (length - valid) % e:
        raise ArgumentError(
            "sorted_ids",
            f"length T * top_k + E * (block_m - 1) = {valid} + {e} * (block_m - 1) for some block_m >= 1",
            length,
        )
    block_m = (length - valid) // e + 1
    blocks = -(-length // block_m)
    if int(block_expert.shape[0]) != blocks:
        raise ArgumentError(
            "block_expert",
            f"length ceil(len(sorted_ids) / block_m) = {blocks} (block_m = {block_m})",
            int(block_expert.shape[0]),
        )
    if int(num_padded.shape[0]) != 1:
        raise ArgumentError("num_padded", "shape [1]", tuple(num_padded.shape))
    if _is_capturing(a):
        return GroupedGemmArgs(t, top_k, e, n, kdim, block_m, -1)
    used = int(num_padded[0])
    if used < 0 or used > length or used % block_m or used < valid:
        raise ArgumentError("num_padded", f"a multiple of block_m = {block_m} in [{valid}, {length}]", used)
    ids = sorted_ids[:used].to(torch.int64)
    if used and (int(ids.min()) < 0 or int(ids.max()) > valid):
        bad = ids[(ids < 0) | (ids > valid)][0]
        raise ArgumentError(
            "sorted_ids", f"ids in [0, T * top_k = {valid}] (the last the sentinel)", int(bad)
        )
    counts = torch.bincount(ids[ids < valid], minlength=valid)
    if valid and bool((counts != 1).any()):
        missing = int((counts != 1).nonzero()[0])
        raise ArgumentError(
            "sorted_ids",
            "every flat index t * top_k + j once",
            f"index {missing} {int(counts[missing])} times",
        )
    experts = block_expert.to(torch.int64)
    used_blocks = used // block_m
    head, tail = experts[:used_blocks], experts[used_blocks:]
    if used_blocks and (int(head.min()) < 0 or int(head.max()) >= e):
        raise ArgumentError("block_expert", f"experts in [0, E = {e}) for the used blocks", head.tolist())
    if tail.numel() and bool((tail != -1).any()):
        raise ArgumentError("block_expert", "-1 past num_padded", tail.tolist())
    return GroupedGemmArgs(t, top_k, e, n, kdim, block_m, used)


def row_experts(
    sorted_ids: torch.Tensor, block_expert: torch.Tensor, args: GroupedGemmArgs
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(flat [R] int64, expert [R] int64)``: each valid (non-sentinel) entry of the first
    ``num_padded`` ids and the expert of its block, in ``sorted_ids`` order."""
    used = args.num_padded
    ids = sorted_ids[:used].to(torch.int64).cpu()
    experts = block_expert.to(torch.int64).cpu().repeat_interleave(args.block_m)[:used]
    keep = ids < args.t * args.k
    return ids[keep], experts[keep]


def _gathered(a: torch.Tensor, flat: torch.Tensor, args: GroupedGemmArgs, a_per_slot: bool) -> torch.Tensor:
    rows = a.reshape(-1, args.kdim)
    src = flat if a_per_slot else flat // args.k
    return rows.index_select(0, src.to(a.device))  # [R, K]


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """Reference grouped GEMM in fp64: ``c[t, j] = a[t] @ w[e].T`` for every entry
    ``sorted_ids[i] = t * top_k + j`` (``i < num_padded``) whose block's expert is ``e``
    (``a[t * top_k + j]`` when ``a_per_slot``: the down projection).

    Parameters
    ----------
    a : Tensor [T, K] (or [T * k, K] / [T, k, K] with ``a_per_slot``), bf16
    w : Tensor [E, N, K], bf16
    sorted_ids, block_expert, num_padded : int32, the ``moe_align`` layout (module docstring)
    top_k : int
    a_per_slot : bool

    Returns
    -------
    Tensor [T, k, N], float64
        Each element one fp64 dot product of exactly converted operands.  Token t's rows depend
        on its own rows of ``a`` and its experts' weights only (not on the other tokens nor on
        an expert's M).  Sentinel entries are skipped: never read, never written.  NaN and inf
        follow IEEE products and sums.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`validate`.

    Source: the fused-MoE grouped GEMM of vLLM (``fused_moe_kernel``), computed directly.
    """
    args = validate(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    out = torch.zeros(args.t * args.k, args.n, dtype=torch.float64, device=a.device)  # [T*k, N]
    flat, experts = row_experts(sorted_ids, block_expert, args)
    x = _gathered(a, flat, args, a_per_slot).to(torch.float64)  # [R, K]
    for e in experts.unique().tolist():
        sel = (experts == e).nonzero().flatten()
        we = w[e].to(torch.float64)  # [N, K]
        out[flat[sel].to(a.device)] = x[sel.to(a.device)] @ we.T
    return out.view(args.t, args.k, args.n)


def tolerance_bound(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
    *,
    reference: torch.Tensor,
    group: int | None = None,
) -> torch.Tensor:
    """The bound of each output element: per expert, the matmul bound of its gathered rows
    (:func:`batchinv.reference.matmul.tolerance_bound`, any order, or with ``group``
    :func:`batchinv.reference.matmul.tight_bound`, increasing k by groups of ``group``) for a
    K-long fp32 dot of exact bf16 products and one rounding to bf16.  [T, k, N] float64."""
    args = validate(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    ref = reference.reshape(args.t * args.k, args.n)
    out = torch.zeros_like(ref, dtype=torch.float64)
    flat, experts = row_experts(sorted_ids, block_expert, args)
    x = _gathered(a, flat, args, a_per_slot)
    for e in experts.unique().tolist():
        sel = (experts == e).nonzero().flatten().to(a.device)
        rows = flat.to(a.device)[sel]
        kwargs = {"layout": "linear", "out_dtype": a.dtype, "reference": ref[rows]}
        if group is None:
            b = ref_matmul.tolerance_bound(x[sel], w[e], None, **kwargs)
        else:
            b = ref_matmul.tight_bound(x[sel], w[e], None, group=group, **kwargs)
        out[rows] = b
    return out.view(args.t, args.k, args.n)
