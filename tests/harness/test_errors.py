"""Typed errors shared by every component: sparse and nested tensors are refused by name."""

from __future__ import annotations

import pytest
import torch

from batchinv.reference.errors import ArgumentError, check_tensor


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
def test_sparse_and_nested_tensors_are_refused_naming_the_argument():
    dense = torch.randn(4, 50)
    for bad, given in ((dense.to_sparse(), "sparse_coo"), (dense.to_sparse_csr(), "sparse_csr")):
        with pytest.raises(
            ArgumentError, match=rf"argument 'x': expected a strided \(dense\) tensor, got .*{given}"
        ):
            check_tensor("x", bad)
    nested = torch.nested.nested_tensor([torch.randn(3, 5), torch.randn(2, 5)])
    with pytest.raises(ArgumentError, match="nested"):
        check_tensor("x", nested)


@pytest.mark.parametrize("component", ["softmax", "log_softmax", "mean", "rms_norm", "matmul", "topk"])
def test_every_component_refuses_a_sparse_input_before_any_kernel(component):
    """The first operand of every registered component, made sparse, raises a typed error from the
    fast path and the reference alike (never a raw torch error from inside a launch)."""
    from batchinv.harness.lanes import Lane
    from batchinv.harness.registry import get

    comp = get(component)
    batch = comp.build(comp.cases(Lane.CPU)[0], torch.device("cpu"))
    name, first = next(iter(batch.rows.items()))
    kwargs = {**batch.kwargs(), name: first.contiguous().to_sparse()}
    for fn in (comp.fast, comp.reference):
        with pytest.raises(ArgumentError, match=f"argument '{name}'"):
            fn(**kwargs)


@pytest.mark.parametrize("component", ["topk", "matmul", "rms_norm", "fused_add_rms_norm", "softmax", "mean"])
def test_every_implementation_refuses_meta_operands_naming_the_argument(component):
    """Every operand of a case on the meta device (shapes, no data): the fast path, the reference
    and every baseline raise DeviceError naming the first operand (never a raw torch error, and
    never a data-less result)."""
    from batchinv.harness.lanes import Lane
    from batchinv.harness.registry import get
    from batchinv.reference.errors import DeviceError

    comp = get(component)
    batch = comp.build(comp.cases(Lane.CPU)[0], torch.device("cpu"))
    name = next(iter(batch.rows))
    kwargs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.kwargs().items()}
    for fn in (comp.fast, comp.reference, *(b.fn for b in comp.baselines)):
        with pytest.raises(DeviceError, match=f"argument '{name}'.*meta"):
            fn(**kwargs)


@pytest.mark.cpu
@pytest.mark.gpu
def test_the_only_public_out_parameter_refuses_a_tensor_requiring_grad(device):
    """Every public function of fast/ and reference/ with an ``out`` parameter (today
    fast.matmul.matmul and fast.fp8_gemm.fp8_gemm; a new one must join this test) refuses an ``out`` that requires
    grad with ArgumentError naming 'out', as ``torch.mm(out=)`` does."""
    import importlib
    import inspect
    import pkgutil

    import batchinv.fast
    import batchinv.reference
    from batchinv.fast.matmul import matmul

    with_out = []
    for package in (batchinv.fast, batchinv.reference):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for fname, fn in inspect.getmembers(module, inspect.isfunction):
                public = not fname.startswith("_") and not fname.startswith("check_")
                if public and fn.__module__ == module.__name__ and "out" in inspect.signature(fn).parameters:
                    with_out.append(f"{module.__name__}.{fname}")
    assert with_out == ["batchinv.fast.fp8_gemm.fp8_gemm", "batchinv.fast.matmul.matmul"], with_out
    from batchinv.fast.fp8_gemm import fp8_gemm

    x, w = torch.randn(4, 8, device=device), torch.randn(16, 8, device=device)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones(1, device=device)
    calls = (lambda out: matmul(x, w, out=out), lambda out: fp8_gemm(x8, w8, one, one, out=out))
    for call in calls:
        leaf = torch.empty(4, 16, device=device, requires_grad=True)
        for out in (leaf, torch.empty(2, 4, 16, device=device, requires_grad=True)[0]):
            with pytest.raises(ArgumentError, match=r"argument 'out'.*requires_grad"):
                call(out)
