"""vLLM's batch-invariant kernels as subjects, its default (non-invariant) paths as baselines.

vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) routes ``mm``, ``addmm``, ``matmul``,
``linear``, ``log_softmax``, ``softmax``, ``mean`` and RMSNorm through its own Triton kernels
(``vllm.model_executor.determinism.batch_invariant`` from vLLM 0.29, ``...layers.batch_invariant``
up to 0.28).  This module declares them as subjects of the matching components, so the harness
checks them like its own kernels::

    batchinv sweep matmul log_softmax softmax mean rms_norm --lane cpu \\
        --subject vllm=batchinv.harness.adapters.vllm:matmul \\
        --subject vllm_default=batchinv.harness.adapters.vllm:matmul_default ...

(``ci/vllm.sh`` runs all of them.)  Each ``<component>`` name here is vLLM's invariant kernel
(role ``fast``); each ``<component>_default`` is what vLLM runs without the mode (role
``baseline``: a negative control that must vary where the platform's library does).

Importing this module needs vLLM installed (else :class:`VllmUnavailable`) but does not import
it; the kernels are imported on first use by :func:`load`, which on a machine without CUDA
pins ``CUDA_VISIBLE_DEVICES=""`` (else vLLM swaps Triton for a placeholder) and
``VLLM_TARGET_DEVICE=cpu`` (its SM count) for the import only, and restores the environment
after (also the variables vLLM sets while it is imported).  This module never calls
``enable_batch_invariant_mode()``, which reroutes aten operators process-wide; it calls the
kernels directly.

Cases outside vLLM's kernels raise :class:`~batchinv.reference.errors.Unsupported` (a ``skip``):
fp32 logits from bf16 in matmul, TF32 precision, a mean to an output dtype other than fp32 or
the input's, RMSNorm along a dim other than the last.  On the cpu lane (the Triton 3.6
interpreter, which does bf16 arithmetic on the raw bits, a known upstream limitation) vLLM's
bf16 matmul gives garbage, so those cases are skipped there instead of reported as vLLM bugs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from batchinv.harness.adapters.env import pinned_environ
from batchinv.harness.subjects import Adapter, Declared, Unsupported, declare
from batchinv.reference.errors import BatchinvError

#: Where vLLM keeps its batch-invariant kernels, newest first.
MODULES: tuple[str, ...] = (
    "vllm.model_executor.determinism.batch_invariant",  # vLLM >= 0.29
    "vllm.model_executor.layers.batch_invariant",  # vLLM <= 0.28
)
#: The environment vLLM needs to import and run its Triton kernels on a machine without CUDA.
CPU_PINS: Mapping[str, str] = {"CUDA_VISIBLE_DEVICES": "", "VLLM_TARGET_DEVICE": "cpu"}


class VllmUnavailable(BatchinvError, ImportError):
    """vLLM is not installed, or none of :data:`MODULES` imports (names what was tried)."""


if importlib.util.find_spec("vllm") is None:
    raise VllmUnavailable(
        "batchinv.harness.adapters.vllm needs vLLM: pip install vllm (ci/vllm.sh installs vllm==0.32.0 "
        "--no-deps with torch 2.13.0); vllm is not installed in this environment"
    )

_loaded: dict[str, ModuleType] = {}


def load() -> ModuleType:
    """vLLM's batch-invariant kernel module (imported once; the first of :data:`MODULES` that
    imports).  Without CUDA the import runs under :data:`CPU_PINS`; ``os.environ`` is restored
    after it either way.  Raises :class:`VllmUnavailable` naming each module tried and why."""
    if "bi" in _loaded:
        return _loaded["bi"]
    pins = {} if torch.cuda.is_available() else dict(CPU_PINS)
    errors = []
    with pinned_environ(pins):
        for name in MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            _loaded["bi"] = module
            return module
    raise VllmUnavailable("vLLM's batch-invariant kernels did not import: " + "; ".join(errors))


def _interpreted(x: torch.Tensor) -> bool:
    """Whether ``x``'s kernels run in the Triton interpreter (the cpu lane)."""
    return x.device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"


def _no_interpreted_bf16(x: torch.Tensor, what: str) -> None:
    if x.dtype == torch.bfloat16 and _interpreted(x):
        raise Unsupported(
            f"vLLM's {what} in bf16 is not runnable on the cpu lane: the Triton 3.6 interpreter does "
            "bf16 arithmetic on the raw bits (an upstream limitation, not a vLLM bug)"
        )


# --- matmul ---------------------------------------------------------------------------------------


def _matmul_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    config: Any = None,
) -> dict[str, Any]:
    if out_dtype not in (None, x.dtype):
        raise Unsupported(f"vLLM's matmul writes the input dtype; this case asks {out_dtype} from {x.dtype}")
    if precision != "ieee":
        raise Unsupported(f"vLLM's matmul has no precision={precision!r}")
    if out is not None or config is not None:
        raise Unsupported("vLLM's matmul takes no out= or config=")
    _no_interpreted_bf16(x, "matmul")
    return {"x": x, "weight": weight, "bias": bias, "layout": layout}


