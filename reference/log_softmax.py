"""Reference log_softmax: one name per component across trees.

The math lives beside softmax in :mod:`batchinv.reference.softmax` (both share the fp64 shift
and sum); this module only gives the ``log_softmax`` component its own import path.
"""

from batchinv.reference.softmax import check_softmax_args, log_softmax

__all__ = ["check_softmax_args", "log_softmax"]
