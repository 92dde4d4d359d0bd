"""Batch- and phase-invariant varlen causal prefill attention over a paged KV cache: the decode
kernel (``kernels/decode_attention.py``) run on packed ragged rows (``HAS_RAGGED``).

One tree for every phase: each query row runs the decode kernel's per-row program -- the split-KV
partials over absolute key positions ``[s * split_tokens, (s + 1) * split_tokens)`` counted from
the request's first key, each split's chunks of ``BLOCK_N`` in increasing position, the splits
merged in ascending order, o rounded once -- with the config of
:data:`~batchinv.fast.decode_attention.DECODE_ATTENTION_TABLE` (the same ``split_tokens`` and
``block_n``).  Only how a row finds its request, its causal key count, its q row and its index
row differs from the uniform decode launch, so a row at (request, position) has the same bits
in a full prefill, a chunked prefill after a cached prefix, a decode step (q_len 1) and a
speculative verify (q_len 2, 4).
"""

from __future__ import annotations

import dataclasses

import torch

from batchinv.fast.decode_attention import DecodeAttentionConfig, check_grid, decode_attention_config
from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels import decode_attention as kernels
from batchinv.reference.decode_attention import AttentionShape
from batchinv.reference.prefill_attention import check_prefill_attention_arguments, default_scale

#: The most bytes one launch's split workspace may take (fp32 partial o and lse of every row x
#: head x split); more rows go in further launches (:func:`launch_rows`).  Never a row's
#: arithmetic: a row is one program whatever else its launch holds.
WORKSPACE_BYTES = 1 << 30

__all__ = [
    "WORKSPACE_BYTES",
    "KVLayout",
    "PackedRows",
    "launch",
    "launch_rows",
    "prefill_attention",
    "row_plan",
]


