"""Launcher of the batch-invariant indexer top-k (kernels: ``batchinv.fast.kernels.topk``).

Validates, allocates, picks a config, sizes the grid (one program per row) and launches.
Outside the kernel's envelope it dispatches to the reference on the same device.

Configs.  A launch of at most :data:`SMALL_ROWS` rows takes :data:`CONFIGS`, keyed only on
(arch, k, num_cols bucket): that path's program never changes with the batch.  A launch of
more rows takes :data:`ROW_CONFIGS`, keyed on (arch, k, num_cols bucket, row bucket): with many
rows the throughput depends on how many programs an SM holds (registers per thread, warps), so
the execution may change with the row count.  That key is allowed here -- where the design
otherwise forbids keying a config on the batch -- only because every execution the table can
name (:data:`EXECUTIONS`) makes exactly the same selection: integer keys, exact counts, ties by
column, no arithmetic whose result depends on an order -- and because the registry check
``config_equivalence`` proves it: ``batchinv.harness.components.topk.configs`` hands it each
kernel on every case of every lane, and every warps and register-cap variant on the GPU lanes'
cases of the tuned bucket, and it requires the shipped launch's bits from each.  A table naming
anything else fails at import (the :data:`EXECUTIONS` lookup) and in ``tests/components/test_topk.py``.

Both tables are read through :func:`execution_table`, the two-step lookup of
:mod:`batchinv.fast.execution`: (arch, k, num_cols) give the executions by row bucket, the rows
pick one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import torch

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.execution import ANY_M, ExecutionTable, UpTo, select_by_m
from batchinv.fast.kernels.topk import topk_kernel, topk_sign_count_kernel
from batchinv.reference.errors import ArgumentError
from batchinv.reference.topk import check_topk_arguments
from batchinv.reference.topk import topk as reference_topk

__all__ = [
    "CONFIGS",
    "ENVELOPE_K",
    "EXECUTIONS",
    "KERNELS",
    "MAX_NUM_COLS",
    "NUM_COLS_BUCKETS",
    "ROW_BUCKETS",
    "ROW_BUCKET_TABLE",
    "ROW_CONFIGS",
    "SM90_8192_BY_ROW_BUCKET",
    "SM90_8192_SMALL_ROWS_KERNEL",
    "SMALL_ROWS",
    "TUNED_NUM_COLS_BUCKET",
    "Execution",
    "TopkConfig",
    "execution_table",
    "in_envelope",
    "launch_rows",
    "row_bucket",
    "select_config",
    "topk",
]

#: The k values the kernel serves (the sparse-attention indexer's index_topk sizes).
ENVELOPE_K: Final[tuple[int, ...]] = (512, 1024, 2048)
#: The widest row the kernel holds in registers.
MAX_NUM_COLS: Final[int] = 8192
#: num_cols buckets: a row is padded to the smallest bucket that holds it (BLOCK_N).
NUM_COLS_BUCKETS: Final[tuple[int, ...]] = (512, 1024, 2048, 4096, 8192)
#: The kernels of an execution: ``"compare"`` is :func:`~batchinv.fast.kernels.topk.topk_kernel`
#: (candidate mask, counts by compare, k constexpr), ``"sign"`` is
#: :func:`~batchinv.fast.kernels.topk.topk_sign_count_kernel` (counts by the sign of a
#: difference, one packed scan, k at run time): fewer instructions per lane.
KERNELS: Final[tuple[str, ...]] = ("compare", "sign")
#: Launches of at most this many rows take :data:`CONFIGS` (one wave on the GPUs served: the
#: rows run side by side, so the latency of one program is the launch's).
SMALL_ROWS: Final[int] = 64
#: Row buckets of the launches above :data:`SMALL_ROWS`: a launch takes the first bucket that
#: holds its rows, and the last bucket any larger launch.
ROW_BUCKETS: Final[tuple[int, ...]] = (256, 1024, 2048, 4096)
#: The num_cols bucket whose row buckets are tuned (the indexer's production width); the
#: other buckets take their :data:`CONFIGS` entry at every row count.
TUNED_NUM_COLS_BUCKET: Final[int] = 8192


@dataclass(frozen=True)
class TopkConfig:
    """One launch configuration.

    Attributes:
        block_n: the register tile of a row (a power of two >= num_cols).
        num_warps: warps of a row's program.
        kernel: one of :data:`KERNELS`.
        maxnreg: the registers per thread ptxas may use (None: its own choice); a cap fits
            more programs on an SM (65536 registers: 8 warps at <= 128 hold two programs).
    """

    block_n: int
    num_warps: int
    kernel: str = "compare"
    maxnreg: int | None = None


@dataclass(frozen=True)
class Execution:
    """A candidate execution, stated for any num_cols bucket: the bucket's :data:`CONFIGS` entry
    with ``kernel``, and ``num_warps`` / ``maxnreg`` where given."""

    kernel: str
    num_warps: int | None = None
    maxnreg: int | None = None

    def config(self, base: TopkConfig) -> TopkConfig:
        """This execution at the bucket whose :data:`CONFIGS` entry is ``base``."""
        return TopkConfig(
            block_n=base.block_n,
            num_warps=self.num_warps if self.num_warps is not None else base.num_warps,
            kernel=self.kernel,
            maxnreg=self.maxnreg,
        )


#: The kernel of sm90's launches of at most :data:`SMALL_ROWS` rows at the tuned num_cols
#: bucket (8 warps, no register cap): ``ci/tune_topk_rows.py`` on the H200, run 64 (2026-12-04):
#: "sign" 11.2-14.4 us at 1-64 rows for k 512/1024/2048, "compare" 20.4-20.8 (torch.topk 57-68).
#: Every other (arch, bucket) keeps "compare" (not measured).
SM90_8192_SMALL_ROWS_KERNEL: Final[str] = "sign"


def _table() -> dict[tuple[str, int, int], TopkConfig]:
    table: dict[tuple[str, int, int], TopkConfig] = {}
    for arch_key in ("sm90", "sm100", "interp", "generic"):
        for k in ENVELOPE_K:
            for bucket in NUM_COLS_BUCKETS:
                tuned = arch_key == "sm90" and bucket == TUNED_NUM_COLS_BUCKET
                table[(arch_key, k, bucket)] = TopkConfig(
                    block_n=bucket,
                    num_warps=4 if bucket <= 2048 else 8,
                    kernel=SM90_8192_SMALL_ROWS_KERNEL if tuned else "compare",
                )
    return table


#: Launch configs of up to :data:`SMALL_ROWS` rows, keyed ONLY on (arch, k, num_cols bucket),
#: and the base of every row bucket.  Unknown arches use the "generic" rows.
CONFIGS: Final = MappingProxyType(_table())

#: Every execution :data:`ROW_CONFIGS` may name, each bit-identical to every other (the
#: registry's ``config_equivalence`` runs them all).  From ptxas (sm_90, num_cols 8192, 8 warps
#: unless named w16): registers per thread, programs an SM holds (65536 registers), bytes
#: spilled; instructions per row per thread (SASS):
#:
#:   compare          187  1         8000  (the small launches' config)
#:   compare_r128     128  2
#:   compare_w16_r64   64  2   60 B
#:   sign             181  1         ~4500 on distinct scores (~20 search steps of ~100),
#:                                   ~5600 with a tie plateau at the cutoff (31 steps)
#:   sign_r128        128  2
#:   sign_r80          80  3  264 B
#:   sign_r64          64  4  496 B
#:   sign_w16_r64      64  2   60 B
EXECUTIONS: Final = MappingProxyType(
    {
        "compare": Execution("compare"),
        "compare_r128": Execution("compare", num_warps=8, maxnreg=128),
        "compare_w16_r64": Execution("compare", num_warps=16, maxnreg=64),
        "sign": Execution("sign"),
        "sign_r128": Execution("sign", num_warps=8, maxnreg=128),
        "sign_r80": Execution("sign", num_warps=8, maxnreg=80),
        "sign_r64": Execution("sign", num_warps=8, maxnreg=64),
        "sign_w16_r64": Execution("sign", num_warps=16, maxnreg=64),
    }
)

#: THE TUNED LINE: the execution of each row bucket (in :data:`ROW_BUCKETS` order) on sm90 at
#: num_cols bucket 8192.  ``ci/tune_topk_rows.py`` times every execution on the H200 and prints the
#: replacement line.  This one: H200 run 32 (2026-12-01), 0.21-0.40x torch.topk at 256-4096 rows
#: for k 512/1024/2048, every execution's bits equal to the shipped launch's.
SM90_8192_BY_ROW_BUCKET: Final[tuple[str, ...]] = ("sign_r128", "sign_r80", "sign_r80", "sign_r64")


def _row_table() -> dict[tuple[str, int, int, int], TopkConfig]:
    table = {(*key, rows): base for key, base in CONFIGS.items() for rows in ROW_BUCKETS}
    for k in ENVELOPE_K:
        for rows, name in zip(ROW_BUCKETS, SM90_8192_BY_ROW_BUCKET, strict=True):
            base = CONFIGS[("sm90", k, TUNED_NUM_COLS_BUCKET)]
            table[("sm90", k, TUNED_NUM_COLS_BUCKET, rows)] = EXECUTIONS[name].config(base)
    return table


#: Launch configs above :data:`SMALL_ROWS` rows, keyed on (arch, k, num_cols bucket, row
#: bucket).  The row bucket is allowed in the key because every entry is an execution of
#: :data:`EXECUTIONS`, proven bit-identical by ``config_equivalence`` (see the module docstring).
ROW_CONFIGS: Final = MappingProxyType(_row_table())


def num_cols_bucket(num_cols: int) -> int:
    """The smallest bucket of :data:`NUM_COLS_BUCKETS` holding ``num_cols`` (<= MAX_NUM_COLS)."""
    for bucket in NUM_COLS_BUCKETS:
        if num_cols <= bucket:
            return bucket
    raise ValueError(f"num_cols: expected at most {MAX_NUM_COLS}, got {num_cols}")


#: The row buckets as M buckets, each naming itself: None (the :data:`CONFIGS` entry) up to
#: :data:`SMALL_ROWS` rows, then each of :data:`ROW_BUCKETS`, the last taking any more rows.
ROW_BUCKET_TABLE: Final[ExecutionTable[int | None]] = (
    UpTo(SMALL_ROWS, None),
    *(UpTo(b, b) for b in ROW_BUCKETS[:-1]),
    UpTo(ANY_M, ROW_BUCKETS[-1]),
)


def row_bucket(num_rows: int) -> int | None:
    """The row bucket of a launch of ``num_rows`` rows: None up to :data:`SMALL_ROWS`, else the
    first of :data:`ROW_BUCKETS` holding it (the last for more rows)."""
    return select_by_m(ROW_BUCKET_TABLE, num_rows, None)


def in_envelope(k: int, num_cols: int) -> bool:
    """Whether the Triton kernel serves ``(k, num_cols)``; otherwise :func:`topk` falls back."""
    return k in ENVELOPE_K and num_cols <= MAX_NUM_COLS


def _config_at(arch_key: str, k: int, num_cols: int, rows: int | None) -> TopkConfig:
    """The config of a row bucket (None: up to :data:`SMALL_ROWS` rows); an arch outside the
    tables takes the "generic" rows."""
    bucket = num_cols_bucket(num_cols)
    known = arch_key if (arch_key, k, bucket) in CONFIGS else "generic"
    if rows is None:
        return CONFIGS[(known, k, bucket)]
    return ROW_CONFIGS[(known, k, bucket, rows)]


def execution_table(arch_key: str, k: int, num_cols: int) -> ExecutionTable[TopkConfig]:
    """The configs of ``arch_key`` (as :func:`batchinv.fast.device.arch` names it), ``k`` and
    ``num_cols`` by number of rows (:data:`ROW_BUCKET_TABLE`): the :data:`CONFIGS` entry up to
    :data:`SMALL_ROWS` rows, the :data:`ROW_CONFIGS` entry of each row bucket above.  No row
    parameter: the rows are the table's to look at (:func:`select_config` reads the same two
    tables through :func:`row_bucket`, without building this tuple on every launch)."""
    return tuple(UpTo(r.max_m, _config_at(arch_key, k, num_cols, r.execution)) for r in ROW_BUCKET_TABLE)


def select_config(arch_key: str, k: int, num_cols: int, num_rows: int = 1) -> TopkConfig:
    """The config for ``arch_key`` (as :func:`batchinv.fast.device.arch` names it), ``k``,
    ``num_cols`` and a launch of ``num_rows`` rows: :data:`CONFIGS` up to :data:`SMALL_ROWS`
    rows, :data:`ROW_CONFIGS` above (every entry proven bit-identical by ``config_equivalence``)."""
    return _config_at(arch_key, k, num_cols, row_bucket(num_rows))


def topk(
    scores: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    k: int,
    *,
    config: TopkConfig | None = None,
) -> torch.Tensor:
    """Row-local indices of each row's ``k`` largest scores inside its window, ascending.

    For row ``r`` with window ``[s, e)`` (``s = clamp(row_starts[r], 0, C)``,
    ``e = clamp(row_ends[r], 0, C)``) and ``key`` the monotone int32 map of the fp32 bits
    (``-0.0 -> +0.0``, then ``bits`` if ``bits >= 0`` else ``bits ^ 0x7fffffff``)::

        chosen = the min(k, e - s) columns of [s, e) with the largest key, ties by smaller column
        out[r] = sorted(c - s for c in chosen) ++ [-1] * (k - len(chosen))

    Args:
        scores: float32 ``[R, C]`` (``R`` = num_rows, ``C`` = num_cols), any strides (padded or
            strided rows); a CUDA tensor, or a CPU tensor under the Triton interpreter.
        row_starts: int32 or int64 ``[R]``, same device; any value (clamped to ``[0, C]`` before
            narrowing, so bounds past the int32 range work).
        row_ends: int32 or int64 ``[R]``, same device, ``row_ends >= row_starts``.
        k: an integral (``operator.index``; not a bool), 1 <= k <= 2**31 - 1.
        config: run this config instead of the table's (tuning and ``config_equivalence``);
            its ``block_n`` must hold ``C`` and its ``kernel`` be one of :data:`KERNELS`.

    Returns:
        int32 ``[R, k]``.  Bitwise equal to :func:`batchinv.reference.topk.topk` on every input,
        and bitwise invariant along the row axis: a row's output does not depend on M, on its
        position or neighbours, on its ``row_start`` offset in a packed buffer, or on earlier
        calls (one program per row; the config, which may follow the row bucket above
        :data:`SMALL_ROWS` rows, is one of :data:`EXECUTIONS`, all bit-identical).

    NaN and signed zeros:
        ``-0.0`` ranks as ``+0.0``.  NaNs rank by their bits: positive NaNs above ``+inf``,
        negative NaNs below ``-inf`` (0xffffffff last).  Out-of-window lanes are never selected,
        whatever their bits.

    Dispatch:
        The Triton kernel serves ``k`` in {512, 1024, 2048} and ``C <= 8192``.  Any other shape
        runs the reference (two stable sorts) on the same device: correct and invariant, slow.

    Raises:
        DTypeError: ``scores`` not float32, bounds not int32/int64, ``k`` not an integral.
        ArgumentError: a wrong rank, bounds of a length other than ``R``, ``k`` outside
            ``[1, 2**31 - 1]``, a row with ``row_end < row_start`` (not checked while a CUDA
            graph is captured: the check reads the bounds; there an inverted window selects
            nothing); a ``config`` whose ``block_n`` is not a power of two holding ``C`` or
            whose ``kernel`` is unknown.
        DeviceError: bounds on another device than ``scores``; a tensor on the meta device; a
            non-CUDA tensor on the GPU path.

    Source:
        Seed write-up 003: one program per row, the row register-resident, a 32-step binary
        search over the int32 key space for the k-th key, one ascending scan emitting keys above
        it plus the first tied lanes by column (exclusive cumsum); no sort, no autotune.
    """
    prepared = _prepare(scores, row_starts, row_ends, k, reference_topk)
    if isinstance(prepared, torch.Tensor):
        return prepared
    scores, row_starts, row_ends, k, out = prepared
    num_rows, num_cols = scores.shape
    if config is None:
        config = select_config(arch(scores.device), k, num_cols, num_rows)
    elif config.kernel not in KERNELS or config.block_n < num_cols or config.block_n & (config.block_n - 1):
        raise ArgumentError(
            "config", f"a power-of-two block_n >= num_cols = {num_cols}, kernel in {KERNELS}", config
        )
    # The kernels are looked up here, at call time (tests and mutants stand in for them).
    kernel = topk_kernel if config.kernel == "compare" else topk_sign_count_kernel
    _launch(kernel, config, scores, row_starts, row_ends, k, out)
    return out


def launch_rows(
    kernel: Any,
    scores: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    k: Any,
    *,
    fallback: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Validate, then launch a one-program-per-row top-k ``kernel`` with
    :func:`~batchinv.fast.kernels.topk.topk_kernel`'s signature (the baselines', the mutants')
    under the :data:`CONFIGS` entry at every row count, or call ``fallback`` outside the
    envelope."""
    prepared = _prepare(scores, row_starts, row_ends, k, fallback)
    if isinstance(prepared, torch.Tensor):
        return prepared
    scores, row_starts, row_ends, k, out = prepared
    _launch(
        kernel, select_config(arch(scores.device), k, scores.shape[1]), scores, row_starts, row_ends, k, out
    )
    return out


