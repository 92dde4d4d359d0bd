"""Launcher of batch-invariant dynamic FP8 quantization (validation, config, allocation, grid).

The kernel is :func:`batchinv.fast.kernels.fp8_quant.fp8_quant_kernel`: one program per (row
block, segment) on one flat grid axis, a segment being a whole row (per token) or one 1 x G group.  The config
(:func:`config_for`) is keyed on (arch, segment length) only, never on the number of rows, which
only sets the grid.  No config could change a bit here anyway (a max is exact and the rest is
elementwise), but the rule of every launcher holds, and ``tests/components/test_fp8_quant.py`` runs every
config of a segment length against the shipped one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.reference.fp8_quant import check_fp8_quant_args, num_groups

#: Longest chunk of a segment held in registers, per arch key; longer segments are read twice
#: in chunks of this size.  The interpreter's is small so that the cpu lane runs the chunked
#: path on a K of a few hundred.
MAX_BLOCK_K: dict[str, int] = {"interp": 512}
MAX_BLOCK_K_GPU = 8192
#: Elements per program the row block is sized for (GPU; interpreter).
TILE_ELEMENTS_GPU = 2048
TILE_ELEMENTS_INTERP = 8192


@dataclass(frozen=True)
class QuantConfig:
    """The launch configuration of one (arch, segment length).

    Attributes:
        block_m: rows per program.
        block_k: columns per chunk (a power of two); the segment is one chunk when
            ``block_k >= seg_len`` (``single_chunk``), else read in chunks twice.
        num_warps: warps per program.
    """

    block_m: int
    block_k: int
    num_warps: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"QuantConfig.{name}: expected a power of two >= 1, got {value}")

    def single_chunk(self, seg_len: int) -> bool:
        return self.block_k >= seg_len


def config_for(arch_name: str, seg_len: int) -> QuantConfig:
    """The config of (arch, segment length): keyed ONLY on these, never on the number of rows.

    block_k = the segment length's next power of two, capped (8192 on GPUs: a 7168-wide token
    is one chunk); block_m fills about 2048 elements per program on GPUs (one row per program
    for whole tokens, 16 rows of a 128-group), 8192 in the interpreter (fewer programs).
    """
    cap = MAX_BLOCK_K.get(arch_name, MAX_BLOCK_K_GPU)
    block_k = min(triton.next_power_of_2(seg_len), cap)
    tile = TILE_ELEMENTS_INTERP if arch_name == "interp" else TILE_ELEMENTS_GPU
    block_m = max(1, min(64, tile // block_k))
    num_warps = min(8, max(4, block_m * block_k // 1024))
    return QuantConfig(block_m=block_m, block_k=block_k, num_warps=num_warps)


def launch(x: torch.Tensor, group_size: int | None, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate ``(q, scale)`` and launch the kernel with ``config`` (arguments already
    validated).  Also used by tests, which pass other configs."""
    m, k = x.shape
    seg_len = k if group_size is None else min(group_size, k)
    ng = num_groups(k, group_size)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, ng), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    x = kernel_operand(x)
    from batchinv.fast.kernels.fp8_quant import fp8_quant_kernel

    grid = (triton.cdiv(m, config.block_m) * ng,)  # flat: (row block, segment) = divmod(pid, ng)
    with interpreter_quiet():
        fp8_quant_kernel[grid](
            x,
            q.view(torch.uint8),
            scale,
            m,
            k,
            seg_len,
            ng,
            x.stride(0),
            x.stride(1),
            q.stride(0),
            scale.stride(0),
            BLOCK_M=config.block_m,
            BLOCK_K=config.block_k,
            SINGLE_CHUNK=config.single_chunk(seg_len),
            num_warps=config.num_warps,
        )
    return q, scale


def fp8_quant(x: torch.Tensor, *, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant dynamic FP8 (e4m3fn) quantization, per token or per 1 x G group (Triton).

    Per group (a whole row when ``group_size`` is None), in IEEE fp32 operations:
    ``amax`` = max |x| over the group's finite elements (NaN, +-inf ignored; 0 if none),
    ``scale = div_rn(max(amax, 2^-64), 448)``, ``q = e4m3(div_rn(x, scale))`` with ``div_rn``
    the correctly rounded fp32 division and ``e4m3`` round to nearest even onto float8_e4m3fn,
    subnormals kept, saturating at +-448 (see :mod:`batchinv.reference.fp8_quant`, whose
    results these are bit for bit).

    Parameters
    ----------
    x : Tensor [M, K], bfloat16, float16 or float32, any strides.
    group_size : None (one scale per row) or an int power of two >= 16 (1 x G groups along K;
        DeepSeek-V3's 128; the last group of a row holds K mod G elements when G does not
        divide K).

    Returns
    -------
    q : Tensor [M, K], float8_e4m3fn, contiguous.
    scale : Tensor [M, NG], float32 (NG = 1 per token, ceil(K / G) per group): the
        dequantization scale (x ~= q * scale), as ``torch._scaled_mm``, vLLM and DeepSeek-V3.
        ``(q, scale)`` are :func:`batchinv.fast.fp8_gemm.fp8_gemm`'s ``(x, x_scale)`` as they
        come: ``scale_layout="token"`` per token, ``"block"`` with ``group_size=128``.
    Bitwise invariant along M, a row's position and neighbours, its place in memory, the
    config and repeated calls: a group's scale reads only that group.  NaN -> NaN (0x7F with
    the input's sign bit), +-inf -> +-448, -0.0 -> -0.0.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError : see
    :func:`batchinv.reference.fp8_quant.check_fp8_quant_args`; DeviceError for CPU tensors
    without the Triton interpreter.
    """
    group_size = check_fp8_quant_args(x, group_size)
    check_launch_device("x", x)
    seg_len = x.shape[1] if group_size is None else min(group_size, x.shape[1])
    # Keyed on (arch, segment length) only -- never on x.shape[0], the number of rows.
    return launch(x, group_size, config_for(arch(x.device), seg_len))
