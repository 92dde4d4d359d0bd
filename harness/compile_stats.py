"""Time spent compiling Triton kernels in this process (the cold-cache share of a sweep).

Triton (3.4 on) calls ``triton.knobs.compilation.listener`` after every compilation with its
stage times and whether it was a cache hit; :func:`install` chains a listener that adds up the
misses.  Where the knob does not exist (or on the cpu lane, where the interpreter compiles
nothing) the figures stay zero and :attr:`CompileStats.available` says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompileStats:
    """Compilations that missed the cache, and their total time in seconds."""

    compilations: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    available: bool = False

    def __add__(self, other: CompileStats) -> CompileStats:
        return CompileStats(
            self.compilations + other.compilations,
            self.seconds + other.seconds,
            self.cache_hits + other.cache_hits,
            self.available or other.available,
        )

    def __sub__(self, other: CompileStats) -> CompileStats:
        return CompileStats(
            self.compilations - other.compilations,
            self.seconds - other.seconds,
            self.cache_hits - other.cache_hits,
            self.available,
        )


_TOTAL = CompileStats()
_INSTALLED = False


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
        global _TOTAL
        if cache_hit:
            _TOTAL = _TOTAL + CompileStats(0, 0.0, 1, True)
        else:
            _TOTAL = _TOTAL + CompileStats(1, getattr(times, "total", 0) / 1e6, 0, True)
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
