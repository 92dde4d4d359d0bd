"""How long a host-device round trip takes when N processes share one GPU (time-slicing).

    python ci/sync_latency.py [--busy] [N ...]        (default: 1 2 4 8 12)

Each of N processes (spawned, one CUDA context each, as the sweep's workers) repeats a round
trip -- a tiny kernel, then ``.item()`` (a device-to-host copy that waits for it) -- for a fixed
number of seconds, and reports the median and 90th percentile of one round trip in
microseconds, and how many it made.  Without MPS the GPU runs one context at a time, so a round
trip may wait for other contexts' time slices: this measures that wait, the price of every
synchronizing call a sweep worker makes (``bool(t.any())``, ``torch.equal``, ``.cpu()``).
With ``--busy`` only the first process measures; the other N - 1 keep the GPU busy with 4096^2
bf16 matmuls (about 0.1 ms each, a sync every 20), as the sweep's heavier checks do.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time

SECONDS = 4.0


def _busy(barrier: mp.synchronize.Barrier, stop: mp.Event) -> None:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    barrier.wait()
    while not stop.is_set():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _worker(barrier: mp.synchronize.Barrier, out: mp.Queue) -> None:
    import torch

    x = torch.zeros(1024, device="cuda")
    for _ in range(50):  # context, kernels and the allocator warmed
        x.add_(1.0)
        x.sum().item()
    barrier.wait()
    samples = []
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        x.add_(1.0)
        x.sum().item()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    out.put((statistics.median(samples), samples[int(0.9 * (len(samples) - 1))], len(samples)))


def main(argv: list[str]) -> int:
    busy = "--busy" in argv
    counts = [int(a) for a in argv if a != "--busy"] or [1, 2, 4, 8, 12]
    ctx = mp.get_context("spawn")
    print(
        f"processes  median_us  p90_us  round_trips_per_process  ({'one measuring, the rest busy' if busy else 'all measuring'})"
    )
    for n in counts:
        barrier, out, stop = ctx.Barrier(n), ctx.Queue(), ctx.Event()
        measuring = 1 if busy else n
        procs = [ctx.Process(target=_worker, args=(barrier, out)) for _ in range(measuring)]
        procs += [ctx.Process(target=_busy, args=(barrier, stop)) for _ in range(n - measuring)]
        for p in procs:
            p.start()
        rows = [out.get() for _ in range(measuring)]
        stop.set()
        for p in procs:
            p.join()
        med = statistics.median(r[0] for r in rows)
        p90 = statistics.median(r[1] for r in rows)
        made = statistics.median(r[2] for r in rows)
        print(f"{n:9d}  {med:9.1f}  {p90:6.1f}  {made:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
