"""Triton kernels of ``moe_align`` (only ``@triton.jit`` code).

Three launches, none of which lets arrival order decide anything (no atomics):

1. :func:`moe_align_count_kernel`: one program per chunk of ``CHUNK`` flat indices writes the
   chunk's per-expert histogram ``counts[c, e]`` (integer counts: order-free).
2. :func:`moe_align_scan_kernel`: one program sums the chunks' counts per expert, pads each to a
   multiple of ``BLOCK_M``, takes the exclusive prefix over experts (each group's start), writes
   for every chunk ``base[c, e] = start[e] + (count of e in chunks < c) - (count of experts < e
   inside chunk c)``, ``num_padded`` and ``block_expert``.
3. :func:`moe_align_scatter_kernel`: one program per chunk sorts its keys ``expert * CHUNK +
   local index`` (distinct keys: the sort has one result), so the element at sorted position p
   of expert e has rank ``p - (count of experts < e in the chunk)`` inside its expert there, and
   its slot is ``base[c, e] + p``.  The flat indices of an expert therefore land in increasing
   order: deterministic by construction.

Ids outside ``[0, E)`` (refused by the launcher's check, which is skipped under graph capture)
are left out of the counts and never written, so no write goes out of bounds.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def moe_align_count_kernel(ids_ptr, counts_ptr, n, num_experts, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < n
    e = tl.load(ids_ptr + offs, mask=valid, other=0)
    ok = valid & (e >= 0) & (e < num_experts)
    hist = tl.histogram(tl.where(ok, e, 0), E_PAD, mask=ok)
    tl.store(counts_ptr + c * E_PAD + tl.arange(0, E_PAD), hist.to(tl.int32))


@triton.jit
def moe_align_scan_kernel(
    counts_ptr,
    base_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_chunks,
    num_experts,
    num_blocks,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    ex = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], dtype=tl.int32)
    for c in range(num_chunks):
        total += tl.load(counts_ptr + c * E_PAD + ex)
    padded = (total + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    running = end - padded  # each group's start, then advanced chunk by chunk
    for c in range(num_chunks):
        row = tl.load(counts_ptr + c * E_PAD + ex)
        inside = tl.cumsum(row, 0) - row  # elements of experts < e in chunk c
        tl.store(base_ptr + c * E_PAD + ex, running - inside)
        running += row
    num_padded = tl.sum(padded, 0)
    tl.store(num_padded_ptr, num_padded)
    end = tl.where(ex < num_experts, end, 2147483647)
    for b0 in range(0, num_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        pos = b * BLOCK_M
        # the expert of block b: how many groups end at or before its first position
        owner = tl.sum((end[None, :] <= pos[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(pos < num_padded, owner, -1), mask=b < num_blocks)


@triton.jit
def moe_align_scatter_kernel(
    ids_ptr, base_ptr, sorted_ptr, n, num_experts, E_PAD: tl.constexpr, CHUNK: tl.constexpr
):
    c = tl.program_id(0)
    local = tl.arange(0, CHUNK)
    offs = c * CHUNK + local
    valid = offs < n
    e = tl.load(ids_ptr + offs, mask=valid, other=0)
    ok = valid & (e >= 0) & (e < num_experts)
    key = tl.where(ok, e, E_PAD) * CHUNK + local  # distinct keys; invalid ones sort last
    key = tl.sort(key)
    se = key // CHUNK
    good = se < E_PAD
    dest = tl.load(base_ptr + c * E_PAD + se, mask=good, other=0) + local
    tl.store(sorted_ptr + dest, c * CHUNK + key % CHUNK, mask=good)


@triton.jit
def moe_align_atomic_scatter_kernel(
    ids_ptr, start_ptr, cursor_ptr, sorted_ptr, n, num_experts, CHUNK: tl.constexpr
):
    """The negative control's scatter: each element claims the next free slot of its expert
    with ``tl.atomic_add`` on a per-expert cursor, so the order inside an expert is the order
    in which the atomics arrive (on a GPU: the warps' and programs' schedule)."""
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < n
    e = tl.load(ids_ptr + offs, mask=valid, other=0)
    ok = valid & (e >= 0) & (e < num_experts)
    e = tl.where(ok, e, 0)
    slot = tl.atomic_add(cursor_ptr + e, 1, mask=ok)
    start = tl.load(start_ptr + e, mask=ok, other=0)
    tl.store(sorted_ptr + start + slot, offs, mask=ok)
