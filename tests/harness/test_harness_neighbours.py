"""The ``neighbours`` check: a victim's bits do not move when only the other units' contents do.

The driver against planted functions (row-local ones pass; a batch-wide amax, a batch-wide NaN
stage and a batch max that only outliers move are caught, each by the transforms that reach it),
the rewrites (layout kept, the victim and integer rows untouched, only the other requests' pool
tokens rewritten), the registry's derivation, and the negative controls the issue names on the
cpu lane: ``fp8_quant``'s per-tensor dynamic scale, ``fused_moe``'s per-tensor FP8 activations
and ``rms_norm``'s eps scaled by the batch max; and ``Component.content_rows``: the sampler's
check rewrites its logits only (its temperature and top_p rows are parameters), passes on the
shipped kernel and catches a sampler whose token follows the batch's logits.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from batchinv.fast.sampler import sampler as fast_sampler
from batchinv.harness import invariance, requests
from batchinv.harness.bitpatterns import to_bits
from batchinv.harness.checks import DRIVERS, FAST, NEIGHBOUR_CASES_CPU, run_check
from batchinv.harness.lanes import Lane
from batchinv.harness.neighbours import CPU_TRANSFORM_GROUPS, TRANSFORMS, copy_layout, rewrite_rows
from batchinv.harness.registry import CHECKS, INVARIANCE_CHECKS, NEIGHBOUR_CHECKS, Batch, components, get

pytestmark = pytest.mark.cpu


def _batch(m: int = 6, n: int = 5, dtype: torch.dtype = torch.float32) -> Batch:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(m, n, generator=g).to(dtype)
    ids = torch.arange(m, dtype=torch.int32)
    return Batch({"x": x, "ids": ids}, {"w": torch.ones(n, dtype=dtype)})


def _row_local(b: Batch) -> tuple[torch.Tensor, ...]:
    x = b.rows["x"].float()
    return (x / (x.abs().amax(dim=1, keepdim=True) + 1.0),)


def _batch_amax(b: Batch) -> tuple[torch.Tensor, ...]:
    """One scale for the whole launch (the amax of every finite element)."""
    x = b.rows["x"].float()
    finite = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
    return (x / finite.amax().clamp_min(1e-12),)


def _nan_poisons_the_batch(b: Batch) -> tuple[torch.Tensor, ...]:
    """A batch-wide stage through which a NaN row reaches every row (vLLM #57094)."""
    x = b.rows["x"].float()
    return (x + 0.0 * x.double().sum(),)


def _outlier_max(b: Batch) -> tuple[torch.Tensor, ...]:
    """A batch-wide max that only moves above 1e30 (only max-normal neighbours reach it)."""
    x = b.rows["x"].float()
    big = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x)).amax()
    return (x * (2.0 if float(big) > 1e30 else 1.0),)


def _run(fn, batch=None, victims=(2,), transforms=TRANSFORMS):
    return invariance.neighbours(fn, batch or _batch(), list(victims), rewrite_rows, transforms)


def test_the_check_is_registered_after_padding_with_one_driver():
    assert NEIGHBOUR_CHECKS == ("neighbours",) and "neighbours" in INVARIANCE_CHECKS
    assert CHECKS.index("neighbours") == CHECKS.index("padding") + 1
    assert tuple(DRIVERS) == CHECKS
    for comp in components():  # row-wise and request-level alike; integer plans have no contents
        floating = any(d.is_floating_point for d in comp.dtypes) and comp.checks is None
        assert ("neighbours" in comp.applicable_checks()) == floating, comp.name
    assert "neighbours" in get("decode_attention").applicable_checks()
    assert "neighbours" not in get("prefill_chunk_plan").applicable_checks()


def test_a_row_local_function_passes_every_transform():
    result = _run(_row_local)
    assert result.passed and result.comparisons == len(TRANSFORMS)


