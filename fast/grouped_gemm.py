"""Batch-invariant grouped GEMM of a fused MoE layer (docs/MOE.md, section 3).

Launcher only: validate (typed errors, shared with the reference), allocate, pick the config
from a frozen table, size the grid, launch :func:`batchinv.fast.kernels.grouped_gemm.grouped_gemm_kernel`.

Pinning: ``BLOCK_M`` is keyed on (arch, dtype) only, because it is the ``moe_align`` block size
that the layer must build ``sorted_ids`` with (both projections share one align); it must
equal the input's ``block_m`` (a property of the align tensors' lengths), which is checked.
``BLOCK_N``/``BLOCK_K`` are keyed on (arch, dtype, N, K).  Nothing is keyed on T nor on an
expert's M, and there is no split-K: every output is one fp32 sum over the whole K in
increasing ``BLOCK_K`` tiles, rounded once.  Production MoE kernels (vLLM's tuned configs per
M bucket, split-K for small M) vary exactly there: see :mod:`batchinv.fast.grouped_gemm_baselines`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, interpreting, kernel_operand
from batchinv.reference.errors import ArgumentError
from batchinv.reference.grouped_gemm import GroupedGemmArgs, validate


@dataclass(frozen=True)
class GroupedGemmConfig:
    """A tile configuration (powers of two >= 16).  ``num_warps``/``num_stages`` change no bits."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name}: expected a power of two >= 16, got {value}")


@dataclass(frozen=True)
class _Rule:
    arch: str
    max_n: int | None
    max_k: int | None
    config: GroupedGemmConfig
    why: str


#: ``BLOCK_M`` per arch (bf16): the align's ``block_m``.  Never keyed on T or M.
BLOCK_M: dict[str, int] = {"interp": 16, "sm90": 64, "sm100": 64}

#: The (arch, N, K) table (bf16 only); first match wins.  No M or T field, on purpose: BLOCK_K
#: fixes each output's fp32 summation order.  sm90 rows are untuned first choices (no GPU
#: measurement yet); sm100 copies them.
TABLE: tuple[_Rule, ...] = (
    _Rule(
        "interp",
        None,
        None,
        GroupedGemmConfig(16, 64, 64),
        "interpreter: N in one tile, K in two (the second partial in most cases)",
    ),
    _Rule(
        "sm90", None, None, GroupedGemmConfig(64, 128, 64, num_warps=4, num_stages=4), "first choice, untuned"
    ),
    _Rule("sm100", None, None, GroupedGemmConfig(64, 128, 64, num_warps=4, num_stages=4), "copy of sm90"),
)


def select_config(arch_key: str, dtype: torch.dtype, n: int, k: int) -> GroupedGemmConfig:
    """The config of ``(arch, dtype, N, K)``; :class:`ArgumentError` when the table has none."""
    if dtype != torch.bfloat16:
        raise ArgumentError("a", "dtype bfloat16 (the grouped GEMM's table)", dtype)
    for rule in TABLE:
        if (
            rule.arch == arch_key
            and (rule.max_n is None or n <= rule.max_n)
            and (rule.max_k is None or k <= rule.max_k)
        ):
            return rule.config
    raise ArgumentError("device", f"an architecture of the grouped GEMM table ({sorted(BLOCK_M)})", arch_key)


