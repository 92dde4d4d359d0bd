"""Registry entry ``moe_combine`` (docs/MOE.md section 5): out[t] = sum_j w[t, j] * y[t, j].

Token-wise: every row check applies (batch_prefix, position; no row window, so no row_start)
plus repeat.  Agreement is Exact: the kernel and the reference do the same IEEE fp64 products and
sums in the same slot order (no FMA contraction) and one rounding.

Value kinds of ``expert_out`` (y) and ``topk_weights`` (w), built from the seed on the CPU:

* ``normal``: y ~ N(0, 1) in y's dtype, w uniform in [0, 1) (fp32);
* ``specials``: y with NaN, +-inf, -0 and subnormals injected; w with 0, -0 and NaN;
* ``cancel``: values whose fp64 sum depends on the order and on the precision.  For k >= 5 each
  element holds [B, -B, S, s, -S, small...] with one weight per token for every slot, B ~ 2**50,
  S ~ 2**16, s ~ 1: in slot order the big terms cancel exactly and s survives; summed in reverse
  s is lost to B's grid, and in fp32 s is rounded to S's grid.  For k < 5, slots 0 and 1 hold
  B and -B with weights that differ in their last bits, so the fp64 difference of the products
  is exact and fp32 products lose it.
* ``tie16`` (k >= 3): sums just off a rounding tie of the output dtype, ``v * (m + h +- d)``
  with ``v = +-2^e``, ``m`` a random p-bit significand, ``h`` half its ULP and ``d`` = 2^-40
  (2^-44 for fp32) towards the odd neighbour (slot 0 ``v m`` weight 1, slot 1 ``v`` weight ``h``,
  slot 2 ``v`` weight ``+-d``, later slots weight 0): the fp64 sum is exact and rounds once away
  from the tie, while a rounding through fp32 first lands on the tie and goes to even (the
  double rounding fp64 -> fp32 -> 16 bit, issue 25 section 6).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchinv.fast.baselines.moe_combine import atomic_add_moe_combine, token_count_dispatch_moe_combine
from batchinv.fast.moe_combine import moe_combine as fast_moe_combine
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import ALL_LANES, GPU_LANES, Baseline, Batch, Case, Component, ErrorCase, Exact
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError
from batchinv.reference.moe_combine import DTYPES
from batchinv.reference.moe_combine import moe_combine as reference_moe_combine

NAME = "moe_combine"
VALUES: tuple[str, ...] = ("normal", "specials", "cancel", "tie16")
#: Significand bits (with the implicit one) of each output dtype: where its rounding ties lie.
_PRECISION = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


def _mantissa(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return 1.0 + torch.randint(0, 128, shape, generator=gen).double() / 128.0  # 8 bits: exact in bf16


def build_values(
    kind: str, num_tokens: int, top_k: int, hidden: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y [T, k, H] of dtype, w [T, k] fp32)`` on the CPU."""
    y = torch.randn(num_tokens, top_k, hidden, generator=gen)
    w = torch.rand(num_tokens, top_k, generator=gen)
    if kind == "normal":
        return y.to(dtype), w
    if kind == "specials":
        y = y.to(dtype)
        flat = y.view(-1)
        pick = torch.rand(flat.shape, generator=gen)
        tiny = torch.tensor([1, 3, -1], dtype=torch.int16 if dtype != torch.float32 else torch.int32)
        sub = tiny.view(dtype)  # min subnormal, 3 * min subnormal, and a negative NaN pattern
        flat[pick < 0.02] = float("nan")
        flat[(pick >= 0.02) & (pick < 0.04)] = float("inf")
        flat[(pick >= 0.04) & (pick < 0.06)] = float("-inf")
        flat[(pick >= 0.06) & (pick < 0.10)] = -0.0
        flat[(pick >= 0.10) & (pick < 0.13)] = sub[0]
        flat[(pick >= 0.13) & (pick < 0.16)] = -sub[1]
        flat[(pick >= 0.16) & (pick < 0.17)] = sub[2]
        wp = torch.rand(w.shape, generator=gen)
        w[wp < 0.1] = 0.0
        w[(wp >= 0.1) & (wp < 0.2)] = -0.0
        w[(wp >= 0.2) & (wp < 0.25)] = float("nan")
        return y, w
    if kind == "cancel":
        shape = (num_tokens, hidden)
        sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()
        big = sign * _mantissa(shape, gen) * 2.0**50
        y64 = y.double()
        if top_k >= 5:
            mid = _mantissa(shape, gen) * 2.0**16
            y64[:, 0], y64[:, 1] = big, -big
            y64[:, 2], y64[:, 4] = mid, -mid
            y64[:, 3] = _mantissa(shape, gen) * sign
            w[:] = w[:, :1]  # one weight per token: the big terms cancel exactly
        else:
            y64[:, 0] = big
            if top_k >= 2:
                y64[:, 1] = -big
                w[:, 1] = (
                    w[:, 0].view(torch.int32)
                    + torch.randint(1, 200, (num_tokens,), generator=gen, dtype=torch.int32)
                ).view(torch.float32)
        if dtype == torch.float16:  # fp16 holds no 2**50: scale the pattern into its range
            y64 = y64 * 2.0**-40
        return y64.to(dtype), w
    if kind == "tie16":
        return _tie16(num_tokens, top_k, hidden, dtype, gen)
    raise ValueError(f"values: expected one of {VALUES}, got {kind!r}")


