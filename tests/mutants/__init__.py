"""The mutant suite: planted one-line regressions of the fast kernels (docs/DESIGN.md, "Teeth").

Each :class:`Mutant` is a subject with its component's fast signature that differs from the
shipped code in one way a real regression would.  ``tests/mutants/test_mutants.py`` runs each through
the registry (``dataclasses.replace(component, fast=subject)``) and the cpu-lane sweep, with
the component's own cpu case list, and requires the sweep to fail on ``caught_by`` for the
planted reason; the same sweep on the shipped kernels passes.  Never shipped: this package
lives under ``tests/`` and nothing in ``batchinv`` imports it.

New mutant classes (MoE, attention, plans...) join :data:`MUTANTS`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from batchinv.fast.matmul_config import reduction_tree
from batchinv.harness.registry import Case

from . import all_reduce as all_reduce_mutants
from . import decode_partition_plan as plan_mutants
from . import emulated, kernels, missing_cases, process
from . import prefill_attention as prefill_mutants
from . import sdpa_attention as sdpa_mutants

#: The interpreter's matmul K step (every dtype): a K that is not a multiple has a partial tile.
INTERP_MATMUL_BLOCK_K = reduction_tree("interp", torch.float32, 1, 1).block_k


@dataclass(frozen=True)
class Mutant:
    """A planted regression.

    Attributes:
        name: the pytest id.
        component: the registry name of the component it mutates.
        build: ``build()`` -> the subject (same signature as the component's fast function).
        regression: one line: what was changed, as a real regression would change it.
        caught_by: the checks that must fail on the cpu-lane sweep.
        every_case: where given, every cpu case for which it is true must fail ``caught_by``
            (for the precision downgrades: every case of their dtype).
        replaces: the component field the subject stands in for: ``fast``, ``torch_op`` (the
            operator the ``modes`` check runs), ``configs`` (the subject is a
            ``configs(batch, lane)``: the executions ``config_equivalence`` runs); or
            ``lifecycle``: the subject is the component's plan lifecycle (a server class), and
            ``caught_by`` names the lifecycle guards (``tests/support/decode_plan_guards.py``) that must
            fail on it (:data:`LIFECYCLE_MUTANTS`).
        independent: where > 0, the failing rows of ``caught_by`` must span at least this many
            cases and name at least this many neighbour mixes besides ``one_huge`` (a request
            check's comparison labels name their mix, ``request 1 with 7 others (equal)``; a
            comparison inside the case's own batch counts as a mix of its own): a class one
            case or one mix alone catches is one case-list change away from surviving.
        try_first: where given, the cpu cases for which it is true run first (after those of
            ``every_case``): where one case is known to catch the mutant for less than the case
            list's first (the interpreter pays per program).  Order only: the requirements, and
            so the verdict, are the same whatever the order.
    """

    name: str
    component: str
    build: Callable[[], Callable[..., Any]]
    regression: str
    caught_by: tuple[str, ...]
    every_case: Callable[[Case], bool] | None = None
    replaces: str = "fast"
    independent: int = 0
    try_first: Callable[[Case], bool] | None = None


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "topk_ties_by_last_column",
        "topk",
        kernels.topk_ties_by_last_column,
        "tie plateau at the cutoff: the last tied columns are taken instead of the first",
        ("agreement",),
    ),
    Mutant(
        "topk_negative_zero_below_positive_zero",
        "topk",
        kernels.topk_negative_zero_below_positive_zero,
        "the -0 -> +0 canonicalization of the key is dropped: -0 ranks below +0",
        ("agreement",),
    ),
    Mutant(
        "topk_sign_scan_from_row_end",
        "topk",
        kernels.topk_sign_scan_from_row_end,
        "the many-row kernel's packed scan runs from the row end: ties to the last columns, slots "
        "counted from the end (an execution the launcher picks only above 64 rows)",
        ("config_equivalence",),
        replaces="configs",
    ),
    Mutant(
        "softmax_block_from_rows",
        "softmax",
        kernels.softmax_block_from_rows,
        "the launcher halves the column chunk (block_n) when the launch has fewer than 8 rows",
        ("batch_prefix",),
    ),
    Mutant(
        "softmax_tile_by_hash_order",
        "softmax",
        process.build_softmax_tile_by_hash_order,
        "the launcher halves the column chunk when a set of two tile names iterates 'halved' first: "
        "a tie broken by the hash order, fixed within a process, another in another process",
        ("cross_process",),
    ),
    Mutant(
        "softmax_split_float_lane_sum",
        "softmax",
        kernels.softmax_split_float_lane_sum,
        "the split execution (the few-row bucket) adds a row's lanes with a float tl.sum instead of "
        "the fixed-point grid: 1 or 2 rows, split, get other bits than in a larger, tiled launch",
        ("batch_prefix",),
    ),
    Mutant(
        "softmax_without_max_subtraction",
        "softmax",
        kernels.softmax_without_max_subtraction,
        "the write pass computes exp(x) / (sum * exp(max)): no max subtraction, exp overflows",
        ("agreement",),
    ),
    Mutant(
        "matmul_dropped_partial_k_tile",
        "matmul",
        kernels.matmul_dropped_partial_k_tile,
        "k_tiles = K // BLOCK_K: the last, partial K tile is never added",
        ("agreement",),
        every_case=lambda case: int(case.axes["k"]) % INTERP_MATMUL_BLOCK_K != 0,
    ),
    Mutant(
        "matmul_dropped_last_product",
        "matmul",
        kernels.matmul_dropped_last_product,
        "the K mask of the pointer reads is off by one: the product at k = K - 1 is never added",
        ("agreement",),
        # every case read through pointers: fp32 (TMA serves 16-bit inputs; the cpu lane's
        # 16-bit walks read through descriptors, whose zero fill has no mask to get wrong)
        every_case=lambda case: case.axes["dtype"] == "fp32",
    ),
    Mutant(
        "matmul_tma_weight_tile_one_step_late",
        "matmul",
        kernels.matmul_tma_weight_tile_one_step_late,
        "the TMA read of the weight takes K tile kt + 1 (zero past the end): products of the wrong k",
        ("agreement",),
    ),
    Mutant(
        "matmul_walk_chunk_boundary_off_by_one",
        "matmul",
        kernels.matmul_walk_chunk_boundary_off_by_one,
        "the walk adds a chunk's sum one K tile early: another tree than the split execution's",
        ("config_equivalence", "batch_prefix"),
    ),
    Mutant(
        "fp8_gemm_block_scale_one_block_late",
        "fp8_gemm",
        kernels.fp8_gemm_block_scale_one_block_late,
        "the block layout scales a K block's sum with the next block's scales",
        ("agreement",),
        every_case=lambda case: case.axes["scales"] == "block",
    ),
    Mutant(
        "fp8_gemm_weight_scale_dropped",
        "fp8_gemm",
        kernels.fp8_gemm_weight_scale_dropped,
        "the per-tensor layout forgets the weight's scale",
        ("agreement",),
        every_case=lambda case: case.axes["scales"] == "tensor",
    ),
    Mutant(
        "fp8_gemm_token_scale_from_last_row",
        "fp8_gemm",
        kernels.fp8_gemm_token_scale_from_last_row,
        "a token's scale read from the row mirrored from the batch's end (depends on M)",
        ("agreement", "batch_prefix"),
        every_case=lambda case: case.axes["scales"] == "token",
    ),
    Mutant(
        "matmul_block_k_from_rows",
        "matmul",
        kernels.matmul_block_k_from_rows,
        "the launcher halves BLOCK_K for M <= 16 (a config keyed on the batch size)",
        ("batch_prefix",),
    ),
    Mutant(
        "matmul_untabled_execution_at_7_rows",
        "matmul",
        kernels.matmul_untabled_execution_at_7_rows,
        "the launcher runs, at M = 7, an execution of the same tree that its table does not hold "
        "(same bits here): an execution config_equivalence never proved, caught by launch provenance",
        ("config_equivalence",),
    ),
    Mutant(
        "matmul_tf32_operands",
        "matmul",
        lambda: emulated.tf32_operands,
        "fp32 operands rounded to TF32 (10 mantissa bits) before an fp32-accumulating matmul",
        ("agreement",),
        every_case=lambda case: case.axes["dtype"] == "fp32",
    ),
    Mutant(
        "matmul_bf16_logits",
        "matmul",
        lambda: emulated.bf16_logits,
        "fp32 router logits rounded through bf16",
        ("agreement",),
        every_case=lambda case: case.axes["out"] == "fp32",
    ),
    Mutant(
        "matmul_low_precision_accumulation",
        "matmul",
        lambda: emulated.low_precision_accumulation,
        "the accumulator kept in fp16 (fp16 inputs) or bf16, rounded after every 16 products",
        ("agreement",),
        every_case=lambda case: True,
    ),
    Mutant(
        "mean_float_lane_sum",
        "mean",
        kernels.mean_float_lane_sum,
        "the exact fixed-point lane combine replaced by a float tl.sum over the fp64 lanes",
        ("agreement",),
    ),
    Mutant(
        "mean_fp32_division",
        "mean",
        kernels.mean_fp32_division,
        "the fp64 division by N replaced by an fp32 one (the sum rounded to fp32 first)",
        ("agreement",),
    ),
    Mutant(
        "decode_attention_dropped_last_partial_page",
        "decode_attention",
        kernels.decode_attention_dropped_last_partial_page,
        "dense split kernel: positions in the request's last, partial page are never attended",
        ("agreement",),
    ),
    Mutant(
        "decode_attention_merge_in_descending_order",
        "decode_attention",
        kernels.decode_attention_merge_in_descending_order,
        "the merge kernel walks the splits from the last to the first (same partials, another order)",
        ("agreement",),
        every_case=lambda case: case.axes["lengths"] == "merge_order",
    ),
    Mutant(
        "prefill_attention_splits_from_the_chunk_start",
        "prefill_attention",
        prefill_mutants.prefill_attention_splits_from_the_chunk_start,
        "split boundaries counted from each greedy packed chunk's first query position, not the "
        "request's first key: where the packing puts a request moves its merge tree",
        # the three cpu cases' co_batch launches put no target across a chunk that moves its
        # splits (the fresh-clone CI of 1bfd5ac); the phase check's chunked prefills do
        ("phase",),
        # every cpu case catches it; the edges case (longest 33) for 33 s of phase, not 46 s
        try_first=lambda case: case.axes["mix"] == "edges",
    ),
    Mutant(
        "prefill_attention_causal_off_by_one",
        "prefill_attention",
        prefill_mutants.prefill_attention_causal_off_by_one,
        "rows of q_len > 1 requests stop one key short of their position (p keys, not p + 1)",
        ("agreement",),
    ),
    Mutant(
        "prefill_attention_lse_in_base_2",
        "prefill_attention",
        prefill_mutants.prefill_attention_lse_in_base_2,
        "lse written as log2 instead of the natural log",
        ("agreement",),
    ),
    Mutant(
        "prefill_attention_empty_split_merged",
        "prefill_attention",
        prefill_mutants.prefill_attention_empty_split_merged,
        "a split with no attended key (0, -inf) merged as if live (an empty prefix chunk merged)",
        ("agreement",),
        every_case=lambda case: int(case.axes["sparse_k"]) > 0,
    ),
    Mutant(
        "prefill_attention_split_from_max_seqlen_q",
        "prefill_attention",
        prefill_mutants.prefill_attention_split_from_max_seqlen_q,
        "the split size planned from the launch's max_seqlen_q x GQA group (vLLM #51902's "
        "thresholds), not the table's",
        ("co_batch",),
    ),
    Mutant(
        "prefill_attention_prefill_config_for_q_len_above_1",
        "prefill_attention",
        prefill_mutants.prefill_attention_prefill_config_for_q_len_above_1,
        "q_len > 1 requests through a prefill config of twice the split, q_len 1 through "
        "decode's: a token's bits depend on its phase",
        ("phase",),
        # cases 0 and 1 catch it; the edges case (longest 33) for 19 s of phase, not 24 s
        try_first=lambda case: case.axes["mix"] == "edges",
    ),
    Mutant(
        "sdpa_attention_visible_end_off_by_one",
        "sdpa_attention",
        sdpa_mutants.sdpa_attention_visible_end_off_by_one,
        "rows with more than one visible key stop one key short",
        ("agreement",),
    ),
    Mutant(
        "moe_combine_reverse_slot_order",
        "moe_combine",
        kernels.moe_combine_reverse_slots,
        "the combine adds a token's slots from j = k-1 down to 0 (fp64, same products)",
        ("agreement",),
        every_case=lambda case: case.axes["values"] == "cancel" and case.axes["k"] >= 5,
    ),
    Mutant(
        "moe_combine_fp32_accumulation",
        "moe_combine",
        kernels.moe_combine_fp32_accumulation,
        "the combine's products and accumulator in fp32 instead of fp64 (slot order kept)",
        ("agreement",),
        # with weights: the fp32 products round (without, bf16 terms S + s still fit in fp32)
        every_case=lambda case: case.axes["values"] == "cancel" and case.axes["weights"],
    ),
    Mutant(
        "swiglu_silu_rounded_to_bf16",
        "swiglu",
        kernels.swiglu_silu_rounded_to_bf16,
        "silu(g) is rounded to bf16 before the product (a 16-bit intermediate, as F.silu(gate) * up)",
        ("agreement",),
        every_case=lambda case: case.axes["rows"] > 2,
    ),
    Mutant(
        "swiglu_scale_first",
        "swiglu",
        kernels.swiglu_scale_first,
        "silu * (u * s) for every scale: u * s overflows fp32 for a routed scale 2.5 and |u| near max",
        ("agreement",),
        every_case=lambda case: case.axes["scale"] == "specials" and case.axes["dtype"] == "bf16",
    ),
    Mutant(
        "swiglu_scale_last",
        "swiglu",
        kernels.swiglu_scale_last,
        "(silu * u) * s for every scale: silu * u overflows fp32 for a scale 0.5 and |u| near max",
        ("agreement",),
        every_case=lambda case: case.axes["scale"] == "specials" and case.axes["dtype"] == "bf16",
    ),
    Mutant(
        "swiglu_no_infinite_limit",
        "swiglu",
        kernels.swiglu_no_infinite_limit,
        "the signed-infinity repair dropped: silu flushed to 0 (g < -87) times an infinite u is NaN",
        ("agreement",),
        every_case=lambda case: case.axes["values"] == "specials" and int(case.axes["rows"]) > 8,
    ),
    Mutant(
        "fp8_quant_truncating_e4m3",
        "fp8_quant",
        kernels.fp8_quant_truncating_e4m3,
        "the e4m3 rounding truncates normal values instead of rounding to nearest even",
        ("agreement",),
        every_case=lambda case: True,
    ),
    Mutant(
        "fp8_quant_amax_over_launch_tile",
        "fp8_quant",
        kernels.fp8_quant_amax_over_launch_tile,
        "amax over the program's whole row block, not per row: a token's scale depends on its neighbours",
        ("batch_prefix", "neighbours"),
    ),
    Mutant(
        "tp_linear_gathered_in_reverse_rank_order",
        "tp_linear",
        kernels.tp_linear_gathered_in_reverse_rank_order,
        "the all-reduce adds the ranks' chunk sums last rank first: another chunk chain per TP degree",
        ("tp_degree",),
    ),
    Mutant(
        "rms_norm_eps_by_tile_max",
        "rms_norm",
        kernels.rms_norm_eps_by_tile_max,
        "eps scaled by the largest mean square of the program's row tile: a row's rstd follows the "
        "values of its neighbours (same shapes, same row)",
        ("neighbours",),
    ),
    Mutant(
        "moe_align_groups_not_padded",
        "moe_align",
        kernels.moe_align_groups_not_padded,
        "an expert's group is not rounded up to a multiple of block_m (blocks straddle experts)",
        ("agreement",),
    ),
    Mutant(
        "moe_router_ties_to_higher_id",
        "moe_router",
        kernels.moe_router_ties_to_higher_id,
        "equal selection keys: the higher expert id is taken first instead of the lower",
        ("agreement",),
    ),
    Mutant(
        "moe_router_weights_through_bf16",
        "moe_router",
        kernels.moe_router_weights_through_bf16,
        "the fp64 weights rounded through bf16 before fp32 (a 16-bit weights buffer)",
        ("agreement",),
    ),
    Mutant(
        "moe_router_weight_one_ulp_top_of_binade",
        "moe_router",
        kernels.moe_router_weight_one_ulp_top_of_binade,
        "slot 0's fp32 weight one ULP up where it lies in [0.5, 1) (half an ULP of v is a full ULP "
        "there near 1: the former bound |v| 2^-24 admitted it where v had rounded down)",
        ("agreement",),
    ),
    Mutant(
        "moe_router_weight_one_ulp_last_slot",
        "moe_router",
        kernels.moe_router_weight_one_ulp_last_slot,
        "the last slot's fp32 weight one ULP up, whatever its value",
        ("agreement",),
        every_case=lambda case: True,
    ),
    Mutant(
        "moe_router_group_score_top2_without_bias",
        "moe_router",
        missing_cases.moe_router_group_score_top2_without_bias,
        "without a correction bias groups ranked by their two best keys' sum, not their best (the "
        "rule before issue 25 section 4; vLLM and DeepSeek-V3 take the group max)",
        ("agreement",),
    ),
    Mutant(
        "moe_router_full_k_not_renormalized",
        "moe_router",
        missing_cases.moe_router_full_k_not_renormalized,
        "renormalize skipped when top_k == E (only softmax scores sum to 1 there)",
        ("agreement",),
        every_case=lambda case: (
            case.axes["scoring"] == "sigmoid"
            and case.axes["top_k"] == case.axes["num_experts"]
            and bool(case.axes["renormalize"])
        ),
    ),
    Mutant(
        "moe_combine_double_rounding",
        "moe_combine",
        missing_cases.moe_combine_double_rounding,
        "the fp64 sum rounded to fp32, then to bf16 / fp16, both to nearest (a tie goes to even)",
        ("agreement",),
        every_case=lambda case: case.axes["values"] == "tie16" and case.axes["dtype"] != "float32",
    ),
    Mutant(
        "grouped_gemm_block_k_from_token_count",
        "grouped_gemm",
        missing_cases.grouped_gemm_block_k_from_token_count,
        "the launcher halves BLOCK_K above 32 tokens (a large-batch config bucket): a token's bits "
        "differ alone and inside its 48-token batch",
        ("co_batch",),
        every_case=lambda case: int(case.axes["T"]) > missing_cases.LARGE_LAUNCH_TOKENS,
    ),
    Mutant(
        "decode_attention_split_one_chunk_longer",
        "decode_attention",
        missing_cases.decode_attention_split_one_chunk_longer,
        "split_tokens one chunk longer than the table's: every split boundary moves",
        ("agreement",),
        # both order-exact cases (their lengths are 4 splits of the table's split_tokens)
        every_case=lambda case: case.axes["lengths"] == "merge_order",
    ),
    Mutant(
        "decode_attention_split_doubled_past_four_splits",
        "decode_attention",
        missing_cases.decode_attention_split_doubled_past_four_splits,
        "the launcher doubles split_tokens when a request of the launch needs more than 4 splits "
        "(a long-context bucket keyed on the launch): a request's splits depend on its neighbours",
        ("co_batch",),
        # the order-exact cases: beside the equal mix (one split past theirs), and inside their
        # own batch beside a 161-slot request (merge_order_long)
        every_case=lambda case: case.axes["lengths"] in ("merge_order", "merge_order_long"),
        independent=2,
    ),
    Mutant(
        "decode_attention_splits_capped_at_four_per_launch",
        "decode_attention",
        missing_cases.decode_attention_splits_capped_at_four_per_launch,
        "the launcher grows split_tokens (whole chunks) until the launch's longest request has at "
        "most 4 splits (a fixed split dimension of the grid): the split size comes from the neighbours",
        ("co_batch",),
        every_case=lambda case: case.axes["lengths"] in ("merge_order", "merge_order_long"),
        independent=2,
    ),
    Mutant(
        "grouped_gemm_dropped_partial_k_tile",
        "grouped_gemm",
        kernels.grouped_gemm_dropped_partial_k_tile,
        "k_tiles = (k_hi - k_lo) // BLOCK_K: the last, partial K tile is never added",
        ("agreement",),
        every_case=lambda case: int(case.axes["K"]) % 64 != 0,  # the interpreter's BLOCK_K
    ),
    Mutant(
        "grouped_gemm_block_k_from_expert_m",
        "grouped_gemm",
        kernels.grouped_gemm_block_k_from_expert_m,
        "the launcher halves BLOCK_K when the launch's largest expert M is <= 4 (a per-M config)",
        ("co_batch",),
    ),
    Mutant(
        "fused_moe_weights_applied_twice",
        "fused_moe",
        kernels.fused_moe_weights_applied_twice,
        "with apply_router_weight_on_input the combine still multiplies by the weights (applied twice)",
        ("agreement",),
        every_case=lambda case: bool(case.axes["on_input"]) and case.axes["values"] == "normal",
    ),
    Mutant(
        "fused_moe_expert_ties_to_higher_id",
        "fused_moe",
        kernels.fused_moe_expert_ties_to_higher_id,
        "the layer's router takes the higher expert id first among equal keys (moe_router's tie mutant)",
        ("agreement",),
        every_case=lambda case: case.axes["values"] == "ties",
    ),
    Mutant(
        "fused_moe_group_ties_to_higher_id",
        "fused_moe",
        kernels.fused_moe_group_ties_to_higher_id,
        "the layer's router keeps the higher group id first among equal group scores",
        ("agreement",),
        every_case=lambda case: case.axes["values"] == "ties",
    ),
    Mutant(
        "softmax_operator_unpinned_when_compiled",
        "softmax",
        kernels.softmax_operator_unpinned_when_compiled,
        "the operator answers torch.softmax while torch.compile traces it (a compiled graph that "
        "leaves the pinned kernel, as aten overrides do under Inductor)",
        ("modes",),
        replaces="torch_op",
    ),
    Mutant(
        "log_softmax_operator_left_to_the_compiler",
        "log_softmax",
        kernels.log_softmax_operator_left_to_the_compiler,
        "the operator answers torch.log_softmax while torch.compile traces it: the compiled graph "
        "runs the compiler's log-softmax, not the kernel (no batchinv::log_softmax ran at run time)",
        ("modes",),
        replaces="torch_op",
    ),
    Mutant(
        "matmul_bucket_frozen_at_trace_time",
        "matmul",
        kernels.matmul_bucket_frozen_at_trace_time,
        "the operator picks its M bucket from the M Dynamo traces (no guard), so a compiled "
        "graph keeps one bucket for every runtime M (vLLM's compiled batch-invariant matmul)",
        ("modes",),
        replaces="torch_op",
    ),
)

# --- plans: prefill_chunk_plan, cuda_graph_buckets (seed write-ups 001 and 003) ----------------

from . import plans  # noqa: E402

MUTANTS = (
    *MUTANTS,
    Mutant(
        "prefill_chunk_plan_extra_chunk_at_budget_multiples",
        "prefill_chunk_plan",
        plans.prefill_chunk_plan_extra_chunk_at_budget_multiples,
        "num_chunks = L // B + 1: a prompt of a multiple of the budget (or empty) gets an empty chunk more",
        ("agreement",),
        every_case=lambda case: case.axes["lengths"] == "budget_edges",
    ),
    Mutant(
        "prefill_chunk_plan_chunk_rows_padded_to_budget",
        "prefill_chunk_plan",
        plans.prefill_chunk_plan_chunk_rows_padded_to_budget,
        "every chunk's rows reported as the budget: the remainder chunk is planned as a full one",
        ("agreement",),
    ),
    Mutant(
        "prefill_chunk_plan_tail_shares_its_chunk",
        "prefill_chunk_plan",
        plans.prefill_chunk_plan_tail_shares_its_chunk,
        "the remainder chunk takes the next request's tokens into its spare rows (tail packing)",
        ("co_batch",),
    ),
    Mutant(
        "cuda_graph_buckets_align_then_validate",
        "cuda_graph_buckets",
        plans.cuda_graph_buckets_align_then_validate,
        "seed 001's first version: token counts aligned before validation, decode sizes not already "
        "a multiple of 64 dropped (max_requests = 100 loses its largest decode bucket)",
        ("agreement", "co_batch"),
    ),
    Mutant(
        "cuda_graph_buckets_without_the_64_floor",
        "cuda_graph_buckets",
        plans.cuda_graph_buckets_without_the_64_floor,
        "the 64-multiple token floor removed: a 1-request decode step replays a 1-token graph",
        ("agreement", "co_batch"),
    ),
    Mutant(
        "cuda_graph_buckets_a_spare_decode_slot_required",
        "cuda_graph_buckets",
        plans.cuda_graph_buckets_a_spare_decode_slot_required,
        "a decode bucket holds a step only with a spare slot (> for >=): a full decode step runs eager",
        ("agreement", "co_batch"),
    ),
    Mutant(
        "decode_partition_plan_last_request_unowned",
        "decode_partition_plan",
        plan_mutants.last_request_unowned,
        "the last partition's span ends one request early: the batch's last request is owned by none",
        ("agreement",),
        every_case=lambda case: True,
    ),
    Mutant(
        "decode_partition_plan_one_request_per_partition",
        "decode_partition_plan",
        plan_mutants.one_request_per_partition,
        "the b <= P skeleton: request r goes to partition r, so above the partition count requests are unowned",
        ("agreement",),
        every_case=lambda case: int(case.axes["b"]) > int(case.axes["P"]),
    ),
    Mutant(
        "decode_partition_plan_splits_aligned_to_the_launch",
        "decode_partition_plan",
        plan_mutants.splits_aligned_to_the_launch,
        "split bounds at multiples of split_tokens in the launch's packed token space, not the request's own",
        ("co_batch", "slot"),
    ),
    Mutant(
        "decode_partition_plan_split_doubled_above_the_partition_count",
        "decode_partition_plan",
        plan_mutants.split_doubled_above_the_partition_count,
        "the split size doubles when the batch has more requests than partitions (fewer partials to merge)",
        ("co_batch", "partition"),
    ),
)

#: Row-count thresholds just above the old M sweep's 1 and 2 (issue 25, section 5): the launcher
#: sums squares in fp32 above 3, 4, 5 or 6 rows.  The launches at or below the threshold must
#: compare rows that change bits (about a quarter of the fp32 case's rows, none of rows 0 and 1).
MUTANTS = (
    *MUTANTS,
    *(
        Mutant(
            f"rms_norm_fp32_sum_above_{rows}_rows",
            "rms_norm",
            functools.partial(kernels.rms_norm_fp32_sum_above, rows),
            f"the launcher takes the fp32-accumulating config above {rows} rows (a config keyed on the batch)",
            ("batch_prefix",),
        )
        for rows in (3, 4, 5, 6)
    ),
    Mutant(
        "all_reduce_leaves_reversed",
        "all_reduce",
        all_reduce_mutants.leaves_reversed,
        "the pinned tree adds the leaves from r = R-1 down to 0 (fp64 still)",
        ("agreement",),
        every_case=lambda case: case.axes["values"] != "normal" and int(case.axes["R"]) >= 3,
    ),
    Mutant(
        "all_reduce_fp32_above_16_rows",
        "all_reduce",
        all_reduce_mutants.fp32_above_16_rows,
        "from 16 rows on the message is summed in fp32 (an algorithm picked by message size)",
        ("batch_prefix",),
    ),
    Mutant(
        "all_reduce_tp_ranks_presum_in_fp32",
        "all_reduce",
        all_reduce_mutants.tp_ranks_presum_in_fp32,
        "each TP rank sums its own leaves in fp32 before the tree over the ranks (TP 1 is one fp32 sum)",
        ("tp_degree",),
        every_case=lambda case: case.axes["values"] != "normal" and int(case.axes["R"]) >= 3,
    ),
)

#: Mutants of the plan lifecycle (``replaces="lifecycle"``): the seed's regressions of the cold
#: start, each caught by the lifecycle guards in ``caught_by`` (``tests/mutants/test_mutants.py``).
LIFECYCLE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "decode_partition_plan_skips_the_record",
        "decode_partition_plan",
        plan_mutants.skips_the_record,
        "the cold start never records the partition count the kernel's plan left: no pinned plan is "
        "ever built, the step fails closed forever",
        ("cold_start_first_call_uses_the_pinned_plan", "cold_start_records_the_observed_partition_count"),
        replaces="lifecycle",
    ),
    Mutant(
        "decode_partition_plan_records_after_the_kernel",
        "decode_partition_plan",
        plan_mutants.records_after_the_kernel,
        "the cold call's output (the kernel's own, batch-planned plan) is returned and the observation "
        "recorded after it: the first call for a shape runs with the unpinned plan",
        ("cold_start_first_call_uses_the_pinned_plan", "every_step_reads_its_own_pinned_plan"),
        replaces="lifecycle",
    ),
    Mutant(
        "decode_partition_plan_drops_the_install",
        "decode_partition_plan",
        plan_mutants.drops_the_install,
        "the pinned plan is built but never installed: the kernel reads the plan it left itself",
        ("cold_start_first_call_uses_the_pinned_plan", "pinned_plan_installs_both_metadata_tensors"),
        replaces="lifecycle",
    ),
    Mutant(
        "decode_partition_plan_drops_the_num_splits_install",
        "decode_partition_plan",
        plan_mutants.drops_the_num_splits_install,
        "the install copies the schedule but not num_splits: the combine merges the in-kernel plan's "
        "split counts",
        ("pinned_plan_installs_both_metadata_tensors", "cold_start_first_call_uses_the_pinned_plan"),
        replaces="lifecycle",
    ),
    Mutant(
        "decode_partition_plan_returns_the_kernel_plan_when_the_build_fails",
        "decode_partition_plan",
        plan_mutants.returns_the_kernel_plan_when_the_build_fails,
        "with no pinned plan buildable the step returns the kernel's run on its own plan instead of raising",
        ("cold_start_fails_closed_without_an_observation",),
        replaces="lifecycle",
    ),
)

# --- sampler (issue 27, section 4) -------------------------------------------------------------

from . import sampler as sampler_mutants  # noqa: E402

MUTANTS = (
    *MUTANTS,
    Mutant(
        "sampler_rng_keyed_by_slot",
        "sampler",
        sampler_mutants.sampler_rng_keyed_by_slot,
        "the Philox counter takes the row's slot in the launch: a request's draw moves with its slot",
        ("co_batch", "slot"),
    ),
    Mutant(
        "sampler_step_dropped_from_the_counter",
        "sampler",
        sampler_mutants.sampler_step_dropped_from_the_counter,
        "the step is dropped from the counter's low word: the draw is not the (seed, step) stream",
        ("agreement",),
    ),
    Mutant(
        "sampler_logits_shifted_by_the_batch_max",
        "sampler",
        sampler_mutants.sampler_logits_shifted_by_the_batch_max,
        "the logits shifted by the whole batch's max (a batch-wide softmax stabiliser): a request's "
        "log-prob and token follow the other requests' logits",
        ("neighbours",),
    ),
)