def block_m(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> int:
    """The ``block_m`` that ``moe_align`` must use for :func:`grouped_gemm` on ``device``."""
    key = "interp" if interpreting() or device.type != "cuda" else arch(device)
    if dtype != torch.bfloat16 or key not in BLOCK_M:
        raise ArgumentError("device", f"an architecture of the grouped GEMM table ({sorted(BLOCK_M)})", key)
    return BLOCK_M[key]


def _arch_key(device: torch.device) -> str:
    return "interp" if interpreting() or device.type != "cuda" else arch(device)


def launch(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    args: GroupedGemmArgs,
    a_per_slot: bool,
    config: GroupedGemmConfig,
    dest: torch.Tensor,
    *,
    splits: int = 1,
    k_per_split: int | None = None,
) -> None:
    """Launch the kernel (shared by the fast path and the baselines).  ``dest`` is ``[T*k, N]``
    in a's dtype (``splits == 1``) or ``[S, T*k, N]`` fp32 partials (``splits > 1`` or
    ``k_per_split`` given: baselines only)."""
    rows = a.reshape(-1, args.kdim)
    rows, wk = kernel_operand(rows), kernel_operand(w)
    split_out = dest.dim() == 3
    kps = args.kdim if k_per_split is None else k_per_split
    grid = (int(block_expert.shape[0]), -(-args.n // config.block_n), splits)
    if args.t * args.k == 0 or args.n == 0 or grid[0] == 0:
        return
    stride_cs = dest.stride(0) if split_out else 0
    stride_cm, stride_cn = (dest.stride(1), dest.stride(2)) if split_out else (dest.stride(0), dest.stride(1))
    from batchinv.fast.kernels.grouped_gemm import grouped_gemm_kernel

    with interpreter_quiet():
        grouped_gemm_kernel[grid](
            rows,
            wk,
            dest,
            sorted_ids,
            block_expert,
            num_padded,
            args.n,
            args.t * args.k,
            kps,
            args.kdim,
            rows.stride(0),
            rows.stride(1),
            wk.stride(0),
            wk.stride(1),
            wk.stride(2),
            stride_cs,
            stride_cm,
            stride_cn,
            TOP_K=args.k,
            A_PER_SLOT=a_per_slot,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            SPLIT_OUT=split_out,
            INTERPRETED=interpreting(),
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )


def checked(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool,
) -> tuple[GroupedGemmArgs, GroupedGemmConfig]:
    """Validate (typed errors), check the launch device, and look the config up (BLOCK_M equal
    to the input's block_m)."""
    args = validate(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    for name, t in (
        ("a", a),
        ("w", w),
        ("sorted_ids", sorted_ids),
        ("block_expert", block_expert),
        ("num_padded", num_padded),
    ):
        check_launch_device(name, t)
    key = _arch_key(a.device)
    cfg = select_config(key, a.dtype, args.n, args.kdim)
    if args.block_m != BLOCK_M.get(key, cfg.block_m):
        raise ArgumentError(
            "block_expert",
            f"the align's block_m = BLOCK_M = {BLOCK_M.get(key)} of this device (lengths of sorted_ids / block_expert)",
            f"block_m = {args.block_m}",
        )
    return args, cfg


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
) -> torch.Tensor:
    """Grouped GEMM of a fused MoE layer: ``c[t, j] = a[t] @ w[e].T`` for each entry
    ``sorted_ids[i] = t * top_k + j`` of a block of expert ``e`` (``a[t * top_k + j]`` with
    ``a_per_slot``, the down projection).

    Parameters
    ----------
    a : Tensor [T, K] (``a_per_slot``: [T * k, K] or [T, k, K]), bf16
    w : Tensor [E, N, K], bf16
    sorted_ids : Tensor [T * k + E * (block_m - 1)], int32
        Flat indices grouped by expert, padded with ``T * k`` (``moe_align``).
    block_expert : Tensor [ceil(len(sorted_ids) / block_m)], int32
    num_padded : Tensor [1], int32
    top_k : int
    a_per_slot : bool

    Returns
    -------
    Tensor [T, k, N], bf16
        fp32 accumulation over K in increasing ``BLOCK_K`` tiles, one rounding (RNE).  Bitwise
        invariant in the other tokens, in an expert's M, in a token's position and in the
        padding: BLOCK sizes from (arch, dtype, N, K) only, no split-K.  Sentinel rows are never
        read nor written.  NaN/inf propagate as IEEE products and sums.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`batchinv.reference.grouped_gemm.validate`; also ``block_m`` (from the align
        tensors' lengths) differing from this device's ``BLOCK_M``, and tensors that cannot be
        kernel operands here.

    Source: vLLM's ``fused_moe_kernel`` structure, pinned (no per-M config, no split-K).
    """
    args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    out = torch.empty(args.t * args.k, args.n, dtype=a.dtype, device=a.device)
    launch(a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, cfg, out)
    return out.view(args.t, args.k, args.n)
