"""Tuning aid for the topk kernel (GPU lanes): times the pinned kernel at the bench points
under several ``num_warps``, and a radix-4 variant of the k-th-key search (16 steps of three
packed counts instead of 32 steps of one), and checks every variant's bits against the shipped
kernel.

    python ci/tune_topk.py            # prints a table; exit 1 if any variant's bits differ

The radix-4 variant is the shipped :func:`~batchinv.fast.kernels.topk.topk_kernel` itself with
one parameter changed, its k-th-key search (:func:`with_kth_key`): its code and its globals are
the shipped kernel's but for that search, so it follows every change to the shipped kernel.

This script is how the small launches' table (``CONFIGS``: arch, k, num_cols bucket) was chosen
(docs/BENCHMARKS.md records the run); ``ci/tune_topk_rows.py`` tunes the many-row buckets.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
import triton
import triton.language as tl

import batchinv.fast.kernels.topk as topk_kernels
import batchinv.fast.topk as fast_topk
from batchinv.fast.kernels.topk import KEY_MIN
from batchinv.harness.bench import time_call
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get


@triton.jit
def _kth_key_radix4(key, candidate, num_wanted):
    """The same threshold as the shipped 32-step search, two bits per step: the three counts
    of a step share one reduction (packed 16 bits apart in an int64; a count is <= 8192)."""
    thresh = tl.full((), KEY_MIN, tl.int64)
    key64 = key.to(tl.int64)
    for step in tl.static_range(16):
        unit = tl.full((), 1, tl.int64) << (30 - 2 * step)
        c1 = (candidate & (key64 >= thresh + unit)).to(tl.int64)
        c2 = (candidate & (key64 >= thresh + 2 * unit)).to(tl.int64)
        c3 = (candidate & (key64 >= thresh + 3 * unit)).to(tl.int64)
        packed = tl.sum(c1 + (c2 << 16) + (c3 << 32), axis=0)
        n1, n2, n3 = packed & 0xFFFF, (packed >> 16) & 0xFFFF, packed >> 32
        digit = (
            (n1 >= num_wanted).to(tl.int64)
            + (n2 >= num_wanted).to(tl.int64)
            + (n3 >= num_wanted).to(tl.int64)
        )
        thresh = thresh + digit * unit
    return thresh.to(tl.int32)


def _rejit(jitted: Any, replaced: dict[str, Any], **jit_kwargs: Any) -> Any:
    """The shipped ``@triton.jit`` function ``jitted`` jitted again with the globals in
    ``replaced`` rebound: the same code object and source (Triton reads it from the shipped file),
    a copy of its module's globals."""
    fn = jitted.fn
    missing = set(replaced) - set(fn.__globals__)
    if missing:  # the shipped kernel no longer calls what this variant replaces
        raise LookupError(f"{fn.__module__}.{fn.__name__} has no global {sorted(missing)}")
    clone = types.FunctionType(
        fn.__code__, {**fn.__globals__, **replaced}, fn.__name__, fn.__defaults__, fn.__closure__
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__annotations__ = dict(fn.__annotations__)
    clone.__qualname__ = fn.__qualname__
    clone.__module__ = fn.__module__
    clone.__doc__ = fn.__doc__
    return triton.jit(clone, **jit_kwargs)


def with_kth_key(kth_key: Any) -> Any:
    """:func:`~batchinv.fast.kernels.topk.topk_kernel` with ``kth_key`` in place of its 32-step
    search ``_kth_key`` (through ``_select``, rebuilt around it); every other operation, the
    signature and the specialization (``do_not_specialize``) are the shipped kernel's."""
    select = _rejit(topk_kernels._select, {"_kth_key": kth_key})
    return _rejit(
        topk_kernels.topk_kernel, {"_select": select}, do_not_specialize=topk_kernels._NOT_SPECIALIZED
    )


#: The radix-4 variant of the shipped kernel.
topk_radix4_kernel = with_kth_key(_kth_key_radix4)


def radix4_topk(scores, row_starts, row_ends, k, num_warps):
    out = torch.empty((scores.shape[0], k), dtype=torch.int32, device=scores.device)
    topk_radix4_kernel[(scores.shape[0],)](
        scores,
        row_starts,
        row_ends,
        out,
        scores.shape[1],
        scores.stride(0),
        scores.stride(1),
        row_starts.stride(0),
        row_ends.stride(0),
        out.stride(0),
        K=k,
        BLOCK_N=triton.next_power_of_2(scores.shape[1]),
        num_warps=num_warps,
    )
    return out


#: num_warps tried for the shipped kernel and for the radix-4 variant (2 warps compiles for
#: minutes at 8192 columns).
WARPS = (4, 8, 16)
RADIX4_WARPS = (8, 16)


def main() -> int:
    component = get("topk")
    bad = 0
    rows = []
    for case in [c for c in component.bench_cases(Lane.SM90) if c.axes["num_rows"] in (1, 1024)]:
        batch = component.build(case, torch.device("cuda"))
        kw = batch.kwargs()
        expected = fast_topk.topk(**kw)
        base = fast_topk.select_config("sm90", kw["k"], kw["scores"].shape[1])
        for warps in WARPS:
            config = fast_topk.TopkConfig(base.block_n, warps)
            got = fast_topk.topk(**kw, config=config)
            same = torch.equal(got, expected)
            bad += not same
            us, _ = time_call(lambda kw=kw, c=config: fast_topk.topk(**kw, config=c), 30)
            rows.append((case.axes["num_rows"], case.axes["k"], warps, us, same, base.num_warps == warps))
        for warps in RADIX4_WARPS:
            got = radix4_topk(**kw, num_warps=warps)
            same = torch.equal(got, expected)
            bad += not same
            us, _ = time_call(lambda kw=kw, w=warps: radix4_topk(**kw, num_warps=w), 30)
            rows.append((case.axes["num_rows"], case.axes["k"], f"r4/{warps}", us, same, False))
    print("num_rows  k     warps  us/call  bits-equal  shipped")
    for r in rows:
        print(f"{r[0]:<9} {r[1]:<5} {r[2]!s:<6} {r[3]:<8.1f} {r[4]!s:<11} {'*' if r[5] else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU (it times kernels with CUDA graphs); none here")
    sys.exit(main())
