"""Batch-invariant matmul: a Triton persistent kernel with one fixed reduction order.

Launcher only: validate (typed errors), allocate, take the reduction tree from the
(arch, dtype, N, K) table and the execution from the (arch, dtype, N, M bucket) table, size the
persistent grid from the planned SM count, launch.  The kernels are in
:mod:`batchinv.fast.kernels.matmul`.

The tree is looked up without M on purpose: it fixes the order of each output's fp32 sum, so
keying it on the batch size would make the bits a function of the batch (see
:mod:`batchinv.fast.matmul_config`).  No autotuning either, for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from batchinv.fast.device import (
    arch,
    check_launch_device,
    check_no_grad,
    interpreter_quiet,
    interpreting,
    kernel_operand,
    sm_count,
)
from batchinv.fast.matmul_config import MatmulConfig, reduction_tree, select_config
from batchinv.reference.errors import ArgumentError, check_tensor
from batchinv.reference.fp8_gemm import SCALE_BLOCK  # the FP8 block scales' edge (128)
from batchinv.reference.matmul import MatmulArgs, validate, weight_kn


@dataclass(frozen=True)
class LaunchPlan:
    """What a call launches: the config (tree from N, K, dtype, arch; execution from M's bucket)
    and the grid of the main kernel."""

    config: MatmulConfig
    num_tiles: int
    num_chunks: int
    grid: int
    interpreted: bool


#: Programs per planned SM of a split-K execution's persistent grid: several in flight per SM
#: hide memory latency at decode.  Which program takes a (tile, chunk) item never changes bits.
SPLIT_PROGRAMS_PER_SM = 8


def plan(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device,
    num_sms: int | None = None,
    config: MatmulConfig | None = None,
    scale_layout: str | None = None,
) -> LaunchPlan:
    """The launch plan of an ``[M, K] @ [K, N]`` problem of input ``dtype`` on ``device``
    (``scale_layout``: an FP8 problem's scales, which choose its tree's chunks).

    ``config`` overrides the tables (for tests, tuning and ``config_equivalence`` only;
    production callers leave it None).  M picks the execution (the tile, split-K or not) and
    sizes the grid; the reduction tree, which fixes the bits, comes from (arch, dtype, N, K).
    """
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1):
        raise ArgumentError(
            "num_sms", "a positive int (the SM count the persistent grid plans for) or None", num_sms
        )
    if config is not None and not isinstance(config, MatmulConfig):
        raise ArgumentError("config", "a MatmulConfig or None", config)
    cfg = config if config is not None else select_config(_arch_key(device), dtype, n, k, m, scale_layout)
    ex = cfg.execution
    tiles = -(m // -ex.block_m) * -(n // -ex.block_n)  # ceil(M / BLOCK_M) * ceil(N / BLOCK_N)
    chunks = cfg.tree.num_chunks(k)
    planned = num_sms if num_sms is not None else sm_count(device if device.type == "cuda" else None)
    per_sm = SPLIT_PROGRAMS_PER_SM if ex.split_k else ex.programs_per_sm
    items, programs = (tiles * chunks if ex.split_k else tiles), planned * per_sm
    # Under the interpreter the kernel avoids numpy's matmul (row-position-dependent BLAS order,
    # raw-bit bf16) and the truncating bf16 cast; see the kernel's INTERPRETED flag.
    return LaunchPlan(cfg, tiles, chunks, max(1, min(programs, items)), interpreting())


def _arch_key(device: torch.device) -> str:
    """The tables' architecture key for operands on ``device`` (``"interp"`` under the interpreter)."""
    return arch(device if device.type == "cuda" and not interpreting() else None)


def accumulation(n: int, k: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int]:
    """``(group, chunk)``: the products per accumulation step and per chunk of the reduction
    tree :func:`matmul` computes for ``[*, K] @ [K, N]`` on this device (any M: the tree has no
    M), as :func:`batchinv.reference.matmul.tight_bound` takes them (a K tile under the
    interpreter, whose products one ``tl.sum`` adds; 16 on a GPU, a tensor-core MMA's k-step,
    with fp32's FMA finer and covered)."""
    tree = reduction_tree(_arch_key(device), dtype, n, k)
    return (tree.block_k if interpreting() else 16), tree.chunk_k


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    precision: str = "ieee",
    num_sms: int | None = None,
    out: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """Batch-invariant ``out = x @ W (+ bias)``: fp32 accumulation, one rounding at the end.

    Each output element is the fp32 sum of its K products along the reduction tree of
    (arch, dtype, N, K) (:func:`batchinv.fast.matmul_config.reduction_tree`): K in chunks of
    ``chunk_k``, each summed from zero in increasing k, the chunk sums added in increasing chunk
    order; plus ``bias`` in fp32, rounded once to ``out_dtype``.  M picks only the execution
    (tile, warps, stages, and whether a tile's chunks run in different programs: split-K across
    the grid at decode), which never changes the bits (``config_equivalence`` checks it).

    Parameters
    ----------
    x : Tensor [M, K]
        bf16, fp16 or fp32, any strides.
    weight : Tensor [N, K] (``layout="linear"``, as ``F.linear``) or [K, N] (``layout="mm"``)
        Same dtype as ``x``, any strides.
    bias : Tensor [N], optional
        ``x``'s dtype or fp32, any stride (0 included); added to the fp32 accumulator before
        the final rounding.  Operands with the negative (or conjugate) bit set, such as
        ``z.conj().imag``, are materialized first (:func:`batchinv.fast.device.kernel_operand`).
    layout : {"linear", "mm"}
    out_dtype : torch.dtype, optional
        ``x``'s dtype (default) or fp32.  fp32 from bf16/fp16 inputs returns the fp32
        accumulator itself (router logits never round through bf16).
    precision : {"ieee", "tf32"}
        fp32 inputs only: ``"ieee"`` (default) computes true fp32 products; ``"tf32"`` must be
        asked for explicitly (operands rounded to 10 mantissa bits, faster on tensor cores).
    num_sms : int, optional
        The SM count the persistent grid plans for (default: the device's).  Any value gives
        the same bits: it decides which program computes a tile, never how (partition axis).
    out : Tensor [M, N], optional
        Preallocated output of ``out_dtype`` on ``x``'s device (tests prefill it with NaN so an
        unwritten tile shows).  Any strides whose elements do not overlap (row- or
        column-major, padded rows); never in the storage of ``x``, ``weight`` or ``bias`` (tiles
        would read inputs other tiles already overwrote), never an expanded (stride-0) view,
        never a view with the negative bit set.
    config : MatmulConfig, optional
        Overrides both tables (tree and execution); for tests, tuning and
        ``config_equivalence`` only.  An execution of the table's tree
        (``MatmulConfig(reduction_tree(arch, dtype, N, K), Execution(...))``) gives the table's
        bits; another :class:`~batchinv.fast.matmul_config.ReductionTree` gives other bits (still
        invariant along M under that fixed config).

    Returns
    -------
    Tensor [M, N] of ``out_dtype``
        Bitwise invariant along M (any batch size), row position and neighbours, the planned SM
        count, the execution and repeated calls: the tree depends on (arch, dtype, N, K) only.
        NaN / inf propagate as IEEE products and sums (``inf * 0`` is NaN); the sign of an
        exactly-zero result is not specified (+0 or -0), but it is invariant too.

    Raises
    ------
    DTypeError
        Unsupported dtype or dtype mix (argument named); ``out`` not a tensor.
    ArgumentError
        Non-2-D operands, mismatched K, bad ``bias`` shape, ``layout``, ``precision``,
        ``num_sms``, ``config``; ``out`` of the wrong shape, dtype or device, requiring grad, sharing
        storage with an input, with overlapping elements, or with the negative bit set.
    DeviceError
        Operands on different devices, on the meta device, or CPU tensors without the Triton
        interpreter.

    Source
    ------
    Persistent tile walk after Triton tutorial 09 (persistent matmul); pinning the reduction
    follows Thinking Machines' "Defeating Nondeterminism in LLM Inference" (2025) and vLLM's
    ``batch_invariant.py``, which forbid split-K; here split-K is allowed because the chunk
    count and the order chunks are added in come from (N, K), never from M (issue 11's design).
    """
    args = validate(x, weight, bias, layout, out_dtype, precision)
    check_launch_device("x", x)
    check_no_grad("weight", weight)
    if bias is not None:
        check_no_grad("bias", bias)
    if out is None:
        out = torch.empty((args.m, args.n), device=x.device, dtype=args.out_dtype)
    else:
        check_out(out, args, x.device, (("x", x), ("weight", weight), ("bias", bias)))
    if args.m == 0 or args.n == 0:
        return out
    x, weight = kernel_operand(x), kernel_operand(weight)
    bias = kernel_operand(bias) if bias is not None else None
    b = weight_kn(weight, layout)  # [K, N]
    p = plan(args.m, args.n, args.k, x.dtype, x.device, num_sms, config)
    descriptors = _descriptors(x, weight, layout, p) if p.config.execution.tma else None
    _launch(x, b, bias, out, args.m, args.n, args.k, p, precision, descriptors, layout == "linear")
    return out


#: The largest TMA box edge (elements) a descriptor may have (CUDA's cuTensorMapEncodeTiled);
#: an execution with a larger tile reads through pointers.
TMA_MAX_BOX = 256


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether TMA can read ``t`` (2-D): a 16-bit or 8-bit dtype, unit inner stride, rows that
    do not overlap (an expanded, stride-0 view reads through pointers), base address and row
    stride multiples of 16 bytes."""
    size = t.element_size()
    return (
        size in (1, 2)
        and t.stride(1) == 1
        and t.stride(0) >= t.shape[1]
        and (t.stride(0) * size) % 16 == 0
        and t.data_ptr() % 16 == 0
        and t.shape[0] > 0
        and t.shape[1] > 0
    )


def _descriptors(x: torch.Tensor, weight: torch.Tensor, layout: str, p: LaunchPlan) -> tuple[Any, Any] | None:
    """Tensor descriptors of ``x`` ``[M, K]`` and the weight as stored (``[N, K]`` for the
    linear layout, ``[K, N]`` for mm), with the execution's blocks; None when either operand's
    layout does not allow TMA or a block passes :data:`TMA_MAX_BOX` (the kernel then reads
    through pointers: the same values)."""
    if not (_tma_ready(x) and _tma_ready(weight)):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    ex, block_k = p.config.execution, p.config.tree.block_k
    if max(ex.block_m, ex.block_n, block_k) > TMA_MAX_BOX:
        return None
    a_desc = TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [ex.block_m, block_k])
    w_block = [ex.block_n, block_k] if layout == "linear" else [block_k, ex.block_n]
    b_desc = TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1], w_block)
    return a_desc, b_desc


def _elements_overlap(t: torch.Tensor) -> bool:
    """Whether two indices of ``t`` may address the same element (stride 0 on a dimension of
    size > 1 included).  Conservative: sorted by stride, each dimension must step past the whole
    extent of the smaller ones; layouts that interleave otherwise count as overlapping."""
    extent = 1  # elements spanned by the dimensions seen so far
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1):
        if stride < extent:
            return True
        extent += stride * (size - 1)
    return False


def check_out(
    out: object,
    args: MatmulArgs,
    device: torch.device,
    inputs: tuple[tuple[str, torch.Tensor | None], ...],
) -> None:
    """Validate a preallocated ``out`` of :func:`matmul`.

    Raises
    ------
    DTypeError
        ``out`` is not a tensor.
    ArgumentError
        Wrong shape, dtype or device; ``requires_grad`` set (the kernel writes it outside
        autograd; ``torch.mm(out=)`` refuses it too); the negative or conjugate bit set (the
        kernel writes raw memory); elements that overlap (an expanded view: tiles would race on them); the same
        storage as one of ``inputs`` (tiles would read values other tiles already wrote).  The
        storage test is conservative: disjoint slices of one buffer are refused too.
    """
    check_tensor("out", out)
    assert isinstance(out, torch.Tensor)
    if out.requires_grad:
        raise ArgumentError(
            "out",
            "a tensor that does not require grad (the kernel writes it outside autograd; "
            "torch.mm(out=) refuses it too)",
            "a tensor with requires_grad=True",
        )
    if tuple(out.shape) != (args.m, args.n) or out.dtype != args.out_dtype or out.device != device:
        raise ArgumentError(
            "out",
            f"a [{args.m}, {args.n}] {args.out_dtype} tensor on {device}",
            f"{tuple(out.shape)} {out.dtype} on {out.device}",
        )
    if out.is_neg() or out.is_conj():
        raise ArgumentError(
            "out",
            "a tensor without the negative or conjugate bit set (the kernel writes raw memory)",
            f"a view with is_neg()={out.is_neg()}, is_conj()={out.is_conj()}",
        )
    if _elements_overlap(out):
        raise ArgumentError(
            "out",
            "a tensor whose elements do not overlap (no expanded, stride-0 dimension)",
            f"strides {tuple(out.stride())}",
        )
    if out.numel() == 0:
        return
    out_storage = out.untyped_storage().data_ptr()
    for name, t in inputs:
        if t is not None and t.numel() > 0 and t.untyped_storage().data_ptr() == out_storage:
            raise ArgumentError(
                "out", f"a tensor that does not share storage with the input {name!r}", f"a view of {name}"
            )


def _launch(
    x: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    m: int,
    n: int,
    k: int,
    p: LaunchPlan,
    precision: str,
    descriptors: tuple[Any, Any] | None,
    b_is_nk: bool,
    scales: ScaleOperands | None = None,
) -> None:
    """Launch the main kernel (and the chunk-sum kernel of a split execution).  ``scales``: an
    FP8 launch's scales (a walk: the launcher refuses a split execution with scales, and for
    block scales a tree whose chunks are not the :data:`SCALE_BLOCK`-wide K blocks)."""
    from batchinv.fast.kernels.matmul import chunk_sum_kernel, chunked_matmul_kernel

    tree, ex = p.config.tree, p.config.execution
    if scales is not None and ex.split_k:
        raise ArgumentError(
            "config", "a walk (split_k=False) for an FP8 launch (issue 12: no split-K)", ex.name
        )
    if scales is not None and scales.code == SCALE_CODES["block"] and tree.chunk_k != SCALE_BLOCK:
        # the kernel scales chunk c by the scales of K block c: a chunk must be a scale block
        raise ArgumentError(
            "config",
            f"a tree with chunk_k = {SCALE_BLOCK} for block scales (a chunk is a scale block)",
            f"chunk_k = {tree.chunk_k}",
        )
    xs, wss = (scales.x_scale, scales.weight_scale) if scales is not None else (out, out)
    # The split execution's chunk sums: fp32 [chunks, M, N], every element written before read.
    ws = torch.empty((p.num_chunks, m, n), device=x.device, dtype=torch.float32) if ex.split_k else out
    with interpreter_quiet():
        a_desc, b_desc = descriptors if descriptors is not None else (None, None)
        chunked_matmul_kernel[(p.grid,)](
            x,
            b,
            a_desc,
            b_desc,
            bias if bias is not None else out,  # never read when HAS_BIAS is False
            out,
            ws,
            m,
            n,
            k,
            tree.chunk_k // tree.block_k,
            p.num_chunks,
            x.stride(0),
            x.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            out.stride(1),
            bias.stride(0) if bias is not None else 0,
            ws.stride(0) if ex.split_k else 0,
            ws.stride(1) if ex.split_k else 0,
            xs,
            wss,
            xs.stride(0) if scales is not None else 0,
            xs.stride(1) if scales is not None else 0,
            wss.stride(0) if scales is not None else 0,
            wss.stride(1) if scales is not None else 0,
            BLOCK_M=ex.block_m,
            BLOCK_N=ex.block_n,
            BLOCK_K=tree.block_k,
            GROUP_M=ex.group_m,
            SPLIT_K=ex.split_k,
            HAS_BIAS=bias is not None,
            INPUT_PRECISION=precision,
            INTERPRETED=p.interpreted,
            USE_TMA=descriptors is not None,
            B_IS_NK=b_is_nk,
            PROMOTE_K=tree.promote_k,
            SCALES=scales.code if scales is not None else 0,
            SCALE_BLOCK=SCALE_BLOCK,
            num_warps=ex.num_warps,
            num_stages=ex.num_stages,
            # The FP8 formula rounds each product of its scaling (no fused multiply-add).
            enable_fp_fusion=scales is None,
        )
        if ex.split_k:
            sum_m, sum_n = min(ex.block_m, SUM_TILE[0]), SUM_TILE[1]
            chunk_sum_kernel[(-(m // -sum_m), -(n // -sum_n))](
                ws,
                bias if bias is not None else out,
                out,
                m,
                n,
                p.num_chunks,
                ws.stride(0),
                ws.stride(1),
                out.stride(0),
                out.stride(1),
                bias.stride(0) if bias is not None else 0,
                BLOCK_M=sum_m,
                BLOCK_N=sum_n,
                HAS_BIAS=bias is not None,
                INTERPRETED=p.interpreted,
                num_warps=4,
            )


#: The chunk-sum kernel's tile (elementwise: any tile gives the same bits); a split execution of
#: fewer rows sums tiles of its own row count (no masked rows at M = 1).
SUM_TILE = (16, 128)


def sum_chunks(ws: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The split execution's second kernel on given chunk sums: ``out = round(((0 + ws[0]) +
    ws[1]) + ... + ws[C-1] + bias)`` in fp32, the bias in fp32, one rounding to ``out_dtype``.

    Parameters
    ----------
    ws : Tensor [C, M, N], fp32, contiguous
        Chunk sums in chunk order (each the fp32 sum of one chunk of the reduction tree, as the
        pinned matmul forms it on that chunk's K slice).
    bias : Tensor [N], optional
    out_dtype : torch.dtype
        bf16, fp16 or fp32.

    Returns
    -------
    Tensor [M, N] of ``out_dtype``: bitwise what :func:`matmul` gives from the same chunk sums
    (the walk adds them in the same order), NaN payloads included.  The tensor-parallel
    emulation's all-reduce (:mod:`batchinv.fast.tp_linear`).

    Raises
    ------
    ArgumentError
        ``ws`` not a contiguous 3-D fp32 tensor, ``bias`` not [N], ``out_dtype`` unsupported.
    """
    from batchinv.fast.kernels.matmul import chunk_sum_kernel

    if (
        not isinstance(ws, torch.Tensor)
        or ws.dim() != 3
        or ws.dtype != torch.float32
        or not ws.is_contiguous()
    ):
        raise ArgumentError("ws", "a contiguous fp32 tensor [chunks, M, N]", getattr(ws, "shape", ws))
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ArgumentError("out_dtype", "bf16, fp16 or fp32", out_dtype)
    chunks, m, n = ws.shape
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ArgumentError("bias", f"a tensor [{n}]", tuple(bias.shape))
    check_launch_device("ws", ws)
    out = torch.empty((m, n), device=ws.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return out
    bias = kernel_operand(bias) if bias is not None else None
    sum_m, sum_n = SUM_TILE
    with interpreter_quiet():
        chunk_sum_kernel[(-(m // -sum_m), -(n // -sum_n))](
            ws,
            bias if bias is not None else out,
            out,
            m,
            n,
            chunks,
            ws.stride(0),
            ws.stride(1),
            out.stride(0),
            out.stride(1),
            bias.stride(0) if bias is not None else 0,
            BLOCK_M=sum_m,
            BLOCK_N=sum_n,
            HAS_BIAS=bias is not None,
            INTERPRETED=interpreting(),
            num_warps=4,
        )
    return out


#: The kernel's code of each FP8 scale layout (its ``SCALES`` constexpr).
SCALE_CODES: dict[str, int] = {"tensor": 1, "token": 2, "block": 3}


@dataclass(frozen=True)
class ScaleOperands:
    """An FP8 launch's scales: the layout's kernel code and the fp32 scales as 2-D tensors
    (``[1, 1]`` each for ``"tensor"``, ``[M, 1]`` / ``[N, 1]`` for ``"token"``, ``[M, KB]`` /
    ``[NB, KB]`` for ``"block"``)."""

    code: int
    x_scale: torch.Tensor
    weight_scale: torch.Tensor


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-invariant ``F.linear(x, weight, bias)``: :func:`matmul` with ``layout="linear"``.

    ``x`` [M, K], ``weight`` [N, K], ``bias`` [N] -> [M, N]; see :func:`matmul` for dtypes,
    invariance, NaN behaviour and errors.
    """
    return matmul(x, weight, bias, layout="linear", out_dtype=out_dtype, num_sms=num_sms)


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-invariant ``a @ b``: :func:`matmul` with ``layout="mm"`` (``a`` [M, K], ``b`` [K, N]).

    Errors name ``x`` for ``a`` and ``weight`` for ``b`` (the arguments of :func:`matmul`).
    """
    return matmul(a, b, layout="mm", out_dtype=out_dtype, num_sms=num_sms)
