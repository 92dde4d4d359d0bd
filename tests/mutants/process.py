"""Mutants of a per-process input: a shipped launcher whose choice follows something that
differs between processes, never between the launches of one (the teeth of ``cross_process``).

Each subject is a module-level function, so a fresh process imports it by its module and name
(``mutants.process:softmax_tile_by_hash_order``) and plants the same change there.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from batchinv.fast import softmax as softmax_launcher

from .patch import mutate

#: The two tiles the mutated launcher "ties" between.  The first name in a set's iteration order
#: wins, and that order follows PYTHONHASHSEED: the cross_process children's seeds (1 and 2)
#: order these two names differently (tests/harness/test_cross_process.py checks it), so one of
#: them differs from any parent.
TILE_NAMES: tuple[str, str] = ("shipped", "halved")


def _tile_by_hash_order(config: Any) -> Any:
    first = next(iter(set(TILE_NAMES)))
    return replace(config, block_n=max(1, config.block_n // 2)) if first == "halved" else config


@functools.cache
def _softmax_tile_by_hash_order() -> Any:
    return mutate(
        softmax_launcher,
        "launch",
        "config = softmax_config(arch(x.device), x.dtype, n_cols)",
        "config = tile_by_hash_order(softmax_config(arch(x.device), x.dtype, n_cols))",
        entry="softmax",
        extra_globals={"tile_by_hash_order": _tile_by_hash_order},
    )


def softmax_tile_by_hash_order(*args: Any, **kwargs: Any) -> Any:
    """softmax whose launcher halves the column chunk (block_n) when ``"halved"`` comes first in
    the iteration order of ``set(TILE_NAMES)``: a tie between two tiles broken by the hash
    order, the same in every launch of a process, another in another process."""
    return _softmax_tile_by_hash_order()(*args, **kwargs)


def build_softmax_tile_by_hash_order() -> Any:
    return softmax_tile_by_hash_order
