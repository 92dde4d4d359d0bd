"""The execution vocabulary of the launchers whose launch may follow the number of rows (matmul
and FP8 GEMM, softmax and log_softmax, topk): one rule, and the few pieces every such table
shares.

**The rule** (docs/DESIGN.md, "Style" 4).  A launch config has two parts:

* the **reduction tree** -- anything that changes the order of a reduction, and with it the
  bits: the matmul's K chunks and K step, softmax's ``block_n``, topk's register tile.  It is
  keyed ONLY on (arch, dtype, shape without M); a key on M (the rows of the launch, or anything
  derived from them) would make a row's bits depend on its batch.
* an **execution** of that tree -- who computes it: the tile, warps, stages, split-or-walk,
  programs per row, a register cap.  Every execution of a tree is written to compute the same
  operations in the same order, but a compiler can still make two of them differ, so an
  execution may follow the M bucket ONLY where the registry check ``config_equivalence`` runs
  every execution the table may pick (:func:`every_execution`) on every case of every lane
  and requires the shipped launch's bits from each.

So a component's table is looked up in two steps: its shape keys (never M) give an
:data:`ExecutionTable` (a tuple of :class:`MBucket` rules), and :func:`select_by_m` takes M.
What each component's tree and execution hold differs, legitimately
(``matmul_config.ReductionTree`` / ``Execution``; ``softmax.RowConfig`` / ``Tiled`` or
``Split``; ``topk.TopkConfig`` / ``topk.Execution``): only the M lookup, the frozen table, the
enumeration and the field checks of the config dataclasses live here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeAlias, TypeVar

from batchinv.reference.errors import ArgumentError

X = TypeVar("X")

#: ``max_m`` of a bucket that takes any number of rows.
ANY_M: Final = None


def check_power_of_two(name: str, value: object, low: int = 1) -> None:
    """``ArgumentError`` naming ``name`` unless ``value`` is an int (not a bool), a power of two
    and ``>= low``: the check of a config table's tile, warps and step fields."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value & (value - 1):
        raise ArgumentError(name, f"a power of two >= {low}", value)


def check_positive_int(name: str, value: object) -> None:
    """``ArgumentError`` naming ``name`` unless ``value`` is an int (not a bool) ``>= 1``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(name, "a positive int", value)


class MBucket(Generic[X]):
    """A rule of an execution table: launches of at most ``max_m`` rows (:data:`ANY_M`: any
    number) run ``execution``.

    The interface only: a component's rule is a frozen dataclass deriving from it that declares
    these two fields beside its own shape keys (never M), in its own order
    (``matmul_config.ExecutionRule``, ``softmax.ExecutionRule``); :class:`UpTo` is the rule with
    no shape key of its own.
    """

    max_m: int | None
    execution: X


@dataclass(frozen=True)
class UpTo(MBucket[X]):
    """An :class:`MBucket` and nothing else: up to ``max_m`` rows (None: any) run ``execution``."""

    max_m: int | None
    execution: X


#: The executions of one reduction tree by M bucket, what a component's shape keys (never M)
#: select: its rules, tried in order (the first whose bucket takes M wins).  A tuple of frozen
#: rules, so frozen; the lookups below are the only place M is looked at.
ExecutionTable: TypeAlias = tuple[MBucket[X], ...]


#: Who hears which execution a launcher picked (:func:`note_execution`): the harness's launch
#: provenance (:mod:`batchinv.harness.provenance`) installs itself; None: nobody (one test).
_LISTENER: Callable[[object], None] | None = None


def set_execution_listener(listener: Callable[[object], None] | None) -> None:
    """Install ``listener`` (None: none), called with every execution :func:`select_by_m`
    returns.  The harness's listener keeps the name only inside its own per-thread recording."""
    global _LISTENER
    _LISTENER = listener


def note_execution(execution: object) -> None:
    """Tell the listener (if any) that the launch about to run takes ``execution`` (its
    ``name``, where it has one, labels the launch in reports).  Never changes what runs."""
    listener = _LISTENER
    if listener is not None:
        listener(execution)


def select_by_m(table: ExecutionTable[X], m: int, fallback: X) -> X:
    """The execution of a launch of ``m`` rows: that of the first rule of ``table`` whose
    bucket takes ``m``, else ``fallback`` (noted for the harness, :func:`note_execution`)."""
    for rule in table:
        if rule.max_m is None or m <= rule.max_m:
            note_execution(rule.execution)
            return rule.execution
    note_execution(fallback)
    return fallback


def every_execution(table: ExecutionTable[X], fallback: X) -> tuple[X, ...]:
    """Every execution ``table`` names, in rule order without repeats, ``fallback`` last unless
    a rule takes any M: so every one :func:`select_by_m` may return at any M (a rule shadowed by an
    earlier one is run too).  What ``config_equivalence`` runs."""
    found = [rule.execution for rule in table]
    if not any(rule.max_m is None for rule in table):
        found.append(fallback)
    return tuple(dict.fromkeys(found))
