"""Tests of ``decode_attention`` (split-KV over a paged KV cache, dense and sparse): agreement with
the fp64 reference within the derived bound, the empty context, bitwise invariance along the
request axes by hand (alone == in a co-batch == at another slot == in other pages), the
batch-planned baseline's variance, typed errors, and top-k -> sparse attention end to end.

The component is not in the registry yet; these tests drive its pieces directly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import pytest
import torch

from batchinv.fast.baselines.decode_attention import batch_planned_splits, planned_config, sdpa_padded
from batchinv.fast.decode_attention import DECODE_ATTENTION_TABLE, decode_attention_config
from batchinv.fast.decode_attention import decode_attention as fast
from batchinv.fast.device import arch
from batchinv.fast.topk import topk
from batchinv.harness.components import decode_attention as component
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import Batch, Case
from batchinv.reference.decode_attention import attention_bound
from batchinv.reference.decode_attention import decode_attention as reference
from batchinv.reference.errors import DeviceError

LANE = current_lane()
DEVICE = torch.device("cpu" if LANE is Lane.CPU else "cuda")


def any_lane(fn):
    """A test of kernel behaviour: the cpu lane (interpreter) and every GPU lane."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def case_of(**axes) -> Case:
    # D = 16 keeps the interpreter fast; GPU tables start at 64
    d = 16 if LANE is Lane.CPU else 64
    base = dict(R=3, Q=1, Hq=4, Hkv=1, D=d, page_size=16, dtype="bfloat16", lengths="edges", longest=97)
    base.update(sparse_k=0)
    base.update(axes)
    return Case(component.NAME, base)


def run(fn, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return fn(**batch.kwargs())


def bound_of(batch: Batch, ref: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    kw = batch.kwargs()
    q = kw["q"]
    config = decode_attention_config(arch(q.device), q.shape[-1], q.dtype)
    return attention_bound(**kw, reference=ref, split_tokens=config.split_tokens, block_n=config.block_n)


def assert_agrees(batch: Batch, out: tuple[torch.Tensor, torch.Tensor]) -> float:
    """fast within the bound of the fp64 reference; exact where the context is empty.  Returns
    the worst error / bound ratio."""
    o, lse = out
    q = batch.rows["q"]
    assert o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    ref_o, ref_lse = reference(**batch.kwargs())
    bound_o, bound_lse = bound_of(batch, (ref_o, ref_lse))
    assert not o.isnan().any() and not lse.isnan().any()
    empty = ref_lse == -math.inf  # (R, Q, Hq)
    assert (lse[empty] == -math.inf).all()
    assert (o[empty] == 0).all() and not torch.signbit(o[empty].float()).any()
    full = ~empty
    err_o = (o.double() - ref_o).abs()[full]
    err_lse = (lse.double() - ref_lse).abs()[full]
    ratio_o = float((err_o / bound_o[full]).max()) if err_o.numel() else 0.0
    ratio_lse = float((err_lse / bound_lse[full]).max()) if err_lse.numel() else 0.0
    assert ratio_o <= 1.0, f"o: worst error / bound = {ratio_o}"
    assert ratio_lse <= 1.0, f"lse: worst error / bound = {ratio_lse}"
    return max(ratio_o, ratio_lse)


def assert_same_bits(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], what: str) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape, what
        xb = x.cpu().contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32)
        yb = y.cpu().contiguous().view(torch.int16 if y.element_size() == 2 else torch.int32)
        assert torch.equal(xb, yb), f"{what}: bits differ"


# --- the config table ---------------------------------------------------------------------------


def test_table_is_frozen_and_keyed_on_arch_head_dim_dtype():
    with pytest.raises(TypeError):
        DECODE_ATTENTION_TABLE[("gpu", 128, torch.bfloat16)] = None  # type: ignore[index]
    for (family, head_dim, dtype), config in DECODE_ATTENTION_TABLE.items():
        assert (
            family in ("gpu", "interp")
            and isinstance(head_dim, int)
            and dtype in (torch.bfloat16, torch.float16, torch.float32)
        )
        assert config.tensor_cores is False or dtype != torch.float32  # fp32: IEEE dots, never TF32
        assert config.split_tokens % config.block_n == 0
    import inspect

    assert list(inspect.signature(decode_attention_config).parameters) == ["arch_name", "head_dim", "dtype"]


def test_planned_config_follows_the_batch():
    base = decode_attention_config("interp", 16, torch.bfloat16)
    one = planned_config(base, 1, 1, 97, 132)
    many = planned_config(base, 64, 4, 97, 132)
    assert one.split_tokens != many.split_tokens


