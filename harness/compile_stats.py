"""Time spent compiling Triton kernels in this process (the cold-cache share of a sweep).

Triton (3.4 on) calls ``triton.knobs.compilation.listener`` after every compilation with its
stage times and whether it was a cache hit; :func:`install` chains a listener that adds up the
misses.  Where the knob does not exist (or on the cpu lane, where the interpreter compiles
nothing) the figures stay zero and :attr:`CompileStats.available` says so.

Every miss is kept by its Triton cache hash (with the kernel's name and its seconds), so the
stats of several worker processes add up to what a sweep's pool compiled more than once: a
kernel two workers compiled side by side, before either had written the shared on-disk cache
(:attr:`CompileStats.repeated`), and per kernel name where the compile time went
(:meth:`CompileStats.by_kernel`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

#: One compilation that missed the cache: (kernel name, seconds).
Compiled = tuple[str, float]


@dataclass(frozen=True)
class CompileStats:
    """Compilations that missed the cache, and their total time in seconds.

    ``compiled``: the misses by Triton cache hash, each (kernel name, seconds) -- the first
    compilation of each hash; ``repeated`` / ``repeated_seconds``: compilations of a hash already
    in ``compiled`` (another process compiled the same kernel before the disk cache had it),
    counted in ``compilations`` and ``seconds`` too.
    """

    compilations: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    available: bool = False
    compiled: dict[str, Compiled] = field(default_factory=dict, hash=False)  # never mutated
    repeated: int = 0
    repeated_seconds: float = 0.0

    def __add__(self, other: CompileStats) -> CompileStats:
        merged = dict(self.compiled)
        repeated, repeated_seconds = (
            self.repeated + other.repeated,
            self.repeated_seconds + other.repeated_seconds,
        )
        for key, (name, seconds) in other.compiled.items():
            if key in merged:
                repeated += 1
                repeated_seconds += seconds
            else:
                merged[key] = (name, seconds)
        return CompileStats(
            self.compilations + other.compilations,
            self.seconds + other.seconds,
            self.cache_hits + other.cache_hits,
            self.available or other.available,
            merged,
            repeated,
            repeated_seconds,
        )

    def __sub__(self, other: CompileStats) -> CompileStats:
        """What this process compiled since ``other`` (an earlier snapshot of it)."""
        return CompileStats(
            self.compilations - other.compilations,
            self.seconds - other.seconds,
            self.cache_hits - other.cache_hits,
            self.available,
            {k: v for k, v in self.compiled.items() if k not in other.compiled},
            self.repeated - other.repeated,
            self.repeated_seconds - other.repeated_seconds,
        )

    def by_kernel(self) -> list[tuple[str, int, float]]:
        """(kernel name, distinct compilations, seconds) by seconds, largest first (repeats of a
        hash are not in it: they are :attr:`repeated`)."""
        totals: dict[str, tuple[int, float]] = {}
        for name, seconds in self.compiled.values():
            count, total = totals.get(name, (0, 0.0))
            totals[name] = (count + 1, total + seconds)
        return sorted(((n, c, s) for n, (c, s) in totals.items()), key=lambda row: (-row[2], row[0]))

    def summary(self, top: int = 20) -> dict[str, Any]:
        """The JSON report's record: the totals, the repeats and the ``top`` kernels by seconds."""
        return {
            "compilations": self.compilations,
            "seconds": self.seconds,
            "cache_hits": self.cache_hits,
            "available": self.available,
            "distinct": len(self.compiled),
            "repeated": self.repeated,
            "repeated_seconds": self.repeated_seconds,
            "by_kernel": [
                {"kernel": name, "compilations": count, "seconds": seconds}
                for name, count, seconds in self.by_kernel()[:top]
            ],
        }


_TOTAL = CompileStats()
_INSTALLED = False


def record(*, hash_key: str, name: str, seconds: float, cache_hit: bool) -> None:
    """Count one compilation of this process (what the listener does with Triton's report)."""
    global _TOTAL
    if cache_hit:
        _TOTAL = _TOTAL + CompileStats(0, 0.0, 1, True)
    else:
        _TOTAL = _TOTAL + CompileStats(1, seconds, 0, True, {hash_key: (name, seconds)})


def install() -> bool:
    """Start counting (idempotent).  Imports triton: call after the lane is entered.  Returns
    whether this Triton has the compilation listener."""
    global _INSTALLED, _TOTAL
    if _INSTALLED:
        return _TOTAL.available
    _INSTALLED = True
    if "triton" not in sys.modules:
        try:
            import triton  # noqa: F401
        except ImportError:  # pragma: no cover - triton is a dependency
            return False
    knobs = getattr(sys.modules["triton"], "knobs", None)
    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return False
    previous = compilation.listener

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        meta = metadata if isinstance(metadata, dict) else {}
        record(
            hash_key=str(meta.get("hash", id(metadata))),
            name=str(meta.get("name", "?")),
            seconds=getattr(times, "total", 0) / 1e6,
            cache_hit=cache_hit,
        )
        if previous is not None:
            previous(
                src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit
            )

    compilation.listener = listener
    _TOTAL = CompileStats(available=True)
    return True


def snapshot() -> CompileStats:
    """The totals so far in this process."""
    return _TOTAL
