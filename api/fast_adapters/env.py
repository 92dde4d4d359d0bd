"""Alias of :mod:`batchinv.harness.adapters.env` (moved there; this path stays importable for code written against it).
The alias is the module itself, not a copy: attributes set through either name are shared."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("batchinv.harness.adapters.env")
