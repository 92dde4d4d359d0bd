"""The differential-testing harness: registry, bit patterns, comparators, invariance drivers,
negative controls, reports, the CLI and the pytest plugin.

Importing this package never imports vllm or flashinfer (a test checks it).
"""

from typing import Any

__all__ = ["check_subject"]


def __getattr__(name: str) -> Any:
    """``check_subject`` (:func:`batchinv.harness.testing.check_subject`), imported lazily: it
    imports torch, and the lane must be entered before triton is."""
    if name == "check_subject":
        from batchinv.harness.testing import check_subject

        return check_subject
    raise AttributeError(f"module 'batchinv.harness' has no attribute {name!r}")
