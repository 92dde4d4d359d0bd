"""Multi-rank runs of the collectives (``all_reduce``, the EP combine) over ``torch.distributed``.

The registry judges the collectives' single-process subjects; this module runs their
distributed paths on real process groups and gives the same verdicts -- bitwise, the registry's
comparisons -- against those single-process subjects:

* :func:`launch` (the cpu lane): ``world`` rank processes of ``python -m
  batchinv.harness.multirank SCENARIO OUT`` on this machine with torchrun's environment (RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a free port), over gloo, bounded in time:
  a rank still running at the deadline is killed and the launch raises ``TimeoutError``, so a
  hang fails a test instead of blocking CI.  Each rank saves its results; ``launch`` returns them.
* Under ``torchrun`` (the ``gpu_2`` / ``gpu_4`` lane, ``ci/multi_gpu.sh``) the tests call the
  same scenarios in-process, over NCCL, each rank on its own GPU.

A scenario returns plain data (tensors, tuples); the ``judge_*`` functions turn one rank's
results into verdicts the tests assert on (pinned paths equal to the single-process subject at
TP / EP 1, in every launch; the unpinned ones found varying, or reported inconclusive).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

#: gloo's / NCCL's timeout on each collective of a scenario.
COLLECTIVE_TIMEOUT_S = 60
#: Rank skews of the perturbation fixture (seconds rank r sleeps before its collective; ranks past
#: the tuple sleep 0): none, then two schedules that reverse the arrival order of ranks 1..3.
SKEWS: tuple[tuple[float, ...], ...] = ((0.0,), (0.0, 0.09, 0.06, 0.03), (0.0, 0.03, 0.06, 0.09))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def skew(schedule: Sequence[float], rank: int) -> float:
    return schedule[rank] if rank < len(schedule) else 0.0


# --- scenarios ---------------------------------------------------------------------------------

#: M values of the prefix launches (windows of the case's rows, as batch_prefix takes them).
PREFIX_MS: tuple[int, ...] = (1, 2, 7)


def all_reduce_cases(world: int, lane: Any = None) -> list[Any]:
    """The ``all_reduce`` cpu cases of :data:`MULTIRANK_SEEDS` whose leaves spread over ``world``
    ranks (R % world == 0): the magnitudes case of 17 rows and 4 leaves, the rank-major 8 leaves;
    on a GPU ``lane`` also the lane's large messages (NCCL picks its algorithm by size)."""
    from batchinv.harness.components import all_reduce as entry
    from batchinv.harness.lanes import Lane

    lane = Lane.CPU if lane is None else lane
    seeds = MULTIRANK_SEEDS + (MULTIRANK_GPU_SEEDS if lane.is_gpu else ())
    return [c for c in entry.cases(lane) if c.seed in seeds and int(c.axes["R"]) % world == 0]


#: The seeds of the ``all_reduce`` cpu cases the multi-rank runs take (the cpu lane pays a
#: process start and the interpreter per rank).
MULTIRANK_SEEDS: tuple[int, ...] = (1, 4)
#: The GPU lanes' large cases added there (2048 x 4096, 4096 x 4096 messages).
MULTIRANK_GPU_SEEDS: tuple[int, ...] = (10, 11)


def _lane_of(device: torch.device) -> Any:
    from batchinv.harness.lanes import Lane, detect_lane

    return Lane.CPU if device.type == "cpu" else detect_lane()


def _launches(num_rows: int) -> list[tuple[int, list[int]]]:
    from batchinv.harness.invariance import prefix_launches

    return [*prefix_launches(num_rows, PREFIX_MS), (num_rows, list(range(num_rows)))]


