"""One-line mutants of the plan components (``prefill_chunk_plan``, ``cuda_graph_buckets``).

The plans are plain torch: a mutant is the shipped function with one line replaced
(:func:`mutants.patch.mutate`), and the functions between the patched one and the component's
entry point are re-created unchanged in the same namespace (:func:`_chain`), so the entry point
calls the patched line (the bucket table's cache included: a fresh one per mutant).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from batchinv.fast import cuda_graph_buckets as buckets_module
from batchinv.fast import prefill_chunk_plan as chunk_module

from .patch import _exec, _source, mutate


def _chain(module: ModuleType, target: str, old: str, new: str, *callers: str) -> Callable[..., Any]:
    """``module.<callers[-1]>`` calling ``target`` with ``old`` replaced by ``new`` through the
    unchanged ``callers`` (each calls the one before it, or ``target``)."""
    fn = mutate(module, target, old, new)
    namespace = getattr(fn, "__wrapped__", fn).__globals__  # under functools.lru_cache
    for name in callers:
        _exec(_source(getattr(module, name)), namespace, f"{module.__name__}.{name}")
    return namespace[callers[-1]] if callers else fn  # type: ignore[no-any-return]


# --- prefill_chunk_plan -----------------------------------------------------------------------

_GEOMETRY = "geometry = torch.stack([offset, length, length, torch.zeros_like(length)], dim=-1)"


def prefill_chunk_plan_extra_chunk_at_budget_multiples() -> Callable[..., Any]:
    return mutate(
        chunk_module,
        "prefill_chunk_plan",
        "num_chunks = (lengths + (token_budget - 1)) // token_budget",
        "num_chunks = lengths // token_budget + 1",
    )


def prefill_chunk_plan_chunk_rows_padded_to_budget() -> Callable[..., Any]:
    return mutate(
        chunk_module,
        "prefill_chunk_plan",
        _GEOMETRY,
        "geometry = torch.stack([offset, length, torch.full_like(length, token_budget), torch.zeros_like(length)], dim=-1)",
    )


def prefill_chunk_plan_tail_shares_its_chunk() -> Callable[..., Any]:
    return mutate(
        chunk_module,
        "prefill_chunk_plan",
        _GEOMETRY,
        "geometry = torch.stack([offset, length, torch.clamp(length + torch.roll(lengths, -1)[:, None], "
        "max=token_budget), torch.zeros_like(length)], dim=-1)",
    )


# --- cuda_graph_buckets -----------------------------------------------------------------------


def cuda_graph_buckets_align_then_validate() -> Callable[..., Any]:
    return _chain(
        buckets_module,
        "_buckets",
        "return table(align(sizes[valid(sizes, cfg)]))",
        "return table(align(sizes)[valid(align(sizes), cfg)])",
        "cuda_graph_buckets",
    )


def cuda_graph_buckets_without_the_64_floor() -> Callable[..., Any]:
    return _chain(
        buckets_module,
        "align",
        "tokens = torch.clamp((sizes[:, 0] + TOKEN_ALIGN - 1) // TOKEN_ALIGN, min=1) * TOKEN_ALIGN",
        "tokens = sizes[:, 0]",
        "_buckets",
        "cuda_graph_buckets",
    )


def cuda_graph_buckets_a_spare_decode_slot_required() -> Callable[..., Any]:
    return _chain(
        buckets_module,
        "holding",
        "return enough & (prefill == 0) & (decode >= step.decode)",
        "return enough & (prefill == 0) & (decode > step.decode)",
        "step_bucket",
        "launch_rows",
        "cuda_graph_buckets",
    )
