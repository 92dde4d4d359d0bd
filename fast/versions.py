"""The torch and Triton versions batchinv is tested with, checked before any kernel is defined.

:func:`check_versions` runs when the kernels are first imported (``batchinv.fast.kernels``,
which every launcher imports) and when the ``batchinv`` command enters its lane: a torch or
Triton outside the tested range raises :class:`UnsupportedVersionError` naming the version found
and the range, instead of a failure deep inside a kernel.  ``import batchinv`` and ``import
batchinv.harness`` do not run it (they import neither triton nor the kernels).

Tested ranges (README, "Compatibility"; ``docs/COMPAT.md`` says which combinations ran where):

* Triton 3.6 to 3.9: the cpu lane (Triton's interpreter) on each of 3.6.0, 3.7.1, 3.8.0, 3.9.0
  (``ci/compat.sh``); GPUs on 3.6 only.
* torch 2.11 to 2.15: the torch releases that bring those Tritons (2.11 -> 3.6, 2.12 / 2.13 ->
  3.7, 2.14 -> 3.8, 2.15 -> 3.9).

Only (major, minor) is compared, so a local or pre-release build of a tested minor release
(``2.11.0a0+git...``, ``3.6.0+cu130``) is accepted.  ``BATCHINV_ALLOW_UNTESTED=1`` lets an
untested torch or Triton through (at the user's risk); a combination known to fail is refused
all the same.

One known-bad combination depends on the lane: Triton's interpreter before 3.7 converts values
through numpy in a way numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
scalars", inside a kernel's ``range`` loop), so on the cpu lane Triton 3.6 needs numpy < 2.4;
Triton 3.7, 3.8 and 3.9 run with numpy 2.4.  An environment marker cannot express "numpy < 2.4
only next to Triton 3.6", so the dependency has no upper bound and this check refuses the pair.
GPU lanes do not run the interpreter and take any numpy.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from batchinv.reference.errors import BatchinvError

#: Set to ``1`` to run with a torch or Triton outside the tested range.
ALLOW_UNTESTED_ENV = "BATCHINV_ALLOW_UNTESTED"


class UnsupportedVersionError(BatchinvError, RuntimeError):
    """An installed package's version is outside what batchinv is tested with.

    Attributes:
        package: the distribution's name (``torch``, ``triton``, ``numpy``).
        expected: the accepted versions, in words.
        found: the version installed.
    """

    def __init__(self, package: str, expected: str, found: str, fix: str) -> None:
        self.package, self.expected, self.found = package, expected, found
        super().__init__(f"package '{package}': expected {expected}, found {found}; {fix}")


@dataclass(frozen=True)
class VersionRange:
    """The (major, minor) releases of ``package`` from ``oldest`` to ``newest``, both included."""

    package: str
    oldest: tuple[int, int]
    newest: tuple[int, int]

    def admits(self, version: str) -> bool:
        """True when ``version``'s (major, minor) lies in the range (any patch, local or
        pre-release part)."""
        return self.oldest <= _minor(self.package, version) <= self.newest

    def __str__(self) -> str:
        return f"{self.package} {_dotted(self.oldest)} to {_dotted(self.newest)}"


TORCH = VersionRange("torch", (2, 11), (2, 15))
TRITON = VersionRange("triton", (3, 6), (3, 9))
#: The interpreter of every Triton below this release needs numpy below ``INTERPRETER_NUMPY_BELOW``.
INTERPRETER_NUMPY_FIXED_IN = (3, 7)
INTERPRETER_NUMPY_BELOW = (2, 4)


def _dotted(release: tuple[int, int]) -> str:
    return ".".join(str(part) for part in release)


def _minor(package: str, version: str) -> tuple[int, int]:
    try:
        release = Version(version).release
    except InvalidVersion:
        raise UnsupportedVersionError(
            package, "a PEP 440 version", repr(version), "reinstall the package"
        ) from None
    major, minor = (*release, 0, 0)[:2]
    return major, minor


def installed_version(package: str) -> str:
    """The installed version of ``package``: its distribution metadata, else the module's
    ``__version__`` (a source build on ``sys.path``, or Triton installed as ``pytorch-triton``)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return str(importlib.import_module(package).__version__)


def check_versions(
    *,
    interpreter: bool,
    version_of: Callable[[str], str] = installed_version,
    env: Mapping[str, str] | None = None,
) -> None:
    """Refuse a torch or Triton outside the tested range, and numpy >= 2.4 under the interpreter
    of a Triton before 3.7.

    Parameters:
        interpreter: whether Triton kernels run in its interpreter (the cpu lane).
        version_of: package name -> installed version (the installed metadata by default).
        env: the environment read for ``BATCHINV_ALLOW_UNTESTED`` (``os.environ`` by default).

    Raises:
        UnsupportedVersionError: naming the package, the version found and the accepted range.
    """
    env = os.environ if env is None else env
    allow_untested = env.get(ALLOW_UNTESTED_ENV, "") not in ("", "0")
    triton = version_of("triton")
    for accepted in (TORCH, TRITON):
        found = triton if accepted is TRITON else version_of(accepted.package)
        if not allow_untested and not accepted.admits(found):
            raise UnsupportedVersionError(
                accepted.package,
                f"{accepted} (the range batchinv is tested with)",
                found,
                f"install a {accepted.package} in that range, or set {ALLOW_UNTESTED_ENV}=1 to try it anyway",
            )
    if interpreter and _minor("triton", triton) < INTERPRETER_NUMPY_FIXED_IN:
        numpy = version_of("numpy")
        if _minor("numpy", numpy) >= INTERPRETER_NUMPY_BELOW:
            below = _dotted(INTERPRETER_NUMPY_BELOW)
            raise UnsupportedVersionError(
                "numpy",
                f"numpy < {below} next to triton {triton} in the Triton interpreter (the cpu lane): "
                f"that interpreter fails with numpy >= {below}",
                numpy,
                f"install 'numpy<{below}', or triton >= {_dotted(INTERPRETER_NUMPY_FIXED_IN)}",
            )
