"""Which NVFP4 linear kernel a layer gets, under batch-invariant mode or not (vLLM PR #62192).

The seed (vLLM PR #62192, ``vllm/model_executor/kernels/linear/__init__.py``): under
``VLLM_BATCH_INVARIANT=1`` the NVFP4 kernel choice *forced* ``CutlassNvFp4LinearKernel``, a
W4A4-only kernel; a W4A16 layer (16-bit activations, NVFP4 weights) then failed at kernel init
with ``ValueError: CutlassNvFp4LinearKernel does not support W4A16``.  The fix: under batch
invariance a W4A16 layer selects ``HummingNvFp4LinearKernel`` (batch-invariant, 16-bit
activations); a ``--linear-backend`` other than Humming is overridden with a warning.

The rule here, in one place: a kernel fits when it supports the activation width and the arch,
and, under batch invariance, is batch-invariant; the first fitting kernel of :data:`KERNELS`
(the preference order) is selected.  An override names a kernel: taken when it fits; under
batch invariance a non-batch-invariant override is replaced by the batch-invariant choice with a
:class:`BatchInvariantOverrideWarning`; without batch invariance an override that cannot run
the layer is an error.  :meth:`KernelSpec.init` repeats the activation and arch checks, as a
vLLM kernel's init does, so a wrong selection fails loudly at init, never at the first GEMM.

The descriptors model the kernels of the seed on this project's NVFP4 lane (sm100); vLLM's own
support checks (``is_supported``, compute capability ranges) are wider and not reproduced.
Pure Python: importing it loads neither torch nor vLLM.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from batchinv.reference.errors import ArgumentError

#: Activation widths of NVFP4 linears: W4A4 (activations quantized to NVFP4) and W4A16.
ACTIVATION_BITS: tuple[int, ...] = (4, 16)


class BatchInvariantOverrideWarning(UserWarning):
    """Batch-invariant mode replaced a requested kernel that is not batch-invariant."""


class KernelInitError(ArgumentError):
    """A kernel was initialized for a layer it cannot run (a ``ValueError``, as vLLM's init).

    Attributes (besides :class:`ArgumentError`'s): ``kernel``, the kernel's name.
    """

    def __init__(self, kernel: str, argument: str, expected: str, given: object, summary: str) -> None:
        super().__init__(argument, expected, given)
        self.kernel = kernel
        self.args = (
            f"{kernel} does not support {summary} (argument '{argument}': expected {expected}, got {given!r})",
        )


@dataclass(frozen=True)
class KernelSpec:
    """An NVFP4 linear kernel's descriptor.

    Attributes:
        name: vLLM's class name.
        activation_bits: activation widths it runs (4: W4A4, 16: W4A16).
        batch_invariant: a row's output bits do not depend on the batch (no per-M tactic,
            split or autotuned backend).
        archs: lanes it runs on.
        note: where the descriptor comes from.
    """

    name: str
    activation_bits: frozenset[int]
    batch_invariant: bool
    archs: frozenset[str]
    note: str = ""

    def supports(self, activation_bits: int, arch: str) -> bool:
        return activation_bits in self.activation_bits and arch in self.archs

    def init(self, *, activation_bits: int, arch: str) -> InitializedKernel:
        """The kernel set up for a layer; raises like vLLM's kernel init when it cannot run it.

        Raises
        ------
        KernelInitError
            ``activation_bits`` outside :attr:`activation_bits` (``"<name> does not support
            W4A16"``) or ``arch`` outside :attr:`archs`.
        """
        _check_activation_bits(activation_bits)
        if activation_bits not in self.activation_bits:
            widths = " or ".join(f"W4A{b}" for b in sorted(self.activation_bits))
            raise KernelInitError(
                self.name, "activation_bits", widths, activation_bits, f"W4A{activation_bits}"
            )
        if arch not in self.archs:
            raise KernelInitError(self.name, "arch", " or ".join(sorted(self.archs)), arch, f"arch {arch}")
        return InitializedKernel(self, activation_bits, arch)


@dataclass(frozen=True)
class InitializedKernel:
    """A kernel initialized for a layer's activation width on an arch."""

    spec: KernelSpec
    activation_bits: int
    arch: str


CUTLASS_W4A4 = KernelSpec(
    "CutlassNvFp4LinearKernel",
    frozenset({4}),
    batch_invariant=True,
    archs=frozenset({"sm100"}),
    note="W4A4 only; the kernel the seed's batch-invariant branch forced",
)
FLASHINFER_CUTE_DSL_W4A16 = KernelSpec(
    "FlashInferCuteDslNvFp4W4A16LinearKernel",
    frozenset({16}),
    batch_invariant=False,
    archs=frozenset({"sm100"}),
    note="W4A16; FlashInfer autotune picks tactics per M bucket; the default W4A16 choice (the seed)",
)
HUMMING_W4A16 = KernelSpec(
    "HummingNvFp4LinearKernel",
    frozenset({16}),
    batch_invariant=True,
    archs=frozenset({"sm100"}),
    note="W4A16; reads use_batch_invariant; the seed's batch-invariant W4A16 choice",
)

#: The kernels in preference order (the first that fits is selected).
KERNELS: tuple[KernelSpec, ...] = (FLASHINFER_CUTE_DSL_W4A16, CUTLASS_W4A4, HUMMING_W4A16)


def _check_activation_bits(activation_bits: object) -> int:
    if isinstance(activation_bits, bool) or activation_bits not in ACTIVATION_BITS:
        raise ArgumentError("activation_bits", "4 (W4A4) or 16 (W4A16)", activation_bits)
    assert isinstance(activation_bits, int)
    return activation_bits


def kernel(name: str, kernels: Sequence[KernelSpec] = KERNELS) -> KernelSpec:
    """The descriptor called ``name``; ``ArgumentError`` (``override``) listing the names otherwise."""
    for spec in kernels:
        if spec.name == name:
            return spec
    raise ArgumentError("override", "one of " + ", ".join(s.name for s in kernels), name)


def select_nvfp4_kernel(
    *,
    activation_bits: int,
    batch_invariant: bool,
    arch: str,
    override: str | None = None,
    kernels: Sequence[KernelSpec] = KERNELS,
) -> KernelSpec:
    """The NVFP4 linear kernel for a layer.

    Parameters
    ----------
    activation_bits : {4, 16}
        W4A4 or W4A16.
    batch_invariant : bool
        Batch-invariant mode (``VLLM_BATCH_INVARIANT=1``): only batch-invariant kernels fit.
    arch : str
        The lane (``"sm100"``).
    override : str, optional
        A kernel name (vLLM's ``--linear-backend``).
    kernels : sequence of KernelSpec
        The candidates in preference order (default :data:`KERNELS`).

    Returns
    -------
    KernelSpec
        The override when it fits; else the first fitting kernel.

    Warns
    -----
    BatchInvariantOverrideWarning
        Under batch invariance, an override that is not batch-invariant (or cannot run the
        layer) is replaced by the batch-invariant choice.

    Raises
    ------
    ArgumentError
        ``activation_bits`` not 4 or 16; ``batch_invariant`` not a bool; ``override`` unknown,
        or (without batch invariance) unable to run the layer; nothing fits: the argument that
        removed the last candidates (``activation_bits``, ``arch`` or ``batch_invariant``).
    """
    bits = _check_activation_bits(activation_bits)
    if not isinstance(batch_invariant, bool):
        raise ArgumentError("batch_invariant", "a bool", batch_invariant)
    requested = kernel(override, kernels) if override is not None else None
    fits = [k for k in kernels if bits in k.activation_bits]
    if not fits:
        raise ArgumentError("activation_bits", "a width some kernel supports", bits)
    fits = [k for k in fits if arch in k.archs]
    if not fits:
        raise ArgumentError("arch", f"an arch with a W4A{bits} NVFP4 kernel", arch)
    if batch_invariant:
        fits = [k for k in fits if k.batch_invariant]
        if not fits:
            raise ArgumentError(
                "batch_invariant", f"False (no batch-invariant W4A{bits} kernel on {arch})", True
            )
    if requested is not None:
        if requested in fits:
            return requested
        if not batch_invariant:
            raise ArgumentError("override", f"a kernel that runs W4A{bits} on {arch}", requested.name)
        warnings.warn(
            f"batch-invariant mode overrides the requested NVFP4 kernel {requested.name} "
            f"(not batch-invariant for W4A{bits} on {arch}); using {fits[0].name}",
            BatchInvariantOverrideWarning,
            stacklevel=2,
        )
    return fits[0]


def init_nvfp4_linear_kernel(
    *, activation_bits: int, batch_invariant: bool, arch: str, override: str | None = None
) -> InitializedKernel:
    """:func:`select_nvfp4_kernel`, then the kernel's :meth:`KernelSpec.init` (vLLM's
    ``init_nvfp4_linear_kernel``).  Raises and warns as those two."""
    spec = select_nvfp4_kernel(
        activation_bits=activation_bits, batch_invariant=batch_invariant, arch=arch, override=override
    )
    return spec.init(activation_bits=activation_bits, arch=arch)
