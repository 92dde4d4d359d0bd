"""Registry entry ``all_reduce``: the pinned sum of a tensor-parallel all-reduce's partials.

Row-wise (a row is a token of the message ``[M, N]``): the subject takes the stacked leaves
``partials [M, R, N]`` fp32 (row m's partial from each of the R leaves: one per rank at the
widest TP degree) and the keyword ``tp_degree`` (the ranks T the leaves are spread over, a
divisor of R), and returns ``[M, N]`` fp32.  The fast subject emulates the pinned tree in one
process (fp64 in leaf order, one rounding: :mod:`batchinv.fast.all_reduce`); the baselines run
real gloo collectives over in-process ranks (:mod:`batchinv.fast.gloo_threads`); the
multi-process tests (``tests/components/test_all_reduce_distributed.py``) run the distributed
pinned paths over gloo processes and compare them bitwise with this entry's fast subject.

Checks: agreement (exact), batch_prefix (a row's bits do not depend on how many rows share the
message), position, repeat, tp_degree (TP 1, 2, 4, ... of the same leaves give the TP 1 bits).

Value kinds (``values``), built from the seed on the CPU:

* ``normal``: N(0, 1) leaves;
* ``magnitudes``: leaves of very different magnitudes (N(0, 1) times 2^e, e uniform in
  [-20, 20]) with, in every other column, a cancelling pair B, -B (B ~ 2^40 |leaf|) at leaves
  0 and 1: fp32 sums of the same leaves in two orders differ in most elements (the gloo ring's
  position-dependent order, a TP rank's local pre-sum, an arrival order), and fp64 sums too
  where the pair does not cancel first (the leaves reversed: the others are lost to B's grid);
* ``specials``: ``magnitudes`` with NaN, +-inf, -0 and fp32 subnormals injected.

Layouts: ``contiguous`` ([M, R, N] row-major) or ``rank_major`` (a [R, M, N] stack of the ranks'
messages viewed as [M, R, N]: the layout a gather produces).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchinv.fast.all_reduce import all_reduce as fast_all_reduce
from batchinv.fast.baselines.all_reduce import arrival_ring_all_reduce, torch_distributed_all_reduce
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import ALL_LANES, Baseline, Batch, Case, Component, ErrorCase, Exact
from batchinv.reference.all_reduce import DTYPES
from batchinv.reference.all_reduce import all_reduce as reference_all_reduce
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "all_reduce"
VALUES: tuple[str, ...] = ("normal", "magnitudes", "specials")


def build_partials(kind: str, rows: int, leaves: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """``partials [M, R, N]`` float32 on the CPU (module docstring)."""
    p = torch.randn(rows, leaves, cols, generator=gen)
    if kind == "normal":
        return p
    if kind not in ("magnitudes", "specials"):
        raise ValueError(f"values: expected one of {VALUES}, got {kind!r}")
    p = p * torch.exp2(torch.randint(-20, 21, p.shape, generator=gen).float())
    if leaves >= 2:
        big = p[:, 0, 1::2].abs().add(1e-30) * 2.0**40 * torch.where(p[:, 0, 1::2] < 0, -1.0, 1.0)
        p[:, 0, 1::2] = big
        p[:, 1, 1::2] = -big
    if kind == "specials":
        flat = p.view(-1)
        pick = torch.rand(flat.shape, generator=gen)
        sub = torch.tensor([1, 3], dtype=torch.int32).view(torch.float32)
        flat[pick < 0.02] = float("nan")
        flat[(pick >= 0.02) & (pick < 0.04)] = float("inf")
        flat[(pick >= 0.04) & (pick < 0.06)] = float("-inf")
        flat[(pick >= 0.06) & (pick < 0.10)] = -0.0
        flat[(pick >= 0.10) & (pick < 0.13)] = sub[0]
        flat[(pick >= 0.13) & (pick < 0.16)] = -sub[1]
    return p


def build(case: Case, device: torch.device) -> Batch:
    """Row ``partials`` [M, R, N] float32."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    p = build_partials(str(a["values"]), int(a["M"]), int(a["R"]), int(a["N"]), gen)
    if a.get("layout", "contiguous") == "rank_major":
        p = p.transpose(0, 1).contiguous().transpose(0, 1)
    return Batch({"partials": p.to(device)})


