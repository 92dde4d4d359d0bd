"""One-line mutants of ``decode_partition_plan``: of the planner (judged by the sweep, as every
other mutant) and of its lifecycle (seed 003's regressions, judged by the lifecycle guards).

Planner mutants have the fast planner's signature.  Each lifecycle builder returns a server
class with ``DecodePlanServer``'s constructor, rebuilt from the shipped source of
:mod:`batchinv.fast.decode_partition_plan_lifecycle` with one line replaced
(:func:`mutants.patch.mutate`); they are judged by the lifecycle guards of
``tests/support/decode_plan_guards.py``, not by the sweep: a lifecycle is a sequence of calls over
time, which no single launch shows.
"""

from __future__ import annotations

from typing import Any

import batchinv.fast.decode_partition_plan as planner
import batchinv.fast.decode_partition_plan_lifecycle as lifecycle

from .patch import mutate

# --- the planner ---------------------------------------------------------------------------------


def last_request_unowned() -> Any:
    return mutate(
        planner,
        "partition_spans",
        "return torch.stack([starts[:-1], starts[1:]], dim=1).to(PLAN_DTYPE)",
        "return torch.stack([starts[:-1], starts[1:] - (starts[1:] == num_requests).to(starts.dtype)], dim=1).to(PLAN_DTYPE)",
        entry="decode_partition_plan",
    )


def one_request_per_partition() -> Any:
    return mutate(
        planner,
        "request_partitions",
        "return torch.searchsorted(ends, requests, right=True).to(PLAN_DTYPE)",
        "return torch.where(requests < spans.shape[0], requests, -1).to(PLAN_DTYPE)",
        entry="decode_partition_plan",
    )


def splits_aligned_to_the_launch() -> Any:
    return mutate(
        planner,
        "request_splits",
        "cuts = torch.minimum(k[None, :] * split_tokens, lengths[:, None])",
        "cuts = torch.minimum(k[None, :] * split_tokens + ((lengths.cumsum(0) - lengths) % split_tokens)[:, None], lengths[:, None])",
        entry="decode_partition_plan",
    )


def split_doubled_above_the_partition_count() -> Any:
    return mutate(
        planner,
        "decode_partition_plan",
        "num_splits, bounds = request_splits(seq_lens.to(torch.int64), split_tokens, int(max_splits))",
        "num_splits, bounds = request_splits(seq_lens.to(torch.int64), split_tokens * (1 + (b > parts)), int(max_splits))",
    )


# --- the lifecycle -------------------------------------------------------------------------------

_COLD_CALL = "self.kernel(seq_lens, shape, buffers)  # the cold call: the in-kernel plan's output, dropped"


def _kernel_then_record(server: Any, seq_lens: Any, shape: Any, buffers: Any) -> Any:
    """The pre-fix cold start: the kernel's run on its own plan is the step's output, and the
    observation is recorded after it (the pinned plan serves only the next step)."""
    out = server.kernel(seq_lens, shape, buffers)
    server.cache.record(shape, buffers)
    return out


def skips_the_record() -> Any:
    return mutate(lifecycle, "DecodePlanServer", "self.cache.record(shape, buffers)", "pass")


def records_after_the_kernel() -> Any:
    return mutate(
        lifecycle,
        "DecodePlanServer",
        _COLD_CALL,
        "return kernel_then_record(self, seq_lens, shape, buffers)",
        extra_globals={"kernel_then_record": _kernel_then_record},
    )


def drops_the_install() -> Any:
    return mutate(lifecycle, "DecodePlanServer", "install(buffers, plan)", "pass")


def drops_the_num_splits_install() -> Any:
    return mutate(
        lifecycle,
        "install",
        "buffers.num_splits[:b].copy_(plan.num_splits)",
        "pass",
        entry="DecodePlanServer",
    )


def returns_the_kernel_plan_when_the_build_fails() -> Any:
    return mutate(
        lifecycle,
        "DecodePlanServer",
        "raise PlanUnavailable(shape, self.cache.recorded(shape))",
        "return self.kernel(seq_lens, shape, buffers)",
    )
