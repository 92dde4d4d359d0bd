"""Guards of the decode plan lifecycle (seed 003; :mod:`batchinv.fast.decode_partition_plan_lifecycle`).

Each guard takes a server class (the subject: the shipped ``DecodePlanServer`` or a mutant of it
from ``tests/mutants/lifecycle.py``, same constructor) and raises :class:`GuardFailed` when the
property it is named after does not hold.  ``tests/components/test_decode_partition_plan.py`` runs each on
the shipped server as a test of the same name (``test_<guard>``); ``tests/mutants/test_mutants.py``
runs the guards a lifecycle mutant names and requires each to fail -- with ``GuardFailed``,
never another exception (a crash is not a detection).

The batches mix long and short requests, so that the kernel's own (token-balanced) plan and the
pinned plan differ on every one of them (``test_the_guard_batches_tell_the_in_kernel_plan_from_the_pinned_one``):
an output equal to the pinned plan can only come from the pinned plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from batchinv.fast.decode_partition_plan import decode_partition_plan
from batchinv.fast.decode_partition_plan_lifecycle import DecodeKernel, PlanConfig, PlanUnavailable, Shape

CONFIG = PlanConfig(block_size=16, blocks_per_split=4, max_splits=16, max_requests=64)
SM_COUNT = 8
#: Two layer types with different kernel partition counts (8 and 4 at SM_COUNT).
SHAPES: tuple[Shape, ...] = ((16, 1), (64, 2))
#: Batches of long and short requests (tokens); the capacity is 1024.
BATCHES: tuple[tuple[int, ...], ...] = (
    (1000, 3, 50),
    (1024,),
    (7, 900, 900, 12, 0, 333),
    (5, 17, 64, 65, 1024, 700, 1, 0, 2, 31, 640, 129, 250, 511, 512, 513, 3, 3, 999),
)

Server = Any  # a DecodePlanServer or a mutant of it


class GuardFailed(AssertionError):
    """A lifecycle guard found its property broken."""


def lengths(batch: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(batch, dtype=torch.int32)


def kernel(*, observable: bool = True) -> DecodeKernel:
    return DecodeKernel(CONFIG, SM_COUNT, observable=observable)


def pinned(seq_lens: torch.Tensor, num_sm_parts: int) -> tuple[torch.Tensor, ...]:
    c = CONFIG
    return decode_partition_plan(seq_lens, num_sm_parts, c.block_size, c.blocks_per_split, c.max_splits)


def _expect_plan(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], what: str) -> None:
    names = ("partition", "num_splits", "split_bounds")
    for name, g, w in zip(names, got, want, strict=True):
        if g.shape != w.shape or not torch.equal(g, w):
            raise GuardFailed(f"{what}: {name} is not the pinned plan's ({g.tolist()} != {w.tolist()})")


@contextmanager
def _no_fail_closed(what: str) -> Iterator[None]:
    try:
        yield
    except PlanUnavailable as exc:
        raise GuardFailed(f"{what}: failed closed where a pinned plan was buildable ({exc})") from exc


def cold_start_first_call_uses_the_pinned_plan(server_cls: Callable[..., Server]) -> None:
    """A fresh server's first step for a shape returns the pinned plan's run, never the output
    of the kernel's own plan; so does the first step of a second shape on a warm server."""
    for batch in BATCHES:
        for shape in SHAPES:
            k = kernel()
            server = server_cls(k, CONFIG)
            seq = lengths(batch)
            with _no_fail_closed(f"first step, shape {shape}, batch {batch}"):
                got = server.step(seq, shape)
            _expect_plan(got, pinned(seq, k.num_sm_parts(shape)), f"first step, shape {shape}, batch {batch}")
        k = kernel()
        server = server_cls(k, CONFIG)
        seq = lengths(batch)
        with _no_fail_closed(f"warm server, batch {batch}"):
            server.step(seq, SHAPES[0])
            got = server.step(seq, SHAPES[1])
        _expect_plan(
            got, pinned(seq, k.num_sm_parts(SHAPES[1])), f"a second shape's first step, batch {batch}"
        )


def cold_start_records_the_observed_partition_count(server_cls: Callable[..., Server]) -> None:
    """After a shape's first step the cache holds the partition count the kernel's own plan
    used, and the kernel planned in-kernel once per shape however many steps follow."""
    k = kernel()
    server = server_cls(k, CONFIG)
    for i, shape in enumerate(SHAPES):
        for batch in BATCHES:
            with _no_fail_closed(f"shape {shape}, batch {batch}"):
                server.step(lengths(batch), shape)
            recorded = server.cache.recorded(shape)
            if recorded != k.num_sm_parts(shape):
                raise GuardFailed(
                    f"shape {shape}: recorded num_sm_parts {recorded}, the kernel's plan used {k.num_sm_parts(shape)}"
                )
        if k.planned != i + 1:
            raise GuardFailed(
                f"the kernel planned {k.planned} times for {i + 1} shape(s): once per shape expected"
            )


def every_step_reads_its_own_pinned_plan(server_cls: Callable[..., Server]) -> None:
    """On one server, steps of batches that grow, shrink and change lengths each return their
    own pinned plan (never a plan left by an earlier step)."""
    k = kernel()
    server = server_cls(k, CONFIG)
    shape = SHAPES[0]
    for step, batch in enumerate((*BATCHES, *reversed(BATCHES))):
        seq = lengths(batch)
        with _no_fail_closed(f"step {step}"):
            got = server.step(seq, shape)
        _expect_plan(got, pinned(seq, k.num_sm_parts(shape)), f"step {step}, batch {batch}")


def pinned_plan_installs_both_metadata_tensors(server_cls: Callable[..., Server]) -> None:
    """After a step, the buffers the kernel reads hold the pinned plan: the schedule (partitions,
    split bounds) and num_splits, both, for this batch."""
    k = kernel()
    server = server_cls(k, CONFIG)
    shape = SHAPES[0]
    for batch in BATCHES:
        seq = lengths(batch)
        with _no_fail_closed(f"batch {batch}"):
            server.step(seq, shape)
        buffers = server.cache.buffers(shape)
        b = len(batch)
        want = pinned(seq, k.num_sm_parts(shape))
        held = (buffers.partition[:b], buffers.num_splits[:b], buffers.split_bounds[:b])
        _expect_plan(held, want, f"the installed buffers after batch {batch}")
        if buffers.source != "pinned":
            raise GuardFailed(f"the buffers' contents came from {buffers.source!r}, not an install")


def cold_start_fails_closed_without_an_observation(server_cls: Callable[..., Server]) -> None:
    """When no pinned plan can be built -- the kernel left no observable partition count --
    the step raises PlanUnavailable, on the first step and every later one, and never returns
    the kernel's own plan's output."""
    server = server_cls(kernel(observable=False), CONFIG)
    for step, batch in enumerate(BATCHES):
        try:
            got = server.step(lengths(batch), SHAPES[0])
        except PlanUnavailable:
            continue
        raise GuardFailed(f"step {step}: returned {got[1].tolist()} splits without a pinned plan (no raise)")


#: Every guard, by name (the tests named ``test_<name>`` run them on the shipped server).
GUARDS: dict[str, Callable[[Callable[..., Server]], None]] = {
    g.__name__: g
    for g in (
        cold_start_first_call_uses_the_pinned_plan,
        cold_start_records_the_observed_partition_count,
        every_step_reads_its_own_pinned_plan,
        pinned_plan_installs_both_metadata_tensors,
        cold_start_fails_closed_without_an_observation,
    )
}
