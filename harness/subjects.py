"""Subjects from outside: a user's own kernel checked like the shipped ones.

A *subject* is what a check runs: the component's ``fast`` kernel, one of its baselines, or an
outside callable with (or adapted to) the component's signature.  This module is the data model
of the outside ones and the three ways they come in, which all end in one :class:`Subject`:

* the CLI: ``batchinv sweep rms_norm --subject mine=pkg.mod:fn`` (``--as baseline``: a negative
  control, which must vary);
* Python: :func:`check_subject` (``batchinv.harness.check_subject``) and the pytest helpers of
  :mod:`batchinv.harness.testing`;
* entry points: a package declares ``"<component>:<name>" = "pkg.mod:attr"`` in the group
  ``batchinv.subjects`` (:data:`ENTRY_POINT_GROUP`); ``batchinv list`` shows them and
  ``batchinv sweep`` includes them.

The import target (``pkg.mod:attr``) is a callable, bound to the component's arguments by name,
or a :class:`Declared` (from :func:`declare`) carrying an :class:`Adapter` for a foreign
signature and a role.  Reports and repro lines name a subject as ``name=pkg.mod:attr``; a repro
(and a sweep worker process) re-imports it from that.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchinv.reference.errors import ArgumentError, Unsupported

#: The entry-point group packages declare their subjects in.
ENTRY_POINT_GROUP = "batchinv.subjects"
#: The roles a subject runs in: checked like ``fast`` (agreement and every invariance check), or
#: as a negative control (its invariance checks must find different bits; a crash is an error).
ROLES: tuple[str, ...] = ("fast", "baseline")
#: Names an outside subject cannot take (they mean the shipped kernel or are reserved).
RESERVED_NAMES: frozenset[str] = frozenset({"fast", "reference", "oracle"})


class SubjectError(ArgumentError):
    """A subject that cannot be used: a bad ``name=pkg.mod:attr`` spelling, an import that fails,
    a target that is not callable, or a signature that does not bind to the component's
    parameters (the message names the component's expected parameters).  A usage error: the
    CLI prints it and exits 2."""


@dataclass(frozen=True)
class Adapter:
    """Maps the component's keyword arguments onto a foreign callable, and its return value back.

    Attributes:
        inputs: ``inputs(**component_kwargs) -> kwargs`` for the subject (transpose a weight,
            add a leading dimension, rename, drop what does not apply); it may raise
            :class:`Unsupported` for a case the subject cannot take.  None: bind by name.
        rename: ``{component parameter: subject parameter}``, applied before binding by name
            (ignored when ``inputs`` is given).
        output: which outputs the component's checks see: an index into a tuple return (a
            matmul returning ``(out, aux)``: ``0``), a function of the return value (``lambda
            y: y[0]`` to drop a leading dimension), or None (the return value as is).
        partition: the subject takes the component's partition keyword (``num_sms``).

    Example, a matmul ``(a, b_kn)`` with ``b`` as [K, N], onto ``(x, weight [N, K], ...)``::

        Adapter(inputs=lambda x, weight, bias=None, layout="linear", out_dtype=None:
                {"a": x, "b_kn": weight.t() if layout == "linear" else weight})
    """

    inputs: Callable[..., Mapping[str, Any]] | None = None
    rename: Mapping[str, str] = field(default_factory=dict)
    output: int | Callable[[Any], Any] | None = None
    partition: bool = False


@dataclass(frozen=True)
class Declared:
    """A callable declared as a subject (what :func:`declare` returns; an import target or
    entry point may name one).  Calling it calls ``fn`` unchanged."""

    fn: Callable[..., Any]
    adapter: Adapter | None = None
    role: str = "fast"
    component: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def declare(
    fn: Callable[..., Any],
    *,
    adapter: Adapter | None = None,
    role: str = "fast",
    component: str | None = None,
) -> Declared:
    """Declare ``fn`` as a subject: its :class:`Adapter` (None: bound by name), its role
    (``"fast"`` or ``"baseline"``, see :data:`ROLES`) and optionally its component (which a CLI
    ``--subject`` spelling then need not name).  Raises :class:`SubjectError` for an unknown
    role or a non-callable ``fn``."""
    if role not in ROLES:
        raise SubjectError("role", f"one of {ROLES}", role)
    if not callable(fn):
        raise SubjectError("fn", "a callable", type(fn).__name__)
    return Declared(fn, adapter, role, component)


@dataclass(frozen=True)
class Subject:
    """An outside subject as the checks, the sweep, the report and the repro see it.

    Attributes:
        name: short id in tables and reports (not ``fast``, ``reference``, ``oracle``).
        target: the import path ``pkg.mod:attr`` it is re-imported from (repro lines, sweep
            workers); None for an in-process callable (Python API), which cannot be re-imported.
        fn: the callable (None: imported from ``target`` on first use).
        role: ``"fast"`` (checked like the shipped kernel) or ``"baseline"`` (a negative control).
        adapter: how the component's arguments reach ``fn`` (None: by name).
        component: the component whose signature it has, when known.
    """

    name: str
    target: str | None = None
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    role: str = "fast"
    adapter: Adapter | None = field(default=None, compare=False, repr=False)
    component: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise SubjectError("name", "letters, digits, '_' or '-'", self.name)
        if self.name in RESERVED_NAMES:
            raise SubjectError("name", f"a name other than {sorted(RESERVED_NAMES)}", self.name)
        if self.role not in ROLES:
            raise SubjectError("role", f"one of {ROLES}", self.role)
        if self.fn is None and self.target is None:
            raise SubjectError(self.name, "a callable or an import path 'pkg.mod:attr'", None)

    @property
    def spec(self) -> str:
        """``name=pkg.mod:attr`` (the CLI's spelling), or the bare name without a target."""
        return f"{self.name}={self.target}" if self.target else self.name

    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    def loaded(self) -> Subject:
        """This subject with ``fn`` (and a declared adapter, role, component) imported from
        ``target`` when it has no ``fn`` yet.  Raises :class:`SubjectError` if the import fails."""
        if self.fn is not None:
            return self
        assert self.target is not None  # __post_init__
        obj = import_target(self.target)
        if isinstance(obj, Declared):
            return Subject(
                self.name,
                self.target,
                obj.fn,
                self.role,
                obj.adapter if self.adapter is None else self.adapter,
                self.component or obj.component,
            )
        return Subject(self.name, self.target, obj, self.role, self.adapter, self.component)

    def without_fn(self) -> Subject:
        """A picklable copy for a worker process, which imports ``fn`` from ``target`` again."""
        if self.target is None:
            raise SubjectError(
                self.name, "an import path 'pkg.mod:attr' to run in worker processes (use jobs=1)", None
            )
        return Subject(self.name, self.target, None, self.role, None, self.component)


def import_target(target: str) -> Any:
    """The object at ``pkg.mod:attr`` (``attr`` may be dotted).  Raises :class:`SubjectError`
    naming the target when the spelling is wrong, the import fails or the object is not callable."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise SubjectError("--subject", "an import path 'pkg.mod:attr'", target)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise SubjectError(
            "--subject", f"an importable module ({type(exc).__name__}: {exc})", target
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SubjectError("--subject", f"a name defined in module {module_name!r}", target)
        obj = getattr(obj, part)
    if not callable(obj):
        raise SubjectError("--subject", "a callable", f"{target} ({type(obj).__name__})")
    return obj


def parse_spec(text: str, *, role: str = "fast", component: str | None = None) -> Subject:
    """A CLI ``--subject`` value ``name=pkg.mod:attr`` (or ``pkg.mod:attr``, named after
    ``attr``) as a :class:`Subject` (not imported yet).  Raises :class:`SubjectError`."""
    name, sep, target = text.partition("=")
    if not sep:
        target = text
        name = text.rpartition(":")[2].rpartition(".")[2]
    if ":" not in target:
        raise SubjectError("--subject", "'name=pkg.mod:attr' (an import path with ':')", text)
    return Subject(name, target, None, role, None, component)


# --- binding a subject to a component's arguments ----------------------------------------------


def expected_parameters(fast: Callable[..., Any]) -> str:
    """The component's parameters as a signature-like string, e.g. ``(x, weight, eps=1e-06)``
    (names and defaults; a ``*`` before keyword-only ones)."""
    try:
        params = inspect.signature(fast).parameters.values()
    except (TypeError, ValueError):
        return "(?)"
    parts: list[str] = []
    star = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name if p.default is p.empty else f"{p.name}={p.default!r}"
        parts.append(("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + text)
        star = star or p.kind is p.VAR_POSITIONAL
    return "(" + ", ".join(parts) + ")"


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an operator without a Python signature
        return None


def check_signature(component: Any, subject: Subject) -> None:
    """Refuse, before anything runs, a subject whose signature cannot take the component's
    arguments by name: a required parameter the component never passes, or a required
    parameter of the component the subject cannot take.  Skipped with an adapter's ``inputs``
    (the adapter decides) or when the subject has no inspectable signature.

    Raises:
        SubjectError: naming the subject, the parameter, and the component's expected parameters.
    """
    loaded = subject.loaded()
    adapter = loaded.adapter
    assert loaded.fn is not None
    if adapter is not None and adapter.inputs is not None:
        sig = _signature(adapter.inputs)
        fn_label = "its adapter's inputs"
        rename: Mapping[str, str] = {}
    else:
        sig = _signature(loaded.fn)
        fn_label = "it"
        rename = adapter.rename if adapter is not None else {}
    if sig is None:
        return
    fast_sig = inspect.signature(component.fast)
    offered = {rename.get(n, n) for n in fast_sig.parameters}
    params = sig.parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    expected = expected_parameters(component.fast)
    where = f"subject {subject.spec!r} for {component.name}"
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        if p.name not in offered:
            raise SubjectError(
                where,
                f"parameters that {component.name}'s arguments {expected} bind to by name "
                "(declare an Adapter to map a foreign signature)",
                f"{fn_label} requires {p.name!r}",
            )
    names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    for p in fast_sig.parameters.values():
        if p.default is p.empty and rename.get(p.name, p.name) not in names and not var_kw:
            raise SubjectError(
                where,
                f"a callable taking {component.name}'s parameters {expected} "
                "(declare an Adapter to map a foreign signature)",
                f"{fn_label} takes no {p.name!r}",
            )


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # tensors and other values without a plain truth value
        return False


def bound_call(component: Any, subject: Subject) -> Callable[..., Any]:
    """``call(**component_kwargs)`` running the subject: through its adapter's ``inputs``, or by
    name, dropping a component argument the subject does not take only where it holds the
    component's default (or None); another value raises :class:`Unsupported` (the check is a
    ``skip``).  The return value goes through the adapter's ``output``."""
    loaded = subject.loaded()
    fn = loaded.fn
    assert fn is not None
    adapter = loaded.adapter or Adapter()
    sig = _signature(fn)
    accepted: set[str] | None = None
    if sig is not None and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        accepted = {p.name for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL}
    defaults = {
        n: p.default
        for n, p in inspect.signature(component.fast).parameters.items()
        if p.default is not p.empty
    }

    def by_name(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in kwargs.items():
            name = adapter.rename.get(key, key)
            if accepted is not None and name not in accepted:
                if value is None or (key in defaults and _same(value, defaults[key])):
                    continue
                raise Unsupported(
                    f"the subject takes no {name!r}; this case passes {key}={_short(value)} "
                    "(declare an Adapter to pass it)"
                )
            out[name] = value
        return out

    def call(**kwargs: Any) -> Any:
        mapped = dict(adapter.inputs(**kwargs)) if adapter.inputs is not None else by_name(kwargs)
        result = fn(**mapped)
        if adapter.output is None:
            return result
        if isinstance(adapter.output, int):
            return result[adapter.output]
        return adapter.output(result)

    return call


def accepts_partition(component: Any, subject: Subject) -> bool:
    """Whether the subject takes the component's partition keyword (declared by the adapter, or
    a parameter of that name when bound by name)."""
    arg = component.partition_arg
    if arg is None:
        return False
    loaded = subject.loaded()
    if loaded.adapter is not None and (loaded.adapter.inputs is not None or loaded.adapter.partition):
        return loaded.adapter.partition
    return accepts_keyword(subject, arg)


def accepts_keyword(subject: Subject, name: str) -> bool:
    """Whether the subject's callable has a parameter ``name`` (False through an adapter that
    maps the inputs: it passes only what it declares)."""
    loaded = subject.loaded()
    if loaded.adapter is not None and loaded.adapter.inputs is not None:
        return False
    assert loaded.fn is not None
    sig = _signature(loaded.fn)
    return sig is not None and name in sig.parameters


def _short(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} tensor"
    return repr(value)


# --- entry points ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryPointSubject:
    """One ``batchinv.subjects`` entry point: ``"<component>:<name>" = "pkg.mod:attr"``, from
    distribution ``dist``."""

    component: str
    subject: Subject
    dist: str


def entry_point_subjects(components: Sequence[str] | None = None) -> list[EntryPointSubject]:
    """The subjects packages declare in :data:`ENTRY_POINT_GROUP`, optionally only those of
    ``components``, sorted by (component, name).  The targets are not imported here; a
    :class:`Declared` target's role is read when it is (:meth:`Subject.loaded`), so the role is
    resolved by :func:`resolve_role`.

    Raises:
        SubjectError: an entry point whose name is not ``component:name`` or whose component is
            not registered (naming the entry point and its distribution).
    """
    from importlib.metadata import entry_points

    from batchinv.harness.registry import COMPONENT_MODULES

    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        component, sep, name = ep.name.partition(":")
        if not sep or component not in COMPONENT_MODULES:
            raise SubjectError(
                f"entry point {ep.name!r} of {dist} (group {ENTRY_POINT_GROUP})",
                f"a name '<component>:<subject>' with a registered component ({', '.join(COMPONENT_MODULES)})",
                ep.name,
            )
        if components and component not in components:
            continue
        found.append(
            EntryPointSubject(component, Subject(name, ep.value, None, "fast", None, component), dist)
        )
    return sorted(found, key=lambda e: (e.component, e.subject.name))


def resolve_role(subject: Subject) -> Subject:
    """``subject`` loaded, with the role its :class:`Declared` target declares (entry points)."""
    loaded = subject.loaded()
    if subject.target is not None and subject.fn is None:
        obj = import_target(subject.target)
        if isinstance(obj, Declared):
            return Subject(loaded.name, loaded.target, loaded.fn, obj.role, loaded.adapter, loaded.component)
    return loaded
