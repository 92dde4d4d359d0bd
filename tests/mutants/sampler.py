"""One-line mutants of the ``sampler`` kernel and launcher (issue 27, section 4).

The kernel mutants patch one line of ``fast/kernels/sampler.py``'s ``sampler_kernel`` and run
it through the shipped launcher (:func:`mutants.kernels.with_kernel`); the launcher mutant
patches one line of ``fast/sampler.py``'s ``sampler``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import batchinv.fast.kernels.sampler as sampler_kernels
from batchinv.fast import sampler as sampler_launcher

from .kernels import with_kernel
from .patch import mutate

_DRAW = "r0, r1, _r2, _r3 = tl.philox(seed, c0, c1, zero, zero)"


def _subject(old: str, new: str) -> Callable[..., Any]:
    kernel = mutate(sampler_kernels, "sampler_kernel", old, new)
    return with_kernel(sampler_launcher, "sampler_kernel", kernel, sampler_launcher.sampler)


def sampler_rng_keyed_by_slot() -> Callable[..., Any]:
    """The Philox counter takes the row's index in the launch (its slot) as its third word."""
    return _subject(_DRAW, "r0, r1, _r2, _r3 = tl.philox(seed, c0, c1, row.to(tl.uint32), zero)")


def sampler_step_dropped_from_the_counter() -> Callable[..., Any]:
    """The counter's low word ignores the step: every step of a request draws the same u."""
    return _subject("c0 = (step & 0xFFFFFFFF).to(tl.uint32)", "c0 = (step * 0).to(tl.uint32)")


def sampler_logits_shifted_by_the_batch_max() -> Callable[..., Any]:
    """The launcher stabilises the logits by the max over the whole batch (``logits.amax()``
    where a row's own max was meant): each request's ``x - M`` is rounded at the batch max's
    magnitude, so its weights, log-prob and token follow the other requests' logits (a +inf or
    NaN neighbour turns the victim's row into -inf / NaN)."""
    return mutate(  # type: ignore[no-any-return]
        sampler_launcher,
        "sampler",
        "logits = kernel_operand(logits)",
        "logits = kernel_operand(logits - logits.amax())",
    )
