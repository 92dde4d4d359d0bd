"""Mutants of ``all_reduce`` (the pinned TP all-reduce): one line of the launcher replaced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from batchinv.fast import all_reduce as launcher

from .patch import mutate

_SHIPPED = "return leaf_order_sum(partials, None)"
#: The message size from which the ``fp32_above_16_rows`` mutant takes its other algorithm.
SWITCH_ROWS = 16


def _fp32_leaf_order(partials: torch.Tensor) -> torch.Tensor:
    acc = partials[:, 0].clone()
    for r in range(1, partials.shape[1]):
        acc = acc + partials[:, r]
    return acc


def _rank_partials(partials: torch.Tensor, tp_degree: int | None) -> torch.Tensor:
    """Each TP rank's leaves pre-summed in fp32: ``[M, T, N]``."""
    degree = partials.shape[1] if tp_degree is None else tp_degree
    width = partials.shape[1] // degree
    return torch.stack(
        [_fp32_leaf_order(partials[:, t * width : (t + 1) * width]) for t in range(degree)], dim=1
    )


def leaves_reversed() -> Callable[..., Any]:
    """The leaves added from r = R-1 down to 0 (fp64 still)."""
    return mutate(launcher, "all_reduce", _SHIPPED, "return leaf_order_sum(partials, None, reverse=True)")


def fp32_above_16_rows() -> Callable[..., Any]:
    """From 16 rows on, an fp32 sum (an algorithm picked by message size, as NCCL's)."""
    return mutate(
        launcher,
        "all_reduce",
        _SHIPPED,
        "return leaf_order_sum(partials, None) if partials.shape[0] < SWITCH_ROWS else _fp32_leaf_order(partials)",
        extra_globals={"SWITCH_ROWS": SWITCH_ROWS, "_fp32_leaf_order": _fp32_leaf_order},
    )


def tp_ranks_presum_in_fp32() -> Callable[..., Any]:
    """Each TP rank sums its own leaves in fp32 before the pinned tree over the ranks."""
    return mutate(
        launcher,
        "all_reduce",
        _SHIPPED,
        "return leaf_order_sum(_rank_partials(partials, tp_degree), None)",
        extra_globals={"_rank_partials": _rank_partials},
    )