def test_a_batch_wide_amax_is_caught_and_the_failure_names_the_victim_and_transform():
    result = _run(_batch_amax)
    assert not result.passed
    assert result.detail.startswith("victim row 2 beside neighbours scaled by 1e3 vs original neighbours: ")
    assert (
        result.first_difference
        == "victim row 2 beside neighbours scaled by 1e3 vs original neighbours: (row 2, col 0)"
    )
    assert result.rows_differing == 1 and result.worst_ulp


def test_each_transform_reaches_its_own_class():
    labels = [w.removeprefix("victim row 2 beside neighbours ").removesuffix(" vs original neighbours")
              for w in _run(_nan_poisons_the_batch).where]  # fmt: skip
    assert set(labels) == {"set to +inf", "set to -inf", "set to NaN"}  # inf + -inf: NaN too
    outlier = _run(_outlier_max)
    assert [w.split(" beside neighbours ")[1] for w in outlier.where] == [
        "set to max-normal vs original neighbours"
    ]
    for i, group in enumerate(CPU_TRANSFORM_GROUPS):  # the cpu lane's third case reaches it
        assert _run(_outlier_max, transforms=group).passed == (i != 2)
    assert sorted(t.label for g in CPU_TRANSFORM_GROUPS for t in g) == sorted(t.label for t in TRANSFORMS)


def test_a_one_row_batch_compares_nothing():
    result = _run(_batch_amax, _batch(m=1), victims=(0,))
    assert result.passed and result.comparisons == 0 and result.vacuous


def test_the_rewrite_keeps_the_layout_the_victim_and_the_integer_rows():
    wide = torch.full((6, 9), math.nan)
    wide[:, 2:7] = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    batch = Batch({"x": wide[:, 2:7], "ids": torch.arange(6)}, {"w": torch.ones(5)})
    for t in TRANSFORMS:
        out, changed = rewrite_rows(batch, [3], t)
        x = out.rows["x"]
        assert changed and x.stride() == (9, 1) and x.storage_offset() == 2, t.label
        assert torch.equal(to_bits(x[3]), to_bits(batch.rows["x"][3])), t.label
        assert out.rows["ids"] is batch.rows["ids"] and out.shared["w"] is batch.shared["w"]
        storage = torch.empty(0).set_(x.untyped_storage())
        assert bool(torch.isnan(storage.view(6, 9)[:, :2]).all()), t.label  # the padding kept
        assert not torch.equal(to_bits(x[[0, 1, 2, 4, 5]]), to_bits(batch.rows["x"][[0, 1, 2, 4, 5]])), (
            t.label
        )
    assert torch.isnan(rewrite_rows(batch, [3], TRANSFORMS[4])[0].rows["x"][0]).all()
    assert (
        copy_layout(batch.rows["x"]).untyped_storage().data_ptr()
        != batch.rows["x"].untyped_storage().data_ptr()
    )


def test_special_values_come_from_bit_patterns_and_fp8_keeps_what_it_cannot_express():
    bf = _batch(dtype=torch.bfloat16)
    sub, _ = rewrite_rows(bf, [0], TRANSFORMS[-1])
    assert int(to_bits(sub.rows["x"][1, 0])) == 0x007F  # bf16's largest subnormal
    fp8 = Batch({"x": torch.ones(3, 4).to(torch.float8_e4m3fn)})
    labels = {t.label: rewrite_rows(fp8, [0], t)[1] for t in TRANSFORMS}
    assert labels["set to +inf"] is False and labels["set to -inf"] is False  # no infinities in e4m3
    assert labels["set to NaN"] and labels["scaled by 1e3"]


