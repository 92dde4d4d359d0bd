"""Tests of the fused MoE layer (``fused_moe``): the composition is the pinned stages in order
(bitwise), the weights are applied exactly once in every (on_input, renormalize) combination,
the generator's tokens route identically on fast and reference logits, and a token's bits do
not depend on its experts' M.  The registry-driven checks (agreement, co_batch, slot,
placement, repeat, the negative control, error cases) live in ``tests/components/test_components.py``.
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
from batchinv.harness import invariance
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


def _route(kw):
    """The fast layer's own routing: pinned logits [T, E] and the router's ids [T, k]."""
    logits = matmul(kw["hidden"], kw["router_weight"], out_dtype=torch.float32)
    route = {
        n: kw[n] for n in ("top_k", "scoring", "renormalize", "correction_bias", "n_group", "topk_group")
    }
    return logits, moe_router(logits, **route)[1]


TIE_CASES = [c for c in component.cases(LANE) if c.axes["values"] == "ties"]


@pytest.mark.cpu
@pytest.mark.parametrize("case", TIE_CASES, ids=lambda c: c.id)
def test_ties_straddle_the_cutoff_on_the_fast_and_reference_logits(case):
    """Every token of a ties case has a class of bitwise-equal router rows with members chosen
    and members not chosen (the tie straddles the cutoff, broken to the lower ids), and the
    fast logits of the class are bitwise equal: the fast and reference routings are equal, so
    agreement compares the whole layer (a higher-id tie break is the mutants' regression)."""
    kw = component.build(case, DEVICE).kwargs()
    logits, ids = _route(kw)
    rw = kw["router_weight"]
    twins = [
        (a, b) for a in range(rw.shape[0]) for b in range(a + 1, rw.shape[0]) if torch.equal(rw[a], rw[b])
    ]
    assert twins
    for a, b in twins:
        assert torch.equal(logits[:, a], logits[:, b]), (a, b)
    assert torch.equal(ids.cpu(), ref_moe.expert_terms(**kw).ids.cpu())
    kinds = set()
    for t, row in enumerate(ids.cpu().tolist()):
        straddling = [(a, b) for a, b in twins if a in row and b not in row]
        assert straddling, f"token {t}: no tie straddles its cutoff (ids {row})"
        assert not [(a, b) for a, b in twins if b in row and a not in row], f"token {t}: higher id taken"
        size = rw.shape[0] // kw["n_group"]
        kinds.add("group" if any(a // size != b // size for a, b in straddling) else "expert")
    if kw["n_group"] > 2:
        assert kinds == {"group", "expert"}, kinds


@pytest.mark.cpu
def test_near_tie_neighbours_sit_at_a_cutoff_and_route_invariantly():
    """The ``near_tie`` neighbours' two keys at the top_k cutoff are closer than the fast and
    reference logits may differ (tokens the case generator would redraw), and such a token's
    bits are the same alone, in a co-batch and on repeat (fast vs fast: the invariance checks'
    contract, for which near-ties are valid)."""
    case = component._case(8, 2, 32, 32, 3, "sigmoid", True, False, n_group=4, topk_group=2, seed=6)
    batch = component.build(case, DEVICE)
    near = component.build(component.neighbours(case, LANE)["near_tie"], DEVICE)
    kw = near.kwargs()
    cut = component.routing_cutoffs(kw["hidden"], kw)
    keys = cut["keys"].sort(dim=1, descending=True).values
    k = kw["top_k"]
    assert bool(((keys[:, k - 1] - keys[:, k]) * component.GAP_FACTOR <= cut["need"]).all())
    assert not bool(cut["stable"].any())
    model = component.COMPONENT.requests

    def call(b):
        return (fused_moe(**b.kwargs()),)

    near = model.take(near, [0, 1])  # two targets: first and last
    co = invariance.co_batch(call, near, batch, model, sizes=(2,), generator=torch.Generator().manual_seed(0))
    assert co.passed and co.comparisons == 4, co.detail
    rep = invariance.repeat(call, near, times=2, take=model.take)
    assert rep.passed, rep.detail
