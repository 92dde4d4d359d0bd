"""Registry entry ``moe_router``: token-wise MoE routing (docs/MOE.md, section 1).

Inputs are built row by row from a seed and a CPU ``torch.Generator``: each token's logits row
has a *kind* (what decides its selection: exact ties, every special bit pattern, signed zeros,
a -inf plateau, sigmoid saturation to fp32 1.0...), injected into a realistic background from
raw bits (:mod:`batchinv.harness.bitpatterns`).  Layouts: contiguous, or ``strided`` (the logits
are every other column of a NaN-filled buffer: the kernel must read only its lanes).

Agreement: the ids are exact (a bound of 0: integer selection on the same fp32 keys); the
weights are the reference rounded once to fp32, bitwise, except within fp64 slack of a rounding
midpoint, where either fp32 neighbour is admitted: see :func:`weights_envelope` and docs/MOE.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast.baselines.moe_router import bf16_large_batch_router, torch_topk_router
from batchinv.fast.moe_router import moe_router as fast_moe_router
from batchinv.harness import bitpatterns as bp
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    Toleranced,
)
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.moe_router import moe_router as reference_moe_router
from batchinv.reference.moe_router import weights_bound as reference_weights_bound
from batchinv.reference.moe_router import weights_envelope as reference_weights_envelope

NAME = "moe_router"
F32 = torch.float32

#: Row kinds, cycled by ``mixed`` rows (row i of seed s: (s + i) % len).
ROW_KINDS: tuple[str, ...] = (
    "ties",  # logits quantized to halves: duplicated logits at the cutoff
    "specials",  # every catalogue pattern (NaNs of both signs, +-inf, +-0, subnormals) at 20%
    "normal",
    "all_equal",  # one value: every expert ties
    "signed_zeros",  # +0 and -0 plateau with a few normals
    "saturating",  # |logit| up to ~60: fp32 sigmoid saturates to 1.0 (ties of the sigmoid key)
    "neg_inf_plateau",  # most logits -inf
    "negative_nans",  # -inf, negative NaNs, 0xffffffff, 0xfffffffe among normals
)
LAYOUTS: tuple[str, ...] = ("contiguous", "strided")
BIASES: tuple[str, ...] = ("none", "random", "quantized")

_NEGATIVE_NANS = ("-inf", "-quiet_nan", "-signalling_nan", "all_ones_nan", "all_ones_minus_one_nan")


def build_row(kind: str, num_experts: int, gen: torch.Generator) -> torch.Tensor:
    """One token's logits of ``kind``: float32 ``[E]`` on the CPU, a function of ``gen``'s state."""
    normal = torch.randn(num_experts, generator=gen) * 2.0
    if kind == "normal":
        return normal
    if kind == "ties":
        return bp.quantized(normal, 2)
    if kind == "all_equal":
        return torch.full((num_experts,), float(normal[0]))
    if kind == "specials":
        return bp.inject(normal, bp.catalogue(F32), 0.2, gen)
    if kind == "signed_zeros":
        zeros = torch.where(torch.rand(num_experts, generator=gen) < 0.5, 0.0, -0.0)
        return torch.where(torch.rand(num_experts, generator=gen) < 0.8, zeros, normal)
    if kind == "saturating":
        return bp.quantized(normal * 30.0, 1)
    if kind == "neg_inf_plateau":
        return torch.where(torch.rand(num_experts, generator=gen) < 0.3, normal, torch.tensor(float("-inf")))
    if kind == "negative_nans":
        return bp.inject(normal, [bp.pattern(F32, n) for n in _NEGATIVE_NANS], 0.4, gen)
    raise ValueError(f"kind: expected one of {ROW_KINDS}, got {kind!r}")


def build_bias(kind: str, num_experts: int, gen: torch.Generator) -> torch.Tensor | None:
    """The correction bias: None, small random values, or quantized ones (ties after the add)."""
    if kind == "none":
        return None
    values = torch.randn(num_experts, generator=gen) * 0.05
    if kind == "random":
        return values
    if kind == "quantized":
        return bp.quantized(values, 64)
    raise ValueError(f"bias: expected one of {BIASES}, got {kind!r}")


def build(case: Case, device: torch.device) -> Batch:
    """The case's batch: logits ``[T, E]`` (rows) and the routing arguments (shared)."""
    axes = case.axes
    num_rows, num_experts = int(axes["num_rows"]), int(axes["num_experts"])
    gen = torch.Generator().manual_seed(case.seed)
    rows = str(axes["rows"])
    if rows == "mixed":
        kinds = [ROW_KINDS[(case.seed + i) % len(ROW_KINDS)] for i in range(num_rows)]
    elif rows in ROW_KINDS:
        kinds = [rows] * num_rows
    else:
        raise ValueError(f"rows: expected 'mixed' or one of {ROW_KINDS}, got {rows!r}")
    logits = (
        torch.stack([build_row(kind, num_experts, gen) for kind in kinds])
        if num_rows
        else torch.empty(0, num_experts)
    )
    # The bias is a model weight shared by every token: a function of (kind, E) alone, so the
    # position check's neighbours (another seed) see the same one.
    bias = build_bias(str(axes["bias"]), num_experts, torch.Generator().manual_seed(num_experts))
    if axes["layout"] == "strided":  # every other column of a NaN-filled buffer
        buffer = torch.full((num_rows, 2 * num_experts), float("nan"))
        buffer[:, ::2] = logits
        logits = buffer.to(device)[:, ::2]
    else:
        logits = logits.to(device)
    shared: dict[str, Any] = {
        "top_k": int(axes["top_k"]),
        "scoring": str(axes["scoring"]),
        "renormalize": bool(axes["renormalize"]),
        "correction_bias": bias.to(device) if bias is not None else None,
        "n_group": int(axes["n_group"]),
        "topk_group": int(axes["topk_group"]),
    }
    return Batch({"logits": logits}, shared)


