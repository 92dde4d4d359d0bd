"""The plan lifecycle of seed 003: a pinned decode plan is recorded, built and installed before
the kernel reads it -- including on the first call for a new shape (the cold start).

A split-KV decode kernel (FlashMLA's sparse decode, in the seed) reads its schedule from
metadata buffers.  With nothing installed it plans with its own, shipped planner (the
token-balanced one of :mod:`batchinv.fast.baselines.decode_partition_plan`) and leaves that
plan in the buffers -- the only place its partition count ``num_sm_parts`` can be observed.
So the first step of a shape must run the kernel once to observe it, record it, build the
pinned plan (:func:`batchinv.fast.decode_partition_plan.decode_partition_plan`), install both
pinned metadata tensors and run the kernel again; the first call's output, planned from the
whole batch, is never the one returned.  If no pinned plan can be built the step raises
(:class:`PlanUnavailable`): fail closed, never the shipped plan's output.

The participants, as small objects (the kernel is a model: its output is the plan it ran with,
per request, so a step's bits are the pinned plan's exactly when the lifecycle is right):

* :class:`DecodeKernel` -- reads the installed metadata, or plans in-kernel when none is;
* :class:`PlanCache` -- per shape (the layer type ``(num_heads_q, q_len)``): the static
  metadata buffers (:class:`PlanBuffers`) and the partition count recorded from an observation;
* :func:`install` -- copies the pinned plan into the buffers the kernel reads;
* :class:`DecodePlanServer` -- one decode step: the order of the above.

The mutant suite (``tests/mutants/lifecycle.py``) plants the seed's regressions here -- the
record skipped, the kernel's output returned before the record, the install dropped (whole, or
its ``num_splits`` half), the shipped output returned when the build fails -- and the guards of
``tests/support/decode_plan_guards.py`` must each catch theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchinv.fast.baselines.decode_partition_plan import token_balanced
from batchinv.fast.decode_partition_plan import decode_partition_plan
from batchinv.reference.decode_partition_plan import PLAN_DTYPE
from batchinv.reference.errors import MAX_SIZE, MAX_WIDTH, ArgumentError, BatchinvError, check_int

#: A shape's key: the layer type, ``(num_heads_q, q_len)`` -- what the kernel's partition count
#: depends on (with the device's SM count), never the batch.
Shape = tuple[int, int]
Plan = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class PlanUnavailable(BatchinvError, RuntimeError):
    """No pinned plan could be built for a shape: the step fails closed instead of returning the
    output of the kernel's own, batch-dependent plan."""

    def __init__(self, shape: Shape, recorded: int | None) -> None:
        self.shape = shape
        self.recorded = recorded
        super().__init__(
            f"no pinned decode plan for shape {shape} (recorded num_sm_parts: {recorded}); "
            "refusing to return the in-kernel plan's batch-dependent output"
        )


@dataclass(frozen=True)
class PlanConfig:
    """The plan's configuration: split geometry (``block_size``, ``blocks_per_split``,
    ``max_splits``) and the static buffers' capacity in requests (``max_requests``)."""

    block_size: int = 16
    blocks_per_split: int = 4
    max_splits: int = 16
    max_requests: int = 512

    def __post_init__(self) -> None:
        """Validate the fields with :func:`~batchinv.reference.errors.check_int` (host integers
        >= 1; ``max_splits`` and ``max_requests`` at most
        :data:`~batchinv.reference.errors.MAX_WIDTH`: they size the static buffers); a NumPy
        integer is stored as the Python int it holds.

        Raises:
            DTypeError, ArgumentError: a field that is not a host integer in its range.
        """
        for name in ("block_size", "blocks_per_split", "max_splits", "max_requests"):
            high = MAX_WIDTH if name in ("max_splits", "max_requests") else MAX_SIZE
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1, high))


class PlanBuffers:
    """The static metadata buffers one shape's kernel reads (a CUDA graph's static inputs):
    ``partition [max_requests]``, ``num_splits [max_requests]``, ``split_bounds [max_requests,
    max_splits + 1]`` (int32; the first b rows are the launch's), and where their contents came
    from: ``source`` is None (never written), ``"kernel"`` (the kernel's own plan) or
    ``"pinned"`` (installed); ``observed_num_sm_parts`` is the partition count of a plan the
    kernel left, None until it leaves one."""

    def __init__(self, config: PlanConfig, device: torch.device | str = "cpu") -> None:
        n, width = config.max_requests, config.max_splits + 1
        self.partition = torch.zeros(n, dtype=PLAN_DTYPE, device=device)
        self.num_splits = torch.zeros(n, dtype=PLAN_DTYPE, device=device)
        self.split_bounds = torch.full((n, width), -1, dtype=PLAN_DTYPE, device=device)
        self.source: str | None = None
        self.observed_num_sm_parts: int | None = None

    def check_fits(self, num_requests: int) -> None:
        """Raise :class:`ArgumentError` if a launch of ``num_requests`` does not fit the buffers."""
        if num_requests > self.partition.shape[0]:
            raise ArgumentError(
                "seq_lens", f"at most max_requests = {self.partition.shape[0]} requests", num_requests
            )


