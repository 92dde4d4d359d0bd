"""FlashInfer's FP8 ``bmm_fp8`` as subjects of ``fp8_gemm``: each backend pinned, and ``auto``.

vLLM's FP8 linear (``flashinfer_scaled_fp8_mm``, vLLM PR #62192) calls FlashInfer's ``bmm_fp8``
with ``backend="cutlass"`` under ``VLLM_BATCH_INVARIANT=1`` and ``backend="auto"`` otherwise.
With FlashInfer's autotuner on (vLLM's default at -O1 and above), ``auto`` tunes over every
backend the GPU has per bucket of M (``flashinfer.gemm.gemm_base.fp8_gemm_sm100``, tuning config
``_FP8_GEMM_SM100_TUNING_CONFIG``: buckets 1, 2, 4, ... 256, then every 256 to 2048), so two
batch sizes can run two backends and a row's bits depend on the batch.  This module declares::

    batchinv sweep fp8_gemm --lane sm90 \\
        --subject cutlass=batchinv.harness.adapters.flashinfer:cutlass \\
        --subject auto_autotuned=batchinv.harness.adapters.flashinfer:auto_autotuned

(``ci/device_flashinfer.sh`` runs it and ``ci/flashinfer_table.py``, the seed's table.)

Subjects (role ``fast`` unless said): ``cutlass``, ``cublas``, ``cudnn``, ``auto`` (the backend
untuned: FlashInfer runs the first candidate with its default tactic) and ``<backend>_autotuned``
(tuned first, as vLLM's warm-up does: once per process and weight shape, one call of
:data:`TUNE_M` rows inside ``flashinfer.autotuner.autotune()``, which profiles every bucket up to
it; the call itself then runs untuned, reading the tuned choice for its bucket).
``auto_autotuned`` is a ``baseline``: vLLM's path without batch invariance, a negative control.

FlashInfer's tuner is one process-wide cache that every later ``bmm_fp8`` call reads, tuned or
not, and whose entries one backend's runner list shares with another's (a ``cublas`` entry is
a hit for ``auto``).  So each subject claims the tuner before it runs (:func:`_claim`): a
subject other than the last one to run clears the cache, and an untuned subject always runs on
an empty one.  A subject here therefore behaves as if it were alone in its process.

Arguments (``batchinv.reference.fp8_gemm``'s signature): ``x [M, K]`` becomes ``A [1, M, K]``
(row-major, contiguous: FlashInfer's cuBLAS path reads the raw pointer), ``weight [N, K]``
becomes ``B [1, K, N]`` column-major (the transposed view of the contiguous weight, the layout
``bmm_fp8`` documents), the per-tensor scales one-element fp32 tensors (dequantization scales,
as FlashInfer's), the output ``[1, M, N]`` is returned as ``[M, N]``.  Cases ``bmm_fp8`` cannot
express raise :class:`~batchinv.reference.errors.Unsupported` (a ``skip``): ``scale_layout``
``"token"``/``"block"``, a bias, an fp32 output (``bmm_fp8`` writes bf16 or fp16), a tensor not
on a CUDA device (the cpu lane), and a backend FlashInfer refuses on this GPU (its own error
text: ``cutlass`` FP8 bmm needs SM100 or SM12x, ``_cutlass_bmm_fp8_requirement``).

Importing this module needs FlashInfer installed (else :class:`FlashInferUnavailable`) but does
not import it; :func:`load` does on first use.  Checked against ``flashinfer-python`` 0.7.2.post1.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from batchinv.harness import provenance
from batchinv.harness.subjects import Adapter, Declared, Unsupported, declare
from batchinv.reference.errors import BatchinvError

#: The rows of the one tuning call per weight shape (vLLM tunes at its max batched tokens; 2048
#: is the seed's largest M and the top of FlashInfer's step-256 buckets).  A call with more rows
#: than were tuned falls back to FlashInfer's default (it logs "outside the tuning bucket range").
TUNE_M = 2048
#: The backends of ``bmm_fp8`` declared here (FlashInfer 0.7.2 also has ``cute-dsl``: SM107 only).
BACKENDS: tuple[str, ...] = ("cutlass", "cublas", "cudnn", "auto")
#: The output dtypes ``bmm_fp8`` writes (``gemm_base._validate_fp8_output_dtype``).
OUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


class FlashInferUnavailable(BatchinvError, ImportError):
    """FlashInfer (``flashinfer-python``) is not installed, or does not import."""


if importlib.util.find_spec("flashinfer") is None:
    raise FlashInferUnavailable(
        "batchinv.harness.adapters.flashinfer needs FlashInfer: pip install flashinfer-python (or "
        "batchinv[flashinfer]; on the H200 device ci/flashinfer_wheels.py fetches the wheels and "
        "ci/device_flashinfer.sh installs them); flashinfer is not installed in this environment"
    )

_loaded: dict[str, SimpleNamespace] = {}
#: Which subject's tuning the process-wide tuner holds: ``(backend, autotuned)``; None: empty.
_owner: list[tuple[str, bool] | None] = [None]
#: ``(backend, device, A dtype, B dtype, K, N, out dtype)`` tuned since the owner last changed.
_tuned: set[tuple[Any, ...]] = set()


def load() -> SimpleNamespace:
    """FlashInfer's pieces used here (imported once): ``bmm_fp8``, ``autotune``, the tuner
    singleton ``tuner()``, ``BackendSupportedError`` and ``version``.  Raises
    :class:`FlashInferUnavailable` naming the import error."""
    if "fi" in _loaded:
        return _loaded["fi"]
    try:
        fi = importlib.import_module("flashinfer")
        autotuner = importlib.import_module("flashinfer.autotuner")
        utils = importlib.import_module("flashinfer.utils")
    except ImportError as exc:
        raise FlashInferUnavailable(f"flashinfer did not import: {type(exc).__name__}: {exc}") from exc
    _loaded["fi"] = SimpleNamespace(
        bmm_fp8=fi.bmm_fp8,
        autotune=autotuner.autotune,
        tuner=autotuner.AutoTuner.get,
        BackendSupportedError=utils.BackendSupportedError,
        version=getattr(fi, "__version__", "?"),
    )
    return _loaded["fi"]


def _check_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda":
        raise Unsupported(f"FlashInfer's bmm_fp8 runs on CUDA devices; this case is on {t.device.type}")


def _arch(device: torch.device) -> str:
    """``sm90`` for a CUDA device of compute capability 9.0; the device type otherwise."""
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def _bmm_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    x_scale: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_layout: str = "tensor",
    out_dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    """``fp8_gemm``'s arguments as ``bmm_fp8``'s (see the module docstring); raises
    :class:`Unsupported` for a case it cannot express."""
    if scale_layout != "tensor":
        raise Unsupported(
            f"FlashInfer's bmm_fp8 takes per-tensor scales; this case asks scale_layout={scale_layout!r}"
        )
    if bias is not None:
        raise Unsupported("FlashInfer's bmm_fp8 takes no bias")
    if out_dtype not in OUT_DTYPES:
        raise Unsupported(f"FlashInfer's bmm_fp8 writes bf16 or fp16; this case asks {out_dtype}")
    _check_device(x)
    return {
        "A": x.contiguous().unsqueeze(0),
        "B": weight.contiguous().unsqueeze(0).transpose(1, 2),
        "A_scale": x_scale.reshape(1).contiguous(),
        "B_scale": weight_scale.reshape(1).contiguous(),
        "dtype": out_dtype,
    }


def _claim(fi: SimpleNamespace, owner: tuple[str, bool]) -> None:
    """Make the process-wide tuner hold only ``owner``'s tuning: cleared when another subject
    ran last (an untuned subject: cleared unless it ran last, so it runs on an empty cache)."""
    if _owner[0] != owner:
        fi.tuner().clear_cache()
        _tuned.clear()
        _owner[0] = owner


def _tune(fi: SimpleNamespace, backend: str, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor,
          B_scale: torch.Tensor, dtype: torch.dtype) -> None:  # fmt: skip
    """Tune ``backend`` once for this weight: one call of ``max(TUNE_M, M)`` zero rows inside
    ``autotune()`` (FlashInfer profiles every bucket up to it)."""
    key = (backend, A.device, A.dtype, B.dtype, A.shape[2], B.shape[2], dtype)
    if key in _tuned:
        return
    rows = torch.zeros((1, max(TUNE_M, A.shape[1]), A.shape[2]), dtype=torch.bfloat16, device=A.device)
    with fi.autotune(True):
        fi.bmm_fp8(rows.to(A.dtype), B, A_scale, B_scale, dtype, backend=backend)
    _tuned.add(key)


def _backend_note(backend: str, autotuned: bool) -> str:
    """The launch provenance of a call (:func:`provenance.note`): the backend asked for; the
    runner and tactic FlashInfer then picks are not exposed (``auto`` picks the backend too)."""
    tuned = "tuned" if autotuned else "untuned"
    chosen = "FlashInfer's backend choice and tactic" if backend == "auto" else "its tactic"
    return f"flashinfer bmm_fp8 backend={backend} ({tuned}; {chosen} not exposed)"


_BACKEND_NOTES = {(b, t): _backend_note(b, t) for b in BACKENDS for t in (False, True)}


def _subject_fn(backend: str, autotuned: bool) -> Callable[..., torch.Tensor]:
    def run(
        A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        fi = load()
        _claim(fi, (backend, autotuned))
        try:
            if autotuned:
                _tune(fi, backend, A, B, A_scale, B_scale, dtype)
            out = fi.bmm_fp8(A, B, A_scale, B_scale, dtype, backend=backend)
            provenance.note(_BACKEND_NOTES[(backend, autotuned)])
            return out
        except fi.BackendSupportedError as exc:
            raise Unsupported(f"FlashInfer {fi.version} on {_arch(A.device)}: {exc}") from exc

    run.__name__ = f"bmm_fp8_{backend}" + ("_autotuned" if autotuned else "")
    run.__doc__ = (
        f"``flashinfer.bmm_fp8(A [1, M, K], B [1, K, N] column-major, A_scale, B_scale, dtype, "
        f"backend={backend!r})``" + (", tuned first (see :func:`_tune`)" if autotuned else ", untuned")
        + "; returns [1, M, N].  Raises Unsupported where FlashInfer refuses the backend on this GPU."
    )  # fmt: skip
    return run


def _subject(backend: str, autotuned: bool, role: str = "fast") -> Declared:
    adapter = Adapter(inputs=_bmm_inputs, output=lambda y: y[0])
    return declare(_subject_fn(backend, autotuned), adapter=adapter, role=role, component="fp8_gemm")


#: vLLM's batch-invariant pin (PR #62192), and the same after the tuner ran.
cutlass = _subject("cutlass", False)
cutlass_autotuned = _subject("cutlass", True)
#: One backend alone, untuned and tuned (the seed found each invariant after tuning on SM100).
cublas = _subject("cublas", False)
cublas_autotuned = _subject("cublas", True)
cudnn = _subject("cudnn", False)
cudnn_autotuned = _subject("cudnn", True)
#: ``auto`` untuned: FlashInfer's first candidate (cutlass on SM100, cuBLAS on SM90), default tactic.
auto = _subject("auto", False)
#: ``auto`` after tuning: vLLM's FP8 path without batch invariance (a negative control).
auto_autotuned = _subject("auto", True, role="baseline")

#: ``(component, name, attribute)`` of every subject here.
SUBJECTS: tuple[tuple[str, str, str], ...] = tuple(
    (d.component or "", name, name)
    for name, d in list(globals().items())
    if isinstance(d, Declared) and not name.startswith("_")
)