def all_reduce_scenario(pg: Any, device: torch.device) -> dict[str, Any]:
    """Every case of :func:`all_reduce_cases`: the pinned paths (both methods) and the backend's
    all-reduce on each prefix launch, the pinned one twice more (repeat), and on the first case
    the arrival ring under each rank skew of :data:`SKEWS` (with its measured arrival order)."""
    from batchinv.fast.all_reduce import METHODS, pinned_all_reduce
    from batchinv.fast.baselines.all_reduce import arrival_ring, default_all_reduce
    from batchinv.harness.components import all_reduce as entry

    world, rank = pg.size(), pg.rank()
    out: dict[str, Any] = {}
    cases = all_reduce_cases(world, _lane_of(device))
    for case in cases:
        partials = entry.build(case, device).rows["partials"]
        width = partials.shape[1] // world
        local = partials[:, rank * width : (rank + 1) * width]
        for m, rows in _launches(partials.shape[0]):
            leaves = local[rows].contiguous()
            for method in METHODS:
                out[f"{case.id}|{method}|{m}"] = pinned_all_reduce(leaves, pg, method=method).cpu()
            out[f"{case.id}|default|{m}"] = default_all_reduce(leaves, pg).cpu()
        whole = local.contiguous()
        out[f"{case.id}|repeat"] = [pinned_all_reduce(whole, pg).cpu() for _ in range(2)]
    first = cases[0]
    partials = entry.build(first, device).rows["partials"]
    width = partials.shape[1] // world
    local = partials[:, rank * width : (rank + 1) * width].contiguous()
    out["arrival"] = [
        (lambda res: (res[0].cpu(), res[1]))(arrival_ring(local, pg, skew(s, rank))) for s in SKEWS
    ]
    out["arrival_case"] = first.id
    return out


@dataclass(frozen=True)
class EPData:
    """One EP combine problem: every rank builds the same from (world, others, seed)."""

    counts: tuple[int, ...]  # tokens per rank
    y: torch.Tensor  # [T, k, H] the expert outputs of every (token, slot)
    w: torch.Tensor  # [T, k] fp32
    experts: torch.Tensor  # [T, k] int64, distinct per token
    num_experts: int

    def tokens_of(self, rank: int) -> slice:
        start = sum(self.counts[:rank])
        return slice(start, start + self.counts[rank])


#: EP shapes: rank 0 holds :data:`EP_TOKENS` tokens, every other rank one of :data:`EP_OTHERS`.
EP_TOKENS, EP_K, EP_H, EP_EXPERTS = 9, 6, 32, 8
EP_OTHERS: tuple[int, ...] = (1, 17)


