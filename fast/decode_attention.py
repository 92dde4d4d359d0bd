"""Batch-invariant split-KV (flash-decoding) decode attention over a paged KV cache: the launcher
of ``kernels/decode_attention.py``.

The split -- a fixed number of KV slots per split -- comes from :data:`DECODE_ATTENTION_TABLE`,
keyed ONLY on (arch, head dim, dtype): never on the batch, the SM count, or other requests'
lengths.  Each query token gets ``ceil(its slots / split_tokens)`` splits; the grid is
``(R * Q * Hkv, the most splits a token of the launch has)``, sized from the longest length
(read on the host with the value checks), or under CUDA-graph capture from the table's
capacity ``T * S`` alone, so a captured launch needs no host sync (the value checks that read
lengths and page ids are skipped under capture, as :mod:`batchinv.fast.topk` does).  Either way
the size moves no output bit: the splits are absolute position ranges.  A grid past CUDA's
limits (65,535 splits) is refused with an ArgumentError.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import torch

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.decode_attention import (
    decode_attention_merge_kernel,
    decode_attention_split_kernel,
)
from batchinv.fast.row_config import arch_family
from batchinv.reference.decode_attention import AttentionShape, check_decode_attention_arguments
from batchinv.reference.errors import ArgumentError

__all__ = [
    "DECODE_ATTENTION_TABLE",
    "DecodeAttentionConfig",
    "decode_attention",
    "decode_attention_config",
    "launch",
]


@dataclass(frozen=True)
class DecodeAttentionConfig:
    """A launch configuration of the split-KV kernel.

    Attributes:
        split_tokens: KV slots per split (a multiple of ``block_n``): sets the split boundaries
            and so the merge tree -- it alone (with ``block_n``) fixes a token's reduction order.
        block_n: slots per chunk of a split's online softmax (a power of two, >= 16 for tl.dot).
        num_warps: warps per program.
        tensor_cores: scores as 16-bit tensor-core dots and the weighted values as 3xTF32 dots
            (GPUs); False: fp32 IEEE dots (the interpreter).  Either way the products of the
            scores are exact and every sum is fp32; only the order inside a dot differs.
        weight_pair: on tensor cores, the weights times values as two 16-bit dots of a head and
            tail of p (instead of 3xTF32); the bound counts either.
        num_stages: software-pipelining stages of the split kernel's chunk loop.
    """

    split_tokens: int
    block_n: int
    num_warps: int
    tensor_cores: bool = True
    weight_pair: bool = False
    num_stages: int = 2

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n: expected a power of two >= 16, got {self.block_n}")
        if self.split_tokens < self.block_n or self.split_tokens % self.block_n:
            raise ValueError(f"split_tokens: expected a multiple of block_n, got {self.split_tokens}")


def _table() -> dict[tuple[str, int, torch.dtype], DecodeAttentionConfig]:
    table: dict[tuple[str, int, torch.dtype], DecodeAttentionConfig] = {}
    for dtype in (torch.bfloat16, torch.float16):
        # GPUs: 256-slot splits of 64-slot chunks (32 at D = 256, to bound registers), 4 warps,
        # 3 stages, weights as a 16-bit pair: chosen on the H200 with ci/tune_decode_attention.py
        # (docs/BENCHMARKS.md): 80-82% of the KV-bytes floor at R >= 64, 11 us at R = 1, 1k.
        for head_dim in (64, 128, 256):
            table[("gpu", head_dim, dtype)] = DecodeAttentionConfig(
                split_tokens=256,
                block_n=64 if head_dim <= 128 else 32,
                num_warps=4,
                weight_pair=True,
                num_stages=3 if head_dim <= 128 else 2,
            )
        # The interpreter pays per operation: 32-slot splits of two 16-slot chunks, so tiny
        # contexts already merge several splits and end in masked tails.
        for head_dim in (16, 32, 64, 128, 256):
            table[("interp", head_dim, dtype)] = DecodeAttentionConfig(
                split_tokens=32, block_n=16, num_warps=1, tensor_cores=False
            )
    # fp32 (dense SDPA through ``enable()``, e.g. a float32 model): fp32 IEEE dots on every
    # device -- a 16-bit tensor-core dot would round q and k to TF32.
    for head_dim in (64, 128, 256):
        table[("gpu", head_dim, torch.float32)] = DecodeAttentionConfig(
            split_tokens=256, block_n=32, num_warps=4, tensor_cores=False, num_stages=2
        )
    for head_dim in (16, 32, 64, 128, 256):
        table[("interp", head_dim, torch.float32)] = DecodeAttentionConfig(
            split_tokens=32, block_n=16, num_warps=1, tensor_cores=False
        )
    return table


# The configuration table.  It is keyed ONLY on (arch family, head dim, dtype): the split sets a
# token's split boundaries and merge order, so a key on the batch (R, lengths, SM count) would make
# a request's bits depend on its neighbours.  Never add those to the key; a CPU test checks that
# the launcher's config is the same whatever the batch.
DECODE_ATTENTION_TABLE: Final = MappingProxyType(_table())


def decode_attention_config(arch_name: str, head_dim: int, dtype: torch.dtype) -> DecodeAttentionConfig:
    """The config for ``head_dim`` and ``dtype`` on ``arch_name``.  The signature is the key.

    Raises:
        ArgumentError: a head dim the table has no entry for.
    """
    key = (arch_family(arch_name), head_dim, dtype)
    if key not in DECODE_ATTENTION_TABLE:
        dims = sorted({d for (a, d, _) in DECODE_ATTENTION_TABLE if a == key[0]})
        raise ArgumentError("q", f"head dim D in {dims} (the kernel's table on {key[0]})", head_dim)
    return DECODE_ATTENTION_TABLE[key]


def _capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


#: CUDA's grid limits: dim 0 (x) up to 2**31 - 1 programs, dims 1 and 2 (y, z) up to 65,535.
MAX_GRID_X: Final = 2**31 - 1
MAX_GRID_Y: Final = 65_535


def max_splits(shape: AttentionShape, split_tokens: int, longest: int | None = None) -> int:
    """The most splits any token of the launch can have.  With ``longest`` (the longest length
    of the launch, read from ``seq_lens``): ``ceil(min(longest, T * S) / split_tokens)``; without
    it (under CUDA-graph capture, where no length is read) from shapes only -- the table's
    capacity ``T * S``.  Sparse mode: the index slots K.  It sizes the grid and the workspace's
    row stride only: every split is an absolute position range and a token merges its own
    ``ceil(slots / split_tokens)`` splits, so no output bit depends on it."""
    if shape.index_slots is not None:
        slots = shape.index_slots
    else:
        capacity = shape.max_pages * shape.page_size
        slots = capacity if longest is None else min(longest, capacity)
    return max(1, -(-slots // split_tokens))


def check_grid(programs: int, splits: int, split_tokens: int, length_argument: str) -> None:
    """Raise :class:`ArgumentError` unless the split kernel's grid ``(programs, splits)`` and the
    merge kernel's fit CUDA's limits (:data:`MAX_GRID_X`, :data:`MAX_GRID_Y`): checked on every
    device, the interpreter too, so a launch the GPU cannot take is refused the same way on
    the cpu lane rather than launched with a wrapped or rejected grid."""
    if splits > MAX_GRID_Y:
        raise ArgumentError(
            length_argument,
            f"at most {MAX_GRID_Y} splits of {split_tokens} keys per query token "
            f"({MAX_GRID_Y * split_tokens} keys: CUDA's grid dim-1 limit)",
            f"{splits} splits",
        )
    if programs > MAX_GRID_X:
        raise ArgumentError(
            "q", f"at most {MAX_GRID_X} query rows x heads (CUDA's grid dim-0 limit)", programs
        )


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None,
    shape: AttentionShape,
    config: DecodeAttentionConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch both stages on validated arguments with ``config`` (the table's, or a baseline's)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (R, Q, Hq, D) contiguous
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)  # (R, Q, Hq)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    # The kernel reads raw memory with unit stride along D: resolve neg/conj views, make D contiguous.
    q, k_cache, v_cache = (kernel_operand(t) for t in (q, k_cache, v_cache))
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    block_table, seq_lens = kernel_operand(block_table).contiguous(), kernel_operand(seq_lens).contiguous()
    has_indices = indices is not None
    idx = kernel_operand(indices).contiguous() if indices is not None else seq_lens  # a dummy pointer
    # The grid and workspace are sized from the longest length (validation has read the lengths
    # already: ``shape.longest``), from the table's capacity under CUDA-graph capture (no host
    # read there).
    if _capturing(seq_lens) or indices is not None:
        longest = None
    else:
        longest = shape.longest if shape.longest is not None else int(seq_lens.max())
    splits = max_splits(shape, config.split_tokens, longest)
    rows = shape.num_requests * shape.q_len * shape.num_q_heads
    check_grid(rows, splits, config.split_tokens, "seq_lens" if indices is None else "indices")
    ws_o = torch.empty((rows, splits, shape.head_dim), dtype=torch.float32, device=q.device)
    ws_lse = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    index_slots = shape.index_slots or 0
    max_tokens = shape.max_pages * shape.page_size
    block_g = max(16, 1 << (shape.group - 1).bit_length())
    with interpreter_quiet():
        decode_attention_split_kernel[(shape.num_requests * shape.q_len * shape.num_kv_heads, splits)](
            q,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            idx,
            seq_lens,  # row_request, row_keys, row_key_start: unused by the uniform path (HAS_RAGGED False)
            seq_lens,
            seq_lens,
            ws_o,
            ws_lse,
            float(scale),
            shape.q_len,
            shape.num_kv_heads,
            index_slots,
            max_tokens,
            config.split_tokens,
            splits,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(2),
            block_table.stride(0),
            idx.stride(0) if has_indices else 0,
            idx.stride(1) if has_indices else 0,
            GROUP=shape.group,
            HEAD_DIM=shape.head_dim,
            PAGE_SIZE=shape.page_size,
            BLOCK_G=block_g,
            BLOCK_N=config.block_n,
            HAS_INDICES=has_indices,
            TENSOR_CORES=config.tensor_cores,
            WEIGHT_PAIR=config.weight_pair,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        decode_attention_merge_kernel[(rows,)](
            ws_o,
            ws_lse,
            seq_lens,
            seq_lens,  # row_keys: unused by the uniform path
            o,
            lse,
            shape.q_len,
            shape.num_q_heads,
            index_slots,
            max_tokens,
            config.split_tokens,
            splits,
            HEAD_DIM=shape.head_dim,
            HAS_INDICES=has_indices,
            num_warps=config.num_warps,
        )
    return o, lse


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant decode attention over a paged KV cache (Triton, split-KV, two stages).

    ``o[r, i, h] = sum_p softmax_p(scale * <q[r, i, h], k_p>) v_p`` over the positions query
    token i of request r attends to (dense: ``p < L - Q + i + 1``; sparse: ``indices[r, i]``
    without -1), k/v of kv head ``h // (Hq // Hkv)``; ``lse = log sum_p exp(s_p)`` (natural log).

    Parameters
    ----------
    q : Tensor, (R, Q, Hq, D), bfloat16 or float16; Q >= 1 new tokens per request (causal
        among themselves); D in the table: 64/128/256 on GPUs, 16/32/64/128/256 in the Triton
        interpreter (the cpu lane)
    k_cache, v_cache : Tensor, (P, S, Hkv, D) -- pages, slots per page, kv heads, D: the vLLM
        "NHD" page layout, not (P, Hkv, S, D) -- q's dtype; any page order
    block_table : Tensor, (R, T), int32; entries past ``ceil(L / S)`` are never read
    seq_lens : Tensor, (R,), int32, ``Q <= L <= T * S`` (the context including the Q new tokens)
    scale : float, finite in fp32 (used in fp32)
    indices : Tensor, (R, Q, K), int32, optional: sparse mode, positions in ``[0, L)`` or -1

    Returns
    -------
    (o, lse): o (R, Q, Hq, D) in q's dtype, lse (R, Q, Hq) float32, both contiguous.

    Notes
    -----
    Stage 1 walks each token's slots in splits of ``split_tokens`` (from
    :data:`DECODE_ATTENTION_TABLE`, keyed on arch, D and dtype) with an fp32 online softmax and
    writes partial (o, lse) pairs in fp32; stage 2 merges them in ascending split order in fp32
    and rounds o once.  A request's output bits are therefore invariant along every batch axis:
    the other requests (number, lengths, contents), its slot in the batch, the physical pages
    its KV lives in and the table's padding, and earlier calls.  An empty context (sparse, all
    indices -1) gives o = +0, lse = -inf, never NaN, and so does a token whose every attended
    score is -inf (a -inf score is a masked key of weight 0, as in the reference); a NaN or +inf
    score (NaN or inf in q or an attended key, a scale that overflows the fp32 scores) gives NaN
    o and lse, never the empty context's pair.  The scores are fp32: inputs whose products ``|q_d k_d|`` exceed
    fp32's range (|q|, |k| ~ 1e19) are outside the contract -- tensor cores may return finite,
    wrong scores for them, and the launcher does not scan the caches for such values (that
    would double the bytes a decode step reads).  Unreferenced memory (other pages, table
    padding, the tail of the last page, index slots of -1) is never read.  Under CUDA-graph
    capture the value checks are skipped; an index past the length is then ignored.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As :func:`batchinv.reference.decode_attention.check_decode_attention_arguments`; also
        an ArgumentError for a head dim outside the table, and a DeviceError for a non-CUDA
        tensor (CPU tensors are accepted when ``TRITON_INTERPRET=1`` was set before triton,
        i.e. batchinv.fast, was first imported).

    Example (cpu lane)::

        import os; os.environ["TRITON_INTERPRET"] = "1"  # before importing batchinv.fast
        from batchinv.fast.decode_attention import decode_attention
        o, lse = decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale=D**-0.5)

    Source: flash-decoding (Dao et al. 2023) with the split size pinned, as SGLang's and vLLM's
    batch-invariant modes do for their attention backends (docs/BENCHMARKS.md has the speed).
    """
    shape = check_decode_attention_arguments(q, k_cache, v_cache, block_table, seq_lens, scale, indices)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_launch_device(name, t)
    config = decode_attention_config(arch(q.device), shape.head_dim, q.dtype)
    return launch(q, k_cache, v_cache, block_table, seq_lens, scale, indices, shape, config)
