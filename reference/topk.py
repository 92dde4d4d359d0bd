"""Reference top-k of the sparse-attention indexer: two stable sorts on integer keys.

Dimension legend:
    R: num_rows   rows of the launch (one query token each)
    C: num_cols   candidate columns of a row (the padded width of ``scores``)
    K: k          slots of the output row

A row's candidates are the columns ``[row_start, row_end)`` clamped to ``[0, C]`` (the row's
*window*).  Each candidate's fp32 bits are mapped to a monotone int32 *key* (see
:func:`monotone_key`); the row's ``min(K, window length)`` best candidates are the ones with
the largest keys, exact key ties going to the smaller column.  The selected columns are returned
ascending, relative to the clamped ``row_start``, then padded with -1.

The ranking is lexicographic on (in window, key, -column), built as two stable sorts (least
significant first): key descending, then validity.  No key value is reserved as an
"out of window" sentinel: 0xffffffff and 0xfffffffe are NaN bit patterns that map onto the two
smallest keys, so any sentinel would collide with a real input (seed write-up 003).
"""

from __future__ import annotations

from typing import Any

import torch

from batchinv.reference.errors import ArgumentError, check_int, check_same_device, check_tensor

__all__ = ["INDEX_DTYPES", "check_topk_arguments", "clamped_window", "monotone_key", "topk"]

#: The dtypes accepted for ``row_starts`` and ``row_ends``.
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)

_INT32_MIN = -(2**31)
_MAGNITUDE_MASK = 0x7FFFFFFF
#: The largest ``k`` accepted: output indices and slot counts are int32.
MAX_K = 2**31 - 1


def check_topk_arguments(scores: Any, row_starts: Any, row_ends: Any, k: Any) -> int:
    """Validate the arguments of :func:`topk` (and of the fast path, which shares the contract).

    Returns:
        ``k`` as a Python int (a Python int or a NumPy integer; a tensor is refused: a device
        value read on the host is a synchronisation and a capture failure).

    Raises:
        DTypeError: a non-tensor, ``scores`` not float32, bounds not int32/int64, ``k`` not a
            host integer (:func:`~batchinv.reference.errors.check_int`: a bool, a float, a tensor).
        ArgumentError: a wrong rank, bounds whose length is not ``num_rows``, ``k < 1`` or
            ``k > 2**31 - 1`` (:data:`MAX_K`), or a row with ``row_end < row_start``.
        DeviceError: bounds on another device than ``scores``; any tensor on the meta device.

    The ``row_end < row_start`` check reads the bounds (a host sync); it is skipped while a CUDA
    graph is being captured, where an inverted window simply selects nothing.
    """
    check_tensor("scores", scores, dtypes=(torch.float32,), ndim=2)
    num_rows = scores.shape[0]
    for name, bound in (("row_starts", row_starts), ("row_ends", row_ends)):
        check_tensor(name, bound, dtypes=INDEX_DTYPES, ndim=1)
        check_same_device(name, bound, scores.device)
        if bound.shape[0] != num_rows:
            raise ArgumentError(name, f"length num_rows = {num_rows} (the rows of scores)", bound.shape[0])
    k = check_int("k", k, 1, MAX_K)  # the one integer rule: indices are int32
    if num_rows and not _capturing(scores.device):
        inverted = row_ends.to(torch.int64) < row_starts.to(torch.int64)
        if bool(inverted.any()):
            row = int(inverted.nonzero()[0, 0])
            raise ArgumentError(
                "row_ends",
                f"row_end >= row_start in every row (row {row} has row_start {int(row_starts[row])})",
                int(row_ends[row]),
            )
    return k


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def monotone_key(scores: torch.Tensor) -> torch.Tensor:
    """The int32 key of each fp32 element: its bit order is the value order.

    ``-0.0`` (0x80000000) is first canonicalized to ``+0.0``.  Non-negative bit patterns keep
    their bits; negative ones flip their 31 magnitude bits, so a larger magnitude gives a smaller
    key.  Positive NaNs land above +inf, negative NaNs below -inf; 0xffffffff maps to the
    smallest key (-2**31) and 0xfffffffe to the next.

    Args:
        scores: float32, any shape and strides; a view with the negative bit set (such as
            ``z.conj().imag``) is materialized first, since its memory holds the negated values.

    Returns:
        int32, the shape of ``scores``.
    """
    bits = scores.resolve_neg().view(torch.int32)
    bits = torch.where(bits == _INT32_MIN, torch.zeros_like(bits), bits)  # -0.0 -> +0.0
    return torch.where(bits < 0, bits ^ _MAGNITUDE_MASK, bits)


