"""One-line mutants of the shipped kernels and launchers (see :mod:`mutants.patch`).

Each subject has the signature of its component's fast function and goes through the shipped
launcher (its validation, config lookup and grid); only the one patched line differs.  A kernel
patched in ``fast/kernels/`` is handed to the shipped launcher by :func:`with_kernel`, which
puts it where the launcher looks it up for the duration of one call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import torch

import batchinv.fast.kernels.decode_attention as attention_kernels
import batchinv.fast.kernels.fp8_quant as fp8_quant_kernels
import batchinv.fast.kernels.grouped_gemm as grouped_gemm_kernels
import batchinv.fast.kernels.matmul as matmul_kernels
import batchinv.fast.kernels.mean as mean_kernels
import batchinv.fast.kernels.moe_align as moe_align_kernels
import batchinv.fast.kernels.moe_router as moe_router_kernels
import batchinv.fast.kernels.primitives as primitives
import batchinv.fast.kernels.rms_norm as rms_norm_kernels
import batchinv.fast.kernels.softmax as softmax_kernels
import batchinv.fast.kernels.swiglu as swiglu_kernels
import batchinv.fast.kernels.topk as topk_kernels
from batchinv.fast import decode_attention as attention_launcher
from batchinv.fast import fp8_gemm as fp8_gemm_launcher
from batchinv.fast import fp8_quant as fp8_quant_launcher
from batchinv.fast import grouped_gemm as grouped_gemm_launcher
from batchinv.fast import matmul as matmul_launcher
from batchinv.fast import mean as mean_launcher
from batchinv.fast import moe_align as moe_align_launcher
from batchinv.fast import moe_router as moe_router_launcher
from batchinv.fast import rms_norm as rms_norm_launcher
from batchinv.fast import softmax as softmax_launcher
from batchinv.fast import swiglu as swiglu_launcher
from batchinv.fast import topk as topk_launcher
from batchinv.fast import tp_linear as tp_linear_launcher
from batchinv.fast.matmul_config import Execution
from batchinv.reference.topk import topk as reference_topk

from .patch import mutate


def with_kernel(
    module: ModuleType, name: str, kernel: Any, launcher: Callable[..., Any]
) -> Callable[..., Any]:
    """``launcher`` run with ``module.<name>`` replaced by ``kernel`` during each call."""

    @functools.wraps(launcher)
    def subject(*args: Any, **kwargs: Any) -> Any:
        shipped = getattr(module, name)
        setattr(module, name, kernel)
        try:
            return launcher(*args, **kwargs)
        finally:
            setattr(module, name, shipped)

    return subject


# --- topk -------------------------------------------------------------------------------------


def _topk_subject(kernel: Any) -> Callable[..., Any]:
    def topk(scores: Any, row_starts: Any, row_ends: Any, k: Any) -> Any:
        return topk_launcher.launch_rows(kernel, scores, row_starts, row_ends, k, fallback=reference_topk)

    return topk


def topk_ties_by_last_column() -> Callable[..., Any]:
    kernel = mutate(
        topk_kernels,
        "_select",
        "tie_rank = tl.cumsum(tied.to(tl.int32), axis=0)  # inclusive: 1 for the first tie",
        "tie_rank = tl.sum(tied.to(tl.int32), axis=0) - tl.cumsum(tied.to(tl.int32), axis=0) + tied.to(tl.int32)",
        entry="topk_kernel",
    )
    return _topk_subject(kernel)


def topk_negative_zero_below_positive_zero() -> Callable[..., Any]:
    kernel = mutate(
        primitives,
        "monotone_key",
        "bits = tl.where(bits == NEG_ZERO_BITS, 0, bits)",
        "bits = bits",
        entry="topk_kernel",
        entry_module=topk_kernels,
    )
    return _topk_subject(kernel)


def topk_sign_scan_from_row_end() -> Callable[..., Any]:
    """The component's ``configs`` with the "sign" kernel's packed scan run from the row end:
    its ties go to the last columns and its slots count from the end (every store stays in the
    row).  At <= 64 rows the launcher never runs that kernel, so only ``config_equivalence``
    (which runs every execution on every case) can see it."""
    from batchinv.harness.components import topk as topk_component

    kernel = mutate(
        topk_kernels,
        "topk_sign_count_kernel",
        "packed = tl.cumsum(above.to(tl.int32) + (tied.to(tl.int32) << 16), axis=0)  # inclusive",
        "packed = tl.cumsum(above.to(tl.int32) + (tied.to(tl.int32) << 16), axis=0, reverse=True)",
    )
    mutated = with_kernel(topk_launcher, "topk_sign_count_kernel", kernel, topk_launcher.topk)

    def configs(batch: Any, lane: Any) -> dict[str, Any]:
        shipped = topk_component.configs(batch, lane)
        return {
            name: functools.partial(mutated, config=fn.keywords["config"])
            if fn.keywords["config"].kernel == "sign"
            else fn
            for name, fn in shipped.items()
        }

    return configs


# --- matmul -----------------------------------------------------------------------------------


def _matmul_kernel_subject(old: str, new: str, target: str = "chunked_matmul_kernel") -> Callable[..., Any]:
    kernel = mutate(matmul_kernels, target, old, new, entry="chunked_matmul_kernel")
    return with_kernel(matmul_kernels, "chunked_matmul_kernel", kernel, matmul_launcher.matmul)


def matmul_dropped_partial_k_tile() -> Callable[..., Any]:
    return _matmul_kernel_subject("k_tiles = tl.cdiv(K, BLOCK_K)", "k_tiles = K // BLOCK_K")


def matmul_dropped_last_product() -> Callable[..., Any]:
    return _matmul_kernel_subject("k_left = K - kt * BLOCK_K", "k_left = K - 1 - kt * BLOCK_K", "_k_step")


def matmul_tma_weight_tile_one_step_late() -> Callable[..., Any]:
    return _matmul_kernel_subject(
        "b = b_desc.load([start_n, kt * BLOCK_K]).T",
        "b = b_desc.load([start_n, (kt + 1) * BLOCK_K]).T",
        "_k_step",
    )


def _fp8_gemm_kernel_subject(old: str, new: str) -> Callable[..., Any]:
    kernel = mutate(matmul_kernels, "chunked_matmul_kernel", old, new)
    return with_kernel(matmul_kernels, "chunked_matmul_kernel", kernel, fp8_gemm_launcher.fp8_gemm)


def fp8_gemm_block_scale_one_block_late() -> Callable[..., Any]:
    return _fp8_gemm_kernel_subject("c = kt // chunk_tiles", "c = (kt + 1) // chunk_tiles")


def fp8_gemm_weight_scale_dropped() -> Callable[..., Any]:
    return _fp8_gemm_kernel_subject(
        "total = total * (tl.load(xs_ptr) * tl.load(ws_scale_ptr))", "total = total * tl.load(xs_ptr)"
    )


def fp8_gemm_token_scale_from_last_row() -> Callable[..., Any]:
    return _fp8_gemm_kernel_subject(
        "x_s = tl.load(xs_ptr + rows * stride_xs_m)", "x_s = tl.load(xs_ptr + (M - 1 - rows) * stride_xs_m)"
    )


def matmul_walk_chunk_boundary_off_by_one() -> Callable[..., Any]:
    return _matmul_kernel_subject(
        "if ((kt + 1) % chunk_tiles == 0) | (kt + 1 == k_tiles):",
        "if (kt % chunk_tiles == 0) | (kt + 1 == k_tiles):",
    )


def _halve_block_k_for_small_m(config: Any, m: int) -> Any:
    if m > 16:
        return config
    return replace(config, tree=replace(config.tree, block_k=max(16, config.tree.block_k // 2)))


def matmul_block_k_from_rows() -> Callable[..., Any]:
    return mutate(  # type: ignore[no-any-return]
        matmul_launcher,
        "plan",
        "cfg = config if config is not None else select_config(_arch_key(device), dtype, n, k, m, scale_layout)",
        "cfg = config if config is not None else halve_block_k_for_small_m("
        "select_config(_arch_key(device), dtype, n, k, m, scale_layout), m)",
        entry="matmul",
        extra_globals={"halve_block_k_for_small_m": _halve_block_k_for_small_m},
    )


#: The execution :func:`matmul_untabled_execution_at_7_rows` runs at M = 7: the table's tree, a
#: split-K tile no row of the interpreter's execution table (nor ``configs``) names.
UNTABLED_EXECUTION = Execution(32, 32, group_m=1, split_k=True)


def _untabled_execution_at_7_rows(config: Any, m: int) -> Any:
    return replace(config, execution=UNTABLED_EXECUTION) if m == 7 else config


def matmul_untabled_execution_at_7_rows() -> Callable[..., Any]:
    """The launcher picks, at M = 7 only, an execution of the same tree that its table does not
    hold: the same bits on the cpu lane (every invariance check passes), but an execution
    ``config_equivalence`` never ran -- which launch provenance must catch, loudly."""
    return mutate(  # type: ignore[no-any-return]
        matmul_launcher,
        "plan",
        "cfg = config if config is not None else select_config(_arch_key(device), dtype, n, k, m, scale_layout)",
        "cfg = config if config is not None else untabled_execution_at_7_rows("
        "select_config(_arch_key(device), dtype, n, k, m, scale_layout), m)",
        entry="matmul",
        extra_globals={"untabled_execution_at_7_rows": _untabled_execution_at_7_rows},
    )


# --- softmax ----------------------------------------------------------------------------------


def softmax_without_max_subtraction() -> Callable[..., Any]:
    subject = softmax_launcher.softmax
    for entry in ("softmax_kernel", "softmax_split_write_kernel"):  # both write through _output
        kernel = mutate(
            softmax_kernels,
            "_output",
            "y = tl.exp(x - row_max) / row_sum",
            "y = tl.exp(x) / (row_sum * tl.exp(row_max))",
            entry=entry,
        )
        subject = with_kernel(softmax_launcher, entry, kernel, subject)
    return subject


def _halve_block_n_below_8_rows(config: Any, num_rows: int) -> Any:
    return replace(config, block_n=max(1, config.block_n // 2)) if num_rows < 8 else config


def softmax_block_from_rows() -> Callable[..., Any]:
    return mutate(  # type: ignore[no-any-return]
        softmax_launcher,
        "launch",
        "config = softmax_config(arch(x.device), x.dtype, n_cols)",
        "config = halve_block_n_below_8_rows(softmax_config(arch(x.device), x.dtype, n_cols), num_rows)",
        entry="softmax",
        extra_globals={"halve_block_n_below_8_rows": _halve_block_n_below_8_rows},
    )


def softmax_split_float_lane_sum() -> Callable[..., Any]:
    kernel = mutate(
        softmax_kernels,
        "softmax_split_write_kernel",
        "row_max, row_sum, log_sum = _row_stats(m, s, FIXED_POINT, FLOAT_PARTS)",
        "row_max, row_sum, log_sum = _row_stats(m, s, False, FLOAT_PARTS)",
    )
    return with_kernel(softmax_launcher, "softmax_split_write_kernel", kernel, softmax_launcher.softmax)


# --- mean -------------------------------------------------------------------------------------

_MEAN_OUT = "out = round_from_f64(fixed_point_lane_sum_f64(acc) / n_cols, y_ptr.dtype.element_ty)"


def _mean_subject(new: str) -> Callable[..., Any]:
    kernel = mutate(mean_kernels, "mean_kernel", _MEAN_OUT, new)
    return with_kernel(mean_launcher, "mean_kernel", kernel, mean_launcher.mean)


def mean_float_lane_sum() -> Callable[..., Any]:
    return _mean_subject("out = round_from_f64(tl.sum(acc, axis=1) / n_cols, y_ptr.dtype.element_ty)")


def mean_fp32_division() -> Callable[..., Any]:
    return _mean_subject(
        "out = round_from_f64((fixed_point_lane_sum_f64(acc).to(tl.float32) / n_cols).to(tl.float64), "
        "y_ptr.dtype.element_ty)"
    )


# --- decode_attention -------------------------------------------------------------------------


def _attention_subject(name: str, kernel: Any) -> Callable[..., Any]:
    return with_kernel(attention_launcher, name, kernel, attention_launcher.decode_attention)


def decode_attention_dropped_last_partial_page() -> Callable[..., Any]:
    kernel = mutate(
        attention_kernels,
        "decode_attention_split_kernel",
        "valid = lane_ok",
        "valid = lane_ok & (t < (length // PAGE_SIZE) * PAGE_SIZE)",
    )
    return _attention_subject("decode_attention_split_kernel", kernel)


def decode_attention_merge_in_descending_order() -> Callable[..., Any]:
    kernel = mutate(
        attention_kernels,
        "decode_attention_merge_kernel",
        "for s in range(0, num_splits):",
        "for s in range(num_splits - 1, -1, -1):",
    )
    return _attention_subject("decode_attention_merge_kernel", kernel)


def moe_combine_reverse_slots() -> Callable[..., torch.Tensor]:
    """The pinned combine kernel summing a token's slots from j = k-1 down to 0 (fp64 still)."""
    from batchinv.fast.moe_combine import launch
    from batchinv.reference.moe_combine import check_moe_combine_args

    def subject(expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        check_moe_combine_args(expert_out, topk_weights)
        return launch(expert_out, topk_weights, reverse=True)

    return subject


def moe_combine_fp32_accumulation() -> Callable[..., torch.Tensor]:
    """The combine with fp32 products and an fp32 accumulator (slot order kept), one cast."""
    from batchinv.reference.moe_combine import canonical_nan, check_moe_combine_args

    def subject(expert_out: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        check_moe_combine_args(expert_out, topk_weights)
        y = expert_out.float()
        terms = y if topk_weights is None else topk_weights[:, :, None] * y
        acc = terms[:, 0]
        for j in range(1, y.shape[1]):
            acc = acc + terms[:, j]
        out = acc.to(expert_out.dtype)
        return torch.where(torch.isnan(acc), canonical_nan(expert_out.dtype).to(acc.device), out)

    return subject


# --- swiglu -----------------------------------------------------------------------------------


def swiglu_silu_rounded_to_bf16() -> Callable[..., Any]:
    """silu(g) rounded to bf16 before the product: the unfused ``F.silu(gate) * up`` precision."""
    kernel = mutate(
        swiglu_kernels,
        "swiglu_kernel",
        "silu = num / (1.0 + e)",
        "silu = exact_fp32(fp32_to_bf16_rne(num / (1.0 + e)))",
    )
    return with_kernel(swiglu_kernels, "swiglu_kernel", kernel, swiglu_launcher.swiglu)


_SWIGLU_ORDER = "out = tl.where(small, silu * (u * s), (silu * u) * s)"


def swiglu_scale_first() -> Callable[..., Any]:
    """``silu * (u * s)`` for every scale (the order before review item 2): u s overflows fp32
    for s > 1 and |u| near the maximum where the exact product is finite."""
    kernel = mutate(swiglu_kernels, "swiglu_kernel", _SWIGLU_ORDER, "out = silu * (u * s)")
    return with_kernel(swiglu_kernels, "swiglu_kernel", kernel, swiglu_launcher.swiglu)


def swiglu_scale_last() -> Callable[..., Any]:
    """``(silu * u) * s`` for every scale: silu u overflows fp32 for s < 1 where the exact
    product is finite (the reorder without the branch on |s|)."""
    kernel = mutate(swiglu_kernels, "swiglu_kernel", _SWIGLU_ORDER, "out = (silu * u) * s")
    return with_kernel(swiglu_kernels, "swiglu_kernel", kernel, swiglu_launcher.swiglu)


def swiglu_no_infinite_limit() -> Callable[..., Any]:
    """The signed-infinity repair dropped: a flushed silu (g < -87) times an infinite u is NaN."""
    kernel = mutate(
        swiglu_kernels,
        "swiglu_kernel",
        "out = tl.where((out != out) & lost, tl.where(neg, NEG_INF, POS_INF), out)",
        "out = out",
    )
    return with_kernel(swiglu_kernels, "swiglu_kernel", kernel, swiglu_launcher.swiglu)


# --- fp8_quant --------------------------------------------------------------------------------


def fp8_quant_truncating_e4m3() -> Callable[..., Any]:
    """The e4m3 rounding of normal values truncates (drops 20 mantissa bits) instead of rounding
    to nearest even: the bit trick without its rounding bias."""
    kernel = mutate(
        fp8_quant_kernels,
        "e4m3_rne_satfinite",
        "normal = ((an + 0x7FFFF + ((an >> 20) & 1)) >> 20) - (120 << 3)",
        "normal = (an >> 20) - (120 << 3)",
        entry="fp8_quant_kernel",
    )
    return with_kernel(fp8_quant_kernels, "fp8_quant_kernel", kernel, fp8_quant_launcher.fp8_quant)


def fp8_quant_amax_over_launch_tile() -> Callable[..., Any]:
    """amax taken over the program's whole row block instead of per row: the scale of a token
    depends on the tokens launched beside it (a batch-wide dynamic scale)."""
    kernel = mutate(
        fp8_quant_kernels,
        "fp8_quant_kernel",
        "amax = tl.max(_finite_abs(xf), axis=1)",
        "amax = tl.max(tl.max(tl.where(mask, _finite_abs(xf), 0.0), axis=1), axis=0) + tl.zeros([BLOCK_M], dtype=tl.float32)",
    )
    return with_kernel(fp8_quant_kernels, "fp8_quant_kernel", kernel, fp8_quant_launcher.fp8_quant)


# --- moe_router -------------------------------------------------------------------------------


def _moe_router_subject(kernel: Any) -> Callable[..., Any]:
    return with_kernel(moe_router_launcher, "moe_router_kernel", kernel, moe_router_launcher.moe_router)


def moe_router_ties_to_higher_id() -> Callable[..., Any]:
    kernel = mutate(
        moe_router_kernels,
        "moe_router_kernel",
        "pick = tl.min(tl.where(candidate & (key_flat == best), expert_flat, ID_SENTINEL), axis=0)",
        "pick = tl.max(tl.where(candidate & (key_flat == best), expert_flat, -1), axis=0)",
    )
    return _moe_router_subject(kernel)


def _moe_router_group_ties_to_higher_id_kernel() -> Any:
    return mutate(
        moe_router_kernels,
        "moe_router_kernel",
        "first = tl.min(tl.where(~kept & (gkey == best_group), offs_g, ID_SENTINEL), axis=0)",
        "first = tl.max(tl.where(~kept & (gkey == best_group), offs_g, -1), axis=0)",
    )


def moe_router_weights_through_bf16() -> Callable[..., Any]:
    kernel = mutate(
        moe_router_kernels,
        "moe_router_kernel",
        "tl.store(weights_ptr + row * stride_weights_row + offs_k, p.to(tl.float32), mask=in_k)",
        "tl.store(weights_ptr + row * stride_weights_row + offs_k, p.to(tl.bfloat16).to(tl.float32), mask=in_k)",
    )
    return _moe_router_subject(kernel)


_ROUTER_STORE = "tl.store(weights_ptr + row * stride_weights_row + offs_k, p.to(tl.float32), mask=in_k)"


def _moe_router_one_ulp_up(where: str) -> Callable[..., Any]:
    """The stored fp32 weight one ULP up (its bits plus one) on the lanes where ``where`` holds."""
    one_up = "(p.to(tl.float32).to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True)"
    stored = f"tl.where({where}, {one_up}, p.to(tl.float32))"
    kernel = mutate(
        moe_router_kernels,
        "moe_router_kernel",
        _ROUTER_STORE,
        _ROUTER_STORE.replace("p.to(tl.float32),", f"{stored},"),
    )
    return _moe_router_subject(kernel)


def moe_router_weight_one_ulp_top_of_binade() -> Callable[..., Any]:
    w = "p.to(tl.float32)"
    return _moe_router_one_ulp_up(f"(offs_k == 0) & ({w} >= 0.5) & ({w} < 1.0)")


def moe_router_weight_one_ulp_last_slot() -> Callable[..., Any]:
    return _moe_router_one_ulp_up("offs_k == K - 1")


# --- moe_align --------------------------------------------------------------------------------


def moe_align_groups_not_padded() -> Callable[..., Any]:
    kernel = mutate(
        moe_align_kernels,
        "moe_align_scan_kernel",
        "padded = (total + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M",
        "padded = total",
    )
    return with_kernel(moe_align_launcher, "moe_align_scan_kernel", kernel, moe_align_launcher.moe_align)


# --- grouped_gemm -----------------------------------------------------------------------------


def grouped_gemm_dropped_partial_k_tile() -> Callable[..., Any]:
    kernel = mutate(
        grouped_gemm_kernels,
        "grouped_gemm_kernel",
        "k_tiles = tl.cdiv(k_hi - k_lo, BLOCK_K)",
        "k_tiles = (k_hi - k_lo) // BLOCK_K",
    )
    return with_kernel(
        grouped_gemm_kernels, "grouped_gemm_kernel", kernel, grouped_gemm_launcher.grouped_gemm
    )


def _halve_block_k_for_small_experts(checked: Any, sorted_ids: Any, block_expert: Any) -> Any:
    """``(args, config)`` with BLOCK_K halved when the launch's largest expert M is <= 4."""
    from batchinv.reference.grouped_gemm import row_experts

    args, config = checked
    counts = row_experts(sorted_ids, block_expert, args)[1].bincount(minlength=args.e)
    if int(counts.max()) <= 4:
        config = replace(config, block_k=max(16, config.block_k // 2))
    return args, config


def grouped_gemm_block_k_from_expert_m() -> Callable[..., Any]:
    return mutate(  # type: ignore[no-any-return]
        grouped_gemm_launcher,
        "grouped_gemm",
        "args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)",
        "args, cfg = halve_block_k_for_small_experts("
        "checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot), sorted_ids, block_expert)",
        extra_globals={"halve_block_k_for_small_experts": _halve_block_k_for_small_experts},
    )


# --- fused_moe -------------------------------------------------------------------------------


def fused_moe_weights_applied_twice() -> Callable[..., Any]:
    import batchinv.fast.fused_moe as fused_moe_launcher

    return mutate(  # type: ignore[no-any-return]
        fused_moe_launcher,
        "compose",
        "out = combine(down, None if apply_router_weight_on_input else topk_weights)",
        "out = combine(down, topk_weights)",
        entry="fused_moe",
    )


def _fused_moe_with_router(router: Callable[..., Any]) -> Callable[..., Any]:
    """The shipped layer with ``router`` in place of the pinned ``moe_router`` (one line)."""
    import batchinv.fast.fused_moe as fused_moe_launcher

    return mutate(  # type: ignore[no-any-return]
        fused_moe_launcher,
        "compose",
        "topk_weights, topk_ids = moe_router(",
        "topk_weights, topk_ids = mutant_router(",
        entry="fused_moe",
        extra_globals={"mutant_router": router},
    )


def fused_moe_expert_ties_to_higher_id() -> Callable[..., Any]:
    return _fused_moe_with_router(moe_router_ties_to_higher_id())


def fused_moe_group_ties_to_higher_id() -> Callable[..., Any]:
    return _fused_moe_with_router(_moe_router_subject(_moe_router_group_ties_to_higher_id_kernel()))


# --- operators (the modes check) ----------------------------------------------------------------


def softmax_operator_unpinned_when_compiled() -> Callable[..., Any]:
    import torch

    def subject(x: Any, dim: int = -1, half_to_float: bool = False) -> Any:
        if torch.compiler.is_compiling():
            return torch.softmax(x, dim, dtype=torch.float32 if half_to_float else None)
        return torch.ops.batchinv.softmax(x, dim, half_to_float)

    return subject


def log_softmax_operator_left_to_the_compiler() -> Callable[..., Any]:
    """Issue 25: the operator answers ``torch.log_softmax`` while ``torch.compile`` traces it, so
    the compiled graph runs the compiler's own log-softmax (Inductor's on GPU lanes, aten's under
    the cpu lane's aot_eager).  ``modes`` fails it twice on each cpu case: the compiled call ran
    no ``batchinv::log_softmax`` at run time (the check's operator count, on every case and every
    compiled M), and the bits differ (on these cases; where the compiler's bits equal the kernel's
    only the count sees it: tests/harness/test_harness_invariance.py).  The same leak planted in
    ``enable()``'s torch-function handler, the one that survived the cpu lane, is caught in
    tests/integration/test_enable.py."""
    import torch

    def subject(x: Any, dim: int = -1, half_to_float: bool = False) -> Any:
        if torch.compiler.is_compiling():
            return torch.log_softmax(x, dim, dtype=torch.float32 if half_to_float else None)
        return torch.ops.batchinv.log_softmax(x, dim, half_to_float)

    return subject


def matmul_bucket_frozen_at_trace_time() -> Callable[..., Any]:
    """vLLM's compiled batch-invariant matmul (public issue): the M bucket is looked up in Python
    while Dynamo traces, from the traced M, without a guard, so the compiled graph keeps the
    bucket of its first M for every runtime M.  The buckets' configs differ in bits here (above
    16 rows K is summed in two slices), as untested per-M configs may."""
    import torch

    def traced_m(x: Any) -> int:
        m = x.shape[0]
        return int(m.node.hint) if isinstance(m, torch.SymInt) else int(m)  # no guard: frozen

    def subject(
        x: Any,
        weight: Any,
        bias: Any = None,
        *,
        layout: str = "linear",
        out_dtype: Any = None,
        precision: str = "ieee",
    ) -> Any:
        if traced_m(x) <= 16 or x.shape[1] < 2:
            return torch.ops.batchinv.matmul(x, weight, bias, layout, out_dtype, precision)
        half = x.shape[1] // 2
        w_lo, w_hi = (
            (weight[:, :half], weight[:, half:]) if layout == "linear" else (weight[:half], weight[half:])
        )
        lo = torch.ops.batchinv.matmul(x[:, :half], w_lo, None, layout, torch.float32, precision)
        hi = torch.ops.batchinv.matmul(x[:, half:], w_hi, None, layout, torch.float32, precision)
        acc = lo + hi if bias is None else lo + hi + bias.float()
        return acc.to(out_dtype or x.dtype)

    return subject


# --- tp_linear --------------------------------------------------------------------------------


def tp_linear_gathered_in_reverse_rank_order() -> Callable[..., Any]:
    """The all-reduce gathers the ranks' chunk sums last rank first (each rank's own chunks
    still in order): the chunk chain is another association at every degree above 1."""
    return mutate(  # type: ignore[no-any-return]
        tp_linear_launcher,
        "tp_linear",
        "ws = torch.stack([partial for rank in gathered for partial in rank])  # [chunks, M, N] fp32",
        "ws = torch.stack([partial for rank in reversed(gathered) for partial in rank])",
    )


# --- rms_norm ---------------------------------------------------------------------------------

_RMS_CONFIG = "config = config_for(arch(x.device), x.dtype, x.shape[1])"


def _fp32_sum_above(rows: int) -> Callable[[Any, int], Any]:
    def pick(config: Any, num_rows: int) -> Any:
        return replace(config, fp64_sum=False) if num_rows > rows else config

    return pick


def rms_norm_eps_by_tile_max() -> Callable[..., Any]:
    """eps scaled by the largest mean square of the program's row tile (a guard sized from the
    batch's dynamic range): a row's rstd follows the values of the rows launched beside it."""
    kernel = mutate(
        rms_norm_kernels,
        "_rstd_split",
        "rstd = 1.0 / tl.sqrt(mean_sq + tl.full([BLOCK_M], eps, tl.float32).to(tl.float64))",
        "rstd = 1.0 / tl.sqrt(mean_sq + tl.full([BLOCK_M], eps, tl.float32).to(tl.float64) * tl.max(mean_sq, axis=0))",
        entry="rms_norm_rows_kernel",
    )
    return with_kernel(rms_norm_launcher, "rms_norm_rows_kernel", kernel, rms_norm_launcher.rms_norm)


def rms_norm_fp32_sum_above(rows: int) -> Callable[..., Any]:
    """The rms_norm launcher with a config keyed on the batch: above ``rows`` rows it takes the
    fp32-accumulating config (the squares summed in fp32, in the tile's fp32 order)."""
    return mutate(  # type: ignore[no-any-return]
        rms_norm_launcher,
        "rms_norm",
        _RMS_CONFIG,
        "config = fp32_sum_above(config_for(arch(x.device), x.dtype, x.shape[1]), x.shape[0])",
        extra_globals={"fp32_sum_above": _fp32_sum_above(rows)},
    )
