"""Batch-invariant seeded sampler: the launcher of ``kernels/sampler.py``.

Validates (the reference's checks, so both raise the same errors; they read the per-request
values: a host synchronisation), computes each request's fp32 temperature factor ``k =
fp32(LOG2E / fp64(T))`` (fp64 division, IEEE on every device), allocates, picks the tile from
:data:`SAMPLER_TABLE` (keyed on the arch and V only) and launches one program per request
with ``enable_fp_fusion=False`` (the rule's fp32 weights are separate multiplies and adds).

What is pinned: the RNG (Philox4x32-10, key = the request's seed, counter = its step: never
its slot, R or a batch offset), the order (logit descending, lower id first), and the
arithmetic (int64 fixed-point sums, associative; IEEE fp32 element-wise operations).  The tile
cannot change a bit (no floating-point sum depends on it); the table keys it on V anyway.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

import torch
import triton

from batchinv.fast.device import arch, check_launch_device, interpreter_quiet, kernel_operand
from batchinv.fast.kernels.sampler import sampler_kernel
from batchinv.reference.sampler import LOG2E, check_sampler_args

#: ``(V limit, BLOCK, NPIV, num_warps)`` by arch kind: keyed on V, never on R.  BLOCK: columns per
#: step of a pass over the row; NPIV: pivots per level of the top-k / top-p cut's search (a
#: [BLOCK, NPIV] int64 tile: 32 to 64 per thread on GPUs).  Neither can change a bit: every sum
#: is an int64 sum, and the cut the search finds is unique.
SAMPLER_TABLE: Final = MappingProxyType(
    {
        "gpu": ((2048, 256, 8, 1), (32768, 1024, 8, 4), (2**20, 1024, 8, 8)),
        # the interpreter pays per operation: one tile per pass for the cpu lane's vocabularies,
        # 64 pivots per level (6 levels for the 32-bit keys)
        "interp": ((2**20, 1024, 64, 1),),
    }
)


def sampler_config(arch_name: str, vocab: int) -> tuple[int, int, int]:
    """``(BLOCK, NPIV, num_warps)`` for rows of ``vocab`` tokens on ``arch_name`` (never the row
    count).  NPIV: the pivots per level of the top-k / top-p cut's search (the cut is unique:
    any NPIV finds the same one)."""
    kind = "interp" if arch_name == "interp" else "gpu"
    for limit, block, npiv, warps in SAMPLER_TABLE[kind]:
        if vocab <= limit:
            return min(block, triton.next_power_of_2(vocab)), npiv, warps
    raise AssertionError("SAMPLER_TABLE covers V <= 2**20")  # V is validated <= 2**20


def temperature_factors(temperature: torch.Tensor) -> torch.Tensor:
    """``k = fp32(LOG2E / fp64(T))`` per request (``inf`` for T = 0, unused: greedy)."""
    return (LOG2E / temperature.to(torch.float64)).to(torch.float32)


def sampler(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant seeded sampling, one Triton program per request.

    The rule (temperature, top-k then top-p with ties to the lower id, inverse CDF over exactly
    the kept set, greedy at T = 0, NaN read as -inf) is :mod:`batchinv.reference.sampler`'s.

    Parameters
    ----------
    logits : Tensor [R, V] float32, bfloat16 or float16, any strides; 1 <= V <= 2**20.
    temperature : Tensor [R] float32, finite, >= 0 (0: greedy, the lowest id at the max).
    top_k : Tensor [R] int32 / int64, >= 0 (0 or >= V: no top-k).
    top_p : Tensor [R] float32 in (0, 1] (1: no top-p).
    seeds : Tensor [R] int64: the request's Philox key.
    step : Tensor [R] int64: the request's step, the Philox counter.

    Returns
    -------
    tokens : Tensor [R] int64, each in [0, V): bitwise the reference's.
    logprob : Tensor [R] float32: the token's log-probability under the kept, tempered
        distribution (0 for greedy), within ``reference.sampler.tolerance_bound``.

    Invariance: request r's outputs are bitwise a function of its own row and parameters: not
    of R, its slot, the other requests' values, or the tile.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError: as the reference (:func:`check_sampler_args`); a
    tensor that requires grad under grad mode is an ArgumentError.
    """
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    for name, t in (
        ("logits", logits),
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("seeds", seeds),
        ("step", step),
    ):
        check_launch_device(name, t)
    logits = kernel_operand(logits)
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprob = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return tokens, logprob
    temp = kernel_operand(temperature).contiguous()
    k = temperature_factors(temp).contiguous()
    top_k64 = kernel_operand(top_k).to(torch.int64).contiguous()
    top_p32 = kernel_operand(top_p).contiguous()
    seeds64 = kernel_operand(seeds).contiguous()
    step64 = kernel_operand(step).contiguous()
    block, npiv, warps = sampler_config(arch(logits.device), vocab)
    with interpreter_quiet():
        sampler_kernel[(rows,)](
            logits,
            temp,
            k,
            top_k64,
            top_p32,
            seeds64,
            step64,
            tokens,
            logprob,
            vocab,
            logits.stride(0),
            logits.stride(1),
            BLOCK=block,
            NPIV=npiv,
            num_warps=warps,
            enable_fp_fusion=False,
        )
    return tokens, logprob


__all__ = ["SAMPLER_TABLE", "sampler", "sampler_config", "temperature_factors"]