def test_the_paged_rewrite_changes_only_the_other_requests_tokens():
    batch = _paged_batch()
    pool, table = batch.shared["pool"], batch.rows["block_table"]
    layout = requests.PagedLayout(("pool",))
    out, changed = layout.rewrite_others(batch, [1], TRANSFORMS[5])  # victim: request 1, page 2
    new = out.shared["pool"]
    assert changed and new.shape == pool.shape
    assert torch.equal(to_bits(new[2]), to_bits(pool[2]))  # the victim's page, its NaN tail too
    assert bool((new[[0, 3]] == 0).all()) and bool((new[1, :1] == 0).all()) and bool((new[4, :2] == 0).all())
    assert bool(torch.isnan(new[1, 1:]).all() and torch.isnan(new[4, 2:]).all() and torch.isnan(new[5]).all())
    assert out.rows["block_table"] is table


@pytest.mark.negative_control
@pytest.mark.parametrize(
    ("component", "baseline"),
    [
        ("fp8_quant", "per_tensor_dynamic"),
        ("rms_norm", "eps_by_batch_max"),
        ("fused_moe", "per_tensor_fp8_activations"),
    ],
)
def test_the_batch_wide_statistics_are_caught_on_the_cpu_lane(component, baseline):
    comp = get(component)
    result = run_check(comp, baseline, "neighbours", comp.cases(Lane.CPU)[0], Lane.CPU)
    assert result.status == "fail", (result.status, result.detail)
    unit = "request" if comp.requests is not None else "row"
    assert result.detail.startswith(f"victim {unit} ") and " vs original neighbours: " in result.detail
    assert result.first_difference and "--check neighbours" in result.repro


def test_the_cpu_lane_runs_the_first_cases_and_says_so_on_the_others():
    comp = get("mean")
    late = comp.cases(Lane.CPU)[NEIGHBOUR_CASES_CPU]
    result = run_check(comp, "fast", "neighbours", late, Lane.CPU)
    assert result.status == "skip" and "first 3 cases" in result.detail


def _paged_batch() -> Batch:
    """Three requests of 5, 3 and 6 tokens in pages of 4 (page 5: table padding, NaN)."""
    pool = requests.nan_filled_pages(6, 4)
    pool[:5] = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    pool[1, 1:], pool[2, 3:], pool[4, 2:] = math.nan, math.nan, math.nan
    table = torch.tensor([[0, 1], [2, 5], [3, 4]], dtype=torch.int32)
    return Batch(
        {"block_table": table, "seq_lens": torch.tensor([5, 3, 6], dtype=torch.int32)}, {"pool": pool}
    )


def _request_values(b: Batch) -> list[torch.Tensor]:
    pool, out = b.shared["pool"], []
    for r, length in enumerate(b.rows["seq_lens"].tolist()):
        pages = b.rows["block_table"][r, : requests.pages_needed([length], 4)[0]].long()
        out.append(pool[pages].reshape(-1)[:length])
    return out


def test_a_request_level_batch_statistic_over_the_pages_is_caught():
    layout = requests.PagedLayout(("pool",))

    def own_sums(b: Batch) -> tuple[torch.Tensor, ...]:
        return (torch.stack([v.sum() for v in _request_values(b)]),)

    def batch_max_scaled(b: Batch) -> tuple[torch.Tensor, ...]:  # one scale over every request's tokens
        vals = _request_values(b)
        top = torch.stack([torch.where(torch.isfinite(v), v.abs(), 0.0).amax() for v in vals]).amax()
        return (torch.stack([v.sum() for v in vals]) / top,)

    batch = _paged_batch()
    assert invariance.neighbours(own_sums, batch, [1], layout.rewrite_others, TRANSFORMS, "request").passed
    caught = invariance.neighbours(batch_max_scaled, batch, [1], layout.rewrite_others, TRANSFORMS, "request")
    assert not caught.passed
    assert caught.where[0] == "victim request 1 beside neighbours scaled by 1e3 vs original neighbours"


# --- content rows: contents rewritten, per-request parameters kept ------------------------------


def _sampler_batch() -> Batch:
    comp = get("sampler")
    return comp.build(comp.cases(Lane.CPU)[0], torch.device("cpu"))


