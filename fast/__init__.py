"""Fast implementations: production kernels with every batch-dependent choice pinned, and,
beside each, the unpinned baselines production uses by default (the negative controls).

``batchinv.fast.enable()`` (a context manager, :func:`batchinv.fast.aten_override.enable`) routes
``torch.mm``, ``torch.addmm`` and ``F.linear`` through the pinned matmul.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "enable":  # lazy: importing batchinv.fast must not import triton
        from batchinv.fast.aten_override import enable

        return enable
    raise AttributeError(f"module 'batchinv.fast' has no attribute {name!r}")