# --- agreement ----------------------------------------------------------------------------------


@any_lane
@pytest.mark.parametrize("case", component.cases(LANE), ids=lambda c: c.id)
def test_agreement(case):
    batch = component.build(case, DEVICE)
    assert_agrees(batch, run(fast, batch))


@any_lane
def test_empty_context_gives_zero_and_minus_inf():
    batch = component.build(case_of(R=4, Q=2, sparse_k=8, lengths="mixed", longest=40), DEVICE)
    rows = dict(batch.rows)
    indices = rows["indices"].clone()
    indices[1] = -1  # request 1: nothing to attend to
    indices[2, 1] = -1  # request 2, token 1: nothing either
    rows["indices"] = indices
    batch = Batch(rows, batch.shared)
    o, lse = run(fast, batch)
    for r, i in ((1, 0), (1, 1), (2, 1)):
        assert (lse[r, i] == -math.inf).all()
        assert torch.equal(
            o[r, i].float().view(torch.int32), torch.zeros_like(o[r, i].float()).view(torch.int32)
        )
    assert (lse[0] == -math.inf).all()  # the builder empties every fourth request by seed
    assert torch.isfinite(lse[3]).all() and torch.isfinite(lse[2, 0]).all()
    assert_agrees(batch, (o, lse))


@any_lane
def test_dropped_last_partial_page_exceeds_the_bound():
    """The bound's teeth: the reference without each request's last partial page is outside it."""
    batch = component.build(case_of(R=3, Q=1, lengths="equal", longest=49), DEVICE)
    ref = reference(**batch.kwargs())
    bound_o, bound_lse = bound_of(batch, ref)
    rows = dict(batch.rows)
    rows["seq_lens"] = (rows["seq_lens"] // 16) * 16  # 49 -> 48: the partial page dropped
    dropped = reference(**Batch(rows, batch.shared).kwargs())
    for r in range(3):
        assert bool(((dropped[1][r] - ref[1][r]).abs() > bound_lse[r]).all())
        assert bool(((dropped[0][r] - ref[0][r]).abs() > bound_o[r]).any())


# --- invariance by hand ---------------------------------------------------------------------------


def _invariance_batch(sparse_k: int, q_len: int) -> Batch:
    return component.build(
        case_of(R=5, Q=q_len, Hq=4, Hkv=2, lengths="edges", sparse_k=sparse_k).with_seed(7), DEVICE
    )


@any_lane
@pytest.mark.parametrize(("sparse_k", "q_len"), [(0, 1), (0, 2), (24, 2)], ids=["dense", "spec2", "sparse"])
def test_request_bits_alone_in_co_batch_at_any_slot_and_placement(sparse_k, q_len):
    batch = _invariance_batch(sparse_k, q_len)
    others = component.build(
        case_of(R=4, Q=q_len, Hq=4, Hkv=2, lengths="one_huge", longest=97, sparse_k=sparse_k).with_seed(11),
        DEVICE,
    )
    full = run(fast, batch)
    gen = torch.Generator().manual_seed(5)
    for r in range(batch.num_rows):
        alone_batch = component.take(batch, [r])
        alone = run(fast, alone_batch)
        assert_same_bits(alone, tuple(t[r : r + 1] for t in full), f"request {r}: alone vs slot {r}")
        # co-batch: before and after other requests (another slot, other pools before its pages)
        for slot, parts in ((0, [alone_batch, others]), (others.num_rows, [others, alone_batch])):
            mixed = run(fast, component.concat(parts))
            assert_same_bits(alone, tuple(t[slot : slot + 1] for t in mixed), f"request {r} at slot {slot}")
        moved = run(fast, component.relocate(alone_batch, gen))
        assert_same_bits(alone, moved, f"request {r}: other pages")
    assert_same_bits(full, run(fast, component.relocate(batch, gen)), "batch: other pages")
    assert_same_bits(full, run(fast, batch), "repeat")


def test_relocate_moves_pages_and_keeps_logical_kv():
    batch = _invariance_batch(0, 1)
    moved = component.relocate(batch, torch.Generator().manual_seed(1))
    assert not torch.equal(moved.rows["block_table"], batch.rows["block_table"])
    ref = reference(**batch.kwargs())
    ref_moved = reference(**moved.kwargs())
    assert torch.equal(ref[0], ref_moved[0]) and torch.equal(ref[1], ref_moved[1])


def test_unreferenced_memory_is_nan():
    batch = component.build(case_of(R=3, lengths="edges"), DEVICE)
    table, lens = batch.rows["block_table"].long().cpu(), batch.rows["seq_lens"].cpu()
    k = batch.shared["k_cache"].cpu()
    owned = torch.zeros(k.shape[:2], dtype=torch.bool)
    for r in range(3):
        length = int(lens[r])
        for p in range(length):
            owned[table[r, p // 16], p % 16] = True
    assert k[~owned].isnan().all() and not k[owned].isnan().any()


# --- baselines ------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_batch_planned_baseline_changes_a_requests_bits():
    """Negative control by hand: a long request's splits follow the batch size, so its bits do."""
    # alone: 132 pretend SMs / 1 -> 16-slot splits (25 of them); among 33: 4 splits of 112 slots
    long_case = case_of(R=1, Q=2, Hq=8, Hkv=1, lengths="equal", longest=400)
    batch = component.build(long_case, DEVICE)
    others = component.build(
        case_of(R=32, Q=2, Hq=8, Hkv=1, lengths="mixed", longest=97).with_seed(3), DEVICE
    )
    alone = run(batch_planned_splits, batch)
    mixed = run(batch_planned_splits, component.concat([batch, others]))
    differ = any(
        not torch.equal(a.float().view(torch.int32), m[:1].float().view(torch.int32))
        for a, m in zip(alone, mixed, strict=True)
    )
    assert differ, "the batch-planned baseline gave the same bits alone and in a batch of 33"
    # ... and it is still attention: within the bound computed for its own split
    assert_agrees_loosely(batch, alone)


def assert_agrees_loosely(batch: Batch, out: tuple[torch.Tensor, torch.Tensor]) -> None:
    ref_o, ref_lse = reference(**batch.kwargs())
    assert torch.allclose(out[0].double(), ref_o, atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(out[1].double()[finite], ref_lse[finite], atol=1e-3)


@pytest.mark.cpu
@pytest.mark.parametrize("sparse_k", [0, 24], ids=["dense", "sparse"])
def test_sdpa_padded_baseline_computes_attention(sparse_k):
    batch = component.build(case_of(R=3, Q=2, lengths="mixed", longest=40, sparse_k=sparse_k), DEVICE)
    o, lse = run(sdpa_padded, batch)
    assert o.dtype == batch.rows["q"].dtype and lse.dtype == torch.float32
    assert not o.isnan().any() and not lse.isnan().any()
    assert_agrees_loosely(batch, (o, lse))


# --- typed errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("error_case", component.error_cases(DEVICE), ids=lambda e: e.name)
@pytest.mark.parametrize("subject", ["fast", "reference"])
def test_error_inputs(error_case, subject):
    fn = {"fast": fast, "reference": reference}[subject]
    with pytest.raises(error_case.error, match=error_case.match):
        fn(**error_case.kwargs)


def test_fast_refuses_a_head_dim_outside_the_table():
    batch = component.build(case_of(R=1, D=16), DEVICE)
    kw = batch.kwargs()
    kw["q"] = kw["q"][..., :8].contiguous()
    kw["k_cache"], kw["v_cache"] = kw["k_cache"][..., :8], kw["v_cache"][..., :8]
    from batchinv.reference.errors import ArgumentError

    with pytest.raises(ArgumentError, match="head dim"):
        fast(**kw)


# --- top-k -> sparse decode attention ---------------------------------------------------------------


@any_lane
def test_topk_then_sparse_attention_end_to_end():
    """Indexer scores -> the pinned top-k (k = 512) -> sparse decode attention, against the reference."""
    r_count, q_len, k = 3, 2, 512
    batch = component.build(
        case_of(R=r_count, Q=q_len, Hq=4, Hkv=1, lengths="mixed", longest=700).with_seed(2), DEVICE
    )
    lens = batch.rows["seq_lens"].long()
    gen = torch.Generator().manual_seed(9)
    num_cols = 704
    scores = torch.randn(r_count * q_len, num_cols, generator=gen).to(DEVICE)
    # token i of request r sees positions < L - Q + i + 1 (causal), row-local = absolute here
    ends = (lens[:, None] - q_len + torch.arange(q_len, device=DEVICE)[None, :] + 1).reshape(-1)
    starts = torch.zeros_like(ends)
    indices = topk(scores, starts.to(torch.int32), ends.to(torch.int32), k).reshape(r_count, q_len, k)
    assert ((indices >= -1) & (indices < lens[:, None, None])).all()
    sparse = Batch({**batch.rows, "indices": indices}, batch.shared)
    assert_agrees(sparse, run(fast, sparse))


def _split_partials_fp32(q, k, v, scale, split, weights_dtype=torch.float32):
    """fp32 partial (o_s, lse_s) of one token's heads over splits of ``split`` positions, the
    weights rounded to ``weights_dtype`` before the sum with v (bf16: the usual flash shortcut).
    q (Hq, D), k/v (N, Hq, D) -> o_s (n_s, Hq, D), lse_s (n_s, Hq)."""
    outs, lses = [], []
    for start in range(0, k.shape[0], split):
        s = torch.einsum("hd,nhd->hn", q.float(), k[start : start + split].float()) * scale  # [Hq, n]
        lse = torch.logsumexp(s, dim=-1)  # [Hq]
        p = (s - lse[:, None]).exp().to(weights_dtype).float()
        outs.append(torch.einsum("hn,nhd->hd", p, v[start : start + split].float()))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _merge_fp32(o_s, lse_s, order):
    m = lse_s.max(dim=0).values  # [Hq]
    acc = torch.zeros_like(o_s[0])
    total = torch.zeros_like(m)
    for s in order:
        w = (lse_s[s] - m).exp()
        acc = acc + w[:, None] * o_s[s]
        total = total + w
    return acc / total[:, None], m + total.log()


@pytest.mark.cpu  # an fp32 emulation of the interpreter's table entry (D = 16)
def test_merging_splits_in_another_order_stays_within_the_bound():
    """Why the bound cannot catch a reordered merge (that takes a bitwise, order-aware check):
    an fp32 split-KV computation merged ascending and descending both sit inside it."""
    batch = component.build(case_of(R=2, Q=1, Hq=4, Hkv=4, lengths="equal", longest=97), torch.device("cpu"))
    kw = batch.kwargs()
    ref = reference(**kw)
    config = decode_attention_config("interp", 16, torch.bfloat16)
    bound_o, bound_lse = attention_bound(
        **kw, reference=ref, split_tokens=config.split_tokens, block_n=config.block_n
    )
    differs = False
    for r in range(2):
        length = int(kw["seq_lens"][r])
        pages = kw["block_table"][r, : -(-length // 16)].long()
        k = kw["k_cache"][pages].reshape(-1, 4, 16)[:length]
        v = kw["v_cache"][pages].reshape(-1, 4, 16)[:length]
        o_s, lse_s = _split_partials_fp32(kw["q"][r, 0], k, v, kw["scale"], config.split_tokens)
        results = []
        for order in (range(len(o_s)), reversed(range(len(o_s)))):
            o, lse = _merge_fp32(o_s, lse_s, list(order))
            assert bool(((o.bfloat16().double() - ref[0][r, 0]).abs() <= bound_o[r, 0]).all())
            assert bool(((lse.double() - ref[1][r, 0]).abs() <= bound_lse[r, 0]).all())
            results.append((o, lse))
        differs |= not torch.equal(results[0][0], results[1][0]) or not torch.equal(
            results[0][1], results[1][1]
        )
    assert differs, "the two merge orders gave the same fp32 bits: pick other inputs"


@pytest.mark.cpu  # an fp32 emulation of the interpreter's table entry (D = 16)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bf16_rounded_weights_exceed_the_bound(dtype):
    """The bound's teeth against a precision downgrade: rounding the softmax weights to bf16
    before the sum with v (tl.dot(p.to(bf16), v)) lands far outside it (measured ~16x)."""
    batch = component.build(
        case_of(R=3, Q=1, Hq=4, Hkv=4, lengths="equal", longest=97, dtype=dtype), torch.device("cpu")
    )
    kw = batch.kwargs()
    ref = reference(**kw)
    config = decode_attention_config("interp", 16, kw["q"].dtype)
    bound_o, _ = attention_bound(
        **kw, reference=ref, split_tokens=config.split_tokens, block_n=config.block_n
    )
    worst = {torch.float32: 0.0, torch.bfloat16: 0.0}
    for r in range(3):
        length = int(kw["seq_lens"][r])
        pages = kw["block_table"][r, : -(-length // 16)].long()
        k = kw["k_cache"][pages].reshape(-1, 4, 16)[:length]
        v = kw["v_cache"][pages].reshape(-1, 4, 16)[:length]
        for weights_dtype in worst:
            o_s, lse_s = _split_partials_fp32(
                kw["q"][r, 0], k, v, kw["scale"], config.split_tokens, weights_dtype
            )
            o, _ = _merge_fp32(o_s, lse_s, range(len(o_s)))
            ratio = (o.to(kw["q"].dtype).double() - ref[0][r, 0]).abs() / bound_o[r, 0]
            worst[weights_dtype] = max(worst[weights_dtype], float(ratio.max()))
    assert worst[torch.float32] <= 1.0
    assert worst[torch.bfloat16] > 2.0


@pytest.mark.cpu
@pytest.mark.parametrize("lane", [Lane.CPU, Lane.SM90])
def test_neighbour_mixes_keep_the_case_shapes_and_cover_the_issue_lengths(lane: Lane) -> None:
    """co_batch's other requests: one case per mix, with the target case's shape axes (so they
    concatenate), short, long, equal (on the cpu lane each request one split longer than any of
    the case's) and one request past the case's longest context."""
    cpu = torch.device("cpu")
    factor = 4 if lane.is_gpu else 2
    for case in component.cases(Lane.CPU):
        mixes = component.neighbours(case, lane)
        assert tuple(mixes) == component.NEIGHBOUR_MIXES
        shape = ("Q", "Hq", "Hkv", "D", "page_size", "dtype", "sparse_k")
        assert all({k: c.axes[k] for k in shape} == {k: case.axes[k] for k in shape} for c in mixes.values())
        assert len({c.seed for c in mixes.values()} | {case.seed}) == 5
        assert mixes["one_huge"].axes["longest"] == factor * case.axes["longest"]
        if lane.is_gpu:
            continue  # building 4x the longest context on the cpu is not this test's business
        batch = component.build(case, cpu)
        q_len, longest = case.axes["Q"], case.axes["longest"]
        lens = {mix: component.build(c, cpu).rows["seq_lens"].tolist() for mix, c in mixes.items()}
        assert all(q_len <= n <= q_len + 16 for n in lens["short"])
        assert all(q_len <= n <= longest for n in lens["long"])
        # cpu lane: one slot past the last whole split of the case's longest request
        split = decode_attention_config(
            "interp", case.axes["D"], component.DTYPES[case.axes["dtype"]]
        ).split_tokens
        own = max(batch.rows["seq_lens"].tolist())
        (equal,) = set(lens["equal"])
        assert equal % split == 1 and -(-equal // split) > -(-own // split)
        assert max(lens["one_huge"]) == factor * longest and sorted(lens["one_huge"])[-2] <= q_len + 16
        joined = component.concat([batch, *(component.build(c, cpu) for c in mixes.values())])
        assert joined.num_rows == batch.num_rows + sum(len(v) for v in lens.values())


# --- GPU only ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_lengths_and_pages_equals_eager():
    """Captured once, replayed after seq_lens, the block table's rows and the caches were
    rewritten in place (what a decode step does): every replay gives the eager launch's bits."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    batch = component.build(
        case_of(R=8, Q=1, Hq=32, Hkv=8, D=128, page_size=16, lengths="equal", longest=3000), device
    )
    static = batch.kwargs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fast(**static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fast(**static)
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        # every request owns as many pages as the longest needs: any length up to 3000 fits
        static["seq_lens"].copy_(torch.randint(1, 3001, (8,), generator=gen, dtype=torch.int32))
        static["block_table"].copy_(static["block_table"][torch.randperm(8, generator=gen)])
        static["q"].copy_(torch.randn(static["q"].shape, generator=gen))
        static["k_cache"].copy_(torch.randn(static["k_cache"].shape, generator=gen))
        static["v_cache"].copy_(torch.randn(static["v_cache"].shape, generator=gen))
        graph.replay()
        eager = fast(**static)
        torch.cuda.synchronize()
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1]), f"step {step}"


# --- the order-exact merge_order design ----------------------------------------------------------


def _merge_equal_weights(partials: torch.Tensor, descending: bool) -> torch.Tensor:
    """The merge kernel's arithmetic on ``partials`` [n_splits, ...] (fp32) whose merge weights
    are all exp(0) = 1: an fp32 running sum in split order, one division by the count."""
    order = range(partials.shape[0] - 1, -1, -1) if descending else range(partials.shape[0])
    acc = torch.zeros(partials.shape[1:], dtype=torch.float32)
    for s in order:
        acc = acc + partials[s]
    return acc / partials.shape[0]


def _merge_order_cases(lane: Lane) -> list[Case]:
    return [c for c in component.cases(lane) if c.axes["lengths"] == "merge_order"]


@pytest.mark.parametrize("lane", [Lane.CPU, Lane.SM90])
def test_merge_order_cases_exist_on_the_lane(lane):
    cases = _merge_order_cases(lane)
    assert {c.axes["dtype"] for c in cases} == {"bfloat16", "float16"}
    assert all(c.axes["sparse_k"] == 0 for c in cases)


def _merge_in_order(partials: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """The merge kernel's arithmetic with all merge weights exp(0) = 1, splits taken in ``order``."""
    acc = torch.zeros(partials.shape[1:], dtype=torch.float32)
    for s in order:
        acc = acc + partials[s]
    return acc / partials.shape[0]


def _merge_pairwise_tree(partials: torch.Tensor) -> torch.Tensor:
    return ((partials[0] + partials[1]) + (partials[2] + partials[3])) / partials.shape[0]


#: The merge orders no design can tell from ascending: those that only swap the first two merged
#: splits (with weights exactly 1 the first two merges are 0 + a and a + b; fp32 '+' commutes).
_ASCENDING_EQUIVALENT = {(0, 1, 2, 3), (1, 0, 2, 3)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_merge_order_values_are_exact_ascending_and_round_descending(dtype):
    big, small = component._MERGE_VALUES[dtype]
    for pattern in component._MERGE_PATTERNS:
        for odd in (1, 3, 5, 7):
            for sign in (1.0, -1.0):
                v = torch.tensor(
                    [sign * (b * big + m * odd * small) for b, m in pattern], dtype=torch.float64
                )
                assert torch.equal(v.to(dtype).double(), v), "a design value is not exact in the dtype"
                exact = v.sum() / 4
                up = _merge_equal_weights(v.float(), descending=False)
                down = _merge_equal_weights(v.float(), descending=True)
                assert up.double() == exact and up.to(dtype).double() == exact
                assert down.to(dtype).double() != exact
                assert abs(float(exact)) >= 2.0**-14  # a normal number of either output dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_merge_order_patterns_together_catch_every_other_order(dtype):
    """Exhaustive fp32 emulation over the 24 orders: each pattern catches (for every sign and odd
    multiple) the orders that do not merge its small split after both big splits; together every
    order but ascending and (1, 0, 2, 3), and the pairwise tree."""
    big, small = component._MERGE_VALUES[dtype]
    orders = list(itertools.permutations(range(component.MERGE_SPLITS)))
    caught: set[tuple[int, ...]] = set()
    tree_caught = False
    for pattern in component._MERGE_PATTERNS:
        small_split = next(s for s, (_, m) in enumerate(pattern) if m)
        big_splits = [s for s, (b, _) in enumerate(pattern) if b]
        expected = {p for p in orders if p.index(small_split) < max(p.index(s) for s in big_splits)}
        for odd in (1, 3, 5, 7):
            for sign in (1.0, -1.0):
                v = torch.tensor([sign * (b * big + m * odd * small) for b, m in pattern]).float()
                want = _merge_in_order(v, range(4)).to(dtype)
                differ = {p for p in orders if not torch.equal(_merge_in_order(v, p).to(dtype), want)}
                assert differ == expected, (pattern, odd, sign)
                caught |= differ
                tree_caught |= not torch.equal(_merge_pairwise_tree(v).to(dtype), want)
    assert caught == set(orders) - _ASCENDING_EQUIVALENT
    assert tree_caught


@pytest.mark.cpu
@pytest.mark.parametrize("seed", [0, 1, 6])
@pytest.mark.parametrize("which", [0, 1])
def test_merge_order_design_distinguishes_every_other_merge_order(which, seed):
    """(Review F4.)  In every kv head of every request of a built case, every merge order but
    ascending and (1, 0, 2, 3), and the pairwise tree, give other bits in some channel."""
    case = _merge_order_cases(Lane.CPU)[which].with_seed(seed)
    batch = component.build(case, torch.device("cpu"))
    kw = batch.kwargs()
    split = decode_attention_config(arch(torch.device("cpu")), case.axes["D"], kw["q"].dtype).split_tokens
    page_size = kw["k_cache"].shape[1]
    for r in range(case.axes["R"]):
        n = int(kw["seq_lens"][r])
        v = kw["v_cache"][kw["block_table"][r, : n // page_size].long()].reshape(n, case.axes["Hkv"], -1)
        partials = v.float().reshape(n // split, split, *v.shape[1:])[:, 0]  # [4, Hkv, D]
        want = _merge_in_order(partials, range(4)).to(kw["q"].dtype)
        for head in range(case.axes["Hkv"]):
            same = [
                p
                for p in itertools.permutations(range(4))
                if p not in _ASCENDING_EQUIVALENT
                and torch.equal(_merge_in_order(partials, p).to(want.dtype)[head], want[head])
            ]
            tree_same = torch.equal(_merge_pairwise_tree(partials).to(want.dtype)[head], want[head])
            assert not same and not tree_same, f"request {r}, kv head {head}: {same}, tree: {tree_same}"
            swapped = _merge_in_order(partials, (1, 0, 2, 3)).to(want.dtype)[head]
            assert torch.equal(swapped, want[head])  # the one order no design can tell apart


@pytest.mark.cpu
@pytest.mark.parametrize("seed", [0, 1, 6])
def test_merge_order_envelope_is_found_from_the_data(seed):
    case = _merge_order_cases(Lane.CPU)[0].with_seed(seed)
    batch = component.build(case, torch.device("cpu"))
    ref = reference(**batch.kwargs())
    mask_o, mask_lse = component.exact(batch, ref)
    q_len = case.axes["Q"]
    assert mask_o[:, q_len - 1].all(), "the last token of every request is held bitwise"
    assert not bool(mask_lse.any())
    # The request functions keep the design: a take, a concat with a random request, a relocation.
    other = component.build(case_of(R=2, lengths="mixed", longest=40).with_seed(seed), torch.device("cpu"))
    parts = component.concat([component.take(batch, [1, 0]), other])
    moved = component.relocate(parts, torch.Generator().manual_seed(seed))
    for b in (parts, moved):
        m = component.exact(b, reference(**b.kwargs()))[0]
        assert m[:2, q_len - 1].all() and not m[2:].any()


@pytest.mark.cpu
def test_random_cases_hold_nothing_bitwise():
    for case in component.cases(Lane.CPU):
        if case.axes["lengths"] not in ("merge_order", "merge_order_long") and case.axes["D"] == 16:
            batch = component.build(case, torch.device("cpu"))
            assert not component.exact(batch, reference(**batch.kwargs()))[0].any(), case.id


@any_lane
@pytest.mark.parametrize("case", _merge_order_cases(LANE), ids=lambda c: c.id)
def test_merge_order_is_bitwise_and_order_sensitive(case):
    from batchinv.reference.exact import round_once

    batch = component.build(case, DEVICE)
    ref = reference(**batch.kwargs())
    mask = component.exact(batch, ref)[0]
    assert mask.any()
    o, _ = run(fast, batch)
    want = round_once(ref[0], o.dtype)
    assert torch.equal(o[mask], want[mask]), "the shipped merge is not bitwise on the design"
    # Each split's partial is its constant value; merged descending, every held element differs.
    kw = batch.kwargs()
    split_tokens = decode_attention_config(arch(DEVICE), case.axes["D"], o.dtype).split_tokens
    table, k_cache, v_cache = kw["block_table"].long(), kw["k_cache"], kw["v_cache"]
    group = case.axes["Hq"] // case.axes["Hkv"]
    for r in range(case.axes["R"]):
        n = int(kw["seq_lens"][r])
        v = v_cache[table[r, : n // k_cache.shape[1]]].reshape(n, case.axes["Hkv"], -1)
        partials = v.float().cpu().reshape(n // split_tokens, split_tokens, *v.shape[1:])[:, 0]
        down = _merge_equal_weights(partials, descending=True).repeat_interleave(group, dim=0).to(o.dtype)
        held = mask[r, -1].cpu()
        assert not (down == want[r, -1].cpu())[held].any()


# --- regressions (adversarial review) -----------------------------------------------------------


@any_lane
@pytest.mark.parametrize("poison", ["q_nan", "k_nan", "q_inf", "scale_overflow"])
def test_non_finite_scores_give_nan_never_an_empty_context(poison):
    """A NaN or infinite score (NaN/inf in q or an attended key, or a scale that takes the fp32
    scores past fp32's range) makes the token's outputs NaN -- never the (0, -inf) of an empty
    context, which a caller cannot tell from a real one.  The reference, in fp64, gives NaN for
    the first three.  (Products of q and k past fp32's range are outside the contract: see the
    ``decode_attention`` docstring.)"""
    batch = component.build(case_of(R=3, Q=1, Hq=4, Hkv=1, lengths="equal", longest=40), DEVICE)
    kw = batch.kwargs()
    q, k = kw["q"].clone(), kw["k_cache"].clone()
    if poison == "q_nan":
        q[1, 0, 2, 3] = math.nan
    elif poison == "q_inf":
        q[1, 0, 2, 3] = math.inf
    elif poison == "k_nan":
        page = int(kw["block_table"][1, 0])
        k[page, 5, 0, 3] = math.nan  # position 5 of request 1, kv head 0: every q head attends it
    scale = kw["scale"]
    if poison == "scale_overflow":  # finite in fp32, but every score times it overflows
        scale = 3.0e38
        q[1] = q[1].abs() + 1  # and no score of request 1 is 0 (0 * scale stays finite)
        k[kw["block_table"][1, :3].long(), :, 0] = k[kw["block_table"][1, :3].long(), :, 0].abs() + 1
    o, lse = fast(**{**kw, "q": q, "k_cache": k, "scale": scale})
    heads = [2] if poison in ("q_nan", "q_inf") else [0, 1, 2, 3]
    for h in heads:
        assert bool(lse[1, 0, h].isnan()), f"{poison}: lse of head {h} is {float(lse[1, 0, h])}"
        assert bool(o[1, 0, h].isnan().all()), f"{poison}: o of head {h} is not NaN"
    untouched = [] if poison == "scale_overflow" else [0, 2]
    ref = fast(**kw)
    for r in untouched:  # the other requests keep their bits
        assert torch.equal(o[r], ref[0][r]) and torch.equal(lse[r], ref[1][r])


@pytest.mark.cpu
def test_interpreter_switched_on_after_import_is_a_device_error_that_says_so(monkeypatch):
    """TRITON_INTERPRET=1 set after batchinv.fast was imported cannot take effect (Triton read it
    at import): the launcher says so instead of failing inside Triton (new-user walkthrough)."""
    import batchinv.fast.device as device

    monkeypatch.setattr(device, "INTERPRETING_AT_IMPORT", False)
    batch = component.build(case_of(R=1), torch.device("cpu"))
    with pytest.raises(DeviceError, match=r"BEFORE batchinv\.fast"):
        fast(**batch.kwargs())


def test_validation_reads_the_longest_length_once_for_the_launcher():
    """The launcher sizes its grid from ``AttentionShape.longest``, read with the other values in
    validation's one host copy; without the values read (CUDA-graph capture) it stays None."""
    from batchinv.reference.decode_attention import check_decode_attention_arguments
    from batchinv.reference.host_read import host_int64
    from batchinv.reference.prefill_attention import check_prefill_attention_arguments

    q = torch.zeros(3, 1, 2, 16, dtype=torch.bfloat16)
    cache = torch.zeros(6, 4, 1, 16, dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    lens = torch.tensor([5, 8, 1], dtype=torch.int32)
    shape = check_decode_attention_arguments(q, cache, cache, table, lens, 0.25)
    assert shape.longest == 8
    assert (
        check_decode_attention_arguments(q, cache, cache, table, lens, 0.25, read_values=False).longest
        is None
    )
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    shape, cu_list = check_prefill_attention_arguments(
        q[:, 0][[0, 1, 1, 2]], cache, cache, table, cu, lens, 0.25
    )
    assert shape.longest == 8 and cu_list == [0, 1, 3, 4]
    parts = host_int64(lens, table, cu.to(torch.int64))
    assert [p.dtype for p in parts] == [torch.int64] * 3
    assert [p.tolist() for p in parts] == [lens.tolist(), table.tolist(), cu.tolist()]


@pytest.mark.parametrize(
    ("lens", "table", "argument"),
    [
        ([-1, 8, 1], [[0, 1], [2, 3], [4, 5]], "seq_lens"),  # a negative length
        ([5, 9, 1], [[0, 1], [2, 3], [4, 5]], "seq_lens"),  # more pages than the table holds
        ([5, 8, 1], [[0, 9], [2, 3], [4, 5]], "block_table"),  # a referenced page id past P
    ],
)
def test_prefill_validation_reads_once_and_keeps_decode_checks_first(lens, table, argument):
    """The one host read of prefill's validation keeps its errors in their order: decode's value
    checks (lengths, page ids) come before the shape of ``indices`` (found by a breaker: the read
    once moved them after it)."""
    from batchinv.reference.errors import ArgumentError
    from batchinv.reference.prefill_attention import check_prefill_attention_arguments

    q = torch.zeros(4, 2, 16, dtype=torch.bfloat16)
    cache = torch.zeros(6, 4, 1, 16, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32)
    wrong_rows = torch.zeros(3, 2, dtype=torch.int32)  # T is 4
    with pytest.raises(ArgumentError) as err:
        check_prefill_attention_arguments(
            q,
            cache,
            cache,
            torch.tensor(table, dtype=torch.int32),
            cu,
            torch.tensor(lens, dtype=torch.int32),
            0.25,
            wrong_rows,
        )
    assert err.value.argument == argument