def _tie16(
    num_tokens: int, top_k: int, hidden: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``tie16`` values (module docstring): per token one significand, per element a sign
    and an exponent in [-6, 6]; slots 0..2 as described, the rest weight 0."""
    if top_k < 3:
        raise ValueError(f"tie16: expected k >= 3, got {top_k}")
    p = _PRECISION[dtype]
    ulp = 2.0 ** (1 - p)
    odd = torch.randint(0, 2, (num_tokens,), generator=gen).double()  # the significand's last bit
    m = 1.0 + (2 * torch.randint(0, 2 ** (p - 2), (num_tokens,), generator=gen).double() + odd) * ulp
    # away from even: up from an even significand, down from an odd one
    d = torch.where(odd == 0, 1.0, -1.0) * (2.0**-44 if dtype == torch.float32 else 2.0**-40)
    shape = (num_tokens, hidden)
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()
    v = sign * torch.exp2(torch.randint(-6, 7, shape, generator=gen).double())
    y = torch.zeros(num_tokens, top_k, hidden, dtype=torch.float64)
    y[:, 0] = v * m[:, None]
    y[:, 1] = v
    y[:, 2] = v
    w = torch.zeros(num_tokens, top_k, dtype=torch.float64)
    w[:, 0], w[:, 1], w[:, 2] = 1.0, ulp / 2, d
    return y.to(dtype), w.float()


def build(case: Case, device: torch.device) -> Batch:
    """Rows ``expert_out`` (and ``topk_weights`` unless the case's weights are None)."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, a["dtype"])
    y, w = build_values(str(a["values"]), int(a["T"]), int(a["k"]), int(a["H"]), dtype, gen)
    if a.get("layout", "contiguous") == "strided":  # slot-major storage: y[t, j] strides (H, T*H)
        y = y.transpose(0, 1).contiguous().transpose(0, 1)
    if a.get("weights", True):
        return Batch({"expert_out": y.to(device), "topk_weights": w.to(device)})
    return Batch({"expert_out": y.to(device)}, {"topk_weights": None})


def make_case(
    num_tokens: int,
    top_k: int,
    hidden: int,
    dtype: str = "bfloat16",
    values: str = "normal",
    weights: bool = True,
    layout: str = "contiguous",
    seed: int = 0,
) -> Case:
    axes = {
        "T": num_tokens,
        "k": top_k,
        "H": hidden,
        "dtype": dtype,
        "values": values,
        "weights": weights,
        "layout": layout,
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> Sequence[Case]:
    c = make_case
    out = [
        # first: cancelling rows past the dispatch threshold (the cpu negative control finds it here)
        c(17, 8, 64, values="cancel", seed=1),
        c(9, 1, 96, values="specials", seed=2),
        c(17, 2, 64, values="cancel", seed=3),
        c(7, 8, 96, values="specials", seed=4),
        c(8, 2, 64, "float16", "normal", weights=False, seed=5),
        c(8, 8, 96, "float32", "cancel", layout="strided", seed=6),
        c(7, 8, 64, values="cancel", weights=False, seed=7),
        c(1, 2, 64, values="normal", seed=8),
        # just off a 16-bit tie: a double rounding fp64 -> fp32 -> 16 bit goes to even
        c(5, 3, 32, values="tie16", seed=9),
        c(5, 4, 32, "float16", "tie16", layout="strided", seed=10),
    ]
    if lane.is_gpu:
        out += [
            c(4096, 8, 4096, values="normal", seed=10),
            c(2048, 8, 7168, values="cancel", seed=11),
            c(1000, 2, 2048, values="specials", seed=12),
            c(4096, 6, 5120, "float16", "normal", weights=False, seed=13),
            c(513, 8, 4096, "float32", "cancel", layout="strided", seed=14),
            c(1000, 8, 4096, values="tie16", seed=15),
            c(1000, 6, 2048, "float16", "tie16", seed=16),
        ]
    return out


def bench_cases(lane: Lane) -> Sequence[Case]:
    if not lane.is_gpu:
        return []
    return [make_case(t, 8, 4096, seed=t) for t in (1, 64, 1024, 8192)]


def bench_bytes(batch: Batch) -> int:
    y = batch.rows["expert_out"]
    return y.numel() * y.element_size() * (y.shape[1] + 1) // max(y.shape[1], 1)


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    y = torch.zeros(3, 2, 8, dtype=torch.bfloat16, device=device)
    w = torch.zeros(3, 2, device=device)
    ok = {"expert_out": y, "topk_weights": w}
    out = [
        ErrorCase("y_float64", {**ok, "expert_out": y.double()}, DTypeError, r"'expert_out'.*float64"),
        ErrorCase("y_int", {**ok, "expert_out": y.int()}, DTypeError, r"'expert_out'.*int32"),
        ErrorCase("y_rank_2", {**ok, "expert_out": y[:, 0]}, ArgumentError, r"'expert_out'.*3-D.*2-D"),
        ErrorCase(
            "y_k_zero", {"expert_out": y[:, :0], "topk_weights": None}, ArgumentError, r"'expert_out'.*k >= 1"
        ),
        ErrorCase(
            "w_bfloat16",
            {**ok, "topk_weights": w.bfloat16()},
            DTypeError,
            r"'topk_weights'.*float32.*bfloat16",
        ),
        ErrorCase("w_rank_1", {**ok, "topk_weights": w[:, 0]}, ArgumentError, r"'topk_weights'.*2-D.*1-D"),
        ErrorCase(
            "w_wrong_k",
            {**ok, "topk_weights": w[:, :1]},
            ArgumentError,
            r"'topk_weights'.*\[3, 2\].*\[3, 1\]",
        ),
        ErrorCase(
            "w_not_tensor", {**ok, "topk_weights": [[1.0, 0.0]]}, DTypeError, r"'topk_weights'.*torch\.Tensor"
        ),
        ErrorCase("y_on_meta", {**ok, "expert_out": y.to("meta")}, DeviceError, r"'expert_out'.*meta"),
    ]
    if device.type == "cuda":
        out.append(
            ErrorCase("w_on_host", {**ok, "topk_weights": w.cpu()}, DeviceError, r"'topk_weights'.*cuda")
        )
    return out


COMPONENT = Component(
    name=NAME,
    summary="MoE combine: sum_j w_j * y_j per token in fp64, slot order, no FMA, one rounding",
    reference=reference_moe_combine,
    fast=fast_moe_combine,
    baselines=(
        Baseline(
            name="atomic_add",
            fn=atomic_add_moe_combine,
            why=(
                "fp32 tl.atomic_add of each slot's product into the output: a token's slots are added "
                "in arrival order (the GPU schedule); the interpreter runs programs in order"
            ),
            expected_to_vary_on=GPU_LANES,
        ),
        Baseline(
            name="token_count_dispatch",
            fn=token_count_dispatch_moe_combine,
            why=(
                "fp32 accumulation whose slot order follows the number of tokens (slot order below 16 "
                "tokens, a pairwise tree from 16 on): batch_prefix sees cancelling rows change"
            ),
            expected_to_vary_on=ALL_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("the same IEEE fp64 products and sums in the same slot order, then one rounding"),
    dtypes=DTYPES,
    error_cases=error_cases,
    bench_cases=bench_cases,
    bench_bytes=bench_bytes,
)
