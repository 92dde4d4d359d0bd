"""NVFP4 kernel selection under batch invariance (``fast/nvfp4_select.py``): vLLM PR #62192.

The seed's bug: under batch invariance the selection forced the W4A4-only CUTLASS kernel, and a
W4A16 layer failed at init with ``ValueError: CutlassNvFp4LinearKernel does not support W4A16``.
:func:`_select_before_pr62192` reproduces that rule; its test is the negative control (it must
fail at init), so the W4A16 test below is shown to be one that a wrong rule fails.
"""

from __future__ import annotations

import warnings

import pytest

from batchinv.fast import nvfp4_select as sel
from batchinv.reference.errors import ArgumentError

pytestmark = pytest.mark.cpu


def _select_before_pr62192(*, activation_bits: int, batch_invariant: bool, arch: str) -> sel.KernelSpec:
    """The seed's rule at its base: under batch invariance, always the W4A4 CUTLASS kernel."""
    if batch_invariant:
        return sel.CUTLASS_W4A4
    return sel.select_nvfp4_kernel(activation_bits=activation_bits, batch_invariant=False, arch=arch)


def test_w4a16_under_batch_invariance_selects_a_batch_invariant_16_bit_kernel():
    spec = sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=True, arch="sm100")
    assert 16 in spec.activation_bits and spec.batch_invariant
    assert spec is sel.HUMMING_W4A16
    kernel = sel.init_nvfp4_linear_kernel(activation_bits=16, batch_invariant=True, arch="sm100")
    assert kernel.spec is sel.HUMMING_W4A16 and kernel.activation_bits == 16


def test_w4a4_under_batch_invariance_selects_the_batch_invariant_w4a4_kernel():
    kernel = sel.init_nvfp4_linear_kernel(activation_bits=4, batch_invariant=True, arch="sm100")
    assert kernel.spec is sel.CUTLASS_W4A4 and kernel.spec.batch_invariant


def test_without_batch_invariance_the_defaults_are_unchanged():
    w4a16 = sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=False, arch="sm100")
    assert w4a16 is sel.FLASHINFER_CUTE_DSL_W4A16 and not w4a16.batch_invariant
    assert sel.select_nvfp4_kernel(activation_bits=4, batch_invariant=False, arch="sm100") is sel.CUTLASS_W4A4


def test_negative_control_the_seed_rule_fails_at_init_for_w4a16():
    spec = _select_before_pr62192(activation_bits=16, batch_invariant=True, arch="sm100")
    with pytest.raises(ValueError, match=r"^CutlassNvFp4LinearKernel does not support W4A16") as info:
        spec.init(activation_bits=16, arch="sm100")
    assert isinstance(info.value, sel.KernelInitError) and info.value.argument == "activation_bits"
    # the same rule is right for W4A4: the bug is the W4A16 case alone
    assert _select_before_pr62192(activation_bits=4, batch_invariant=True, arch="sm100").init(
        activation_bits=4, arch="sm100"
    )


def test_a_non_batch_invariant_override_is_overridden_with_a_warning():
    with pytest.warns(sel.BatchInvariantOverrideWarning, match="FlashInferCuteDslNvFp4W4A16LinearKernel"):
        kernel = sel.init_nvfp4_linear_kernel(
            activation_bits=16,
            batch_invariant=True,
            arch="sm100",
            override="FlashInferCuteDslNvFp4W4A16LinearKernel",
        )
    assert kernel.spec is sel.HUMMING_W4A16


def test_a_fitting_override_is_taken_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bi = sel.select_nvfp4_kernel(
            activation_bits=16, batch_invariant=True, arch="sm100", override="HummingNvFp4LinearKernel"
        )
        plain = sel.select_nvfp4_kernel(
            activation_bits=16, batch_invariant=False, arch="sm100", override="HummingNvFp4LinearKernel"
        )
    assert bi is plain is sel.HUMMING_W4A16


def test_nothing_fits_raises_a_typed_error_naming_the_argument():
    with pytest.raises(ArgumentError, match=r"'arch'.*sm90"):
        sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=False, arch="sm90")
    with pytest.raises(ArgumentError, match=r"'activation_bits'.*8"):
        sel.select_nvfp4_kernel(activation_bits=8, batch_invariant=False, arch="sm100")
    with pytest.raises(ArgumentError, match="'activation_bits'"):
        sel.select_nvfp4_kernel(activation_bits=True, batch_invariant=False, arch="sm100")
    with pytest.raises(ArgumentError, match="'batch_invariant'"):
        sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=1, arch="sm100")
    with pytest.raises(ArgumentError, match=r"'override'.*Marlin"):
        sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=True, arch="sm100", override="Marlin")
    with pytest.raises(ArgumentError, match=r"'override'.*CutlassNvFp4LinearKernel"):
        sel.select_nvfp4_kernel(
            activation_bits=16, batch_invariant=False, arch="sm100", override="CutlassNvFp4LinearKernel"
        )
    only_default = (sel.FLASHINFER_CUTE_DSL_W4A16,)
    with pytest.raises(ArgumentError, match="'batch_invariant'"):
        sel.select_nvfp4_kernel(activation_bits=16, batch_invariant=True, arch="sm100", kernels=only_default)


def test_init_refuses_an_arch_the_kernel_does_not_run_on():
    with pytest.raises(sel.KernelInitError, match="HummingNvFp4LinearKernel does not support arch sm90"):
        sel.HUMMING_W4A16.init(activation_bits=16, arch="sm90")


def test_every_kernel_inits_for_what_it_declares_and_refuses_the_rest():
    for spec in sel.KERNELS:
        for bits in sel.ACTIVATION_BITS:
            if bits in spec.activation_bits:
                assert spec.init(activation_bits=bits, arch="sm100").spec is spec
            else:
                with pytest.raises(sel.KernelInitError, match=f"{spec.name} does not support W4A{bits}"):
                    spec.init(activation_bits=bits, arch="sm100")
