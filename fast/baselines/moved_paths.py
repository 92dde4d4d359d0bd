"""The baselines' import paths before they moved under ``fast/baselines/`` (house step, issue 23):
``batchinv.fast.<component>_baselines`` stays importable, as the module
``batchinv.fast.baselines.<component>`` itself (not a copy), for code written against it -- the
outside measurement kit (``side_by_side3.py``) imports three of them.

:func:`install` puts one finder on ``sys.meta_path`` (idempotent); ``batchinv.fast`` calls it on
import.  A name whose component has no baselines module is left to the normal import (a
``ModuleNotFoundError`` naming it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

_PREFIX = "batchinv.fast."
_SUFFIX = "_baselines"


class MovedBaselinesFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``batchinv.fast.X_baselines`` to ``batchinv.fast.baselines.X``."""

    @staticmethod
    def _target(fullname: str) -> str | None:
        if not (fullname.startswith(_PREFIX) and fullname.endswith(_SUFFIX)):
            return None
        component = fullname[len(_PREFIX) : -len(_SUFFIX)]
        if not component.isidentifier() or "." in component:
            return None
        target = f"batchinv.fast.baselines.{component}"
        return target if importlib.util.find_spec(target) is not None else None

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved_to = self._target(fullname)
        if moved_to is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=moved_to)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        assert spec.origin is not None
        return importlib.import_module(spec.origin)

    def exec_module(self, module: ModuleType) -> None:
        # the import system binds sys.modules[old name] to the returned module: put it back on
        # the real module (already executed) so both names are one object
        pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, MovedBaselinesFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedBaselinesFinder())
