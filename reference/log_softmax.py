"""Reference log_softmax: one name per component across trees.

The math lives beside softmax in :mod:`batchinv.reference.softmax` (both share the fp64 shift
and sum, and the error model of the bound); this module only gives the ``log_softmax`` component
its own import path.
"""

from batchinv.reference.softmax import check_softmax_args, log_softmax, log_softmax_bound

__all__ = ["check_softmax_args", "log_softmax", "log_softmax_bound"]
