"""Seeded bf16 weight tensors drawn on the target device with a bounded fp32 temporary.

``torch.randn`` draws fp32: a DeepSeek-V3-sized expert stack (256 x 4096 x 7168) is 30 GB of
fp32 before the bf16 cast, enough to run a GPU out of memory when several pytest workers build
cases at once.  :func:`seeded_normal` draws such a tensor one leading index at a time.
"""

from __future__ import annotations

import torch

#: Tensors with at most this many elements are drawn in one call (the cpu lane's cases all are).
SINGLE_DRAW_ELEMENTS = 1 << 26


def seeded_normal(
    shape: tuple[int, ...], generator: torch.Generator, scale: float, device: torch.device
) -> torch.Tensor:
    """``N(0, scale^2)`` values rounded to bf16, ``shape``, on ``device``, drawn from
    ``generator`` (which lives on ``device`` when it is a GPU, else on the CPU).

    Up to :data:`SINGLE_DRAW_ELEMENTS` one ``randn`` call (fp32 then bf16); above it one call per
    index of dim 0, so the fp32 temporary is one slice.  Deterministic in (shape, seed, device
    kind); the two regimes draw different values for the same seed.
    """
    gdev = generator.device
    numel = 1
    for d in shape:
        numel *= d
    if numel <= SINGLE_DRAW_ELEMENTS or len(shape) < 2:
        return (torch.randn(shape, generator=generator, device=gdev) * scale).to(torch.bfloat16).to(device)
    out = torch.empty(shape, dtype=torch.bfloat16, device=device)
    for i in range(shape[0]):
        out[i] = (torch.randn(shape[1:], generator=generator, device=gdev) * scale).to(torch.bfloat16)
    return out
