"""Tests of the fused MoE layer (``fused_moe``): the composition is the pinned stages in order
(bitwise), the weights are applied exactly once in every (on_input, renormalize) combination,
the generator's tokens route identically on fast and reference logits, and a token's bits do
not depend on its experts' M.  The registry-driven checks (agreement, co_batch, slot,
placement, repeat, the negative control, error cases) live in ``tests/test_components.py``.
"""

from __future__ import annotations

import pytest
import torch

from batchinv.fast.fused_moe import fused_moe
from batchinv.fast.grouped_gemm import block_m, grouped_gemm
from batchinv.fast.matmul import matmul
from batchinv.fast.moe_align import moe_align
from batchinv.fast.moe_combine import moe_combine
from batchinv.fast.moe_router import moe_router
from batchinv.fast.swiglu import swiglu
from batchinv.harness.components import fused_moe as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.reference import fused_moe as ref_moe

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")


def small(on_input: bool, renormalize: bool, scoring: str = "softmax", t: int = 3):
    groups = {"n_group": 4, "topk_group": 2} if scoring == "sigmoid" else {}
    case = component._case(8, 2, 32, 32, t, scoring, renormalize, on_input, **groups, seed=11)
    return component.build(case, DEVICE)


@pytest.mark.cpu
@pytest.mark.parametrize("on_input", [False, True])
@pytest.mark.parametrize("renormalize", [False, True])
def test_layer_is_the_stages_with_weights_once(on_input, renormalize):
    kw = small(on_input, renormalize).kwargs()
    x, e, k = kw["hidden"], kw["w13"].shape[0], kw["top_k"]
    logits = matmul(x, kw["router_weight"], out_dtype=torch.float32)
    weights, ids = moe_router(logits, k, "softmax", renormalize)
    align = moe_align(ids, e, block_m(DEVICE))
    gate_up = grouped_gemm(x, kw["w13"], *align, k)
    act = swiglu(gate_up.view(-1, gate_up.shape[-1]), weights.reshape(-1) if on_input else None)
    down = grouped_gemm(act, kw["w2"], *align, k, a_per_slot=True)
    want = moe_combine(down, None if on_input else weights)
    assert torch.equal(fused_moe(**kw), want)
    # exactly once: the fast layer is within the bound of the reference; the weights applied
    # at both places (the seed's bug) is not
    batch = small(on_input, renormalize)
    ref = ref_moe.fused_moe(**kw)
    limit = component.bound(batch, (ref,))[0]
    assert bool(((want.double() - ref).abs() <= limit).all())
    twice = (
        moe_combine(down, weights)
        if on_input
        else moe_combine(
            grouped_gemm(
                swiglu(gate_up.view(-1, gate_up.shape[-1]), weights.reshape(-1)),
                kw["w2"],
                *align,
                k,
                a_per_slot=True,
            ),
            weights,
        )
    )
    assert bool(((twice.double() - ref).abs() > limit).any())


@pytest.mark.cpu
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_generated_tokens_route_alike_on_fast_and_reference_logits(scoring):
    kw = small(False, True, scoring, t=6).kwargs()
    route = {
        n: kw[n] for n in ("top_k", "scoring", "renormalize", "correction_bias", "n_group", "topk_group")
    }
    fast_logits = matmul(kw["hidden"], kw["router_weight"], out_dtype=torch.float32)
    _, fast_ids = moe_router(fast_logits, **route)
    terms = ref_moe.expert_terms(**kw)
    assert torch.equal(fast_ids.cpu(), terms.ids.cpu())
    assert bool(component.stable_routing(kw["hidden"], kw).all())


@pytest.mark.cpu
def test_token_bits_do_not_depend_on_its_experts_m():
    case = component._case(4, 2, 64, 32, 2, "softmax", False, False, values="cancel", seed=4)
    batch = component.build(case, DEVICE)
    flood = component.build(component.neighbours(case, LANE)["flood"], DEVICE)
    model = component.COMPONENT.requests
    alone = fused_moe(**model.take(batch, [0]).kwargs())
    for count in (1, 3):
        mixed = model.concat([model.take(flood, list(range(count))), model.take(batch, [0])])
        assert torch.equal(fused_moe(**mixed.kwargs())[count], alone[0]), count
