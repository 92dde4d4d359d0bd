"""Launcher of the batch-invariant indexer top-k (kernels: ``batchinv.fast.kernels.topk``).

Validates, allocates, picks a config from :data:`CONFIGS` (keyed only on arch, k and the
num_cols bucket: never on the number of rows), sizes the grid (one program per row) and
launches.  Outside the kernel's envelope it dispatches to the reference on the same device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import torch

from batchinv.fast.device import arch, check_launch_device, kernel_operand
from batchinv.fast.kernels.topk import topk_kernel
from batchinv.reference.topk import check_topk_arguments
from batchinv.reference.topk import topk as reference_topk

__all__ = [
    "CONFIGS",
    "ENVELOPE_K",
    "MAX_NUM_COLS",
    "NUM_COLS_BUCKETS",
    "TopkConfig",
    "in_envelope",
    "launch_rows",
    "select_config",
    "topk",
]

#: The k values the kernel serves (the sparse-attention indexer's index_topk sizes).
ENVELOPE_K: Final[tuple[int, ...]] = (512, 1024, 2048)
#: The widest row the kernel holds in registers.
MAX_NUM_COLS: Final[int] = 8192
#: num_cols buckets: a row is padded to the smallest bucket that holds it (BLOCK_N).
NUM_COLS_BUCKETS: Final[tuple[int, ...]] = (512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class TopkConfig:
    """One launch configuration: the register tile of a row and the warps of its program."""

    block_n: int
    num_warps: int


def _table() -> dict[tuple[str, int, int], TopkConfig]:
    table: dict[tuple[str, int, int], TopkConfig] = {}
    for arch_key in ("sm90", "sm100", "interp", "generic"):
        for k in ENVELOPE_K:
            for bucket in NUM_COLS_BUCKETS:
                table[(arch_key, k, bucket)] = TopkConfig(
                    block_n=bucket, num_warps=4 if bucket <= 2048 else 8
                )
    return table


#: Launch configs keyed ONLY on (arch, k, num_cols bucket) -- never on the number of rows, so a
#: row's program is the same whatever M the batch has.  (The result does not depend on the
#: config at all -- the selection is exact -- but a config that moved with M would make speed,
#: and any future non-exact variant, batch-dependent.)  Unknown arches use the "generic" rows.
CONFIGS: Final = MappingProxyType(_table())


def num_cols_bucket(num_cols: int) -> int:
    """The smallest bucket of :data:`NUM_COLS_BUCKETS` holding ``num_cols`` (<= MAX_NUM_COLS)."""
    for bucket in NUM_COLS_BUCKETS:
        if num_cols <= bucket:
            return bucket
    raise ValueError(f"num_cols: expected at most {MAX_NUM_COLS}, got {num_cols}")


def in_envelope(k: int, num_cols: int) -> bool:
    """Whether the Triton kernel serves ``(k, num_cols)``; otherwise :func:`topk` falls back."""
    return k in ENVELOPE_K and num_cols <= MAX_NUM_COLS


def select_config(arch_key: str, k: int, num_cols: int) -> TopkConfig:
    """The config for ``arch_key`` (as :func:`batchinv.fast.device.arch` names it), ``k`` and
    ``num_cols``.  Takes no row count, by design."""
    bucket = num_cols_bucket(num_cols)
    return CONFIGS.get((arch_key, k, bucket)) or CONFIGS[("generic", k, bucket)]


def topk(scores: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int) -> torch.Tensor:
    """Row-local indices of each row's ``k`` largest scores inside its window, ascending.

    For row ``r`` with window ``[s, e)`` (``s = clamp(row_starts[r], 0, C)``,
    ``e = clamp(row_ends[r], 0, C)``) and ``key`` the monotone int32 map of the fp32 bits
    (``-0.0 -> +0.0``, then ``bits`` if ``bits >= 0`` else ``bits ^ 0x7fffffff``)::

        chosen = the min(k, e - s) columns of [s, e) with the largest key, ties by smaller column
        out[r] = sorted(c - s for c in chosen) ++ [-1] * (k - len(chosen))

    Args:
        scores: float32 ``[R, C]`` (``R`` = num_rows, ``C`` = num_cols), any strides (padded or
            strided rows); a CUDA tensor, or a CPU tensor under the Triton interpreter.
        row_starts: int32 or int64 ``[R]``, same device; any value (clamped to ``[0, C]`` before
            narrowing, so bounds past the int32 range work).
        row_ends: int32 or int64 ``[R]``, same device, ``row_ends >= row_starts``.
        k: an integral (``operator.index``; not a bool), 1 <= k <= 2**31 - 1.

    Returns:
        int32 ``[R, k]``.  Bitwise equal to :func:`batchinv.reference.topk.topk` on every input,
        and bitwise invariant along the row axis: a row's output does not depend on M, on its
        position or neighbours, on its ``row_start`` offset in a packed buffer, or on earlier
        calls (one program per row, a config keyed only on arch, k and the num_cols bucket).

    NaN and signed zeros:
        ``-0.0`` ranks as ``+0.0``.  NaNs rank by their bits: positive NaNs above ``+inf``,
        negative NaNs below ``-inf`` (0xffffffff last).  Out-of-window lanes are never selected,
        whatever their bits.

    Dispatch:
        The Triton kernel serves ``k`` in {512, 1024, 2048} and ``C <= 8192``.  Any other shape
        runs the reference (two stable sorts) on the same device: correct and invariant, slow.

    Raises:
        DTypeError: ``scores`` not float32, bounds not int32/int64, ``k`` not an integral.
        ArgumentError: a wrong rank, bounds of a length other than ``R``, ``k`` outside
            ``[1, 2**31 - 1]``, a row with ``row_end < row_start`` (not checked while a CUDA
            graph is captured: the check reads the bounds; there an inverted window selects
            nothing).
        DeviceError: bounds on another device than ``scores``; a tensor on the meta device; a
            non-CUDA tensor on the GPU path.

    Source:
        Seed write-up 003: one program per row, the row register-resident, a 32-step binary
        search over the int32 key space for the k-th key, one ascending scan emitting keys above
        it plus the first tied lanes by column (exclusive cumsum); no sort, fixed num_warps, no
        autotune.
    """
    return launch_rows(topk_kernel, scores, row_starts, row_ends, k, fallback=reference_topk)


def launch_rows(
    kernel: Any,
    scores: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    k: Any,
    *,
    fallback: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Validate, then launch a one-program-per-row top-k ``kernel`` (the pinned one or the
    baseline's, which share a signature), or call ``fallback`` outside the envelope."""
    k = check_topk_arguments(scores, row_starts, row_ends, k)
    for name, tensor in (("scores", scores), ("row_starts", row_starts), ("row_ends", row_ends)):
        check_launch_device(name, tensor)
    num_rows, num_cols = scores.shape
    if not in_envelope(k, num_cols):
        return fallback(scores, row_starts, row_ends, k)
    out = torch.empty((num_rows, k), dtype=torch.int32, device=scores.device)
    if num_rows == 0:
        return out
    # The kernel reads raw memory: a negative-bit view (z.conj().imag) must be materialized.
    scores, row_starts, row_ends = (kernel_operand(t) for t in (scores, row_starts, row_ends))
    config = select_config(arch(scores.device), k, num_cols)
    kernel[(num_rows,)](
        scores,
        row_starts,
        row_ends,
        out,
        num_cols,
        scores.stride(0),
        scores.stride(1),
        row_starts.stride(0),
        row_ends.stride(0),
        out.stride(0),
        K=k,
        BLOCK_N=config.block_n,
        num_warps=config.num_warps,
    )
    return out
