"""The matmul's two tables: the reduction tree, keyed only on (arch, dtype, N, K), and the
executions of that tree, keyed on (arch, dtype, N, M bucket).

**The reduction tree** (:class:`ReductionTree`, :func:`reduction_tree`) fixes every output's fp32
sum: K is cut into chunks of ``chunk_k`` (the last one may be shorter); each chunk is summed from
zero in ``BLOCK_K`` steps in increasing k (a tensor core adds its 16-wide k-steps in order inside
a step); the chunk sums are added in increasing chunk order to a total that starts at zero; the
bias is added to the total; one rounding to the output dtype.  Nothing in it depends on M, so
the bits of a row cannot depend on the batch.

**An execution** (:class:`Execution`, :func:`execution_table`, :func:`select_execution`) is who computes what: the tile
(``BLOCK_M`` x ``BLOCK_N``), the visiting order (``GROUP_M``), warps and stages, and whether the
chunks of a tile run in different programs (``split_k``: each program sums one chunk into an fp32
workspace, a second kernel adds the chunk sums in order) or one program walks all of them.  Both
compute the same tree, so they are written to give the same bits; a compiler can still make them
differ (an unshipped IEEE fp32 tree did on the H200, run 29), so the registry check
``config_equivalence`` runs every execution of this table on the same inputs and requires
identical bits (on every lane, every production shape), which is what makes it legitimate for
the execution, and only the execution, to be chosen from M: small M splits K across the grid
(decode would otherwise stream the whole weight through ``N / BLOCK_N`` programs), large M walks
wide tiles (prefill).

Why the tree is never keyed on M: see above, and vLLM's issue with a bucket lookup frozen at
the trace-time M under torch.compile (the ``modes`` check compares the compiled prefix to eager at
every M; the launcher runs at call time, inside an opaque custom op, with the runtime M).

The two-step lookup (shape keys without M give an :class:`~batchinv.fast.execution.ExecutionTable`,
the table takes M) is the shared vocabulary of :mod:`batchinv.fast.execution`.

``docs/BENCHMARKS.md`` gives the floor and the measurements behind each row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.fast.execution import (
    ExecutionTable,
    MBucket,
    check_positive_int,
    check_power_of_two,
    every_execution,
    select_by_m,
)
from batchinv.reference.errors import ArgumentError
from batchinv.reference.fp8_gemm import SCALE_BLOCK


@dataclass(frozen=True)
class ReductionTree:
    """How each output's fp32 sum is associated (see the module docstring).

    Attributes:
        block_k: products per K step (a power of two >= 16).  Under the interpreter a step's
            products are summed by one ``tl.sum``; on a GPU the tensor core adds them in
            16-wide k-steps in order (the H200 gave the same bits for BLOCK_K 32, 64, 128).
        chunk_k: K per chunk, a multiple of ``block_k``; chunk sums are added in increasing
            chunk order.  ``chunk_k >= K`` is one chunk: a single accumulator over all of K.
            For FP8 block scales the chunks are the 128-wide scale blocks.
        promote_k: FP8 inputs on a GPU: the products the tensor core sums in its reduced-precision
            accumulator (Hopper: 13 fraction bits, truncating) before the sum is added to the
            fp32 accumulator (Triton's ``max_num_imprecise_acc``; a power of two >= 32, one
            ``wgmma`` k-step, dividing ``block_k``).  0: not an FP8 tree (16-bit and fp32
            inputs accumulate in fp32 throughout).  Without it Triton's sm90 default lets the
            whole K accumulate in the tensor core (``max_num_imprecise_acc = 2**30``).
    """

    block_k: int
    chunk_k: int
    promote_k: int = 0

    def __post_init__(self) -> None:
        check_power_of_two("block_k", self.block_k, 16)
        check_positive_int("chunk_k", self.chunk_k)
        if self.chunk_k % self.block_k:
            raise ArgumentError("chunk_k", f"a multiple of block_k = {self.block_k}", self.chunk_k)
        if self.promote_k:
            check_power_of_two("promote_k", self.promote_k, 32)
            if self.block_k % self.promote_k:
                raise ArgumentError(
                    "promote_k", f"0 or a divisor of block_k = {self.block_k}", self.promote_k
                )

    def num_chunks(self, k: int) -> int:
        """Chunks of a K-long reduction (at least 1)."""
        return max(1, -(-k // self.chunk_k))


@dataclass(frozen=True)
class Execution:
    """Who computes the tree: tile, visiting order, warps, stages, and split-K across the grid.

    Attributes:
        block_m, block_n: output tile (powers of two; ``block_n >= 16``; ``block_m >= 1``:
            Triton 3.6 accepts dots of fewer than 16 rows, which the IEEE fp32 (FMA) dot computes
            without the padding rows a 16-row tile multiplies at M = 1).
        group_m: row tiles visited together (L2 reuse of the weight); visiting order only.
        num_warps, num_stages: Triton launch options.
        split_k: each chunk of a tile in its own program (fp32 workspace, chunk sums added in
            order by a second kernel) instead of one program walking all chunks.
        tma: read the operands through tensor descriptors (TMA) where their layout allows it
            (16-bit inputs, unit inner stride, 16-byte aligned base and row stride); the
            launcher falls back to pointers elsewhere.  The same values reach the same dots.
        programs_per_sm: a walk's persistent programs per planned SM (2: two in flight per SM,
            which hides the walk's memory latency at mid M; tuning run 57).  Each tile is
            still computed by one program from its first chunk to its last, so which program
            takes it never changes the bits.  A split-K execution keeps
            ``SPLIT_PROGRAMS_PER_SM`` (fast/matmul.py) and must leave this at 1.
    """

    block_m: int
    block_n: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: bool = False
    tma: bool = False
    programs_per_sm: int = 1

    def __post_init__(self) -> None:
        check_power_of_two("block_m", self.block_m, 1)
        check_power_of_two("block_n", self.block_n, 16)
        for name in ("group_m", "num_warps", "num_stages", "programs_per_sm"):
            check_positive_int(name, getattr(self, name))
        for name in ("split_k", "tma"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(name, "a bool", getattr(self, name))
        if self.split_k and self.programs_per_sm != 1:
            raise ArgumentError(
                "programs_per_sm", "1 for a split-K execution (its grid is fixed)", self.programs_per_sm
            )

    @property
    def name(self) -> str:
        """``BMxBN gG wW sS`` (+ `` split`` for a split-K execution, `` tma`` for TMA loads,
        `` gridP`` for a walk of P programs per SM)."""
        extra = (" split" if self.split_k else "") + (" tma" if self.tma else "")
        extra += f" grid{self.programs_per_sm}" if self.programs_per_sm != 1 else ""
        return f"{self.block_m}x{self.block_n} g{self.group_m} w{self.num_warps} s{self.num_stages}{extra}"


@dataclass(frozen=True)
class MatmulConfig:
    """One launch: a reduction tree and an execution of it (``ArgumentError`` naming ``tree`` or
    ``execution`` when either is of another type)."""

    tree: ReductionTree
    execution: Execution

    def __post_init__(self) -> None:
        if not isinstance(self.tree, ReductionTree):
            raise ArgumentError("tree", "a ReductionTree", self.tree)
        if not isinstance(self.execution, Execution):
            raise ArgumentError("execution", "an Execution", self.execution)

    @property
    def name(self) -> str:
        """``kBK/CK[pP] <execution name>`` (``pP``: an FP8 tree's promotion interval)."""
        promote = f"p{self.tree.promote_k}" if self.tree.promote_k else ""
        return f"k{self.tree.block_k}/{self.tree.chunk_k}{promote} {self.execution.name}"


# --- the reduction tree ---------------------------------------------------------------------


@dataclass(frozen=True)
class TreeRule:
    """One row of the tree table: applies to ``arch`` and ``dtypes`` when the row's ``n`` and
    ``k`` (None: any) equal the problem's and ``N <= max_n`` (None: any).  Rows are tried in
    order; the first match wins.  ``scales``: the FP8 scale layouts the row applies to (None:
    any).  There is no M field, on purpose."""

    arch: str
    dtypes: tuple[torch.dtype, ...]
    tree: ReductionTree
    why: str
    n: int | None = None
    k: int | None = None
    max_n: int | None = None
    scales: tuple[str, ...] | None = None

    def matches(self, arch: str, dtype: torch.dtype, n: int, k: int, scale_layout: str | None = None) -> bool:
        return (
            self.arch == arch
            and dtype in self.dtypes
            and (self.n is None or self.n == n)
            and (self.k is None or self.k == k)
            and (self.max_n is None or n <= self.max_n)
            and (self.scales is None or scale_layout in self.scales)
        )


HALF = (torch.bfloat16, torch.float16)
FP32 = (torch.float32,)
FP8 = (torch.float8_e4m3fn,)
ALL = (*HALF, *FP32)
T = ReductionTree
#: One chunk: a single fp32 accumulator over all of K.
WHOLE_K = 1 << 30
#: FP8 block scales: the chunks are the 128-wide K blocks of the scales.
SCALE_BLOCK_K = SCALE_BLOCK
BLOCK_SCALES = ("block",)
WHOLE_SCALES = ("tensor", "token")

#: The tree table.  sm90 rows: the H200 tuning run 29 (``ci/tune_matmul.py``, docs/BENCHMARKS.md):
#: for each production shape, the chunk whose best split execution was fastest at M = 1..32
#: (fewer chunks: less workspace traffic at M = 32-64; more: more programs at M = 1).
TREE_TABLE: tuple[TreeRule, ...] = (
    TreeRule(
        "interp",
        ALL,
        T(32, 64),
        "interpreter: chunks of two K steps on the cpu lane's small K (160 -> 64 + 64 + 32), so chunk "
        "boundaries inside a walk, a short last chunk and a partial K step are exercised",
    ),
    TreeRule(
        "sm90",
        HALF,
        T(64, 1536),
        "3 chunks: 1.13-1.23x cuBLAS at M <= 32 (2 chunks: 1.23-1.43x)",
        14336,
        4096,
    ),
    TreeRule("sm90", HALF, T(64, 3584), "4 chunks: 1.09-1.14x at M <= 32, 1.31x at M = 128", 4096, 14336),
    TreeRule("sm90", HALF, T(64, 1024), "router N <= 512: 0.84-1.06x cuBLAS + cast at M <= 512", max_n=512),
    TreeRule("sm90", HALF, T(64, 1024), "4096x4096 and 2688x4096: 4 chunks (8 and 2 were slower at M <= 32)"),
    TreeRule(
        "sm90",
        FP32,
        T(32, 256),
        "IEEE fp32 router: chunks of 256, 16 at K = 4096 (K steps 64 / 128 no faster)",
    ),
    # --- FP8 (float8_e4m3fn): issue 12; the scales decide the chunks, never N, K or M ---
    TreeRule(
        "interp",
        FP8,
        T(32, SCALE_BLOCK_K),
        "cpu lane, block scales: each 128-wide scale block summed in 4 K steps",
        scales=BLOCK_SCALES,
    ),
    TreeRule("interp", FP8, T(32, WHOLE_K), "cpu lane: one accumulator over K", scales=WHOLE_SCALES),
    TreeRule(
        "sm90",
        FP8,
        T(128, SCALE_BLOCK_K, promote_k=128),
        "block scales: one K step per scale block; its 128 products (4 wgmma k-steps) promoted to fp32 at once",
        scales=BLOCK_SCALES,
    ),
    TreeRule(
        "sm90",
        FP8,
        T(256, WHOLE_K, promote_k=128),
        "one fp32 accumulator over K, promoted every 128 products (CUTLASS's and DeepSeek-V3's interval; "
        "every 32 was 15-40% slower, run 35); K steps of 256: the same bits as 128, 8-20% faster at M >= 512 "
        "(run 36)",
        scales=WHOLE_SCALES,
    ),
    TreeRule("sm100", HALF, T(64, 1024), "as sm90 (never run on sm100)"),
    TreeRule("sm100", FP32, T(32, 256), "as sm90 (never run on sm100)"),
)

#: Any other architecture (sm80, sm89, ...): one chunk of 32-wide steps, a plain k loop.
FALLBACK_TREE = ReductionTree(32, WHOLE_K)


def _fallback_tree(dtype: torch.dtype, scale_layout: str | None) -> ReductionTree:
    """:data:`FALLBACK_TREE`; for FP8 its block-scale chunks and a promotion every k-step."""
    if dtype not in FP8:
        return FALLBACK_TREE
    return ReductionTree(32, SCALE_BLOCK_K if scale_layout in BLOCK_SCALES else WHOLE_K, promote_k=32)


def reduction_tree(
    arch: str, dtype: torch.dtype, n: int, k: int, scale_layout: str | None = None
) -> ReductionTree:
    """The reduction tree of an ``[M, K] @ [K, N]`` problem of input ``dtype`` on ``arch``
    (``scale_layout``: an FP8 problem's scales, :data:`batchinv.reference.fp8_gemm.SCALE_LAYOUTS`).

    There is no M parameter, by design (a CPU test enforces it): the tree is the bits.
    ``arch`` is ``"sm90"``, ``"sm100"``, ... or ``"interp"`` (:func:`batchinv.fast.device.arch`).
    """
    for rule in TREE_TABLE:
        if rule.matches(arch, dtype, n, k, scale_layout):
            return rule.tree
    return _fallback_tree(dtype, scale_layout)


# --- the executions -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionRule(MBucket[Execution]):
    """One row of the execution table, an :class:`~batchinv.fast.execution.MBucket`: applies to
    ``arch`` and ``dtypes`` when ``N <= max_n`` and ``M <= max_m`` (None: no limit).  Rows are
    tried in order; the first match wins.  The M key is legitimate because every execution
    computes the same :class:`ReductionTree`, and ``config_equivalence`` proves the bits equal."""

    arch: str
    dtypes: tuple[torch.dtype, ...]
    max_n: int | None
    max_m: int | None
    execution: Execution
    why: str


E = Execution


def S(block_m: int, block_n: int, num_warps: int, num_stages: int) -> Execution:
    """A split-K execution with TMA reads."""
    return Execution(block_m, block_n, num_warps=num_warps, num_stages=num_stages, split_k=True, tma=True)


def W(block_m: int, block_n: int, num_warps: int, num_stages: int, programs_per_sm: int = 1) -> Execution:
    """A walk with TMA reads (``programs_per_sm`` persistent programs per SM)."""
    return Execution(
        block_m,
        block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        tma=True,
        programs_per_sm=programs_per_sm,
    )


#: The execution table.  sm90 rows: the fastest execution per M bucket over the production shapes
#: in tuning runs 29 and 31 (every candidate gave the bits of the others of its tree there; the
#: sweep's config_equivalence checks the rows below on every GPU case).
EXECUTION_TABLE: tuple[ExecutionRule, ...] = (
    # --- interpreter: split at small M, walk above, so the cpu lane's M sweep crosses both ---
    ExecutionRule(
        "interp",
        FP32,
        None,
        2,
        E(2, 32, group_m=2, split_k=True),
        "cpu lane, fp32: two-row split tiles at M <= 2 (as sm90's few-row IEEE router splits), so "
        "config_equivalence proves a tile of fewer than 16 rows and its chunk sum on the cpu lane",
    ),
    ExecutionRule(
        "interp", ALL, None, 16, E(16, 64, group_m=2, split_k=True), "cpu lane: split-K at M <= 16"
    ),
    ExecutionRule("interp", FP8, None, 16, E(16, 64, group_m=2), "cpu lane, FP8: walks only (no split-K)"),
    ExecutionRule("interp", FP8, None, None, E(64, 64, group_m=2, tma=True), "cpu lane, FP8: TMA reads"),
    ExecutionRule(
        "interp",
        ALL,
        None,
        None,
        E(64, 64, group_m=2, tma=True),
        "cpu lane: a walk with TMA reads (where aligned)",
    ),
    # --- sm90 (H100/H200), 16-bit inputs.  Router-sized N first (tuning run 31: 0.84-1.28x) ---
    ExecutionRule("sm90", HALF, 512, 32, E(16, 64, num_warps=2, num_stages=4, split_k=True), "router decode"),
    ExecutionRule("sm90", HALF, 512, 256, E(64, 64, num_warps=4, num_stages=3, split_k=True), "router"),
    ExecutionRule(
        "sm90", HALF, 512, 1024, E(64, 128, num_warps=4, num_stages=4, split_k=True, tma=True), "router"
    ),
    ExecutionRule(
        "sm90", HALF, 512, None, E(64, 128, num_warps=4, num_stages=4, tma=True), "router prefill: walk"
    ),
    # dense layers (run 31: decode 1.04-1.41x, prefill 1.10-1.29x cuBLAS); TMA reads throughout
    ExecutionRule("sm90", HALF, None, 16, S(16, 128, 4, 4), "decode: 16-row tiles, K split across the grid"),
    ExecutionRule("sm90", HALF, None, 32, S(32, 128, 4, 4), "decode"),
    ExecutionRule("sm90", HALF, None, 64, S(64, 128, 4, 4), "decode"),
    ExecutionRule("sm90", HALF, 8192, 128, S(64, 128, 4, 4), "mid M, N <= 8192: still split"),
    ExecutionRule("sm90", HALF, None, 128, W(128, 128, 8, 4), "mid M, wide N (14336): enough tiles to walk"),
    ExecutionRule("sm90", HALF, 8192, 256, W(64, 128, 4, 4), "walk"),
    ExecutionRule("sm90", HALF, None, 256, W(128, 256, 8, 4), "walk, wide N"),
    ExecutionRule(
        "sm90", HALF, 8192, 512, W(64, 128, 4, 4, programs_per_sm=2), "walk, two programs per SM (run 57)"
    ),
    ExecutionRule("sm90", HALF, None, 512, W(128, 256, 8, 4), "walk, wide N"),
    ExecutionRule("sm90", HALF, None, None, W(128, 256, 8, 3), "prefill walk"),
    # --- sm90, IEEE fp32 (FMA dots).  Router N: tiles of 1-4 rows at M <= 8 (tuning run 64,
    # ci/tune_matmul.py round 6: a 16-row tile computes 15 padding rows at M = 1) ---
    ExecutionRule(
        "sm90",
        FP32,
        512,
        1,
        E(1, 64, num_warps=2, num_stages=3, split_k=True),
        "fp32 router M = 1: one-row tiles (run 64: 7.3 / 8.2 us at K 4096 / 7168, 16 rows: 14.2 / 20.3)",
    ),
    ExecutionRule(
        "sm90",
        FP32,
        512,
        4,
        E(2, 32, num_warps=1, num_stages=3, split_k=True),
        "fp32 router M <= 4: two-row tiles (run 64: 7.6-7.9 / 8.8-11.6 us, 16 rows: 14.1 / 20.5)",
    ),
    ExecutionRule(
        "sm90",
        FP32,
        512,
        8,
        E(4, 64, num_warps=2, num_stages=3, split_k=True),
        "fp32 router M <= 8: four-row tiles (run 64: 10.2 / 15.1 us, 16 rows: 14.8 / 21.7)",
    ),
    ExecutionRule("sm90", FP32, None, 32, E(16, 32, num_warps=2, num_stages=3, split_k=True), "fp32 decode"),
    ExecutionRule("sm90", FP32, None, 64, E(32, 64, num_warps=4, num_stages=3, split_k=True), "fp32"),
    ExecutionRule("sm90", FP32, 512, 256, E(64, 64, num_warps=4, num_stages=3, split_k=True), "fp32 router"),
    ExecutionRule(
        "sm90",
        FP32,
        512,
        None,
        E(128, 128, num_warps=8, num_stages=2, split_k=True),
        "fp32 router prefill (run 54: 1.73-2.49x cuBLAS at M 512-4096, against 2.53-3.55x with 64x64)",
    ),
    ExecutionRule("sm90", FP32, None, None, E(64, 64, num_warps=4, num_stages=3), "fp32, large N: walk"),
    # --- sm90, FP8: walks only (issue 12: no split-K), 64-row tiles at least so Triton emits
    # wgmma, whose fp32 promotion (promote_k) it implements; mma.sync has none ---
    # (run 36, ci/tune_fp8_gemm.py: 64x16 / 64x32 tiles, 6 stages and 64x128 were no faster at decode)
    ExecutionRule("sm90", FP8, 8192, 64, W(64, 64, 4, 4), "FP8 decode: 64-row wgmma tiles, 64 columns"),
    ExecutionRule(
        "sm90", FP8, None, 64, W(64, 128, 4, 4), "FP8 decode, wide N: 128 columns, one wave (run 57)"
    ),
    ExecutionRule("sm90", FP8, 8192, 128, W(64, 64, 4, 4), "FP8 mid M, N <= 8192"),
    ExecutionRule("sm90", FP8, None, None, W(128, 128, 8, 3), "FP8 prefill (and wide N from M = 65)"),
    # --- sm100 (B200/GB200): sm90's shapes of rows, never run there ---
    ExecutionRule("sm100", HALF, None, 16, S(16, 128, 4, 4), "as sm90"),
    ExecutionRule("sm100", HALF, None, 128, S(64, 128, 4, 4), "as sm90"),
    ExecutionRule("sm100", HALF, None, None, W(128, 256, 8, 3), "as sm90"),
    ExecutionRule("sm100", FP32, None, 32, E(16, 32, num_warps=2, num_stages=3, split_k=True), "as sm90"),
    ExecutionRule("sm100", FP32, None, None, E(64, 64, num_warps=4, num_stages=3), "as sm90"),
)

#: Any other architecture: a conservative walk that compiles everywhere.
FALLBACK_EXECUTION = Execution(64, 64, num_warps=4, num_stages=2)


def execution_table(arch: str, dtype: torch.dtype, n: int) -> ExecutionTable[Execution]:
    """The executions of ``(arch, dtype, N)`` by M bucket: the rows of :data:`EXECUTION_TABLE`
    whose arch, dtypes and ``max_n`` hold, in order (the fallback: :data:`FALLBACK_EXECUTION`).
    There is no M parameter: M is the table's to look at (:func:`select_execution`)."""
    return tuple(
        r
        for r in EXECUTION_TABLE
        if r.arch == arch and dtype in r.dtypes and (r.max_n is None or n <= r.max_n)
    )


def select_execution(arch: str, dtype: torch.dtype, n: int, m: int) -> Execution:
    """The execution for ``m`` rows: the first row of :data:`EXECUTION_TABLE` that matches,
    else :data:`FALLBACK_EXECUTION`.  Never changes the bits (see the module docstring)."""
    return select_by_m(execution_table(arch, dtype, n), m, FALLBACK_EXECUTION)


def executions(arch: str, dtype: torch.dtype, n: int) -> tuple[Execution, ...]:
    """Every execution :func:`select_execution` may pick for ``(arch, dtype, N)``, any M: what
    ``config_equivalence`` runs."""
    return every_execution(execution_table(arch, dtype, n), FALLBACK_EXECUTION)


def select_config(
    arch: str, dtype: torch.dtype, n: int, k: int, m: int, scale_layout: str | None = None
) -> MatmulConfig:
    """The launch config: :func:`reduction_tree` (no M) and :func:`select_execution` (M bucket)."""
    return MatmulConfig(reduction_tree(arch, dtype, n, k, scale_layout), select_execution(arch, dtype, n, m))
