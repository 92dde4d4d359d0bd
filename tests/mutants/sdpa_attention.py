"""Mutants of ``sdpa_attention`` (the decode kernel on each query row's visible key range).

Each subject is the registry entry's padded-launch adapter around a one-line change of the
launcher (:mod:`batchinv.fast.sdpa_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchinv.fast import sdpa_attention as launcher
from batchinv.fast.baselines.sdpa_attention import absolute_splits
from batchinv.harness.components.sdpa_attention import padded

from .patch import mutate


def sdpa_attention_splits_from_padded_key_0() -> Callable[..., Any]:
    """Each row's splits counted from key 0 of the padded row instead of its first visible key
    (a FlashAttention-style kernel's tiling)."""
    return padded(absolute_splits)


def sdpa_attention_visible_end_off_by_one() -> Callable[..., Any]:
    """The launcher gives every row with more than one visible key one key too few (its last)."""
    fn = mutate(
        launcher,
        "sdpa_attention_rows",
        "keys=(end - start).to(torch.int32).reshape(-1).contiguous(),",
        "keys=(end - start - (end - start > 1).to(end.dtype)).to(torch.int32).reshape(-1).contiguous(),",
        entry="sdpa_attention",
    )
    return padded(fn)