def clamped_window(
    row_starts: torch.Tensor, row_ends: torch.Tensor, num_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's window ``[start, end)`` clamped to ``[0, num_cols]``, as int64 ``[R]`` tensors."""
    start = row_starts.to(torch.int64).clamp(0, num_cols)
    end = row_ends.to(torch.int64).clamp(0, num_cols)
    return start, torch.maximum(end, start)


def topk(scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int) -> torch.Tensor:
    """Row-local indices of each row's ``k`` largest scores inside its window, ascending.

    For row ``r`` with clamped window ``[s, e)`` (``s = clamp(row_starts[r], 0, C)``,
    ``e = clamp(row_ends[r], 0, C)``) and ``key = monotone_key(scores[r])``::

        ranked  = columns c in [s, e) ordered by (key[c] descending, c ascending)
        chosen  = ranked[:min(k, e - s)]
        out[r]  = sorted(c - s for c in chosen) ++ [-1] * (k - len(chosen))

    Args:
        scores: float32 ``[R, C]``, any strides (padded or strided rows).
        row_starts: int32 or int64 ``[R]``, any value (values past the int32 range work).
        row_ends: int32 or int64 ``[R]``, ``row_ends >= row_starts`` elementwise.
        k: an integral >= 1 and <= 2**31 - 1 (may exceed ``C``).

    Returns:
        int32 ``[R, k]`` on the device of ``scores``.  Bitwise invariant along the row axis
        (a row's output depends on that row's scores and window alone), the row's position and
        ``row_start`` offset, and across calls.

    NaN and signed zeros:
        ``-0.0`` ranks as ``+0.0`` (an exact tie, broken by column).  NaNs rank by their bits:
        positive NaNs above ``+inf``, negative NaNs below ``-inf`` (0xffffffff last).  Lanes
        outside the window are never selected, whatever their bits.

    Raises:
        DTypeError, ArgumentError, DeviceError: see :func:`check_topk_arguments`.

    Source:
        The deterministic indexer top-k of seed write-up 003 (DeepSeek sparse attention under
        batch invariance): score descending, exact ties by ascending column, emitted ascending
        with a -1 tail in row-local coordinates.  Runs on CPU or GPU.
    """
    k = check_topk_arguments(scores, row_starts, row_ends, k)
    num_rows, num_cols = scores.shape
    device = scores.device
    out = torch.full((num_rows, k), -1, dtype=torch.int32, device=device)  # [R, K]
    if num_rows == 0 or num_cols == 0:
        return out

    start, end = clamped_window(row_starts, row_ends, num_cols)  # [R], [R]
    col = torch.arange(num_cols, device=device)  # [C]
    in_window = (col[None, :] >= start[:, None]) & (col[None, :] < end[:, None])  # [R, C]
    key = monotone_key(scores)  # [R, C]
    assert in_window.shape == key.shape == (num_rows, num_cols)

    # Sort 1 (least significant): key descending; stable, so equal keys keep ascending columns.
    by_key = torch.sort(key, dim=1, descending=True, stable=True).indices  # [R, C] columns
    # Sort 2 (most significant): in-window lanes first; stable, so the key order survives.
    valid_by_key = in_window.gather(1, by_key).to(torch.int8)  # [R, C]
    ranked = by_key.gather(1, torch.sort(valid_by_key, dim=1, descending=True, stable=True).indices)  # [R, C]

    slots = min(k, num_cols)
    chosen = ranked[:, :slots]  # [R, slots] columns, best first
    num_valid = end - start  # [R]
    taken = torch.arange(slots, device=device)[None, :] < num_valid[:, None]  # [R, slots]
    if not _capturing(device):  # (reading it back would break a CUDA graph capture)
        assert bool(in_window.gather(1, chosen)[taken].all()), "a selected lane lies outside its window"

    local = chosen - start[:, None]  # [R, slots] row-local columns
    local = torch.where(taken, local, torch.full_like(local, num_cols))  # untaken sort last
    local = torch.sort(local, dim=1).values  # [R, slots] ascending
    out[:, :slots] = torch.where(local == num_cols, torch.full_like(local, -1), local).to(torch.int32)
    return out
