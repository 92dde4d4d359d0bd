"""``moe_router``'s grouped top-k follows the production definition (issue 25, section 4).

The expected routing comes from :mod:`moe_router_production` (``tests/support``), a plain-Python
transcription of vLLM's ``grouped_topk`` and DeepSeek-V3's gate that shares no code with the
project: the reference and the fast kernel must choose its experts, in its slot order, on
random tokens of DeepSeek-V3's shape (E = 256, 8 groups, 4 kept, k = 8), and their weights must
lie within the project's weight bound around its weights.  Softmax with a correction bias is
outside the contract (an ArgumentError), so the three scorings are softmax, sigmoid and
sigmoid + bias.  The NaN rule of groups is pinned below by hand-built rows.
"""

from __future__ import annotations

import pytest
import torch
from moe_router_production import grouped_topk

from batchinv.fast.moe_router import moe_router as fast_moe_router
from batchinv.harness.compare import compare_tolerance
from batchinv.reference.moe_router import moe_router as reference_moe_router
from batchinv.reference.moe_router import weights_bound

E, N_GROUP, TOPK_GROUP, TOP_K = 256, 8, 4, 8
SCORINGS = (("softmax", False), ("sigmoid", False), ("sigmoid", True))


def _tokens(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, E, generator=gen) * 2.0
    bias = torch.randn(E, generator=gen) * 0.05
    return logits, bias


def _oracle(
    logits: torch.Tensor, scoring: str, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [
        grouped_topk(
            row,
            TOP_K,
            scoring,
            True,
            N_GROUP,
            TOPK_GROUP,
            None if bias is None else bias.tolist(),
        )
        for row in logits.tolist()
    ]
    weights = torch.tensor([w for w, _ in rows], dtype=torch.float64)
    ids = torch.tensor([i for _, i in rows], dtype=torch.int32)
    return weights, ids


def _check(subject, logits: torch.Tensor, scoring: str, with_bias: bool, bias: torch.Tensor) -> None:
    device = logits.device
    b = bias if with_bias else None
    expected_w, expected_ids = _oracle(logits.cpu(), scoring, b)
    kwargs = {
        "top_k": TOP_K,
        "scoring": scoring,
        "renormalize": True,
        "correction_bias": None if b is None else b.to(device),
        "n_group": N_GROUP,
        "topk_group": TOPK_GROUP,
    }
    weights, ids = subject(logits, **kwargs)
    ids = ids.cpu()
    differ = (ids != expected_ids).any(dim=1)
    assert not bool(differ.any()), (
        f"{scoring}{' + bias' if with_bias else ''}: {int(differ.sum())} of {len(ids)} tokens routed "
        f"elsewhere than production, first: token {int(differ.nonzero()[0])}, "
        f"got {ids[differ][0].tolist()}, production {expected_ids[differ][0].tolist()}"
    )
    on_cpu = {**kwargs, "correction_bias": b}
    bound = weights_bound(logits.cpu(), **on_cpu, weights=expected_w)
    assert compare_tolerance(expected_w, weights.cpu().double(), bound).within


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize(("scoring", "with_bias"), SCORINGS, ids=["softmax", "sigmoid", "sigmoid_bias"])
def test_the_reference_routes_as_production(scoring: str, with_bias: bool) -> None:
    logits, bias = _tokens(64, seed=25)
    _check(reference_moe_router, logits, scoring, with_bias, bias)


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize(("scoring", "with_bias"), SCORINGS, ids=["softmax", "sigmoid", "sigmoid_bias"])
def test_the_fast_router_routes_as_production(device, scoring: str, with_bias: bool) -> None:
    num_tokens = 16 if device.type == "cpu" else 2048  # the interpreter: ~0.1 s a token
    logits, bias = _tokens(num_tokens, seed=26)
    _check(fast_moe_router, logits.to(device), scoring, with_bias, bias)


# --- groups of NaN experts rank as the ungrouped path ranks NaN experts ------------------------

ROUTERS = {"reference": reference_moe_router, "fast": fast_moe_router}


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_without_a_bias_groups_rank_by_their_best_expert_in_the_ungrouped_order(
    device, router: str, scoring: str
) -> None:
    """Without a bias a group's score is its best expert's: the kept groups are the first
    ``topk_group`` groups met walking the ungrouped order (NaNs of both signs included), and the
    experts are that order restricted to them.  The ungrouped order is the project's own, held
    by the topk oracle tests; here the rows are NaN-heavy (the harness's row kinds)."""
    from batchinv.harness.components.moe_router import build_row

    num_experts, n_group, topk_group, top_k = 16, 4, 2, 4
    size = num_experts // n_group
    gen = torch.Generator().manual_seed(4)
    kinds = ("negative_nans", "specials", "neg_inf_plateau", "signed_zeros", "ties")
    logits = torch.stack([build_row(kind, num_experts, gen) for kind in kinds])
    all_negative_nan = torch.tensor(-1, dtype=torch.int32).view(torch.float32)  # 0xffffffff
    logits[0, :size] = all_negative_nan  # group 0: every expert a negative NaN
    logits = logits.to(device)
    order = reference_moe_router(logits, num_experts, scoring)[1].tolist()  # [T, E] ungrouped
    _, ids = ROUTERS[router](logits, top_k, scoring, n_group=n_group, topk_group=topk_group)
    for row, got in zip(order, ids.tolist(), strict=True):
        kept: list[int] = []
        for e in row:
            if e // size not in kept:
                kept.append(e // size)
        expected = [e for e in row if e // size in kept[:topk_group]][:top_k]
        assert got == expected, (row, got, expected)
    # group 0 of row 0 is all negative NaNs: below every finite group with softmax (as a
    # negative NaN ranks below -inf ungrouped), the canonical positive NaN first with sigmoid
    group_0_kept = 0 in {e // size for e in ids[0].tolist()}
    assert group_0_kept == (scoring == "sigmoid"), ids[0].tolist()


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_with_a_bias_a_nan_group_ranks_first(device, router: str) -> None:
    """With a bias every NaN selection value is the canonical positive NaN (it ranks above +inf
    ungrouped) and so is a NaN group sum: the group holding a NaN logit is kept first."""
    num_experts, n_group = 16, 4
    logits = torch.linspace(-3.0, 3.0, num_experts).repeat(2, 1)  # group 3 the best
    logits[0, 1] = float("nan")
    logits[1, 2] = torch.tensor(-1, dtype=torch.int32).view(torch.float32)  # a negative NaN
    bias = torch.zeros(num_experts)
    _, ids = ROUTERS[router](
        logits.to(device), 5, "sigmoid", False, bias.to(device), n_group=n_group, topk_group=2
    )
    for row, nan_expert in zip(ids.tolist(), (1, 2), strict=True):
        assert row[0] == nan_expert, row
        assert sorted({e // 4 for e in row}) == [0, 3], row