class DecodeKernel:
    """A model of the decode kernel: reads the plan in its shape's buffers and returns, per
    request, what it ran -- ``(partition, num_splits, split_bounds)`` with the bounds past the
    ``num_splits`` it merged set to -1.  With nothing in the buffers it plans in-kernel (the
    token-balanced planner at its own partition count, :meth:`num_sm_parts`), writes that plan
    into them and, if ``observable``, leaves its partition count there.

    ``num_sm_parts`` follows FlashMLA's rule for one KV head: ``sm_count // ceil(num_heads_q *
    q_len / 64)``, at least 1.  ``planned`` counts in-kernel plans, ``calls`` launches."""

    def __init__(self, config: PlanConfig, sm_count: int = 132, *, observable: bool = True) -> None:
        self.config = config
        self.sm_count = sm_count
        self.observable = observable
        self.planned = 0
        self.calls = 0

    def num_sm_parts(self, shape: Shape) -> int:
        heads, q_len = shape
        return max(1, self.sm_count // -(-(heads * q_len) // 64))

    def __call__(self, seq_lens: torch.Tensor, shape: Shape, buffers: PlanBuffers) -> Plan:
        b = seq_lens.shape[0]
        buffers.check_fits(b)
        self.calls += 1
        if buffers.source is None:  # nothing installed: the kernel's own (shipped) planner
            c = self.config
            parts = self.num_sm_parts(shape)
            partition, num_splits, bounds = token_balanced(
                seq_lens, parts, c.block_size, c.blocks_per_split, c.max_splits
            )
            buffers.partition[:b].copy_(partition)
            buffers.num_splits[:b].copy_(num_splits)
            buffers.split_bounds[:b].copy_(bounds)
            buffers.source = "kernel"
            buffers.observed_num_sm_parts = parts if self.observable else None
            self.planned += 1
        merged = buffers.num_splits[:b].clone()
        k = torch.arange(buffers.split_bounds.shape[1], device=merged.device)
        bounds = torch.where(k[None, :] <= merged[:, None], buffers.split_bounds[:b], -1).to(PLAN_DTYPE)
        return buffers.partition[:b].clone(), merged, bounds


@dataclass
class PinnedPlan:
    """A built pinned plan: the planner's three outputs and the partition count it used."""

    partition: torch.Tensor
    num_splits: torch.Tensor
    split_bounds: torch.Tensor
    num_sm_parts: int


class PlanCache:
    """Per shape: the metadata buffers (created on first use) and the recorded partition count.

    ``record(shape, buffers)`` counts only an observation -- a plan the kernel left in the
    buffers; called before the kernel has planned it records nothing.  ``build(shape,
    seq_lens)`` is the pinned plan at the recorded count, None before an observation."""

    def __init__(self, config: PlanConfig, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = device
        self._buffers: dict[Shape, PlanBuffers] = {}
        self._num_sm_parts: dict[Shape, int] = {}

    def buffers(self, shape: Shape) -> PlanBuffers:
        if shape not in self._buffers:
            self._buffers[shape] = PlanBuffers(self.config, self.device)
        return self._buffers[shape]

    def recorded(self, shape: Shape) -> int | None:
        return self._num_sm_parts.get(shape)

    def record(self, shape: Shape, buffers: PlanBuffers) -> None:
        if buffers.observed_num_sm_parts is not None:
            self._num_sm_parts[shape] = buffers.observed_num_sm_parts

    def build(self, shape: Shape, seq_lens: torch.Tensor) -> PinnedPlan | None:
        parts = self.recorded(shape)
        if parts is None:
            return None
        c = self.config
        plan = decode_partition_plan(seq_lens, parts, c.block_size, c.blocks_per_split, c.max_splits)
        return PinnedPlan(*plan, num_sm_parts=parts)


def install(buffers: PlanBuffers, plan: PinnedPlan) -> None:
    """Copy both pinned metadata tensors -- the schedule (partitions and split bounds) and
    ``num_splits`` -- into the static buffers the kernel reads, in place."""
    b = plan.num_splits.shape[0]
    buffers.check_fits(b)
    buffers.partition[:b].copy_(plan.partition)
    buffers.split_bounds[:b].copy_(plan.split_bounds)
    buffers.num_splits[:b].copy_(plan.num_splits)
    buffers.source = "pinned"


class DecodePlanServer:
    """One decode step per call: the pinned plan recorded, built and installed before the
    kernel reads it.

    Cold start (no partition count recorded for the shape): the kernel runs once on the batch
    with its own plan -- its output dropped -- and the count it left is recorded.  Every step
    then builds the pinned plan for this batch, installs it and returns the kernel's run on it.
    The in-kernel planner therefore runs once per shape.

    Raises:
        PlanUnavailable: no pinned plan could be built (nothing observed): fail closed.
        ArgumentError: a batch past the buffers' capacity, or a bad plan argument.
    """

    def __init__(self, kernel: DecodeKernel, config: PlanConfig, device: torch.device | str = "cpu") -> None:
        self.kernel = kernel
        self.cache = PlanCache(config, device)

    def step(self, seq_lens: torch.Tensor, shape: Shape) -> Plan:
        buffers = self.cache.buffers(shape)
        if self.cache.recorded(shape) is None:
            self.kernel(seq_lens, shape, buffers)  # the cold call: the in-kernel plan's output, dropped
            self.cache.record(shape, buffers)
        plan = self.cache.build(shape, seq_lens)
        if plan is None:
            raise PlanUnavailable(shape, self.cache.recorded(shape))
        install(buffers, plan)
        return self.kernel(seq_lens, shape, buffers)