def row_plan(
    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per packed query row t: ``(row_request[t], row_keys[t])``, int32 on the lengths' device --
    its request r and its causal key count ``p + 1 = L_r - Q_r + (t - cu[r]) + 1`` (the value the
    uniform decode path computes as ``L - Q + i + 1``).  Built on the device, from the tensors."""
    device = seq_lens.device
    cu = cu_seqlens_q.to(device=device, dtype=torch.int64)  # [R + 1]
    q_lens = cu[1:] - cu[:-1]  # [R]
    requests = torch.arange(q_lens.shape[0], device=device)
    row_request = torch.repeat_interleave(requests, q_lens, output_size=num_rows)  # [T]
    t = torch.arange(num_rows, device=device)  # [T]
    lens = seq_lens.to(torch.int64)[row_request]  # [T]
    keys = lens - q_lens[row_request] + (t - cu[:-1][row_request]) + 1  # [T]
    return row_request.to(torch.int32).contiguous(), keys.to(torch.int32).contiguous()


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """What the split kernel's packed-row path reads of each query row t (int32, contiguous, on
    the rows' device): ``request[t]`` (its row of the table and ``seq_lens``), ``keys[t]`` (how
    many keys it attends to) and, optional, ``key_start[t]`` (the position of its first key;
    None: 0, a causal prefix).  Its splits are counted from that first key."""

    request: torch.Tensor
    keys: torch.Tensor
    key_start: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """How the kernel finds key ``pos`` of request r: ``page = table[r, pos // page_size]``, then
    element ``(page, pos % page_size, kv head, d)`` at ``page * page_stride + (pos % page_size) *
    slot_stride + head * head_stride + d`` (K and V each with their strides)."""

    page_size: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]

    @staticmethod
    def of_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> KVLayout:
        """A paged ``(P, S, Hkv, D)`` cache ("NHD" pages)."""
        return KVLayout(
            int(k_cache.shape[1]),
            (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)),
            (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)),
        )


def launch_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: KVLayout,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: PackedRows,
    indices: torch.Tensor | None,
    *,
    scale: float,
    num_kv_heads: int,
    max_tokens: int,
    splits: int,
    config: DecodeAttentionConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode kernel's two stages on packed query rows ``q (T, Hq, D)`` (last dim contiguous):
    ``(o (T, Hq, D) in q's dtype, lse (T, Hq) fp32)``, contiguous.  ``splits`` (at least every
    row's ``ceil(keys / split_tokens)``) sizes the grid and the workspace only, never a row's
    arithmetic; ``max_tokens`` clamps a row's keys (the table's capacity).  Validated arguments.

    The rows go in consecutive slices whose split workspace (``rows x Hq x splits x (D + 1)``
    fp32) stays within :data:`WORKSPACE_BYTES`: a 32k-token prefill at D 256 would otherwise ask
    for ~17 GB.  Each row is one program whatever shares its launch, so the slicing cannot move
    a bit (the ``co_batch`` check's property; ``test_row_slices_give_the_same_bits`` shows it)."""
    num_rows, num_q_heads, head_dim = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (T, Hq, D) contiguous
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)  # (T, Hq)
    if o.numel() == 0:
        return o.zero_(), lse.fill_(float("-inf"))
    check_grid(
        num_rows * num_q_heads, splits, config.split_tokens, "seq_lens" if indices is None else "indices"
    )
    per_row = num_q_heads * max(1, splits) * (head_dim + 1) * 4
    step = max(1, WORKSPACE_BYTES // per_row)
    ws_rows = min(step, num_rows)
    ws_o = torch.empty((ws_rows * num_q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    ws_lse = torch.empty((ws_rows * num_q_heads, splits), dtype=torch.float32, device=q.device)
    for first in range(0, num_rows, step):
        rows_here = slice(first, min(first + step, num_rows))
        _launch_slice(
            q[rows_here],
            k,
            v,
            kv,
            block_table,
            seq_lens,
            PackedRows(
                rows.request[rows_here],
                rows.keys[rows_here],
                rows.key_start[rows_here] if rows.key_start is not None else None,
            ),
            indices[rows_here] if indices is not None else None,
            o[rows_here],
            lse[rows_here],
            ws_o,
            ws_lse,
            scale=scale,
            num_kv_heads=num_kv_heads,
            max_tokens=max_tokens,
            splits=splits,
            config=config,
        )
    return o, lse


def _launch_slice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: KVLayout,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: PackedRows,
    indices: torch.Tensor | None,
    o: torch.Tensor,
    lse: torch.Tensor,
    ws_o: torch.Tensor,
    ws_lse: torch.Tensor,
    *,
    scale: float,
    num_kv_heads: int,
    max_tokens: int,
    splits: int,
    config: DecodeAttentionConfig,
) -> None:
    """One slice of :func:`launch_rows`: its rows' split and merge kernels, into the views ``o``
    and ``lse`` (contiguous row slices), through the first rows of the shared workspace."""
    num_rows, num_q_heads, head_dim = q.shape
    has_indices = indices is not None
    idx = indices if indices is not None else seq_lens  # a dummy pointer
    index_slots = int(indices.shape[1]) if indices is not None else 0
    key_start = rows.key_start if rows.key_start is not None else rows.keys  # a dummy pointer
    group = num_q_heads // num_kv_heads
    total = num_rows * num_q_heads
    block_g = max(16, 1 << (group - 1).bit_length())
    with interpreter_quiet():
        kernels.decode_attention_split_kernel[(num_rows * num_kv_heads, splits)](
            q,
            k,
            v,
            block_table,
            seq_lens,
            idx,
            rows.request,
            rows.keys,
            key_start,
            ws_o,
            ws_lse,
            float(scale),
            1,  # q_len: unused on packed rows
            num_kv_heads,
            index_slots,
            max_tokens,
            config.split_tokens,
            splits,
            q.stride(0),
            0,
            q.stride(1),
            *kv.k_strides,
            *kv.v_strides,
            block_table.stride(0),
            idx.stride(0) if has_indices else 0,
            0,
            GROUP=group,
            HEAD_DIM=head_dim,
            PAGE_SIZE=kv.page_size,
            BLOCK_G=block_g,
            BLOCK_N=config.block_n,
            HAS_INDICES=has_indices,
            TENSOR_CORES=config.tensor_cores,
            WEIGHT_PAIR=config.weight_pair,
            HAS_RAGGED=True,
            HAS_KEY_START=rows.key_start is not None,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        kernels.decode_attention_merge_kernel[(total,)](
            ws_o,
            ws_lse,
            seq_lens,
            rows.keys,
            o,
            lse,
            1,
            num_q_heads,
            index_slots,
            max_tokens,
            config.split_tokens,
            splits,
            HEAD_DIM=head_dim,
            HAS_INDICES=has_indices,
            HAS_RAGGED=True,
            num_warps=config.num_warps,
        )


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None,
    shape: AttentionShape,
    cu: list[int],
    config: DecodeAttentionConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the decode kernel's two stages on packed rows (validated arguments) with ``config``
    (the decode table's, or a baseline's)."""
    q, k_cache, v_cache = (kernel_operand(t) for t in (q, k_cache, v_cache))
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    block_table, seq_lens = kernel_operand(block_table).contiguous(), kernel_operand(seq_lens).contiguous()
    idx = kernel_operand(indices).contiguous() if indices is not None else None
    row_request, row_keys = row_plan(kernel_operand(cu_seqlens_q), seq_lens, q.shape[0])
    # The grid and the workspace are sized from the lengths (a host read: prefill is not captured
    # in a CUDA graph, and validation has read them already): T rows x the most splits any row
    # of this launch has.  It sizes the grid and the workspace's row stride only -- a split
    # beyond a row's own keys writes nothing and is never merged -- never a row's arithmetic.
    if idx is not None:
        longest = shape.index_slots or 0
    elif shape.longest is not None:  # read by validation
        longest = shape.longest
    else:
        longest = max(_lens(seq_lens), default=0)
    return launch_rows(
        q,
        k_cache,
        v_cache,
        KVLayout.of_cache(k_cache, v_cache),
        block_table,
        seq_lens,
        PackedRows(row_request, row_keys),
        idx,
        scale=scale,
        num_kv_heads=shape.num_kv_heads,
        max_tokens=shape.max_pages * shape.page_size,
        splits=max(1, -(-longest // config.split_tokens)),
        config=config,
    )


def _lens(seq_lens: torch.Tensor) -> list[int]:
    return [int(v) for v in seq_lens.tolist()]


def prepare(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None,
    indices: torch.Tensor | None,
) -> tuple[AttentionShape, list[int], float]:
    """Validate (the reference's checks, so both raise the same errors) and check the devices:
    the call's shape, ``cu_seqlens_q`` as ints, and the scale (default ``1 / sqrt(D)``)."""
    head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else 0
    s = default_scale(head_dim) if scale is None else scale
    shape, cu = check_prefill_attention_arguments(
        q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, indices
    )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_launch_device(name, t)
    if indices is not None:  # decode's checks saw no indices: K is the (T, K) list's width
        shape = dataclasses.replace(shape, index_slots=int(indices.shape[1]))
    return shape, cu, s


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch- and phase-invariant varlen causal attention over a paged KV cache (Triton, the
    decode kernel's split-KV program per packed query row).

    ``o[t, h] = sum_j softmax_j(scale * <q[t, h], k_j>) v_j`` over the positions row t of
    request r (at position ``p = L_r - Q_r + t - cu_seqlens_q[r]``) attends to -- dense
    ``0 <= j <= p``, sparse ``indices[t]`` before its -1 tail -- k/v of kv head
    ``h // (Hq // Hkv)``; ``lse[t, h] = log sum_j exp(s_j)`` (natural log).

    Parameters
    ----------
    q : Tensor, (T, Hq, D), bfloat16 or float16
        Every request's new tokens, packed in request order; D in the decode table (64/128/256
        on GPUs, 16/32/64/128/256 in the Triton interpreter).
    k_cache, v_cache : Tensor, (P, S, Hkv, D), q's dtype
        The paged cache ("NHD" pages), the new tokens' K/V already written after each prefix.
    block_table : Tensor, (R, M), int32; entries past ``ceil(L_r / S)`` are never read
    cu_seqlens_q : Tensor, (R + 1,), int32 or int64, ``0 = cu[0] < cu[1] < ... < cu[R] = T``
    seq_lens : Tensor, (R,), int32, ``Q_r <= L_r <= M * S`` (cached prefix + new tokens)
    scale : float, optional
        Finite in fp32 (used in fp32); default ``1 / sqrt(D)``.
    indices : Tensor, (T, K), int32, optional
        Sparse mode: per row positions in ``[0, p]`` then a -1 tail.

    Returns
    -------
    (o, lse): o (T, Hq, D) in q's dtype, lse (T, Hq) float32, both contiguous.

    Notes
    -----
    A row's reduction is fixed by its own keys alone: split boundaries at multiples of the decode
    table's ``split_tokens`` from the request's first key, each split's chunks in increasing
    position, the splits merged in ascending order in fp32, o rounded once.  The output bits of a
    row are invariant along the batch (other requests, their number, q_len, lengths and
    contents; its slot), the pages its KV lives in and the table's padding, and the phase: for
    the same (request, position) they equal :func:`batchinv.fast.decode_attention.decode_attention`'s
    at q_len 1, 2 or 4 (the same kernel, the same per-row program).  An empty context (sparse,
    all -1) and T = 0 give o = +0, lse = -inf, never NaN; NaN or inf scores give NaN.  Memory
    not attended is never read.  The launch reads the lengths on the host (validation, and the
    grid's split count); it is not CUDA-graph capturable.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As :func:`batchinv.reference.prefill_attention.check_prefill_attention_arguments`; an
        ArgumentError for a head dim outside the decode table; a DeviceError for a non-CUDA
        tensor (CPU tensors when ``TRITON_INTERPRET=1``).

    Source: flash-decoding's split-KV (Dao et al. 2023) with the split pinned, run on
    FlashAttention's varlen layout (``cu_seqlens_q``) over vLLM's paged prefill semantics.
    """
    shape, cu, s = prepare(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, indices)
    config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    return launch(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, s, indices, shape, cu, config)
