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
