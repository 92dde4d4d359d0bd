"""Typed errors for bad input, shared by the reference and fast paths.

Every error names the argument, what was expected and what was given, so a caller never has
to guess which of several tensors was wrong.  Never a silent wrong result.
"""

from __future__ import annotations

from typing import Any


class BatchinvError(Exception):
    """Base class of every error batchinv raises on purpose."""


class ArgumentError(BatchinvError, ValueError):
    """An argument has the wrong value, shape or rank.

    Attributes:
        argument: the parameter's name as the caller spelled it.
        expected: a short description of what is accepted.
        given: what was passed (a value, a shape, a dtype...).
    """

    def __init__(self, argument: str, expected: str, given: Any) -> None:
        self.argument = argument
        self.expected = expected
        self.given = given
        super().__init__(f"argument '{argument}': expected {expected}, got {given!r}")


class DTypeError(ArgumentError, TypeError):
    """An argument has an unsupported dtype (also a ``TypeError``)."""


class Unsupported(Exception):
    """Raised by a subject (a baseline, an adapter, or the harness's default binding) for a case it
    cannot express (a bias for a subject that takes none, a CUDA-only library on the cpu lane): the
    check is reported ``skip`` with this message, never ``pass``.  Not a :class:`BatchinvError`:
    it says "not this case", not "bad input".  Also importable as
    ``batchinv.harness.subjects.Unsupported``."""


class DeviceError(ArgumentError):
    """An argument lives on the wrong device (for example a CPU tensor on the GPU path)."""


def check_tensor(
    argument: str,
    value: Any,
    *,
    dtypes: tuple[Any, ...] | None = None,
    ndim: int | None = None,
) -> None:
    """Validate that ``value`` is a tensor with data, of one of ``dtypes``, with ``ndim`` dimensions.

    Raises:
        DTypeError: not a tensor, or a dtype outside ``dtypes``.
        ArgumentError: a sparse or nested tensor, or a wrong number of dimensions.
        DeviceError: a tensor on the ``meta`` device (shapes without values: nothing to compute
            on, for the reference and the fast path alike).
    """
    import torch

    if not isinstance(value, torch.Tensor):
        raise DTypeError(argument, "a torch.Tensor", type(value).__name__)
    if value.layout != torch.strided:
        raise ArgumentError(argument, "a strided (dense) tensor", f"layout {value.layout}")
    if value.is_nested:
        raise ArgumentError(argument, "a strided (dense) tensor", "a nested tensor")
    if value.device.type == "meta":
        raise DeviceError(
            argument, "a tensor with data (a meta tensor has none)", f"a tensor on {value.device}"
        )
    if dtypes is not None and value.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise DTypeError(argument, f"dtype {names}", str(value.dtype).removeprefix("torch."))
    if ndim is not None and value.dim() != ndim:
        raise ArgumentError(
            argument, f"a {ndim}-D tensor", f"{value.dim()}-D tensor of shape {tuple(value.shape)}"
        )


def check_same_device(argument: str, value: Any, device: Any) -> None:
    """Raise :class:`DeviceError` unless tensor ``value`` lives on ``device``."""
    if value.device != device:
        raise DeviceError(argument, f"a tensor on {device}", f"a tensor on {value.device}")


def check_cuda(argument: str, value: Any) -> None:
    """Raise :class:`DeviceError` unless tensor ``value`` is a CUDA tensor (the GPU path)."""
    if value.device.type != "cuda":
        raise DeviceError(argument, "a CUDA tensor on the GPU path", f"a tensor on {value.device}")


def check_last_dim(x: Any, dim: Any, length_name: str) -> None:
    """Validate a reduction over the last dim: ``x`` 2-D ``(R, L)`` or 3-D ``(B, S, L)`` (``L``
    spelled ``length_name``) and ``dim`` an int naming its last dim (``-1`` or ``x.dim() - 1``).

    Raises:
        ArgumentError: another rank, a non-int ``dim``, or a ``dim`` out of range or not the last.
    """
    if x.dim() not in (2, 3):
        raise ArgumentError(
            "x",
            f"a 2-D (R, {length_name}) or 3-D (B, S, {length_name}) tensor",
            f"{x.dim()}-D tensor of shape {tuple(x.shape)}",
        )
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ArgumentError("dim", "an int", type(dim).__name__)
    if not -x.dim() <= dim < x.dim():
        raise ArgumentError("dim", f"an int in [{-x.dim()}, {x.dim() - 1}] (out of range)", dim)
    if dim % x.dim() != x.dim() - 1:
        raise ArgumentError("dim", f"the last dim (-1 or {x.dim() - 1}): only the last dim is supported", dim)


#: The default upper bound of a size argument (:func:`check_int`): the largest int32.  Every
#: size the kernels and plans index with fits in int32, and a product of two such sizes still
#: fits the int64 the plans compute in; a larger value is refused by name, never wrapped.
MAX_SIZE = 2**31 - 1

#: The upper bound of a width or count that sizes an allocation per request or per worker (a
#: plan's ``max_splits``, ``max_chunks``, ``num_sm_parts``): a plan of ``b`` requests allocates
#: ``b * (W + 1)`` entries, so an absurd width is refused by name rather than attempted (an
#: 8 TB allocation, or a Python loop that never ends).
MAX_WIDTH = 2**20

_INT_EXPECTED = "a host integral (a Python int or a NumPy integer; not a bool, a float or a tensor)"


def check_int(argument: str, value: Any, low: int, high: int = MAX_SIZE) -> int:
    """The one rule for an integer (size, count, index) argument, in both trees: ``value`` as a
    Python int when it is a host integer in ``[low, high]``.

    Accepted: a Python int and a NumPy integer scalar (``np.int64(8)``), anything
    ``operator.index`` takes except the refused kinds below.  Refused with :class:`DTypeError`:
    a bool (Python, NumPy or a bool tensor: a flag is not a count), a float (even ``2.0``), a
    tensor of any rank and dtype (a device value: reading it is a host synchronisation and a
    CUDA-graph capture failure).  Refused with :class:`ArgumentError`: a value below ``low`` or
    above ``high`` (by default :data:`MAX_SIZE`, so the int64 arithmetic on it cannot wrap and
    no allocation is sized by an absurd value).

    Raises:
        DTypeError: not a host integer.
        ArgumentError: outside ``[low, high]``.
    """
    import operator

    import numpy as np

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DTypeError(argument, _INT_EXPECTED, type(value).__name__)
    number = operator.index(value)
    if number < low:
        raise ArgumentError(argument, f"an int >= {low}", number)
    if number > high:
        raise ArgumentError(argument, f"an int in [{low}, {high}] (a larger value cannot be held)", number)
    return number


class NotBuiltError(BatchinvError, NotImplementedError):
    """An implementation that does not exist yet was called (a fast kernel for a lane no machine
    of the project has run, for example).  Never raised for bad input; never a silent fallback.

    Attributes:
        what: the missing implementation (``"w4a16_nvfp4 fast kernel"``).
        why: why it is missing and what would build it.
    """

    def __init__(self, what: str, why: str) -> None:
        self.what = what
        self.why = why
        super().__init__(f"{what} is not built: {why}")
