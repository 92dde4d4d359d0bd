"""Batch-invariant softmax and log_softmax over the last dim: launchers of ``kernels/softmax.py``.

Each launcher validates its arguments (typed errors), allocates the output, picks the kernel
configuration -- the tile from :data:`SOFTMAX_TABLE` (keyed on arch, dtype and row length only)
and the execution from :data:`EXECUTION_TABLE` (:func:`execution_table`, the two-step lookup of
:mod:`batchinv.fast.execution`) -- and launches.  No host synchronisation, so a
call can be captured in a CUDA graph.

Two levels, and only the second may look at the number of rows:

* the **tile** (:class:`RowConfig`, above all ``block_n``) sets the reduction order: each lane
  adds ``ceil(V / block_n)`` chunks in sequence.  It is keyed on (arch, dtype, row length) and
  NEVER on the rows.
* the **execution** (:class:`Tiled` or :class:`Split`) says which programs run that reduction:
  one program per tile of rows (``softmax_kernel``), or a row's lanes over several programs
  (the split kernels), with more or fewer loads in flight.  An execution carries no ``block_n``
  and every one computes each lane's values with the same operations in the same order, the
  lanes' sum order-free on a fixed-point grid, and the output elementwise: the same bits by
  construction.  The execution table may therefore be keyed on the number of rows of the
  launch -- and it is allowed to ONLY because the registry's ``config_equivalence`` check runs
  every execution the table can pick (:func:`equivalence_executions`) on every case of the
  sweep and requires the shipped execution's bits (``harness/components/softmax.py``,
  ``configs``), and the cpu lane's ``batch_prefix`` crosses the interpreter's row-count bucket.
  A GPU entry ships only after ``ci/tune_log_softmax.py`` has timed it and checked its bits on
  that GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.execution import (
    ExecutionTable,
    MBucket,
    check_positive_int,
    check_power_of_two,
    every_execution,
    select_by_m,
)
from batchinv.fast.kernels.softmax import (
    softmax_kernel,
    softmax_split_combine_kernel,
    softmax_split_lanes_kernel,
    softmax_split_write_kernel,
)
from batchinv.fast.row_config import ANY_LENGTH, Bucket, RowConfig, arch_family, lookup
from batchinv.reference.softmax import check_softmax_args

# The configuration table.  It is keyed ONLY on (arch, dtype, row length): the tile sets the
# reduction order, so a key on the number of rows would make a row's bits depend on its batch.
# Never add the row count (or anything derived from it, like "rows < SM count") to this key;
# a CPU test checks that the launcher's tile is the same at every M.
SOFTMAX_TABLE: Final = MappingProxyType(
    {
        # GPUs: short rows share a program; vocabulary rows get one program each and loop over
        # 4096 (fp32) / 8192 (16-bit) column chunks -- 32 bytes per thread per chunk at 16 warps.
        # Vocab 151936 does not fit one register-resident block.
        ("gpu", torch.float32): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(4096, RowConfig(1, 4096, 8)),
            Bucket(ANY_LENGTH, RowConfig(1, 4096, 16)),
        ),
        ("gpu", torch.bfloat16): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(ANY_LENGTH, RowConfig(1, 8192, 16)),
        ),
        ("gpu", torch.float16): (
            Bucket(256, RowConfig(4, 256, 4)),
            Bucket(1024, RowConfig(1, 1024, 4)),
            Bucket(ANY_LENGTH, RowConfig(1, 8192, 16)),
        ),
        # The Triton interpreter (cpu lane) pays per operation, not per element: 64-row tiles,
        # and 128-column chunks so short rows still loop and end in a masked tail.  Rows longer
        # than 1024 take the GPUs' vocabulary path shape (one program per row).
        ("interp", torch.float32): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
        ("interp", torch.bfloat16): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
        ("interp", torch.float16): (
            Bucket(1024, RowConfig(64, 128, 1)),
            Bucket(ANY_LENGTH, RowConfig(1, 512, 1)),
        ),
    }
)


@dataclass(frozen=True)
class Tiled:
    """Today's execution: ``softmax_kernel``, one program per tile of ``block_m`` rows (the
    table's tile), both passes in that program.

    Attributes:
        group: chunks of pass 1 loaded before the first is used.
        stages: software-pipeline depth of both passes' loops (1: no pipelining).
    """

    group: int = 1
    stages: int = 1

    def __post_init__(self) -> None:
        check_positive_int("group", self.group)
        check_positive_int("stages", self.stages)

    @property
    def name(self) -> str:
        return f"tiled g{self.group} s{self.stages}"


@dataclass(frozen=True)
class Split:
    """A row over several programs: pass 1 cut by lanes (``programs`` programs per row, each
    owning ``block_n // programs`` of the tile's ``block_n`` lanes, every chunk), the lanes'
    (max, sum) through an fp32 workspace, then the combine and the write.

    Attributes:
        programs: pass-1 programs per row (a power of two dividing ``block_n``).
        num_warps: warps of a pass-1 program.
        write_programs: write programs per row (each writes a contiguous span of columns).
        write_n: columns a write program handles per step (a power of two).
        write_warps: warps of a write program.
        group, stages: loads in flight in pass 1 (as :class:`Tiled`).
        write_stages: software-pipeline depth of the write loop.
        combine_once: combine each row once, in its own kernel (three launches), instead of in
            every write program (two launches).
        combine_warps: warps of the combine kernel.
        block_m: rows per program (the interpreter's, which pays per program; GPUs: 1).
    """

    programs: int
    num_warps: int
    write_programs: int
    write_n: int
    write_warps: int
    group: int = 1
    stages: int = 1
    write_stages: int = 1
    combine_once: bool = False
    combine_warps: int = 16
    block_m: int = 1

    def __post_init__(self) -> None:
        for name in ("programs", "num_warps", "write_n", "write_warps", "combine_warps", "block_m"):
            check_power_of_two(name, getattr(self, name))
        for name in ("write_programs", "group", "stages", "write_stages"):
            check_positive_int(name, getattr(self, name))

    def lanes(self, config: RowConfig) -> int:
        """Lanes of a pass-1 program under the tile ``config``."""
        if config.block_n % self.programs:
            raise ValueError(f"programs: {self.programs} does not divide block_n {config.block_n}")
        return config.block_n // self.programs

    @property
    def name(self) -> str:
        combine = "c1" if self.combine_once else "cw"
        return (
            f"split p{self.programs} w{self.num_warps} g{self.group} s{self.stages} | "
            f"write p{self.write_programs} n{self.write_n} w{self.write_warps} s{self.write_stages} {combine}"
        )


Execution = Tiled | Split
#: Today's execution: one program per tile, one chunk of loads in flight.
TILED: Final = Tiled()


@dataclass(frozen=True)
class ExecutionRule(MBucket[Execution]):
    """Launches of at most ``max_m`` rows (None: any number), each of at least ``min_cols``
    columns, use ``execution`` (the first rule that holds; none: :data:`TILED`).  An
    :class:`~batchinv.fast.execution.MBucket` whose shape key is the row length."""

    max_m: int | None
    min_cols: int
    execution: Execution


#: The interpreter's few-row execution (launches of up to 8 rows): each row's lanes split over
#: two pass-1 programs, one write program (the interpreter pays per program: it costs about what
#: the tiled kernel does).  It mirrors a GPU's few-row bucket so that the cpu lane's sweep crosses
#: a row-count boundary (batch_prefix compares launches of 1 to 8 rows, split, with the larger
#: ones, tiled) and the mutants run it.
_INTERP_SPLIT: Final = Split(2, 1, 1, 128, 1, group=2, block_m=64)

#: GPU candidates for vocabulary rows (more than 1024 columns: one-row tiles), 16-bit inputs
#: (block_n 8192, so a 129280-column row has 16 chunks).  At one row a tiled program walks those
#: chunks one memory latency each, on one SM; a split spreads the row's lanes over 4 to 64
#: programs (2048 threads at 32 x 2 warps), pipelines its chunks (``stages``: the whole row in
#: flight), and writes from 4 to 32 programs.  ``ci/tune_log_softmax.py`` times each and checks
#: its bits; the sweep's config_equivalence runs the first and those the table ships.
GPU_SPLIT_16BIT: Final = (
    Split(16, 2, 16, 2048, 16, stages=8, write_stages=2),
    Split(32, 2, 16, 2048, 4, stages=8, write_stages=2, combine_once=True),
    Split(32, 2, 32, 1024, 16, stages=8, write_stages=2),
    Split(64, 2, 32, 1024, 4, stages=16, write_stages=2, combine_once=True),
    Split(8, 4, 8, 4096, 16, stages=8, write_stages=2),
    Split(4, 4, 4, 4096, 8, stages=4, write_stages=2, combine_once=True),
)
#: As :data:`GPU_SPLIT_16BIT` for fp32 inputs (block_n 4096: 32 chunks of a 129280-column row).
GPU_SPLIT_32BIT: Final = (
    Split(16, 2, 16, 1024, 16, stages=8, write_stages=2),
    Split(16, 2, 16, 1024, 4, stages=8, write_stages=2, combine_once=True),
    Split(32, 1, 32, 1024, 16, stages=16, write_stages=2),
    Split(32, 2, 32, 1024, 4, stages=16, write_stages=2, combine_once=True),
    Split(8, 2, 8, 2048, 16, stages=8, write_stages=2),
    Split(4, 4, 4, 2048, 8, stages=4, write_stages=2, combine_once=True),
)
#: Tiled candidates (every row length): more loads in flight in the one-program kernel; a group
#: of 4 chunks holds a whole 32000-column bf16 row in flight in pass 1 (issue 26: 16-64 rows).
TILED_CANDIDATES: Final = (
    Tiled(stages=2),
    Tiled(stages=3),
    Tiled(group=2),
    Tiled(group=2, stages=2),
    Tiled(group=4),
    Tiled(group=4, stages=2),
)
#: The interpreter's candidates (every row length): pass 1 over 1, 2 or 4 programs, the write
#: over 1, 2 or 3 (each combining the row, or after a combine kernel), an odd group (a group past
#: the row's end is masked), write steps of 32 to 128 columns.
INTERP_CANDIDATES: Final = (
    _INTERP_SPLIT,
    Split(4, 1, 3, 32, 1, group=3, combine_once=True, block_m=64),
    Split(1, 1, 2, 64, 1, block_m=64),
    Tiled(group=3, stages=2),
)


_GPU_16BIT_LOG_SOFTMAX: Final = (
    ExecutionRule(16, 32000, GPU_SPLIT_16BIT[1]),
    ExecutionRule(None, 32000, Tiled(group=2)),
)

# The execution table: which programs run the tile's reduction, keyed on (arch family, dtype,
# op) and, per rule, on the launch's number of rows and the row length.  The row key is allowed
# ONLY because every execution gives the same bits (see the module docstring; config_equivalence
# proves it on every case of the sweep, running every execution of this table:
# equivalence_executions).  GPU entries: today's execution everywhere until
# ci/tune_log_softmax.py has timed the candidates and checked their bits on the H200; shipping
# one is a one-line edit of the entry (the script prints it), e.g.
#     ("gpu", torch.bfloat16, "log_softmax"): (ExecutionRule(64, 32000, GPU_SPLIT_16BIT[0]),),
EXECUTION_TABLE: Final[Mapping[tuple[str, torch.dtype, str], tuple[ExecutionRule, ...]]] = MappingProxyType(
    {
        # H200 run 32 (ci/tune_log_softmax.py, bits equal to the shipped launch's everywhere):
        # bf16 at 1-16 rows split over 32 programs (0.56-1.12x torch at 32000 / 129280 columns,
        # tiled 1.16-1.20x); the 2-chunk group from 17 rows (0.81-1.21x, tiled 0.82-1.23x);
        # fp32 split at one row (0.85-0.90x, measured at one row only).  fp16 as bf16 (same bytes).
        ("gpu", torch.float32, "log_softmax"): (ExecutionRule(1, 32000, GPU_SPLIT_32BIT[3]),),
        ("gpu", torch.bfloat16, "log_softmax"): _GPU_16BIT_LOG_SOFTMAX,
        ("gpu", torch.float16, "log_softmax"): _GPU_16BIT_LOG_SOFTMAX,
        ("gpu", torch.float32, "softmax"): (),
        ("gpu", torch.bfloat16, "softmax"): (),
        ("gpu", torch.float16, "softmax"): (),
        **{
            ("interp", dtype, op): (ExecutionRule(8, 1, _INTERP_SPLIT),)
            for dtype in (torch.float32, torch.bfloat16, torch.float16)
            for op in ("softmax", "log_softmax")
        },
    }
)


def execution_candidates(arch_name: str, dtype: torch.dtype, n_cols: int) -> tuple[Execution, ...]:
    """The tuning candidates for rows of ``n_cols`` elements of ``dtype`` on ``arch_name``,
    :data:`TILED` (today's) first: what ``ci/tune_log_softmax.py`` times and checks, and on the
    interpreter what ``config_equivalence`` runs.  Keyed like the tile: (arch, dtype, row length)."""
    if arch_family(arch_name) == "interp":
        found: tuple[Execution, ...] = INTERP_CANDIDATES
    else:
        found = TILED_CANDIDATES
        if softmax_config(arch_name, dtype, n_cols).block_m == 1 and n_cols > 1024:
            found += GPU_SPLIT_32BIT if dtype == torch.float32 else GPU_SPLIT_16BIT
    return (TILED, *found)


def execution_table(arch_name: str, dtype: torch.dtype, n_cols: int, op: str) -> ExecutionTable[Execution]:
    """The executions of ``op`` on rows of ``n_cols`` elements of ``dtype`` on ``arch_name`` by
    number of rows: the rules of :data:`EXECUTION_TABLE` whose row length holds, in order (the
    fallback: :data:`TILED`).  Keyed like the tile; the rows are the table's to look at."""
    rules = EXECUTION_TABLE[(arch_family(arch_name), dtype, op)]
    return tuple(r for r in rules if n_cols >= r.min_cols)


def table_executions(arch_name: str, dtype: torch.dtype, n_cols: int, op: str) -> tuple[Execution, ...]:
    """Every execution the launcher may pick for ``op`` on rows of ``n_cols`` elements of
    ``dtype`` on ``arch_name``, at any number of rows: :data:`TILED` (also what a launch with a
    baseline's tile runs) and each of :func:`execution_table`."""
    return tuple(
        dict.fromkeys((TILED, *every_execution(execution_table(arch_name, dtype, n_cols, op), TILED)))
    )


def equivalence_executions(arch_name: str, dtype: torch.dtype, n_cols: int, op: str) -> tuple[Execution, ...]:
    """What ``config_equivalence`` runs: every execution the launcher may pick
    (:func:`table_executions`), plus, under the interpreter, every candidate (cheap there), and
    on GPUs the first split candidate of vocabulary rows -- so the split kernels are proven on
    every GPU case before a split ships -- without the others, whose compiles would cost the GPU
    sweep minutes (``ci/tune_log_softmax.py`` checks their bits)."""
    found = table_executions(arch_name, dtype, n_cols, op)
    candidates = execution_candidates(arch_name, dtype, n_cols)
    if arch_family(arch_name) == "interp":
        found += candidates
    else:
        found += tuple(ex for ex in candidates if isinstance(ex, Split))[:1]
    return tuple(dict.fromkeys(found))


def softmax_execution(arch_name: str, dtype: torch.dtype, n_cols: int, num_rows: int, op: str) -> Execution:
    """The execution of a launch of ``num_rows`` rows of ``n_cols`` elements of ``dtype`` on
    ``arch_name`` for ``op`` (``"softmax"`` or ``"log_softmax"``): the first rule of
    :data:`EXECUTION_TABLE` that holds, else :data:`TILED`.  It may look at the rows because no
    execution changes a bit (module docstring); the tile (:func:`softmax_config`) never does."""
    return select_by_m(execution_table(arch_name, dtype, n_cols, op), num_rows, TILED)


def softmax_config(arch_name: str, dtype: torch.dtype, n_cols: int) -> RowConfig:
    """The configuration for rows of ``n_cols`` elements of input ``dtype`` on ``arch_name``.

    The signature is the key: (arch, dtype, row length), never the number of rows.
    """
    return lookup(SOFTMAX_TABLE, arch_name, dtype, n_cols)


def reduction_depth(config: RowConfig, n_cols: int) -> tuple[int, int]:
    """(chunks, combine) of the pinned reduction, in fp32 roundings: each lane adds ``chunks``
    terms in sequence; the fixed-point combine costs two roundings (int64 -> fp64 -> fp32) plus
    truncations below 2**-29 of the largest lane, counted as part of them.  For tolerances."""
    return max(1, math.ceil(n_cols / config.block_n)), 2


def launch(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    log: bool,
    config: RowConfig | None = None,
    fixed_point: bool = True,
    execution: Execution | None = None,
    float_parts: int = 1,
) -> torch.Tensor:
    """Launch the kernels on validated arguments.  ``config`` (instead of the table),
    ``fixed_point=False`` (a float ``tl.sum`` lane combine) and ``float_parts`` (with it, the
    split's combine as that many float partial sums: ``_row_stats``) are for the unpinned
    baselines (with ``config`` and no ``execution`` they run :data:`TILED`); ``execution``
    (instead of the execution table) is for ``config_equivalence`` and the tuning script."""
    x = kernel_operand(x)  # a negated view (x.conj().imag) is resolved, never read raw
    n_cols = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, n_cols)  # (R, V); a view whenever the strides allow
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)  # contiguous (..., V)
    num_rows = x2.shape[0]
    if num_rows == 0 or n_cols == 0:
        return y
    if execution is None and config is not None:
        execution = TILED
    if config is None:
        config = softmax_config(arch(x.device), x.dtype, n_cols)
    if execution is None:
        op = "log_softmax" if log else "softmax"
        execution = softmax_execution(arch(x.device), x.dtype, n_cols, num_rows, op)
    with interpreter_quiet():
        if isinstance(execution, Split):
            _launch_split(x2, y, config, execution, log, fixed_point, float_parts)
        else:
            softmax_kernel[(triton.cdiv(num_rows, config.block_m),)](
                x2,
                y,
                num_rows,
                n_cols,
                x2.stride(0),
                x2.stride(1),
                n_cols,  # y is contiguous (R, V)
                BLOCK_M=config.block_m,
                BLOCK_N=config.block_n,
                LOG=log,
                FIXED_POINT=fixed_point,
                GROUP=execution.group,
                STAGES=execution.stages,
                num_warps=config.num_warps,
            )
    return y


def _launch_split(
    x2: torch.Tensor,
    y: torch.Tensor,
    config: RowConfig,
    ex: Split,
    log: bool,
    fixed_point: bool,
    float_parts: int,
) -> None:
    """The split execution of ``x2`` (R, V) into ``y`` (contiguous): two or three launches."""
    num_rows, n_cols = x2.shape
    block_n = config.block_n
    lanes = ex.lanes(config)
    # (R, block_n) fp32 per-lane maxima and sums: every slot is written by pass 1
    m_ws = torch.empty((num_rows, block_n), dtype=torch.float32, device=x2.device)
    s_ws = torch.empty_like(m_ws)
    tiles = triton.cdiv(num_rows, ex.block_m)
    softmax_split_lanes_kernel[(tiles, ex.programs)](
        x2,
        m_ws,
        s_ws,
        num_rows,
        n_cols,
        x2.stride(0),
        x2.stride(1),
        BLOCK_M=ex.block_m,
        BLOCK_N=block_n,
        LANES=lanes,
        GROUP=ex.group,
        STAGES=ex.stages,
        num_warps=ex.num_warps,
    )
    stats = m_ws  # not read without a combine kernel
    if ex.combine_once:
        stats = torch.empty((num_rows, 2), dtype=torch.float32, device=x2.device)
        softmax_split_combine_kernel[(tiles,)](
            m_ws,
            s_ws,
            stats,
            num_rows,
            BLOCK_M=ex.block_m,
            BLOCK_N=block_n,
            FIXED_POINT=fixed_point,
            FLOAT_PARTS=float_parts,
            num_warps=ex.combine_warps,
        )
    span = triton.cdiv(triton.cdiv(n_cols, ex.write_programs), ex.write_n) * ex.write_n
    softmax_split_write_kernel[(tiles, triton.cdiv(n_cols, span))](
        x2,
        y,
        m_ws,
        s_ws,
        stats,
        num_rows,
        n_cols,
        span,
        x2.stride(0),
        x2.stride(1),
        n_cols,  # y is contiguous (R, V)
        BLOCK_M=ex.block_m,
        BLOCK_N=block_n,
        WRITE_N=ex.write_n,
        LOG=log,
        HAS_STATS=ex.combine_once,
        STAGES=ex.write_stages,
        FIXED_POINT=fixed_point,
        FLOAT_PARTS=float_parts,
        num_warps=ex.write_warps,
    )


def with_execution(
    x: torch.Tensor, dim: int = -1, half_to_float: bool = False, *, log: bool, execution: Execution
) -> torch.Tensor:
    """:func:`log_softmax` (``log``) or :func:`softmax` run with ``execution`` instead of the
    execution table's (the tile stays the table's): the executions that ``config_equivalence``
    compares and ``ci/tune_log_softmax.py`` times.  Arguments and errors as :func:`softmax`."""
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    return launch(x, out_dtype, log=log, execution=execution)


def softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Batch-invariant softmax over the last dim (Triton: one program per row tile, or a row's
    lanes over several programs at few rows, with the same bits).

    ``y[r, v] = exp(x[r, v] - max_v' x[r, v']) / sum_v'' exp(x[r, v''] - max_v' x[r, v'])``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16; any strides
        (a 3-D input whose leading dims cannot be merged is copied first).
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        As ``aten::_softmax(x, dim, half_to_float)``: bf16/fp16 in, float32 out.

    Returns
    -------
    Tensor, same shape as ``x``, contiguous; dtype float32 if ``half_to_float`` else ``x.dtype``.

    Notes
    -----
    Math in fp32: per-lane online max/sum over fixed ``block_n``-column chunks, an order-free
    fixed-point combine of the lanes, then ``exp(x - max) / sum``.  ``block_n`` comes from
    :data:`SOFTMAX_TABLE` keyed on (arch, dtype, V), so a row's output bits are invariant along
    the batch axes: the number of rows, the row's position and neighbours, its strides (the
    combine does not follow the vector width Triton derives from alignment), and earlier calls.
    The execution (:data:`EXECUTION_TABLE`, which may key on the number of rows) only decides
    which programs compute those values: every execution gives the same bits (the module
    docstring says why; ``config_equivalence`` checks it).
    NaN or +inf anywhere in a row, or a row of all -inf: the whole row is NaN (as aten).
    -inf entries of a finite row give +0; outputs are never -0.  Subnormal inputs are ordinary
    values; a GPU may flush subnormal intermediates (outputs below 2**-126) to zero.

    Raises
    ------
    DTypeError
        ``x`` is not float32/bfloat16/float16.
    ArgumentError
        ``x`` not 2-D/3-D; ``dim`` not the last dim or out of range; ``half_to_float`` with a
        float32 input.
    DeviceError
        ``x`` is not a CUDA tensor (CPU tensors are accepted under ``TRITON_INTERPRET=1``).

    Source: online softmax (Milakov & Gimelshein 2018), with the reduction order pinned.
    """
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    return launch(x, out_dtype, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, half_to_float: bool = False) -> torch.Tensor:
    """Batch-invariant log_softmax over the last dim (Triton: one program per row tile, or a
    row's lanes over several programs at few rows, with the same bits).

    ``y[r, v] = (x[r, v] - max_v' x[r, v']) - log(sum_v'' exp(x[r, v''] - max_v' x[r, v']))``

    Parameters
    ----------
    x : Tensor, (R, V) or (B, S, V), float32, bfloat16 or float16; any strides.
    dim : int
        Must name the last dim (-1 or ``x.dim() - 1``).
    half_to_float : bool
        As ``aten::_log_softmax(x, dim, half_to_float)``: bf16/fp16 in, float32 out.

    Returns
    -------
    Tensor, same shape as ``x``, contiguous; dtype float32 if ``half_to_float`` else ``x.dtype``.

    Notes
    -----
    Same pinned reduction as :func:`softmax`, so the same invariance axes.  NaN or +inf in a
    row, or a row of all -inf: the whole row is NaN; -inf entries of a finite row give -inf.
    The row maximum gives exactly +0 when the sum is exactly 1 (all other terms underflow).
    ``x - max`` is formed in fp32: where it falls below -3.4e38 (a row holding both -max_normal
    and +max_normal) the output is -inf, as in torch's fp32 log_softmax.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError
        As :func:`softmax`.

    Source: online softmax (Milakov & Gimelshein 2018), with the reduction order pinned.
    """
    out_dtype = check_softmax_args(x, dim, half_to_float)
    check_launch_device("x", x)
    return launch(x, out_dtype, log=True)