def ep_data(world: int, others: int, seed: int = 29) -> EPData:
    """Rank 0's tokens from ``seed`` alone (the same in every variant); the other ranks' tokens
    (``others`` each) from ``(seed, others)``; ``cancel`` values (``moe_combine``'s): a sum's
    fp32 bits follow its order."""
    from batchinv.harness.components.moe_combine import build_values

    def part(tokens: int, s: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(s)
        y, w = build_values("cancel", tokens, EP_K, EP_H, torch.float32, gen)
        experts = torch.stack([torch.randperm(EP_EXPERTS, generator=gen)[:EP_K] for _ in range(tokens)])
        return y, w, experts

    parts = [part(EP_TOKENS, seed)] + [part(others, seed * 1000 + others * 10 + r) for r in range(1, world)]
    y, w, experts = (torch.cat([p[i] for p in parts]) for i in range(3))
    counts = (EP_TOKENS, *([others] * (world - 1)))
    return EPData(counts, y, w, experts, EP_EXPERTS)


def ep_pairs(data: EPData, world: int, rank: int) -> tuple[torch.Tensor, ...]:
    """The (token, slot) pairs rank ``rank``'s experts run (expert e on rank e % world), in
    expert-major order (an align sort): ``(pair_out, pair_rank, pair_token, pair_slot)``."""
    token_rank = torch.repeat_interleave(torch.arange(world), torch.tensor(data.counts))
    token_local = torch.cat([torch.arange(c) for c in data.counts])
    tok, slot = torch.nonzero(data.experts % world == rank, as_tuple=True)
    key = data.experts[tok, slot] * (len(token_rank) + 1) + tok
    order = torch.sort(key, stable=True).indices
    tok, slot = tok[order], slot[order]
    return data.y[tok, slot], token_rank[tok], token_local[tok], slot


def ep_scenario(pg: Any, device: torch.device) -> dict[str, Any]:
    """The EP combine on this rank's tokens, beside each count of the other ranks' tokens
    (:data:`EP_OTHERS`), pinned twice (repeat) and in arrival order under each rank skew."""
    from batchinv.fast.baselines.ep_combine import arrival_ep_combine
    from batchinv.fast.ep_combine import ep_combine

    world, rank = pg.size(), pg.rank()
    side = pg if pg.name() == "gloo" else gloo_side_group()  # the arrival combine receives from any source
    out: dict[str, Any] = {}
    for others in EP_OTHERS:
        data = ep_data(world, others)
        pair_out, pair_rank, pair_token, pair_slot = ep_pairs(data, world, rank)
        mine = data.tokens_of(rank)
        args = (
            pair_out.to(device),
            pair_rank,
            pair_token,
            pair_slot,
            data.w[mine].to(device),
            data.counts[rank],
            EP_K,
        )
        out[f"pinned|{others}"] = [ep_combine(*args, group=pg).cpu() for _ in range(2)]
        if others == EP_OTHERS[0]:
            out["arrival"] = [
                (lambda res: (res[0].cpu(), res[1]))(
                    arrival_ep_combine(
                        *(a.cpu() if isinstance(a, torch.Tensor) else a for a in args),
                        group=side,
                        skew_s=skew(s, rank),
                    )
                )
                for s in SKEWS
            ]
        else:
            out[f"arrival|{others}"] = arrival_ep_combine(
                *(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), group=side
            )[0]
    return out


_SIDE: list[Any] = []


def gloo_side_group() -> Any:
    """A gloo group of the default group's ranks (created once, collectively): the arrival-order
    EP combine's receive from any source, which NCCL lacks."""
    import torch.distributed as dist

    if not _SIDE:
        _SIDE.append(dist.new_group(backend="gloo"))
    return _SIDE[0]


def both_scenario(pg: Any, device: torch.device) -> dict[str, Any]:
    """:func:`all_reduce_scenario` and :func:`ep_scenario` in one run (one process start)."""
    return {"all_reduce": all_reduce_scenario(pg, device), "ep_combine": ep_scenario(pg, device)}


def hang_scenario(pg: Any, device: torch.device) -> dict[str, Any]:
    """A rank that never finishes (the launcher's deadline test)."""
    time.sleep(3600)
    return {}


SCENARIOS: dict[str, Callable[[Any, torch.device], dict[str, Any]]] = {
    "hang": hang_scenario,
    "all_reduce": all_reduce_scenario,
    "ep_combine": ep_scenario,
    "both": both_scenario,
}


# --- verdicts ----------------------------------------------------------------------------------


@dataclass
class Verdicts:
    """What one rank's results show.  ``pinned_failures``: every pinned launch whose bits differ
    from the single-process subject (must be empty); ``control``: per negative control, the
    launches where it gave other bits than the pinned tree's invariance demands (a detection);
    ``inconclusive``: controls whose perturbation did not take effect (never a pass)."""

    pinned_checked: int = 0
    pinned_failures: list[str] = field(default_factory=list)
    control: dict[str, list[str]] = field(default_factory=dict)
    inconclusive: dict[str, str] = field(default_factory=dict)
    arrival_orders: list[tuple[int, ...]] = field(default_factory=list)


_EXPECTED: dict[tuple[str, ...], torch.Tensor] = {}


def _tree(key: tuple[str, ...], partials: torch.Tensor) -> torch.Tensor:
    """``fast.all_reduce(partials, tp_degree=1)`` on the CPU, computed once per ``key`` in this
    process (every rank's verdicts compare with the same)."""
    from batchinv.fast.all_reduce import all_reduce

    if key not in _EXPECTED:
        _EXPECTED[key] = all_reduce(partials, tp_degree=1).cpu()
    return _EXPECTED[key]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    from batchinv.harness.compare import compare_bitwise

    return a.shape == b.shape and compare_bitwise(a, b).equal


def judge_all_reduce(
    results: dict[str, Any], world: int, rank: int, device: torch.device | None = None
) -> Verdicts:
    """Verdicts of one rank's :func:`all_reduce_scenario` results: each pinned launch equals the
    single-process subject at TP 1 (``fast.all_reduce(p[rows], tp_degree=1)``) and the full
    message's rows (batch_prefix), the repeats equal the first call; ``torch_distributed`` is
    detected where a launch's rows differ from the full launch's (batch_prefix) or the full
    launch from the TP 1 tree of the same leaves at this TP degree (tp_degree); ``arrival_ring``
    where two skews gave other bits, inconclusive where the arrival orders did not differ."""
    from batchinv.fast.all_reduce import METHODS
    from batchinv.fast.baselines.all_reduce import local_partial
    from batchinv.harness.components import all_reduce as entry

    device = torch.device("cpu") if device is None else device
    v = Verdicts(control={"torch_distributed": [], "arrival_ring": []})
    for case in all_reduce_cases(world, _lane_of(device)):
        partials = entry.build(case, device).rows["partials"]
        n = partials.shape[0]
        tree = _tree((case.id, str(device)), partials)
        for m, rows in _launches(n):
            for method in METHODS:
                got = results[f"{case.id}|{method}|{m}"]
                v.pinned_checked += 1
                alone = _tree((case.id, str(device), str(m)), partials[rows])
                if not (_same(got, alone) and _same(got, tree[rows])):
                    v.pinned_failures.append(f"{case.id} {method} M={m}")
            default, full = results[f"{case.id}|default|{m}"], results[f"{case.id}|default|{n}"]
            if not _same(default, full[rows]):
                v.control["torch_distributed"].append(f"batch_prefix {case.id} M={m}")
        single = local_partial(partials).cpu()  # the baseline at TP 1: one rank's fp32 sum of every leaf
        if not _same(results[f"{case.id}|default|{n}"], single):
            v.control["torch_distributed"].append(f"tp_degree {case.id} TP={world} vs TP=1")
        for i, again in enumerate(results[f"{case.id}|repeat"]):
            v.pinned_checked += 1
            if not _same(again, results[f"{case.id}|all_gather|{n}"]):
                v.pinned_failures.append(f"{case.id} repeat {i + 2}")
    arrivals = results["arrival"]
    v.arrival_orders = [order for _, order in arrivals]
    if rank == 0 and len(set(v.arrival_orders)) < 2:
        v.inconclusive["arrival_ring"] = f"the skews did not change the arrival order: {v.arrival_orders}"
    base = arrivals[0][0]
    for i, (bits, order) in enumerate(arrivals[1:], start=1):
        if not _same(bits, base):
            v.control["arrival_ring"].append(
                f"repeat under skew {SKEWS[i]}: arrival {order} vs {arrivals[0][1]}"
            )
    return v


def judge_ep(results: dict[str, Any], world: int, rank: int, device: torch.device | None = None) -> Verdicts:
    """Verdicts of one rank's :func:`ep_scenario` results: every pinned combine equals
    ``moe_combine`` of the rank's tokens in one process (EP 1) beside every count of the other
    ranks' tokens, twice; the arrival-order combine is detected where it differs from its own
    run at EP 1 (:func:`_single_rank_arrival`: ep_degree), between the other ranks' counts
    (batch_prefix, on rank 0 whose tokens stay) or between skews (repeat)."""
    from batchinv.fast.moe_combine import moe_combine

    device = torch.device("cpu") if device is None else device
    v = Verdicts(control={"arrival_ep_combine": []})
    for others in EP_OTHERS:
        data = ep_data(world, others)
        mine = data.tokens_of(rank)
        expected = moe_combine(data.y[mine].to(device), data.w[mine].to(device)).cpu()
        for i, got in enumerate(results[f"pinned|{others}"]):
            v.pinned_checked += 1
            if not _same(got, expected):
                v.pinned_failures.append(f"others={others} call {i + 1}")
        arrival = results["arrival"][0][0] if others == EP_OTHERS[0] else results[f"arrival|{others}"]
        if not _same(arrival, _single_rank_arrival(data, mine)):
            v.control["arrival_ep_combine"].append(f"ep_degree EP={world} vs EP=1 (others={others})")
    if rank == 0:
        first = results["arrival"][0][0]
        for others in EP_OTHERS[1:]:
            if not _same(results[f"arrival|{others}"], first):
                v.control["arrival_ep_combine"].append(f"batch_prefix: others={others} vs {EP_OTHERS[0]}")
    v.arrival_orders = [order for _, order in results["arrival"]]
    for i, (bits, order) in enumerate(results["arrival"][1:], start=1):
        if not _same(bits, results["arrival"][0][0]):
            v.control["arrival_ep_combine"].append(f"repeat under skew {SKEWS[i]}: arrival {order}")
    if len(set(v.arrival_orders)) < 2:
        v.inconclusive["arrival_ep_combine skew"] = (
            f"the skews did not change the arrival order: {v.arrival_orders}"
        )
    return v


def _single_rank_arrival(data: EPData, mine: slice) -> torch.Tensor:
    """The arrival-order combine at EP 1: one rank runs every expert, its pairs in expert-major
    order, each weighted output added in fp32 in that order."""
    y, w, experts = data.y[mine], data.w[mine], data.experts[mine]
    acc = torch.zeros((y.shape[0], y.shape[2]), dtype=torch.float32)
    tok, slot = torch.nonzero(torch.ones_like(experts, dtype=torch.bool), as_tuple=True)
    order = torch.sort(experts[tok, slot] * (len(experts) + 1) + tok, stable=True).indices
    for t, j in zip(tok[order].tolist(), slot[order].tolist(), strict=True):
        acc[t] += w[t, j] * y[t, j].float()
    return acc


# --- the cpu lane's launcher and the rank's entry point --------------------------------------


def launch(world: int, scenario: str, *, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Run ``scenario`` on ``world`` gloo rank processes on this machine; each rank's results.

    Raises:
        TimeoutError: a rank still running after ``timeout_s`` (every rank is killed).
        RuntimeError: a rank exited non-zero (its stderr's tail in the message).
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="batchinv-multirank-") as tmp:
        procs = []
        for rank in range(world):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "BATCHINV_LANE": "cpu",
                "TRITON_INTERPRET": "1",
                "OMP_NUM_THREADS": "1",
            }
            err = open(Path(tmp) / f"rank{rank}.err", "w")
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-m", "batchinv.harness.multirank", scenario, tmp],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    ),
                    err,
                )
            )
        deadline = time.monotonic() + timeout_s
        try:
            for proc, _ in procs:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"multirank {scenario} at world {world}: a rank still running after {timeout_s} s "
                f"(killed){_tails(tmp, world)}"
            ) from None
        finally:
            for proc, err in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                err.close()
        failed = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
        if failed:
            raise RuntimeError(
                f"multirank {scenario} at world {world}: ranks {failed} failed{_tails(tmp, world)}"
            )
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _tails(tmp: str, world: int) -> str:
    text = ""
    for r in range(world):
        lines = (Path(tmp) / f"rank{r}.err").read_text().strip().splitlines()
        if lines:
            text += f"\n  rank {r}: " + "\n    ".join(lines[-6:])
    return text


def init_from_env(backend: str) -> tuple[Any, torch.device]:
    """``init_process_group`` from torchrun's environment; the default group and this rank's
    device (``cuda:LOCAL_RANK`` for NCCL, the CPU for gloo)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    from batchinv.fast.all_reduce import process_group

    return process_group(None), device


def _main(argv: list[str]) -> int:
    from batchinv.harness.lanes import Lane, enter_lane

    enter_lane(Lane.CPU)
    scenario, out = argv
    import torch.distributed as dist

    pg, device = init_from_env("gloo")
    results = SCENARIOS[scenario](pg, device)
    torch.save(results, Path(out) / f"rank{pg.rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
