"""Buckets meet kernels: a request's bits are the same in two CUDA-graph buckets.

A step pads to its bucket (``cuda_graph_buckets``): the fast matmul sees the bucket's token
count as M, decode attention the bucket's decode slots as R.  Here the same three requests run
in the bucket of a 3-request step and in the bucket of a larger step (other requests beside
them, padding rows after), and their output rows must be bitwise equal: the kernels are
invariant along M / R and padding rows do not leak.  Padding rows are NaN (a leak would show
as NaN in a real row) and, after capture, are rewritten with other junk before a second replay.

GPU lanes capture each bucket in a CUDA graph and replay it; the cpu lane (Triton interpreter)
runs the same padded launches eagerly, so CI exercises the padding comparison.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from batchinv.fast.cuda_graph_buckets import capture_buckets, step_bucket
from batchinv.fast.decode_attention import decode_attention
from batchinv.fast.matmul import matmul
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.reference.cuda_graph_buckets import BatchDims

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")
CONFIG = {
    "max_requests": 100,
    "max_tokens": 512,
    "max_seq_len": 64,
    "num_speculative_tokens": 0,
    "mix": "decode",
}
REAL = 3  # the requests compared


def bucket_of(count: int) -> tuple[int, int]:
    """(tokens, decode slots) of the bucket a decode step of ``count`` requests pads to."""
    table = capture_buckets(**CONFIG)
    index = step_bucket(table, BatchDims(count, 0, count))
    assert index >= 0
    tokens, prefill, decode = (int(v) for v in table[index])
    assert prefill == 0
    return tokens, decode


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def launch(
    fn: Callable[[], tuple[torch.Tensor, ...]], rewrite_padding: Callable[[], None]
) -> list[tuple[torch.Tensor, ...]]:
    """``fn``'s outputs (cloned) before and after ``rewrite_padding``: replays of one CUDA graph
    captured on the static inputs on GPU lanes, eager calls on the cpu lane."""
    if not LANE.is_gpu:
        first = tuple(t.clone() for t in fn())
        rewrite_padding()
        return [first, tuple(t.clone() for t in fn())]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()
    graph.replay()
    torch.cuda.synchronize()
    first = tuple(t.clone() for t in static)
    rewrite_padding()
    graph.replay()
    torch.cuda.synchronize()
    return [first, tuple(t.clone() for t in static)]


def randn(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.cpu
@pytest.mark.gpu
def test_a_requests_matmul_rows_are_equal_in_two_buckets():
    """The 3 requests' hidden rows through the fast matmul in the 64-token bucket (a 3-request
    step) and the 128-token bucket (a 70-request step): equal bits, padding never leaking."""
    small, large = bucket_of(REAL)[0], bucket_of(70)[0]
    assert (small, large) == (64, 128)
    k, n = (64, 32) if LANE is Lane.CPU else (4096, 1024)
    weight = randn(n, k, seed=1, dtype=torch.bfloat16)
    real = randn(REAL, k, seed=2, dtype=torch.bfloat16)
    others = randn(70 - REAL, k, seed=3, dtype=torch.bfloat16)
    outs = []
    for tokens, step in ((small, real), (large, torch.cat([real, others]))):
        x = torch.full((tokens, k), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        x[: step.shape[0]] = step
        used = step.shape[0]

        def rewrite(x: torch.Tensor = x, used: int = used) -> None:
            x[used:] = -65504.0  # large finite junk, after NaN

        outs.append(launch(lambda x=x: (matmul(x, weight, out_dtype=torch.float32),), rewrite))
    want = bits(outs[0][0][0][:REAL])
    assert not torch.isnan(outs[0][0][0][:REAL]).any()
    for replays in outs:
        for (out,) in replays:
            assert torch.equal(bits(out[:REAL]), want)


@pytest.mark.cpu
@pytest.mark.gpu
def test_a_requests_decode_attention_is_equal_in_two_buckets():
    """The 3 requests' decode attention in the 4-slot bucket (a 3-request step) and the 32-slot
    bucket (a 20-request step); padding slots have NaN queries, seq_len 1 and a NaN page."""
    small, large = bucket_of(REAL)[1], bucket_of(20)[1]
    assert (small, large) == (4, 32)
    hq, hkv, d, page = (4, 1, 16, 16) if LANE is Lane.CPU else (32, 8, 128, 16)
    pages_per = 3
    lens = torch.tensor(
        [1, 17, 40]
        + [int(v) for v in torch.randint(1, 48, (17,), generator=torch.Generator().manual_seed(4))]
    )
    q_real = randn(20, 1, hq, d, seed=5, dtype=torch.bfloat16)
    kv = [randn(20 * pages_per, page, hkv, d, seed=s, dtype=torch.bfloat16) for s in (6, 7)]
    outs = []
    for slots, step in ((small, REAL), (large, 20)):
        nan_page = 20 * pages_per  # one page of NaN for every padding slot
        caches = [torch.cat([c, torch.full_like(c[:1], float("nan"))]) for c in kv]
        q = torch.full((slots, 1, hq, d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        q[:step] = q_real[:step]
        table = torch.full((slots, pages_per), nan_page, dtype=torch.int32, device=DEVICE)
        table[:step] = torch.arange(step * pages_per, dtype=torch.int32, device=DEVICE).reshape(
            step, pages_per
        )
        seq = torch.ones(slots, dtype=torch.int32, device=DEVICE)
        seq[:step] = lens[:step].to(torch.int32)

        def rewrite(q: torch.Tensor = q, step: int = step) -> None:
            q[step:] = 1.0e4  # large finite junk: scores of the padding slots only

        outs.append(
            launch(
                lambda q=q, caches=caches, table=table, seq=seq: decode_attention(
                    q, *caches, table, seq, d**-0.5
                ),
                rewrite,
            )
        )
    want_o, want_lse = outs[0][0][0][:REAL], outs[0][0][1][:REAL]
    assert not torch.isnan(want_o).any() and not torch.isnan(want_lse).any()
    for replays in outs:
        for o, lse in replays:
            assert torch.equal(bits(o[:REAL]), bits(want_o))
            assert torch.equal(bits(lse[:REAL]), bits(want_lse))


@pytest.mark.cpu
@pytest.mark.gpu
def test_a_kernel_reading_the_padding_rows_is_caught():
    """The negative control of the two tests above: a kernel whose real rows read the bucket's
    padding (here a column sum over all M rows added to each row) gives NaN rows with NaN
    padding and other bits once the padding is rewritten, which is what those tests look for."""
    k, n = 64, 32
    weight = randn(n, k, seed=1, dtype=torch.bfloat16)
    x = torch.full((bucket_of(REAL)[0], k), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    x[:REAL] = randn(REAL, k, seed=2, dtype=torch.bfloat16)

    def leaky() -> tuple[torch.Tensor]:
        out = matmul(x, weight, out_dtype=torch.float32)
        return (out + 0.0 * x.float().sum(dim=0)[:n],)

    def rewrite() -> None:
        x[REAL:] = -65504.0

    (first,), (second,) = launch(leaky, rewrite)
    assert torch.isnan(first[:REAL]).all()  # NaN padding shows in every real row
    assert not torch.equal(bits(first[:REAL]), bits(second[:REAL]))  # and junk changes the bits
