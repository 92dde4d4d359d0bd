"""Mutants of ``sdpa_attention`` (the decode kernel on each query row's visible key range).

Each subject is the registry entry's padded-launch adapter around a one-line change of the
launcher (:mod:`batchinv.fast.sdpa_attention`).  The padding check's teeth (splits from key 0
of the padded row) are shown in fp32 by ``tests/harness/test_harness_padding.py``: in the cpu
sweep's bf16 / fp16 cases an fp32 regrouping rarely moves a rounded bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchinv.fast import sdpa_attention as launcher
from batchinv.harness.components.sdpa_attention import padded

from .patch import mutate


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