def make_case(
    num_rows: int,
    num_experts: int,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    bias: str = "none",
    n_group: int = 1,
    topk_group: int = 1,
    rows: str = "mixed",
    layout: str = "contiguous",
    seed: int = 0,
) -> Case:
    """A ``moe_router`` case (``rows``: a row kind, or "mixed" cycling the kinds with the seed)."""
    axes = {
        "num_rows": num_rows,
        "num_experts": num_experts,
        "top_k": top_k,
        "scoring": scoring,
        "renormalize": renormalize,
        "bias": bias,
        "n_group": n_group,
        "topk_group": topk_group,
        "rows": rows,
        "layout": layout,
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> Sequence[Case]:
    """Sweep cases: small E and T on the cpu lane (every row kind, k in {1, 2, 8}, both scorings,
    bias kinds, groups, layouts); the issue's three production shapes on GPU lanes."""
    if lane is Lane.CPU:  # ~50-140 ms per row in the interpreter: 5-6 rows a case
        return [
            make_case(6, 8, 2, seed=0),  # Mixtral-like
            make_case(5, 16, 8, renormalize=True, layout="strided", seed=1),
            make_case(5, 64, 1, seed=2),
            make_case(5, 8, 8, renormalize=True, seed=3),  # k = E
            make_case(5, 64, 8, "sigmoid", True, "random", 8, 4, seed=4),  # DeepSeek-V3-like
            make_case(5, 16, 2, "sigmoid", False, "quantized", 4, 2, layout="strided", seed=5),
            make_case(5, 16, 8, "softmax", True, n_group=4, topk_group=2, seed=6),  # grouped softmax
            make_case(6, 16, 2, "sigmoid", True, "quantized", 8, 1, rows="saturating", seed=7),
            make_case(4, 8, 8, "sigmoid", True, seed=8),  # k = E, sigmoid: the sum is not 1
            make_case(4, 32, 4, "sigmoid", True, n_group=8, topk_group=2, rows="normal", seed=9),
        ]
    return [
        make_case(2048, 128, 8, "softmax", True, seed=0),  # Qwen3-30B-A3B-like
        make_case(65, 128, 8, "softmax", True, rows="ties", layout="strided", seed=1),
        make_case(2048, 256, 8, "sigmoid", True, "random", 8, 4, seed=2),  # DeepSeek-V3-like
        make_case(65, 256, 8, "sigmoid", True, "quantized", 8, 4, rows="saturating", seed=3),
        make_case(2048, 8, 2, "softmax", False, seed=4),  # Mixtral-like
        make_case(65, 8, 2, "softmax", True, rows="specials", seed=5),
    ]


def bench_cases(lane: Lane) -> Sequence[Case]:
    """``batchinv bench moe_router``: the three production shapes at T in {1, 64, 2048}."""
    shapes = (
        (128, 8, "softmax", True, "none", 1, 1),
        (256, 8, "sigmoid", True, "random", 8, 4),
        (8, 2, "softmax", False, "none", 1, 1),
    )
    return [
        make_case(t, e, k, sc, rn, b, g, tg, rows="normal", seed=t + e)
        for (e, k, sc, rn, b, g, tg) in shapes
        for t in (1, 64, 2048)
    ]


def weights_envelope(batch: Batch, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` float64 ``[T, k]``: the fp32 values the fast weight may take (both ends in):
    :func:`batchinv.reference.moe_router.weights_envelope` of the batch's arguments."""
    return reference_weights_envelope(**batch.kwargs(), weights=weights)


def weights_bound(batch: Batch, ref_out: Outputs) -> Outputs:
    """Per-element bound of ``|fast - reference|``: ``(weights bound, ids bound 0)``, the weights'
    from :func:`batchinv.reference.moe_router.weights_bound` (NaN where the reference is NaN:
    there only the class is compared)."""
    bound = reference_weights_bound(**batch.kwargs(), weights=ref_out[0])
    return bound, torch.zeros((), dtype=torch.float64)


def weights_exact(batch: Batch, ref_out: Outputs) -> Outputs:
    """Where the envelope is one fp32 value (``lo == hi``, nearly every element): there the fast
    weight must be the reference rounded once, bitwise.  The ids are not roundable (int32)."""
    lo, hi = weights_envelope(batch, ref_out[0])
    return lo == hi, torch.zeros((), dtype=torch.bool)


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    """Bad inputs: each raises a typed error naming the argument, the expectation and the value."""
    logits = torch.zeros(4, 16, device=device)
    bias = torch.zeros(16, device=device)
    ok: dict[str, Any] = {
        "logits": logits,
        "top_k": 2,
        "scoring": "sigmoid",
        "renormalize": True,
        "correction_bias": bias,
        "n_group": 4,
        "topk_group": 2,
    }
    meta = torch.device("meta")
    out = [
        ErrorCase("top_k_above_E", {**ok, "top_k": 17}, ArgumentError, r"'top_k'.*\[1, E = 16\].*17"),
        ErrorCase("top_k_zero", {**ok, "top_k": 0}, ArgumentError, r"'top_k'.*\[1, E = 16\].*0"),
        ErrorCase("top_k_negative", {**ok, "top_k": -1}, ArgumentError, r"'top_k'.*-1"),
        ErrorCase("top_k_float", {**ok, "top_k": 2.0}, DTypeError, r"'top_k'.*integral.*float"),
        ErrorCase("top_k_bool", {**ok, "top_k": True}, DTypeError, r"'top_k'.*integral.*bool"),
        ErrorCase("top_k_above_kept_groups", {**ok, "top_k": 9}, ArgumentError, r"'top_k'.*kept experts.*9"),
        ErrorCase("n_group_not_dividing", {**ok, "n_group": 3}, ArgumentError, r"'n_group'.*dividing E.*3"),
        ErrorCase("n_group_zero", {**ok, "n_group": 0}, ArgumentError, r"'n_group'.*0"),
        ErrorCase(
            "topk_group_above_n_group",
            {**ok, "topk_group": 5},
            ArgumentError,
            r"'topk_group'.*n_group = 4.*5",
        ),
        ErrorCase("topk_group_zero", {**ok, "topk_group": 0}, ArgumentError, r"'topk_group'.*0"),
        ErrorCase(
            "bias_wrong_length",
            {**ok, "correction_bias": bias[:8]},
            ArgumentError,
            r"'correction_bias'.*length E = 16.*8",
        ),
        ErrorCase(
            "bias_rank_2",
            {**ok, "correction_bias": bias[None]},
            ArgumentError,
            r"'correction_bias'.*1-D.*2-D",
        ),
        ErrorCase(
            "bias_bfloat16",
            {**ok, "correction_bias": bias.bfloat16()},
            DTypeError,
            r"'correction_bias'.*float32.*bfloat16",
        ),
        ErrorCase(
            "bias_with_softmax", {**ok, "scoring": "softmax"}, ArgumentError, r"'correction_bias'.*softmax"
        ),
        ErrorCase(
            "logits_bfloat16", {**ok, "logits": logits.bfloat16()}, DTypeError, r"'logits'.*float32.*bfloat16"
        ),
        ErrorCase(
            "logits_float64", {**ok, "logits": logits.double()}, DTypeError, r"'logits'.*float32.*float64"
        ),
        ErrorCase("logits_rank_3", {**ok, "logits": logits[None]}, ArgumentError, r"'logits'.*2-D.*3-D"),
        ErrorCase(
            "logits_not_tensor", {**ok, "logits": [[0.0]]}, DTypeError, r"'logits'.*torch\.Tensor.*list"
        ),
        ErrorCase(
            "scoring_unknown", {**ok, "scoring": "softmax2"}, ArgumentError, r"'scoring'.*sigmoid.*softmax2"
        ),
        ErrorCase("scoring_none", {**ok, "scoring": None}, ArgumentError, r"'scoring'.*sigmoid.*None"),
        ErrorCase("renormalize_int", {**ok, "renormalize": 1}, DTypeError, r"'renormalize'.*bool.*int"),
        ErrorCase(
            "bias_on_meta", {**ok, "correction_bias": bias.to(meta)}, DeviceError, r"'correction_bias'.*meta"
        ),
    ]
    if device.type == "cuda":
        host = {**ok, "logits": logits.cpu(), "correction_bias": bias.cpu()}
        out.append(
            ErrorCase(
                "host_tensors_on_gpu_path", host, DeviceError, r"'logits'.*CUDA.*cpu", applies_to=("fast",)
            )
        )
    return out


COMPONENT = Component(
    name=NAME,
    summary="MoE router: top-k experts per token (softmax / sigmoid + bias, grouped), ids exact, fp32 weights",
    reference=reference_moe_router,
    fast=fast_moe_router,
    baselines=(
        Baseline(
            name="torch_topk_router",
            fn=torch_topk_router,
            why=(
                "fp32 scores and torch.topk: ties broken in no specified order, on a GPU by an algorithm "
                "chosen from the shape (T included); measured inconclusive on the H200 (torch 2.11, "
                "2026-11-30: its ties came out the same at every batch), so reported, not asserted"
            ),
            expected_to_vary_on=frozenset(),
        ),
        Baseline(
            name="bf16_large_batch_router",
            fn=bf16_large_batch_router,
            why=(
                "a dispatch on the token count: above 4 tokens the logits go through bf16 (a large-batch "
                "path taking the activation dtype), so a token's weights depend on T"
            ),
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound=weights_bound,
        justification=(
            "ids: integer selection on identical fp32 keys, bound 0 (exact); weights: fp64 scores rounded "
            "once to fp32, where exp's implementation (libm / NumPy / libdevice) and the softmax "
            "denominator's summation order differ by fp64 ULPs ((4E + 2k + 18) u64 relative): the fast "
            "weight is one of the fp32 values from fp32(v - s) to fp32(v + s), v the reference; the "
            "bound is the distance to the farther of them (weights_envelope)"
        ),
        out_dtypes=lambda batch: (torch.float32, torch.int32),
        exact=weights_exact,
        exact_justification=(
            "weights whose fp64 envelope [v - s, v + s] holds no fp32 rounding midpoint: the kernel's "
            "fp64 weight rounds to fp32(v) whichever exp and summation order it used"
        ),
    ),
    error_cases=error_cases,
    bench_cases=bench_cases,
)