def _vllm_matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str
) -> torch.Tensor:
    """What ``aten::linear`` (layout ``linear``, weight [N, K]) or ``aten::addmm``/``aten::mm``
    (layout ``mm``, weight [K, N]) run in vLLM's batch-invariant mode."""
    bi = load()
    if layout == "linear":
        return bi.linear_batch_invariant(x, weight, bias)
    if bias is None:
        return bi.mm_batch_invariant(x, weight)
    return bi.addmm_batch_invariant(bias, x, weight)


def _default_matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str
) -> torch.Tensor:
    """vLLM's default path: ``torch.nn.functional.linear`` (its unquantized linear method) or
    ``torch.mm``/``torch.addmm``, i.e. the platform's BLAS."""
    if layout == "linear":
        return torch.nn.functional.linear(x, weight, bias)
    return torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)


# --- softmax, log_softmax ---------------------------------------------------------------------------


def _vllm_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """What ``aten::_softmax`` runs in vLLM's batch-invariant mode."""
    return load().softmax_batch_invariant(x, dim, half_to_float)


def _vllm_log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """What ``aten::_log_softmax`` runs in vLLM's batch-invariant mode."""
    return load()._log_softmax_batch_invariant(x, dim, half_to_float)


def _default_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.softmax``: vLLM's path without the mode (``half_to_float`` as ``dtype=float32``)."""
    return torch.softmax(x, dim, dtype=torch.float32 if half_to_float else None)


def _default_log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """``torch.log_softmax``: vLLM's path without the mode (``half_to_float`` as ``dtype=float32``)."""
    return torch.log_softmax(x, dim, dtype=torch.float32 if half_to_float else None)


# --- mean -------------------------------------------------------------------------------------------


def _mean_inputs(
    x: torch.Tensor, dim: int = -1, keepdim: bool = False, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    if dtype not in (None, torch.float32):
        raise Unsupported(f"vLLM's mean writes the input dtype or fp32; this case asks {dtype}")
    return {"x": x, "dim": dim, "keepdim": keepdim, "dtype": dtype}


def _vllm_mean(x: torch.Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    """What ``aten::mean.dim`` runs in vLLM's batch-invariant mode (the input in fp32, then
    ``mean_dim``: so bf16 inputs never reach the interpreter's bf16 arithmetic)."""
    return load().mean_batch_invariant(x, [dim], keepdim, dtype)


def _default_mean(x: torch.Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    """``torch.mean``: vLLM's path without the mode."""
    return torch.mean(x, dim, keepdim, dtype=dtype)


# --- rms_norm ---------------------------------------------------------------------------------------


def _rms_norm_inputs(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, dim: int = -1
) -> dict[str, Any]:
    if dim not in (-1, x.dim() - 1):
        raise Unsupported(f"vLLM's RMSNorm normalizes the last dim; this case asks dim={dim}")
    return {"x": x, "weight": weight, "eps": eps}


def _vllm_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm`` in vLLM's batch-invariant mode: ``rms_norm_batch_invariant`` (without
    ``residual=``, which calls vLLM's compiled extension)."""
    return load().rms_norm_batch_invariant(x, weight, eps)


def _default_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm`` without the mode where vLLM's compiled ops are absent: ``vllm.ir.ops.rms_norm``
    (its native torch implementation)."""
    load()
    from vllm import ir

    return ir.ops.rms_norm(x, weight, eps, None)


def _subject(
    fn: Callable[..., Any], inputs: Callable[..., Any] | None, role: str, component: str
) -> Declared:
    return declare(fn, adapter=Adapter(inputs=inputs), role=role, component=component)


#: vLLM's invariant kernels (role ``fast``) and default paths (role ``baseline``), by component.
matmul = _subject(_vllm_matmul, _matmul_inputs, "fast", "matmul")
matmul_default = _subject(_default_matmul, _matmul_inputs, "baseline", "matmul")
softmax = _subject(_vllm_softmax, None, "fast", "softmax")
softmax_default = _subject(_default_softmax, None, "baseline", "softmax")
log_softmax = _subject(_vllm_log_softmax, None, "fast", "log_softmax")
log_softmax_default = _subject(_default_log_softmax, None, "baseline", "log_softmax")
mean = _subject(_vllm_mean, _mean_inputs, "fast", "mean")
mean_default = _subject(_default_mean, _mean_inputs, "baseline", "mean")
rms_norm = _subject(_vllm_rms_norm, _rms_norm_inputs, "fast", "rms_norm")
rms_norm_default = _subject(_default_rms_norm, _rms_norm_inputs, "baseline", "rms_norm")

#: ``(component, name, attribute)`` of every subject here: what ``ci/vllm.sh`` sweeps.
SUBJECTS: tuple[tuple[str, str, str], ...] = tuple(
    (d.component or "", name, name)
    for name, d in list(globals().items())
    if isinstance(d, Declared) and not name.startswith("_")
)
