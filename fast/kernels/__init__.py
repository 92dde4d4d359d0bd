"""Only ``@triton.jit`` code lives here; launchers (validation, config, grid) live in ``fast/``.

Importing any kernel first checks the installed torch and Triton (and, under the interpreter,
numpy) against the tested range (:func:`batchinv.fast.versions.check_versions`): outside it the
import raises :class:`~batchinv.fast.versions.UnsupportedVersionError`, never a kernel failure.
"""

from batchinv.fast.device import interpreting
from batchinv.fast.versions import check_versions

check_versions(interpreter=interpreting())
