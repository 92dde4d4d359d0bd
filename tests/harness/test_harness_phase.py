"""The ``phase`` check: a query row's bits do not depend on the phase that computed it (full
prefill, chunked prefill over a cached prefix, decode, speculative verify, mixed launches).

Its subjects here: a toy request-level component whose reference and fast are the fp64 prefill
reference (:mod:`batchinv.reference.prefill_attention`) through the prefill phase model
(:class:`~batchinv.harness.phases.PrefillPhaseModel`, the one ``prefill_attention``'s entry will
instantiate), with two planted phase-dependent subjects it must catch; and the registered
``decode_attention`` (uniform q_len, :class:`~batchinv.harness.phases.DecodePhaseModel`): its
fast kernel passes, its ``verify_splits`` baseline (another split size at q_len > 1) is caught.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from batchinv.harness import phases
from batchinv.harness.checks import DRIVERS, FAST, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    CHECKS,
    INVARIANCE_CHECKS,
    PHASE_CHECKS,
    REQUEST_CHECKS,
    Batch,
    Case,
    Component,
    Exact,
    get,
)
from batchinv.harness.requests import nan_filled_pages, paged_model, pages_needed
from batchinv.reference.prefill_attention import prefill_attention

pytestmark = pytest.mark.cpu

NAME = "toy_prefill"
PAGE = 8
SPLIT = 16


def _build(case: Case, device: torch.device) -> Batch:
    """Requests of the case's ``lengths``, each with ``q_len`` new tokens (the last ones): q
    packed by ``cu_seqlens_q`` (shared), block tables and seq_lens per request (rows), pages
    shuffled in a NaN-filled pool with NaN tails; sparse cases: ``indices [T, K]`` (shared),
    ascending positions ``<= p`` and a -1 tail."""
    a = case.axes
    g = torch.Generator().manual_seed(case.seed)
    lens, q_lens = list(a["lengths"]), list(a["q_lens"])
    hq, hkv, d = a["Hq"], a["Hkv"], a["D"]
    need = pages_needed(lens, PAGE)
    num_pages = sum(need) + 2
    perm = torch.randperm(num_pages, generator=g)
    table = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    k_cache = nan_filled_pages(num_pages, PAGE, hkv, d, dtype=torch.bfloat16)
    v_cache = nan_filled_pages(num_pages, PAGE, hkv, d, dtype=torch.bfloat16)
    taken = 0
    for r, length in enumerate(lens):
        ids = perm[taken : taken + need[r]]
        taken += need[r]
        table[r, : need[r]] = ids.to(torch.int32)
        for j, page in enumerate(ids.tolist()):
            n = min(PAGE, length - j * PAGE)
            k_cache[page, :n] = torch.randn(n, hkv, d, generator=g).to(torch.bfloat16)
            v_cache[page, :n] = torch.randn(n, hkv, d, generator=g).to(torch.bfloat16)
    cu = [0]
    for q_len in q_lens:
        cu.append(cu[-1] + q_len)
    shared: dict[str, object] = {
        "q": torch.randn(cu[-1], hq, d, generator=g).to(torch.bfloat16),
        "cu_seqlens_q": torch.tensor(cu, dtype=torch.int32),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "scale": 1.0 / math.sqrt(d),
    }
    if a.get("sparse_k"):
        k = a["sparse_k"]
        idx = torch.full((cu[-1], k), -1, dtype=torch.int32)
        for r, (length, q_len) in enumerate(zip(lens, q_lens, strict=True)):
            for i in range(q_len):
                p = length - q_len + i
                count = int(torch.randint(1, min(k, p + 1) + 1, (1,), generator=g))
                idx[cu[r] + i, :count] = (
                    torch.randperm(p + 1, generator=g)[:count].sort().values.to(torch.int32)
                )
        shared["indices"] = idx
    rows = {"block_table": table, "seq_lens": torch.tensor(lens, dtype=torch.int32)}
    return Batch({k: v.to(device) for k, v in rows.items()}, shared)


def _case(lengths, q_lens, *, hq=4, hkv=2, d=8, sparse_k=0, seed=0) -> Case:
    axes = {"lengths": lengths, "q_lens": q_lens, "Hq": hq, "Hkv": hkv, "D": d, "sparse_k": sparse_k}
    return Case(NAME, axes, seed=seed)


CASES = (
    _case([37, 5, 50], [6, 5, 1]),
    _case([33], [33], hq=2, hkv=1, seed=1),
    _case([17, 40], [2, 9], sparse_k=6, seed=2),
)


def _rounded(**kwargs):
    """The reference with the component's output dtypes: o in q's dtype, lse in fp32."""
    return prefill_attention(**kwargs, rounded=True)


def _toy(fast=_rounded) -> Component:
    return Component(
        name=NAME,
        summary="paged varlen prefill attention (the fp64 reference)",
        reference=prefill_attention,
        fast=fast,
        baselines=(),
        cases=lambda lane: list(CASES),
        build=_build,
        agreement=Exact("the fast subject is the reference itself"),
        dtypes=(torch.bfloat16,),
        requests=paged_model(("k_cache", "v_cache")),
        phase=phases.PrefillPhaseModel(lambda batch: (SPLIT,)),
    )


def _q_lens(cu_seqlens_q: torch.Tensor) -> list[int]:
    cu = cu_seqlens_q.tolist()
    return [b - a for a, b in itertools.pairwise(cu)]


def rounded_twice_when_multi(**kwargs):
    """Planted: o of a request with q_len > 1 rounded twice (to fp16, then to bf16), once at
    q_len 1: a prefill row and the same row decoded differ where the double rounding does."""
    o, lse = prefill_attention(**kwargs)
    once = o.to(torch.bfloat16)
    twice = o.to(torch.float16).to(torch.bfloat16)
    multi = torch.repeat_interleave(
        torch.tensor([q > 1 for q in _q_lens(kwargs["cu_seqlens_q"])]),
        torch.tensor(_q_lens(kwargs["cu_seqlens_q"])),
    )
    return torch.where(multi[:, None, None], twice, once), lse.to(torch.float32)


def splits_from_chunk_start(
    q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *, scale=None, indices=None
):
    """Planted: fp32 split attention whose split boundaries are counted from the chunk's first
    new token (``seq_len - q_len``) instead of the request's first key; splits merged in
    ascending order.  Dense only."""
    assert indices is None
    s = torch.tensor(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]), dtype=torch.float32)
    t_count, hq, d = q.shape
    hkv, page = k_cache.shape[2], k_cache.shape[1]
    group = hq // hkv
    o = torch.zeros(t_count, hq, d, dtype=torch.float32)
    lse = torch.zeros(t_count, hq, dtype=torch.float32)
    cu = cu_seqlens_q.tolist()
    for r, length in enumerate(seq_lens.tolist()):
        start = length - (cu[r + 1] - cu[r])
        pos = torch.arange(length)
        pages = block_table[r].to(torch.int64)[pos // page]
        k = k_cache[pages, pos % page].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache[pages, pos % page].float().repeat_interleave(group, dim=1)
        for t in range(cu[r], cu[r + 1]):
            p = start + t - cu[r]
            cuts = sorted({0, p + 1} | {c for c in range(start % SPLIT, p + 1, SPLIT) if 0 < c < p + 1})
            ms, ls, accs = [], [], []
            for lo, hi in itertools.pairwise(cuts):
                sc = (k[lo:hi] * q[t].float()).sum(-1) * s  # [n, Hq]
                m = sc.amax(0)
                w = torch.exp(sc - m)
                ms.append(m)
                ls.append(w.sum(0))
                accs.append((w[..., None] * v[lo:hi]).sum(0))
            big = torch.stack(ms).amax(0)
            total = torch.zeros(hq)
            acc = torch.zeros(hq, d)
            for m, l_, a in zip(ms, ls, accs, strict=True):
                f = torch.exp(m - big)
                total = total + l_ * f
                acc = acc + a * f[:, None]
            o[t] = acc / total[:, None]
            lse[t] = big + torch.log(total)
    return o.to(q.dtype), lse


def test_the_phase_check_follows_the_request_checks_with_one_driver():
    assert PHASE_CHECKS == ("phase",)
    i = CHECKS.index("phase")
    assert CHECKS[i - len(REQUEST_CHECKS) : i] == REQUEST_CHECKS
    assert "phase" in INVARIANCE_CHECKS
    assert tuple(DRIVERS) == CHECKS
    toy = _toy()
    assert toy.applicable_checks() == (
        "agreement", "co_batch", "slot", "placement", "phase", "repeat", "neighbours", "cross_process",
    )  # fmt: skip
    assert "phase" not in dataclasses.replace(toy, phase=None).applicable_checks()
    assert "phase" in get("decode_attention").applicable_checks()


def test_a_component_without_a_phase_model_skips_with_a_reason():
    toy = dataclasses.replace(_toy(), phase=None)
    r = run_check(toy, FAST, "phase", CASES[0], Lane.CPU)
    assert r.status == "skip" and "no phase model" in r.detail


def test_the_plan_is_bounded_deterministic_and_holds_every_phase():
    batch = _build(CASES[0], torch.device("cpu"))
    model = _toy().phase
    targets = [0, 1, 2]
    plan = phases.plan(model, batch, targets, seed=0)
    assert plan == phases.plan(model, batch, targets, seed=0)
    assert plan.launches <= phases.MAX_LAUNCHES
    assert plan.base_phase == "full prefill"
    assert [(p.request, p.first, p.last) for p in plan.base[0].pieces] == [(0, 0, 36), (1, 0, 4), (2, 0, 49)]
    labels = {p.phase for launch in plan.others for p in launch.pieces}
    for want in ("decode q_len 1", "verify q_len 2", "verify q_len 4"):
        assert want in labels
    assert any(label.startswith("mixed launch: chunk cut at") for label in labels)
    assert "mixed launch: decode q_len 1" in labels
    cuts = phases.cut_points(50, PAGE, (SPLIT,), 0, 2)
    for c in (8, 16, 24, 32, 15, 17, 31, 33):  # page boundaries (4) and split multiples +-1 (2)
        assert c in cuts
        assert f"chunk cut at {c}" in labels
    assert len(cuts) <= phases.MAX_CUTS
    # a mixed launch holds pieces of several q_lens; every piece inside its request
    mixed = plan.others[-1].pieces
    assert len({p.q_len for p in mixed}) > 1
    for launch in (*plan.base, *plan.others):
        for p in launch.pieces:
            assert 0 <= p.first <= p.last < CASES[0].axes["lengths"][p.request]


def test_a_uniform_model_keeps_one_q_len_per_launch():
    comp = get("decode_attention")
    case = comp.cases(Lane.CPU)[3]  # R=9, Q=2
    batch = comp.build(case, torch.device("cpu"))
    plan = phases.plan(comp.phase, batch, [0, 4, 8], seed=case.seed)
    assert plan.base_phase == "decode q_len 1" and plan.launches <= phases.MAX_LAUNCHES
    for launch in (*plan.base, *plan.others):
        assert len({p.q_len for p in launch.pieces}) == 1
    assert {launch.pieces[0].q_len for launch in plan.others} == {2, 4}
    decoded = {(p.request, p.first) for p in plan.base[0].pieces}
    for launch in plan.others:  # every verify window holds a decoded position
        for p in launch.pieces:
            assert any((p.request, i) in decoded for i in range(p.first, p.last + 1))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_reference_passes(case):
    r = run_check(_toy(), FAST, "phase", case, Lane.CPU)
    assert r.status == "pass", r.detail
    assert r.rows_total > 0


def test_double_rounding_at_q_len_above_one_is_caught_naming_both_phases():
    r = run_check(_toy(rounded_twice_when_multi), FAST, "phase", CASES[0], Lane.CPU)
    assert r.status == "fail", r.detail
    assert "full prefill vs " in r.detail and "position" in r.detail and "0x" in r.detail
    assert "o head" in r.detail and ", column " in r.detail
    assert any(phase in r.detail for phase in ("decode q_len 1", "chunk cut at"))
    assert any("decode q_len 1" in w for w in r.where)


def test_splits_counted_from_the_chunk_start_are_caught():
    small = _case([40], [3], hq=2, hkv=1, seed=3)  # the planted subject is a slow Python loop
    r = run_check(_toy(splits_from_chunk_start), FAST, "phase", small, Lane.CPU)
    assert r.status == "fail", r.detail
    assert "full prefill vs " in r.detail and "0x" in r.detail
    assert any("chunk cut at" in w for w in r.where)
    assert any("verify q_len" in w or "decode q_len 1" in w for w in r.where)
    assert r.first_difference.startswith("request ")


def test_decode_attention_fast_passes_and_verify_splits_is_caught():
    comp = get("decode_attention")
    case = comp.cases(Lane.CPU)[3]  # R=9, Q=2, edges lengths
    fast = run_check(comp, FAST, "phase", case, Lane.CPU)
    assert fast.status == "pass", fast.detail
    control = run_check(comp, "verify_splits", "phase", case, Lane.CPU)
    assert control.status == "fail", control.detail
    assert control.negative_control
    assert "decode q_len 1 vs verify q_len" in control.detail and "0x" in control.detail
