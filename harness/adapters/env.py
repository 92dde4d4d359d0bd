"""Environment pins that leave nothing behind: set for the duration of a block, restored after.

An adapter that must set process state (an environment variable read at a library's import,
for instance) does it through :func:`pinned_environ`: every variable it pins, and every
variable the block itself adds, changes or removes, is restored on exit, also after an
exception.  A variable the user already set to a different value is never kept silently (the
pin would be a no-op): it is replaced for the duration and restored (``on_conflict="replace"``)
or refused (``on_conflict="refuse"``, :class:`EnvConflict`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from batchinv.reference.errors import ArgumentError

#: What :func:`pinned_environ` does with a variable already set to a different value.
ON_CONFLICT: tuple[str, ...] = ("replace", "refuse")


class EnvConflict(ArgumentError):
    """An environment variable the adapter must pin is already set to a value that defeats the
    pin, and the caller asked to refuse rather than replace it (names the variable, the value
    the pin needs and the value found)."""


@contextmanager
def pinned_environ(pins: Mapping[str, str], *, on_conflict: str = "replace") -> Iterator[None]:
    """Set ``pins`` in ``os.environ`` for the block; on exit (also after an exception) restore
    ``os.environ`` to exactly what it was on entry: pinned variables get their old value back
    (or are removed), and so does anything the block added, changed or removed (a library that
    sets variables while it is imported, for instance).

    Args:
        pins: variable name -> value (``""`` is a value: set but empty).
        on_conflict: ``"replace"`` (default): a variable already set to another value is
            replaced for the duration and restored after; ``"refuse"``: raise
            :class:`EnvConflict` before anything is set.

    Raises:
        ArgumentError: an unknown ``on_conflict``.
        EnvConflict: ``on_conflict="refuse"`` and a pinned variable holds another value.
    """
    if on_conflict not in ON_CONFLICT:
        raise ArgumentError("on_conflict", f"one of {ON_CONFLICT}", on_conflict)
    if on_conflict == "refuse":
        for key, value in pins.items():
            found = os.environ.get(key)
            if found is not None and found != value:
                raise EnvConflict(
                    f"environment variable {key}",
                    f"unset or {value!r} (the adapter pins it to {value!r}; unset it or set it so)",
                    found,
                )
    saved = dict(os.environ)
    try:
        os.environ.update(pins)
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