_Prepared = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]


def _prepare(
    scores: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    k: Any,
    fallback: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor | _Prepared:
    """Validate; the finished output (the fallback's outside the envelope, an empty batch's),
    or the operands the kernel reads with ``k`` as an int and the output to fill."""
    k = check_topk_arguments(scores, row_starts, row_ends, k)
    for name, tensor in (("scores", scores), ("row_starts", row_starts), ("row_ends", row_ends)):
        check_launch_device(name, tensor)
    num_rows, num_cols = scores.shape
    if not in_envelope(k, num_cols):
        return fallback(scores, row_starts, row_ends, k)
    out = torch.empty((num_rows, k), dtype=torch.int32, device=scores.device)
    if num_rows == 0:
        return out
    # The kernel reads raw memory: a negative-bit view (z.conj().imag) must be materialized.
    scores, row_starts, row_ends = (kernel_operand(t) for t in (scores, row_starts, row_ends))
    return scores, row_starts, row_ends, k, out


def _launch(
    kernel: Any,
    config: TopkConfig,
    scores: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    k: int,
    out: torch.Tensor,
) -> None:
    """One program per row of ``kernel`` (``config.kernel``'s signature) under ``config``."""
    options: dict[str, Any] = {"num_warps": config.num_warps}
    if config.maxnreg is not None:
        options["maxnreg"] = config.maxnreg
    pointers = (scores, row_starts, row_ends, out)
    strides = (scores.stride(0), scores.stride(1), row_starts.stride(0), row_ends.stride(0), out.stride(0))
    grid = (scores.shape[0],)
    if config.kernel == "compare":
        kernel[grid](*pointers, scores.shape[1], *strides, K=k, BLOCK_N=config.block_n, **options)
        return
    with interpreter_quiet():  # "sign" loops to a run-time k (the interpreter warns; a GPU does not)
        kernel[grid](*pointers, scores.shape[1], k, 1, *strides, BLOCK_N=config.block_n, **options)
