"""One-line mutants of shipped source: a function's source with exactly one line replaced.

A mutant is built from the *current* source of the shipped function (``inspect.getsource``),
so it is the fast code with one planted change and nothing else; when the shipped line it
patches changes, building the mutant fails with the line it looked for (a stale mutant is an
error, never a silently different program).

The patched source is compiled in a copy of the shipped module's globals (helpers, constexprs
and imports resolve as in the original) and registered with :mod:`linecache`, so Triton's
``@triton.jit`` -- compiled or interpreted -- can read it back like a file.  When the patched
function is a helper, ``entry`` names the function that calls it: the entry is re-created,
unchanged, in the same namespace, so it calls the mutated helper.  A helper shared from
``fast/kernels/primitives.py`` lives in another module than the kernel that calls it:
``entry_module`` names the kernel's module, whose globals then see the mutated helper in place
of the shipped one.
"""

from __future__ import annotations
import __future__

import inspect
import itertools
import linecache
import textwrap
from collections.abc import Mapping
from types import ModuleType
from typing import Any

_COUNTER = itertools.count()


def _source(obj: Any) -> str:
    fn = getattr(obj, "fn", obj)  # a Triton JITFunction / InterpretedFunction wraps .fn
    return textwrap.dedent(inspect.getsource(fn))


def _exec(source: str, namespace: dict[str, Any], label: str) -> None:
    filename = f"<mutant {next(_COUNTER)}: {label}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    flags = __future__.annotations.compiler_flag  # as the shipped modules are compiled
    exec(compile(source, filename, "exec", flags=flags, dont_inherit=True), namespace)


def mutate(
    module: ModuleType,
    target: str,
    old: str,
    new: str,
    *,
    entry: str | None = None,
    entry_module: ModuleType | None = None,
    extra_globals: Mapping[str, Any] | None = None,
) -> Any:
    """``module.<entry>`` rebuilt with one line of ``module.<target>`` replaced.

    Args:
        module: the shipped module holding ``target`` (and ``entry``).
        target: the function whose source is patched.
        old: the line to replace, stripped of indentation; it must occur exactly once.
        new: its replacement (indented like ``old``).
        entry: the function to return (default ``target``); rebuilt unchanged so that it calls
            the patched ``target``.
        entry_module: the module holding ``entry`` when it is not ``module`` (a kernel calling a
            helper of ``batchinv.fast.kernels.primitives``): ``entry`` is rebuilt in a copy of
            its globals in which every name bound to the shipped ``target`` is bound to the
            patched one.
        extra_globals: names the new line uses that the module does not define.

    Returns:
        The rebuilt ``entry`` (a ``@triton.jit`` kernel stays one).

    Raises:
        LookupError: ``old`` is not exactly one line of ``target``'s source, or ``entry_module``
            does not import ``target`` (the mutant is stale).
    """
    source = _source(getattr(module, target))
    lines = source.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == old.strip()]
    if len(hits) != 1:
        raise LookupError(
            f"mutant of {module.__name__}.{target}: expected the line {old.strip()!r} exactly once, "
            f"found it {len(hits)} times; the shipped code changed, update the mutant"
        )
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = indent + new.strip() + "\n"
    namespace = dict(vars(module))
    namespace.update(extra_globals or {})
    _exec("".join(lines), namespace, f"{module.__name__}.{target}")
    if entry_module is not None and entry_module is not module:
        shipped = getattr(module, target)
        patched = namespace[target]
        namespace = dict(vars(entry_module))
        aliases = [name for name, value in namespace.items() if value is shipped]
        if not aliases:
            raise LookupError(
                f"mutant of {module.__name__}.{target}: {entry_module.__name__} does not import it; "
                "the shipped code changed, update the mutant"
            )
        namespace.update(dict.fromkeys(aliases, patched))
        namespace.update(extra_globals or {})
        module = entry_module
    if entry is not None and entry != target:
        _exec(_source(getattr(module, entry)), namespace, f"{module.__name__}.{entry}")
    return namespace[entry or target]
