"""Registry entry ``moe_align`` (docs/MOE.md section 2): (token, slot) pairs grouped by expert.

A *global* component: a pair's position in ``sorted_ids`` depends on every other token's
experts, so the row checks (batch_prefix, position, row_start) do not apply -- the contract
never promised a token's outputs independent of its batch here.  What it promises is exact
agreement with the stable order (``Component.checks = ("agreement", "repeat")``): the fast
kernel must give the reference's bits on every case, and the same bits on every call.  No
partition check: the kernels plan by chunk of flat indices (from the arch), never by SM count.

Cases (``topk_ids`` built from the seed on the CPU):

* ``random``: each token picks k distinct experts at random (the router's output);
* ``skewed``: k distinct experts among a few hot ones, always including E - 1 (most experts get
  zero tokens; the last group is never empty);
* ``one_expert``: every pair on the same expert (k = 1), E - 1 or a random one;
* ``duplicates``: ids drawn with repeats inside a token (the contract allows them: the order of
  a token's slots inside one expert is then the stable order j = 0..k-1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchinv.fast.baselines.moe_align import atomic_scatter_moe_align
from batchinv.fast.moe_align import MAX_EXPERTS
from batchinv.fast.moe_align import moe_align as fast_moe_align
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import GPU_LANES, Baseline, Batch, Case, Component, ErrorCase, Exact
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.moe_align import moe_align as reference_moe_align

NAME = "moe_align"
PATTERNS: tuple[str, ...] = ("random", "skewed", "one_expert", "duplicates")


def build_ids(
    pattern: str, num_tokens: int, top_k: int, num_experts: int, gen: torch.Generator
) -> torch.Tensor:
    """``topk_ids`` [T, k] int32 (CPU) of ``pattern``."""
    if pattern == "random":
        rows = [torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]
    elif pattern == "skewed":
        hot = max(top_k, min(num_experts, 3))
        pool = torch.randperm(num_experts - 1, generator=gen)[: hot - 1]
        pool = torch.cat([pool, torch.tensor([num_experts - 1])])
        rows = [pool[torch.randperm(pool.numel(), generator=gen)[:top_k]] for _ in range(num_tokens)]
    elif pattern == "one_expert":
        expert = (
            num_experts - 1
            if int(torch.randint(2, (1,), generator=gen))
            else int(torch.randint(num_experts, (1,), generator=gen))
        )
        return torch.full((num_tokens, top_k), expert, dtype=torch.int32)
    elif pattern == "duplicates":
        return torch.randint(min(num_experts, 3), (num_tokens, top_k), generator=gen, dtype=torch.int32) * (
            num_experts // 3 if num_experts >= 3 else 1
        )
    else:
        raise ValueError(f"pattern: expected one of {PATTERNS}, got {pattern!r}")
    return torch.stack(rows).to(torch.int32) if rows else torch.empty(0, top_k, dtype=torch.int32)


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``{"topk_ids": [T, k] int32}``; shared ``num_experts`` and ``block_m``."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    ids = build_ids(str(a["pattern"]), int(a["T"]), int(a["k"]), int(a["E"]), gen)
    layout = a.get("layout", "contiguous")
    if layout == "transposed":  # column-major [T, k]: the launcher must not read it as row-major
        ids = ids.t().contiguous().t()
    elif layout != "contiguous":
        raise ValueError(f"layout: expected contiguous or transposed, got {layout!r}")
    return Batch({"topk_ids": ids.to(device)}, {"num_experts": int(a["E"]), "block_m": int(a["block_m"])})


def make_case(
    num_tokens: int,
    top_k: int,
    num_experts: int,
    block_m: int,
    pattern: str = "random",
    layout: str = "contiguous",
    seed: int = 0,
) -> Case:
    axes = {
        "T": num_tokens,
        "k": top_k,
        "E": num_experts,
        "block_m": block_m,
        "pattern": pattern,
        "layout": layout,
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> Sequence[Case]:
    """T in a few sizes (1 included, T*k rarely a multiple of block_m), E with experts of zero
    tokens, all pairs on one expert, ids hitting E - 1, k = E."""
    c = make_case
    out = [
        c(1, 1, 4, 16, seed=1),
        c(1, 8, 64, 64, "skewed", seed=2),
        c(7, 2, 8, 16, seed=3),  # T*k = 14 < block_m
        c(33, 8, 64, 16, "skewed", seed=4),
        c(64, 1, 16, 32, "one_expert", seed=5),
        c(17, 4, 8, 64, "duplicates", layout="transposed", seed=6),
        c(5, 6, 6, 16, seed=7),  # k = E: every expert hit by every token
        c(40, 8, 128, 16, seed=8),
        c(50, 2, 1024, 16, "skewed", seed=9),  # the widest expert axis of the fast path
    ]
    if lane.is_gpu:
        out += [
            c(4096, 8, 128, 64, seed=10),
            c(4095, 8, 256, 128, "skewed", seed=11),
            c(16384, 8, 64, 64, "duplicates", seed=12),
            c(8191, 1, 32, 16, "one_expert", seed=13),
            c(3000, 6, 160, 64, seed=14),
        ]
    return out


def bench_cases(lane: Lane) -> Sequence[Case]:
    if not lane.is_gpu:
        return []
    return [make_case(t, 8, e, 64, seed=t) for e in (64, 256) for t in (1, 64, 1024, 8192)]


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    ids = torch.tensor([[0, 1], [2, 3], [3, 0]], dtype=torch.int32, device=device)
    ok = {"topk_ids": ids, "num_experts": 4, "block_m": 16}
    neg = ids.clone()
    neg[1, 0] = -1
    big = ids.clone()
    big[2, 1] = 4
    out = [
        ErrorCase(
            "id_negative", {**ok, "topk_ids": neg}, ArgumentError, r"'topk_ids'.*\[0, num_experts = 4\).*-1"
        ),
        ErrorCase(
            "id_equal_to_E", {**ok, "topk_ids": big}, ArgumentError, r"'topk_ids'.*\[0, num_experts = 4\).*4"
        ),
        ErrorCase("ids_int64", {**ok, "topk_ids": ids.long()}, DTypeError, r"'topk_ids'.*int32.*int64"),
        ErrorCase("ids_float", {**ok, "topk_ids": ids.float()}, DTypeError, r"'topk_ids'.*int32.*float32"),
        ErrorCase("ids_not_tensor", {**ok, "topk_ids": [[0, 1]]}, DTypeError, r"'topk_ids'.*torch\.Tensor"),
        ErrorCase("ids_rank_1", {**ok, "topk_ids": ids.reshape(-1)}, ArgumentError, r"'topk_ids'.*2-D.*1-D"),
        ErrorCase("ids_rank_3", {**ok, "topk_ids": ids[None]}, ArgumentError, r"'topk_ids'.*2-D.*3-D"),
        ErrorCase("top_k_zero", {**ok, "topk_ids": ids[:, :0]}, ArgumentError, r"'topk_ids'.*top_k.*>= 1.*0"),
        ErrorCase(
            "top_k_above_E",
            {**ok, "num_experts": 1},
            ArgumentError,
            r"'topk_ids'.*top_k.*<= num_experts = 1.*2",
        ),
        ErrorCase("num_experts_zero", {**ok, "num_experts": 0}, ArgumentError, r"'num_experts'.*>= 1.*0"),
        ErrorCase("num_experts_float", {**ok, "num_experts": 4.0}, DTypeError, r"'num_experts'.*int.*float"),
        ErrorCase(
            "block_m_not_power_of_two", {**ok, "block_m": 24}, ArgumentError, r"'block_m'.*power of two.*24"
        ),
        ErrorCase("block_m_below_16", {**ok, "block_m": 8}, ArgumentError, r"'block_m'.*>= 16.*8"),
        ErrorCase("block_m_bool", {**ok, "block_m": True}, DTypeError, r"'block_m'.*int.*bool"),
        ErrorCase("ids_on_meta", {**ok, "topk_ids": ids.to("meta")}, DeviceError, r"'topk_ids'.*meta"),
        ErrorCase(
            "num_experts_above_fast_path",
            {**ok, "num_experts": MAX_EXPERTS + 1},
            ArgumentError,
            r"'num_experts'.*at most 1024.*1025",
            applies_to=("fast",),
        ),
    ]
    if device.type == "cuda":
        out.append(
            ErrorCase(
                "host_ids_on_gpu_path",
                {**ok, "topk_ids": ids.cpu()},
                DeviceError,
                r"'topk_ids'.*CUDA.*cpu",
                applies_to=("fast",),
            )
        )
    return out


COMPONENT = Component(
    name=NAME,
    summary="MoE align: (token, slot) pairs grouped by expert in stable order, padded to block_m",
    reference=reference_moe_align,
    fast=fast_moe_align,
    baselines=(
        Baseline(
            name="atomic_scatter",
            fn=atomic_scatter_moe_align,
            why=(
                "each pair claims its expert's next slot with tl.atomic_add: the order inside an expert "
                "is the atomics' arrival order (the GPU schedule), so repeated calls reorder it; the "
                "interpreter runs programs in sequence, so only GPU lanes must vary"
            ),
            expected_to_vary_on=GPU_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("integer grouping in the stable order (expert id, flat index): no arithmetic"),
    dtypes=(torch.int32,),
    error_cases=error_cases,
    bench_cases=bench_cases,
    checks=("agreement", "repeat", "cross_process"),
)
