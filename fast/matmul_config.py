"""The persistent matmul's config table, keyed only on (arch, dtype, N, K) — never on M.

Why never M: the BLOCK sizes and the input precision fix the order in which each output's fp32
sum is formed (how the tensor cores group the k products, where chunk boundaries fall).  A
config picked from M would make that order a function of the batch size, which is exactly the
dependence this kernel removes.  (With fp32 FMA dots Triton happens to give equal bits for any
BLOCK_K, but bf16/fp16 go through tensor cores where nothing promises that, so the rule is kept
for every dtype.)  The planned SM count and the persistent grid are free: they decide which
program computes a tile, never how.

One config therefore serves every batch size, and each entry is a compromise between decode
(small M, few tiles: wants small tiles) and prefill (large M: wants wide tiles that re-read
operands less).  The sm90 entries are the ones the H200 sweep verified (2026-11-29); one tuning
round (ci/tune_matmul.py, numbers in docs/BENCHMARKS.md) found faster ones, named in each row,
which ship once a GPU sweep verifies them.  The sm100 rows copy sm90, unmeasured;
``docs/BENCHMARKS.md`` gives the floor each bench point is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MatmulConfig:
    """A tile configuration of the persistent matmul.

    Attributes:
        block_m, block_n, block_k: tile sizes (each >= 16, powers of two).
        group_m: row-tiles visited together (L2 reuse of B); changes only the visiting order.
        num_warps, num_stages: Triton launch options (latency hiding; no effect on bits).
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name}: expected a power of two >= 16, got {value}")


@dataclass(frozen=True)
class ConfigRule:
    """One table row: applies to ``arch`` and ``dtypes`` when ``N <= max_n`` and ``K <= max_k``.

    Rows are tried in order; the first match wins.  There is deliberately no M field.
    """

    arch: str
    dtypes: tuple[torch.dtype, ...]
    max_n: int | None
    max_k: int | None
    config: MatmulConfig
    why: str


HALF = (torch.bfloat16, torch.float16)
FP32 = (torch.float32,)

#: The table.  "interp" is the Triton interpreter (the cpu lane): small tiles there exercise the
#: edge masks on M, N and K and the persistent walk over several tiles per program.
TABLE: tuple[ConfigRule, ...] = (
    ConfigRule(
        "interp",
        (*HALF, *FP32),
        None,
        None,
        MatmulConfig(64, 64, 128, group_m=2),
        "interpreter: numpy-vectorized tiles; small enough that cpu cases span several tiles",
    ),
    # --- sm90 (H100/H200, 132 SMs) ---
    ConfigRule(
        "sm90",
        HALF,
        512,
        None,
        MatmulConfig(64, 64, 128, group_m=8, num_warps=4, num_stages=4),
        "small N (router 4096->256, N=257): 64-wide tiles, one warpgroup wgmma, deep K tiles; "
        "verified by the H200 sweep.  Tuning (ci/tune_matmul.py, 2026-11-29) found 16x32x256 w4 s3 "
        "faster (bf16->fp32 256x4096: 0.33-0.87x cuBLAS at every M, this row up to 1.35x): switch "
        "once a GPU sweep verifies it",
    ),
    ConfigRule(
        "sm90",
        HALF,
        None,
        None,
        MatmulConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3),
        "large N: 128x128 tiles, two warpgroups, 3 stages; verified by the H200 sweep.  Tuning "
        "(2026-11-29) found 64x256x64 w8 s3 better in the worst case over M (decode 3.3x cuBLAS "
        "instead of 6.3x, prefill about equal): switch once a GPU sweep verifies it",
    ),
    ConfigRule(
        "sm90",
        FP32,
        512,
        None,
        MatmulConfig(16, 32, 64, group_m=8, num_warps=4, num_stages=3),
        "fp32 IEEE router: FMA-bound, so many small tiles (8 at M=1 for N=256); verified by the "
        "H200 sweep.  Tuning (2026-11-29) found 16x16x128 faster at decode (80 us, this row "
        "149 us; cuBLAS 3.5 us): switch once a GPU sweep verifies it",
    ),
    ConfigRule(
        "sm90",
        FP32,
        None,
        None,
        MatmulConfig(64, 64, 32, group_m=8, num_warps=4, num_stages=3),
        "fp32 IEEE, large N: 64x64 FMA tiles (32 accumulators per thread)",
    ),
    # --- sm100 (B200/GB200): the sm90 choices until measured ---
    ConfigRule(
        "sm100",
        HALF,
        512,
        None,
        MatmulConfig(64, 64, 128, group_m=8, num_warps=4, num_stages=4),
        "as sm90 (unmeasured on sm100)",
    ),
    ConfigRule(
        "sm100",
        HALF,
        None,
        None,
        MatmulConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3),
        "as sm90 (unmeasured on sm100)",
    ),
    ConfigRule(
        "sm100",
        FP32,
        512,
        None,
        MatmulConfig(16, 32, 64, group_m=8, num_warps=4, num_stages=3),
        "as sm90 (unmeasured on sm100)",
    ),
    ConfigRule(
        "sm100",
        FP32,
        None,
        None,
        MatmulConfig(64, 64, 32, group_m=8, num_warps=4, num_stages=3),
        "as sm90 (unmeasured on sm100)",
    ),
)

#: Any other architecture (sm80, sm89, ...): a conservative config that compiles everywhere.
FALLBACK = MatmulConfig(64, 64, 32, group_m=8, num_warps=4, num_stages=2)


def select_config(arch: str, dtype: torch.dtype, n: int, k: int) -> MatmulConfig:
    """The config for one GEMM problem class.

    Parameters
    ----------
    arch : str
        ``"sm90"``, ``"sm100"``, ... or ``"interp"`` (see :func:`batchinv.fast.device.arch`).
    dtype : torch.dtype
        The input dtype (bf16, fp16 or fp32).
    n, k : int
        Output columns and reduction length.

    Returns
    -------
    MatmulConfig
        The first matching table row's config, else :data:`FALLBACK`.  There is no M parameter
        (see the module docstring); a CPU test enforces it.
    """
    for rule in TABLE:
        if rule.arch != arch or dtype not in rule.dtypes:
            continue
        if rule.max_n is not None and n > rule.max_n:
            continue
        if rule.max_k is not None and k > rule.max_k:
            continue
        return rule.config
    return FALLBACK
