"""The ``enable()`` layer: a torch model's matrix products, RMSNorms, softmaxes, last-dim means and
top-k routed through the pinned kernels, in eager code, CUDA graphs and ``torch.compile`` graphs.

* :mod:`~batchinv.fast.enable.ops`: the ``torch.ops.batchinv`` operators (fake implementations,
  opaque to Inductor, CUDA-graph capturable);
* :mod:`~batchinv.fast.enable.aten_override`: :func:`enable` itself and the aten overrides of the
  matrix products;
* :mod:`~batchinv.fast.enable.function_mode`: the torch-function mode that routes the rest and
  refuses unpinned operators under ``strict``.

``batchinv.enable`` is the public spelling.  ``batchinv.fast.enable`` is this package; calling it
(``with batchinv.fast.enable(): ...``, the spelling the README gave before this package existed)
calls :func:`~batchinv.fast.enable.aten_override.enable`.  Importing the package imports neither
triton nor the kernels.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "enable":  # lazy: importing the package must not import triton
        from batchinv.fast.enable.aten_override import enable

        return enable
    raise AttributeError(f"module 'batchinv.fast.enable' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """This package's module type: calling the package calls :func:`enable`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from batchinv.fast.enable.aten_override import enable

        return enable(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