def test_the_sampler_names_its_logits_as_contents_and_has_the_check():
    comp = get("sampler")
    assert comp.content_rows == ("logits",) and comp.checks is None
    assert "neighbours" in comp.applicable_checks()
    floating = {n for n, t in _sampler_batch().rows.items() if t.dtype.is_floating_point}
    assert floating == {"logits", "temperature", "top_p"}  # the two parameters the check must keep


def test_content_rows_rewrite_the_logits_and_keep_the_parameters():
    batch, victim = _sampler_batch(), 1
    others = [r for r in range(batch.num_rows) if r != victim]
    for t in TRANSFORMS:
        out, changed = rewrite_rows(batch, [victim], t, ("logits",))
        assert changed, t.label
        for name in ("temperature", "top_p", "top_k", "seeds", "step"):
            assert out.rows[name] is batch.rows[name], (t.label, name)
        new, old = out.rows["logits"], batch.rows["logits"]
        assert torch.equal(to_bits(new[victim]), to_bits(old[victim])), t.label
        assert not torch.equal(to_bits(new[others]), to_bits(old[others])), t.label
    # without content_rows every floating-point row is contents: top_p at 1e3 is out of range
    default, _ = rewrite_rows(batch, [victim], TRANSFORMS[0])
    assert bool((default.rows["top_p"][others] > 1).all())


def test_content_rows_naming_a_missing_or_integer_row_is_an_error():
    batch = _batch()
    with pytest.raises(ValueError, match=r"content_rows: 'y' is not a rows tensor.*\['ids', 'x'\]"):
        rewrite_rows(batch, [0], TRANSFORMS[0], ("y",))
    with pytest.raises(
        ValueError, match=r"content_rows: 'ids' must be a floating-point tensor.*got torch.int32"
    ):
        rewrite_rows(batch, [0], TRANSFORMS[0], ("ids",))
    for bad in ((), ["logits"], ("logits", 3)):
        with pytest.raises(ValueError, match="content_rows must be None or a non-empty tuple"):
            dataclasses.replace(get("sampler"), content_rows=bad)


@pytest.mark.parametrize("index", range(NEIGHBOUR_CASES_CPU))
def test_the_sampler_check_passes_on_the_shipped_kernel(index):
    comp = get("sampler")
    result = run_check(comp, FAST, "neighbours", comp.cases(Lane.CPU)[index], Lane.CPU)
    assert result.status == "pass", (result.status, result.detail)


def _shipped_sampler(b: Batch) -> tuple[torch.Tensor, ...]:
    return fast_sampler(**b.kwargs())


def _batch_max_shift(b: Batch) -> tuple[torch.Tensor, ...]:
    """The shipped sampler on logits shifted by the whole batch's max: a batch-wide stabiliser."""
    kw = b.kwargs()
    return fast_sampler(**{**kw, "logits": kw["logits"] - kw["logits"].amax()})


def test_a_sampler_whose_token_follows_the_batch_max_is_caught():
    batch = _sampler_batch()
    sampled = [v for v in range(batch.num_rows) if float(batch.rows["temperature"][v]) > 0]
    rewrite = functools.partial(rewrite_rows, content_rows=("logits",))
    shipped = invariance.neighbours(_shipped_sampler, batch, sampled, rewrite, TRANSFORMS, "request")
    assert shipped.passed and shipped.comparisons == len(sampled) * len(TRANSFORMS)
    caught = invariance.neighbours(_batch_max_shift, batch, sampled, rewrite, TRANSFORMS, "request")
    assert not caught.passed
    # the token itself moves, not only the log-prob: beside NaN neighbours the victim's row is NaN
    nan = next(t for t in TRANSFORMS if t.label == "set to NaN")
    moved = [
        v
        for v in sampled
        if int(_batch_max_shift(rewrite(batch, [v], nan)[0])[0][v]) != int(_batch_max_shift(batch)[0][v])
    ]
    assert moved, "no victim's token moved beside NaN neighbours"
