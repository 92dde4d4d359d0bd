"""Batch-invariant grouped GEMM of a fused MoE layer (docs/MOE.md, section 3).

Launcher only: validate (typed errors, shared with the reference), allocate, pick the config
from a frozen table, size the grid, launch :func:`batchinv.fast.kernels.grouped_gemm.grouped_gemm_kernel`.

Pinning: ``BLOCK_K`` comes from (arch, dtype, N, K) alone (:data:`BLOCK_K_RULES`), and there
is no split-K: every output is one fp32 sum over the whole K in increasing ``BLOCK_K`` tiles,
rounded once, whatever the token count T or an expert's M.  ``BLOCK_M`` is the ``moe_align``
block size, a property of the align tensors (both projections share one align); the layer
picks it from T (:func:`block_m`'s schedule) and the tile (``BLOCK_N``, warps, stages) follows
from it (:data:`TILES`).  Those choices move work between programs and never change an
output's arithmetic: seed 001's observation for this kernel structure, and what the registry
check ``config_equivalence`` proves for every (block_m, tile) the tables hold.  Production MoE
kernels vary exactly where this one does not (vLLM's tuned configs per token count change
BLOCK_K, split-K for small M): see :mod:`batchinv.fast.baselines.grouped_gemm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, interpreting, kernel_operand
from batchinv.reference.errors import ArgumentError, check_int
from batchinv.reference.grouped_gemm import GroupedGemmArgs, validate


@dataclass(frozen=True)
class GroupedGemmConfig:
    """A launch configuration (tile sizes powers of two >= 16).

    ``block_k`` fixes each output's fp32 summation order (the K tiles it is accumulated in) and
    comes from :data:`BLOCK_K_RULES` alone.  ``block_m`` (the align's block), ``block_n``,
    ``num_warps`` and ``num_stages`` only decide which program computes which outputs and how
    loads are pipelined: the registry check ``config_equivalence`` proves on every lane that
    every choice :func:`select_config` can make gives the same bits.
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        """:class:`ArgumentError` naming the field: tiles powers of two >= 16, warps a power of
        two in 1..32, stages >= 1 (ints, not bools)."""
        for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ArgumentError(name, "an int", value)
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ArgumentError(name, "a power of two >= 16", value)
        if not 1 <= self.num_warps <= 32 or self.num_warps & (self.num_warps - 1):
            raise ArgumentError("num_warps", "a power of two in 1..32", self.num_warps)
        if self.num_stages < 1:
            raise ArgumentError("num_stages", "an int >= 1", self.num_stages)


def _is_int(value: object) -> bool:
    """A Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Tile:
    """The bit-neutral part of a config for one ``block_m``: output columns per program and the
    pipeline (warps, stages)."""

    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class _BlockKRule:
    arch: str
    max_n: int | None
    max_k: int | None
    block_k: int
    why: str


#: The reduction rule: ``BLOCK_K`` per (arch, dtype, N, K) (bf16 only); first match wins.  No
#: M, T or block_m field, on purpose.  64 on sm90: vLLM's H200 tables for this layer pick 64 at
#: both ends of the token range (128 in between, for a few per cent), and every issue shape's K
#: (768, 2048, 4096, 7168, 14336) is a multiple of it.
BLOCK_K_RULES: tuple[_BlockKRule, ...] = (
    _BlockKRule("interp", None, None, 64, "interpreter: K in two tiles (the second partial in most cases)"),
    _BlockKRule("sm90", None, None, 64, "vLLM's tuned H200 choice at decode and at >= 512 tokens"),
    _BlockKRule("sm100", None, None, 64, "copy of sm90"),
)

#: The ``block_m`` values (align block sizes) each arch accepts, with the tile that goes with
#: each.  Which one the layer uses is :func:`block_m`'s schedule; all of them give the same bits
#: (``config_equivalence``).  sm90 rows follow the shape of vLLM's tuned H200 configs (BLOCK_N
#: 64 at decode for more programs, wider tiles and 8 warps at thousands of rows).
_SM90_TILES = {16: Tile(64, 4, 5), 32: Tile(128, 4, 4), 64: Tile(128, 4, 3), 128: Tile(256, 8, 4)}
TILES: dict[str, dict[int, Tile]] = {
    "interp": {16: Tile(64, 4, 3), 32: Tile(32, 4, 3)},
    "sm90": _SM90_TILES,
    "sm100": _SM90_TILES,  # untuned: sm90's rows, never run on a Blackwell part
}

#: The schedule: ``(mean rows per expert at most, block_m)``, first match wins; the mean is
#: ``T * top_k / E``.  The interpreter always takes 16 (fewest wasted rows per program).
_SM90_SCHEDULE: tuple[tuple[float, int], ...] = ((0.5, 16), (16.0, 64), (math.inf, 128))
SCHEDULE: dict[str, tuple[tuple[float, int], ...]] = {
    "interp": ((math.inf, 16),),
    "sm90": _SM90_SCHEDULE,
    "sm100": _SM90_SCHEDULE,  # untuned: sm90's
}

#: The ``block_m`` of a launch without a token count (the harness's cases and tests).
DEFAULT_BLOCK_M: dict[str, int] = {"interp": 16, "sm90": 64, "sm100": 64}


def select_config(arch_key: str, dtype: torch.dtype, block_m: int, n: int, k: int) -> GroupedGemmConfig:
    """The config of ``(arch, dtype, block_m, N, K)``: ``BLOCK_K`` from (arch, dtype, N, K)
    only, the tile from (arch, block_m).  :class:`ArgumentError` when the tables have none."""
    if dtype != torch.bfloat16:
        raise ArgumentError("a", "dtype bfloat16 (the grouped GEMM's table)", dtype)
    if not isinstance(arch_key, str):
        raise ArgumentError("arch_key", f"one of {sorted(TILES)}", arch_key)
    block_m = check_int("block_m", block_m, 1)
    tiles = TILES.get(arch_key)
    if tiles is None:
        raise ArgumentError(
            "device", f"an architecture of the grouped GEMM table ({sorted(TILES)})", arch_key
        )
    if block_m not in tiles:
        raise ArgumentError(
            "block_expert",
            f"the align's block_m one of {sorted(tiles)} on {arch_key} (lengths of sorted_ids / block_expert)",
            f"block_m = {block_m}",
        )
    for rule in BLOCK_K_RULES:
        if (
            rule.arch == arch_key
            and (rule.max_n is None or n <= rule.max_n)
            and (rule.max_k is None or k <= rule.max_k)
        ):
            tile = tiles[block_m]
            return GroupedGemmConfig(block_m, tile.block_n, rule.block_k, tile.num_warps, tile.num_stages)
    raise ArgumentError("device", f"an architecture of the grouped GEMM table ({sorted(TILES)})", arch_key)


def arch_key(device: torch.device) -> str:
    """The tables' key for ``device``: ``interp`` under the interpreter, else its arch."""
    return "interp" if interpreting() or device.type != "cuda" else arch(device)


def layer_block_m(device: torch.device, num_tokens: int, top_k: int, num_experts: int) -> int:
    """The fused layer's align block for ``num_tokens`` tokens: :func:`block_m`'s schedule.
    :class:`ArgumentError` for a ``num_tokens`` that is not an int >= 0 or a ``top_k`` that is
    not an int >= 1 (``num_experts``: :func:`block_m`)."""
    num_tokens = check_int("num_tokens", num_tokens, 0)
    top_k = check_int("top_k", top_k, 1)
    return block_m(device, num_rows=num_tokens * top_k, num_experts=num_experts)


def block_m(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    *,
    num_rows: int | None = None,
    num_experts: int | None = None,
) -> int:
    """The ``block_m`` that ``moe_align`` is called with for :func:`grouped_gemm` on ``device``.

    With ``num_rows`` (``T * top_k``, a host integer: CUDA-graph safe) and ``num_experts``: the
    :data:`SCHEDULE` by the mean rows per expert; without them: :data:`DEFAULT_BLOCK_M`.  Any
    value this returns gives the same output bits (``config_equivalence``): it only trades
    padded rows against tile efficiency.  :class:`ArgumentError` naming the argument for a
    dtype or device the tables do not cover, a ``num_rows`` that is not an int >= 0, a
    ``num_experts`` that is not an int >= 1, or one of the two without the other.
    """
    if dtype != torch.bfloat16:
        raise ArgumentError("dtype", "torch.bfloat16 (the grouped GEMM's table)", dtype)
    key = arch_key(device)
    if key not in TILES:
        raise ArgumentError("device", f"an architecture of the grouped GEMM table ({sorted(TILES)})", key)
    if num_rows is None and num_experts is None:
        return DEFAULT_BLOCK_M[key]
    if num_rows is None:
        raise ArgumentError("num_rows", "an int >= 0 (with num_experts)", num_rows)
    if num_experts is None:
        raise ArgumentError("num_experts", "an int >= 1 (with num_rows)", num_experts)
    num_rows = check_int("num_rows", num_rows, 0, 2**62)
    num_experts = check_int("num_experts", num_experts, 1)
    mean = num_rows / num_experts
    return next(bm for limit, bm in SCHEDULE[key] if mean <= limit)


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


def execute(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    args: GroupedGemmArgs,
    a_per_slot: bool,
    config: GroupedGemmConfig,
) -> torch.Tensor:
    """Allocate the ``[T, k, N]`` output and :func:`launch` into it with ``config`` (validated
    arguments: :func:`checked`)."""
    out = torch.empty(args.t * args.k, args.n, dtype=a.dtype, device=a.device)
    launch(a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, config, out)
    return out.view(args.t, args.k, args.n)


def checked(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool,
) -> tuple[GroupedGemmArgs, GroupedGemmConfig]:
    """Validate (typed errors), check the launch device, and look the config up (the input's
    block_m must be one the tile table holds)."""
    args = validate(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    for name, t in (
        ("a", a),
        ("w", w),
        ("sorted_ids", sorted_ids),
        ("block_expert", block_expert),
        ("num_padded", num_padded),
    ):
        check_launch_device(name, t)
    cfg = select_config(arch_key(a.device), a.dtype, args.block_m, args.n, args.kdim)
    return args, cfg


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    a_per_slot: bool = False,
    *,
    config: GroupedGemmConfig | None = None,
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
    config : GroupedGemmConfig, optional
        Another execution than the table's (tuning and ``config_equivalence`` only): its
        ``block_m`` must be the input's; its other fields are taken as given.

    Returns
    -------
    Tensor [T, k, N], bf16
        fp32 accumulation over K in increasing ``BLOCK_K`` tiles, one rounding (RNE).  Bitwise
        invariant in the other tokens, in an expert's M, in a token's position, in the padding
        and in the align's block_m: BLOCK_K from (arch, dtype, N, K) only, no split-K.  Sentinel rows are never
        read nor written.  NaN/inf propagate as IEEE products and sums.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        See :func:`batchinv.reference.grouped_gemm.validate`; also a ``block_m`` (from the align
        tensors' lengths) that this device's tile table does not hold, and tensors that cannot
        be kernel operands here.

    Source: vLLM's ``fused_moe_kernel`` structure, pinned (no per-M config, no split-K).
    """
    args, cfg = checked(a, w, sorted_ids, block_expert, num_padded, top_k, a_per_slot)
    if config is not None:
        if not isinstance(config, GroupedGemmConfig):
            raise ArgumentError("config", "a GroupedGemmConfig", type(config).__name__)
        if config.block_m != args.block_m:
            raise ArgumentError(
                "config", f"block_m = {args.block_m} (the align's)", f"block_m = {config.block_m}"
            )
        cfg = config
    return execute(a, w, sorted_ids, block_expert, num_padded, args, a_per_slot, cfg)
