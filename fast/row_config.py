"""Tile configurations of the row-reduction kernels (softmax, log_softmax, mean) and their
lookup: tables keyed on (arch family, input dtype) whose buckets are row lengths -- never the
number of rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import torch

from batchinv.fast.execution import check_positive_int, check_power_of_two


@dataclass(frozen=True)
class RowConfig:
    """A kernel configuration (a tile) of a row reduction (softmax, log_softmax, mean).

    Attributes:
        block_m: rows per program (1 for vocabulary-sized rows on GPUs: one program per row).
        block_n: columns per chunk of the row loop (a power of two).  It sets the reduction
            order: each lane accumulates ``ceil(N / block_n)`` chunks in sequence, then the lanes
            are combined on a fixed-point grid (``fixed_point_lane_sum``: integer adds, the same
            bits in any order).
        num_warps: warps per program.
        num_stages: software-pipeline depth of the chunk loop (mean only; 1: no pipelining).
            Loads of the next ``num_stages - 1`` chunks are issued before the current chunk is
            added; each lane still adds its chunks in order, so it never changes a bit.

        Only ``block_n`` enters a row's arithmetic (rows of a tile never meet, and the lane
        combine does not depend on the register layout); all of them are pinned anyway.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "num_warps"):
            check_power_of_two(name, getattr(self, name))
        check_positive_int("num_stages", self.num_stages)


@dataclass(frozen=True)
class Bucket:
    """Rows of length ``<= max_cols`` (and above the previous bucket's) use ``config``."""

    max_cols: int
    config: RowConfig


#: Any row length (the last bucket of every table entry).
ANY_LENGTH: Final = 1 << 62


def arch_family(arch_name: str) -> str:
    """The table's arch key: ``"interp"`` under the interpreter, ``"gpu"`` for any sm (sm90 and
    sm100 share one entry until a measurement splits them)."""
    return "interp" if arch_name == "interp" else "gpu"


def lookup(
    table: Mapping[tuple[str, torch.dtype], Sequence[Bucket]], arch_name: str, dtype: torch.dtype, n_cols: int
) -> RowConfig:
    """The config of the first bucket of ``table[(arch_family(arch_name), dtype)]`` holding rows of
    ``n_cols`` elements.  The signature is the key: (arch, dtype, row length), never the rows."""
    for bucket in table[(arch_family(arch_name), dtype)]:
        if n_cols <= bucket.max_cols:
            return bucket.config
    raise AssertionError("unreachable: the last bucket takes any length")
