"""Where a Triton kernel can run: a CUDA device, or the CPU under the Triton interpreter.

The cpu lane runs every kernel through Triton's interpreter (``TRITON_INTERPRET=1``, set before
triton is imported); there CPU tensors are valid kernel operands.  Everywhere else a launcher
must be handed CUDA tensors.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import torch

from batchinv.reference.errors import ArgumentError, DeviceError


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: Whether the interpreter was on when this module (and with it triton) was first imported:
#: Triton reads ``TRITON_INTERPRET`` when its kernels are decorated, so setting it later has no
#: effect on them.
INTERPRETING_AT_IMPORT = interpreting()


def _autograd_handled_outside() -> bool:
    """True inside an aten kernel called by autograd (below the autograd dispatch keys: the
    ``aten`` overrides of ``enable()``), where autograd records the call around the kernel."""
    return torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.ADInplaceOrView)


def check_no_grad(argument: str, tensor: torch.Tensor) -> None:
    """Raise :class:`ArgumentError` if ``tensor`` requires grad while grad mode is on.

    The one rule of every public fast function: the Triton kernels carry no autograd formula,
    so an output computed from such an operand would come back with ``requires_grad=False`` and
    a gradient through it would silently be zero -- refused instead.  Call under
    ``torch.no_grad()`` or ``torch.inference_mode()``, or detach the operand.  Not refused inside
    an aten kernel that autograd calls (the ``aten::mm`` overrides of ``batchinv.enable()``):
    there autograd records the op itself and its backward runs the op's own formula.
    """
    if tensor.requires_grad and torch.is_grad_enabled() and not _autograd_handled_outside():
        raise ArgumentError(
            argument,
            "a tensor that does not require grad, or grad mode off (the kernels carry no autograd "
            "formula: the output would silently have no gradient; use torch.no_grad() or "
            "torch.inference_mode(), or .detach())",
            "a tensor with requires_grad=True under grad mode",
        )


def check_launch_device(argument: str, tensor: torch.Tensor) -> None:
    """Raise :class:`DeviceError` unless ``tensor`` can be a kernel operand here, and
    :class:`ArgumentError` if it requires grad under grad mode (:func:`check_no_grad`).

    CUDA tensors always can; CPU tensors only under the interpreter.  Every launcher passes
    each of its tensor operands through this check, so both rules hold for every public fast
    function.
    """
    check_no_grad(argument, tensor)
    if tensor.device.type == "cuda":
        return
    if tensor.device.type == "cpu" and interpreting():
        if not INTERPRETING_AT_IMPORT:
            raise DeviceError(
                argument,
                "a CUDA tensor; a CPU tensor needs TRITON_INTERPRET=1 set BEFORE batchinv.fast "
                "(and triton) is first imported -- it was set afterwards",
                f"a tensor on {tensor.device}",
            )
        return
    raise DeviceError(
        argument,
        "a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1 set before importing batchinv.fast)",
        f"a tensor on {tensor.device}",
    )


def kernel_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its conjugate and negative bits resolved: what a kernel may read as raw memory.

    A view such as ``z.conj().imag`` stores its values negated and keeps the negation as a flag
    (``t.is_neg()``); a Triton kernel reads the memory and would see ``-t``.  Resolving
    materializes the values into a fresh tensor; it is a no-op returning ``t`` itself when
    neither flag is set.  Every launcher passes each tensor operand through it.
    """
    return t.resolve_conj().resolve_neg()


def sm_count(device: torch.device | None = None) -> int:
    """The number of streaming multiprocessors of ``device`` (a nominal 4 under the interpreter)."""
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device is None and torch.cuda.is_available() and not interpreting():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 4


def arch(device: torch.device | None = None) -> str:
    """The architecture key used by config tables: ``"sm90"``, ``"sm100"``, ... or ``"interp"``."""
    if device is not None and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"
    return "interp"


@contextlib.contextmanager
def interpreter_quiet() -> Iterator[None]:
    """Silence the Triton interpreter's NumPy warnings around a launch (a no-op on a GPU).

    The kernels rely on IEEE semantics (``-inf - -inf`` is NaN, overflow gives inf, the max of
    all-NaN values is NaN), which a GPU applies silently and NumPy warns about; and Triton 3.6's interpreter turns a runtime loop
    bound into a Python int through a deprecated NumPy conversion.  Under pytest's
    ``filterwarnings = error`` either would turn a correct launch into an exception.
    """
    if not interpreting():
        yield
        return
    import numpy as np

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Conversion of an array with ndim > 0 to a scalar", category=DeprecationWarning
        )
        # a max over an all-NaN row (NaN inputs): IEEE gives NaN, as a GPU does, silently
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        yield
