"""Fast implementations: production kernels with every batch-dependent choice pinned, and,
beside each, the unpinned baselines production uses by default (the negative controls).

``batchinv.fast.enable()`` (the package :mod:`batchinv.fast.enable`, callable as
``batchinv.enable``; a context manager, :func:`batchinv.fast.enable.aten_override.enable`) routes a model's matrix products, RMSNorms,
softmaxes and last-dim means through the pinned kernels, eager and compiled.
"""

from typing import Any

from batchinv.fast.baselines import moved_paths as _moved_paths

_moved_paths.install()  # batchinv.fast.<component>_baselines stays importable


def __getattr__(name: str) -> Any:
    if name == "enable":  # the subpackage, callable; lazy: importing batchinv.fast must not import triton
        import importlib

        return importlib.import_module("batchinv.fast.enable")
    raise AttributeError(f"module 'batchinv.fast' has no attribute {name!r}")