def tp_degrees(batch: Batch) -> tuple[int, ...]:
    """The TP degrees of the batch's leaves: every divisor of R."""
    leaves = batch.rows["partials"].shape[1]
    return tuple(t for t in range(1, leaves + 1) if leaves % t == 0)


def make_case(
    rows: int, leaves: int, cols: int, values: str = "magnitudes", layout: str = "contiguous", seed: int = 0
) -> Case:
    return Case(NAME, {"M": rows, "R": leaves, "N": cols, "values": values, "layout": layout}, seed)


def cases(lane: Lane) -> Sequence[Case]:
    c = make_case
    out = [
        # first: the batch_prefix threshold case (17 rows) and the negative controls' first case
        c(17, 4, 64, seed=1),
        c(9, 4, 96, "specials", "rank_major", seed=2),
        c(8, 2, 64, "normal", seed=3),
        c(5, 8, 40, layout="rank_major", seed=4),
        c(3, 3, 50, seed=5),
        c(1, 4, 64, "specials", seed=6),
    ]
    if lane.is_gpu:
        out += [
            c(2048, 4, 4096, seed=10),
            c(4096, 8, 4096, "specials", "rank_major", seed=11),
            c(1000, 2, 7168, "normal", seed=12),
        ]
    return out


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    p = torch.zeros(3, 4, 8, device=device)
    return [
        ErrorCase("partials_float64", {"partials": p.double()}, DTypeError, r"'partials'.*float64"),
        ErrorCase("partials_bfloat16", {"partials": p.bfloat16()}, DTypeError, r"'partials'.*bfloat16"),
        ErrorCase("partials_rank_2", {"partials": p[:, 0]}, ArgumentError, r"'partials'.*3-D.*2-D"),
        ErrorCase("partials_no_leaves", {"partials": p[:, :0]}, ArgumentError, r"'partials'.*R >= 1"),
        ErrorCase(
            "tp_degree_not_a_divisor",
            {"partials": p, "tp_degree": 3},
            ArgumentError,
            r"'tp_degree'.*divisor of the leaves R = 4.*3",
        ),
        ErrorCase("tp_degree_zero", {"partials": p, "tp_degree": 0}, ArgumentError, r"'tp_degree'"),
        ErrorCase("tp_degree_bool", {"partials": p, "tp_degree": True}, DTypeError, r"'tp_degree'"),
        ErrorCase("partials_on_meta", {"partials": p.to("meta")}, DeviceError, r"'partials'.*meta"),
    ]


COMPONENT = Component(
    name=NAME,
    summary="TP all-reduce: R fp32 leaves summed in fp64 in leaf order, one rounding, at any TP degree",
    reference=reference_all_reduce,
    fast=fast_all_reduce,
    baselines=(
        Baseline(
            name="torch_distributed",
            fn=torch_distributed_all_reduce,
            why=(
                "torch.distributed's all-reduce (gloo's ring and chunking here; NCCL's ring / tree "
                "on the gpu_2 / gpu_4 lane) of fp32 rank partials: an element's order of additions "
                "follows its position in the message and the TP degree"
            ),
            expected_to_vary_on=ALL_LANES,
            timed=False,
        ),
        Baseline(
            name="arrival_ring",
            fn=arrival_ring_all_reduce,
            why=(
                "fp32 rank partials added in the order they reach rank 0 (a rank skew rotated from "
                "call to call; the measured orders in fast.baselines.all_reduce.ARRIVALS)"
            ),
            expected_to_vary_on=ALL_LANES,
            timed=False,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("the same IEEE fp64 sums in the same leaf order, then one rounding to fp32"),
    dtypes=DTYPES,
    error_cases=error_cases,
    tp_degrees=tp_degrees,
)
