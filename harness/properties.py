"""What a subject's checks say it has: *batch-invariant* and *deterministic at fixed shape*,
judged apart (docs/DESIGN.md, "What the harness asserts").

* **batch-invariant**: every batch-invariance check that applies
  (:data:`registry.BATCH_INVARIANCE_CHECKS`: batch_prefix ... tp_degree) passed: a row's bits do
  not move with its batch, position, layout, neighbours, partition, phase, config or mode;
* **deterministic at fixed shape**: ``cross_process`` (:data:`registry.PROCESS_CHECKS`) passed:
  the same case gives the same bits in a fresh process (another hash seed, an empty Triton
  cache).

Either can hold without the other: a kernel whose split follows M is deterministic at every
fixed shape and not batch-invariant; an autotuner timed once per process keeps every launch of
the process invariant and changes its bits in the next process (``mean``'s
``autotune_hash_ties``).  A property is ``yes`` when its checks all ran and passed (a skip, a
case with nothing to compare, is allowed beside at least one pass), ``no`` when one failed, and
``unknown`` otherwise: not run (``--checks``), skipped everywhere, an error or a timeout, or a
launch that ran the reference instead of the kernel -- never a ``yes`` it did not earn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from batchinv.harness.registry import BATCH_INVARIANCE_CHECKS, PROCESS_CHECKS

BATCH_INVARIANT = "batch-invariant"
DETERMINISTIC = "deterministic at fixed shape"
#: Each property and the checks that decide it, in report order.
PROPERTIES: Mapping[str, tuple[str, ...]] = {
    BATCH_INVARIANT: BATCH_INVARIANCE_CHECKS,
    DETERMINISTIC: PROCESS_CHECKS,
}
YES, NO, UNKNOWN = "yes", "no", "unknown"


def verdicts(statuses: Mapping[str, str], applicable: Iterable[str] | None = None) -> dict[str, str]:
    """Each property's verdict (``yes`` / ``no`` / ``unknown``) from the statuses of a subject's
    checks (check -> its status over the cases: ``pass``, ``fail``, ``error``, ``timeout``,
    ``skip``, ``reference path``).  ``applicable``: the checks that apply to the component; one
    of a property's that is missing from ``statuses`` makes it ``unknown`` (None: judge the
    checks present)."""
    wanted = set(statuses) if applicable is None else set(applicable)
    out: dict[str, str] = {}
    for name, checks in PROPERTIES.items():
        mine = [c for c in checks if c in wanted]
        found = [statuses.get(c) for c in mine]
        if "fail" in found:
            out[name] = NO
        elif mine and all(s in ("pass", "skip") for s in found) and "pass" in found:
            out[name] = YES
        else:
            out[name] = UNKNOWN
    return out


def by_subject(
    checks: Iterable[Any], applicable: Mapping[str, Iterable[str]] | None = None
) -> dict[tuple[str, str], dict[str, str]]:
    """:func:`verdicts` per (component, subject) from check summaries (objects with
    ``component``, ``subject``, ``check`` and ``status``: :class:`batchinv.harness.sweep.CheckSummary`),
    in first-seen order; ``applicable``: the applicable checks per component name."""
    statuses: dict[tuple[str, str], dict[str, str]] = {}
    for c in checks:
        statuses.setdefault((c.component, c.subject), {})[c.check] = c.status
    return {
        key: verdicts(found, None if applicable is None else applicable.get(key[0]))
        for key, found in statuses.items()
    }


def tally(found: Mapping[tuple[str, str], Mapping[str, str]]) -> str:
    """``batch-invariant 20/25, deterministic at fixed shape 25/25 (2 unknown)``: how many of
    the subjects have each property, of those judged."""
    parts = []
    for name in PROPERTIES:
        values = [v[name] for v in found.values()]
        text = f"{name} {values.count(YES)}/{len(values)}"
        if values.count(UNKNOWN):
            text += f" ({values.count(UNKNOWN)} unknown)"
        parts.append(text)
    return ", ".join(parts)
