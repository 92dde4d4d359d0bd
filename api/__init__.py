"""batchinv: reference-vs-fast differential testing for batch-invariant GPU inference kernels.

Subpackages: :mod:`batchinv.reference` (the slow, obviously-correct torch references),
:mod:`batchinv.fast` (the pinned kernels, their unpinned baselines and the ``torch.ops.batchinv``
operators) and :mod:`batchinv.harness` (registry, checks, sweep, bench, pytest plugin).

``batchinv.enable()`` is :func:`batchinv.fast.enable.aten_override.enable`, the package
``batchinv.fast.enable`` called as a function gives the same context: inside ``with batchinv.enable():`` a torch model's matrix products,
``F.rms_norm``, ``softmax`` / ``log_softmax`` and last-dim ``mean`` run on the pinned kernels, in
eager code, CUDA graphs and ``torch.compile`` graphs.  It is exported lazily, so ``import
batchinv`` (and ``import batchinv.harness``) imports neither triton nor the kernels.
"""

from typing import Any

__all__ = ["enable"]


def __getattr__(name: str) -> Any:
    if name == "enable":
        from batchinv.fast.enable.aten_override import enable

        return enable
    raise AttributeError(f"module 'batchinv' has no attribute {name!r}")
