"""Registry entry ``cuda_graph_buckets`` (seed write-up 001): the CUDA-graph bucket of a step.

A request-level plan: the unit is a request of one step (``rows``: ``kinds [R]``, 0 decode / 1
prefill, and ``num_tokens [R]``), the configuration is shared (``max_requests``,
``max_tokens``, ``max_seq_len``, ``num_speculative_tokens``, ``mix``), and a request's output
is how its step is launched: ``(graphed, token_class)`` (graphed or eager; the launch's token
count mod 64).  The contract: every step the configuration admits pads to a bucket whose token
count is a multiple of 64, so a request's launch class is ``(1, 0)`` in any co-batch.

The bucket table itself (validate-then-align, deduplicated, ascending) is a property of the
configuration, not of a request; tests/components/test_cuda_graph_buckets.py holds it to the reference row
for row and checks its properties with hypothesis (every admissible step maps to exactly one
bucket; the bucket depends only on the step's dims; no requested size is dropped).

Checks: exact agreement, co_batch (1 to 99 other requests, so a step reaches ``max_requests =
100``), slot, placement, repeat.  The baseline ``align_then_validate`` drops the decode-only
sizes whose token count is not already a multiple of 64; with ``max_requests = 100`` a decode
step of 65 to 100 requests then runs eager, and co_batch sees a request alone graphed and the
same request beside 99 others eager -- on every lane.

Every case has ``max_requests >= 100`` and room for its longest request beside 99 neighbours
of its mixes (:func:`neighbours`), so every co-batch the checks form is a step the
configuration admits (an inadmissible one would raise: an error, never a detection).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchinv.fast.baselines.cuda_graph_buckets import align_then_validate
from batchinv.fast.cuda_graph_buckets import cuda_graph_buckets as fast_buckets
from batchinv.harness.lanes import Lane
from batchinv.harness.plan_requests import plan_model
from batchinv.harness.registry import Baseline, Batch, Case, Component, ErrorCase, Exact
from batchinv.reference.cuda_graph_buckets import DECODE, PREFILL, check_config
from batchinv.reference.cuda_graph_buckets import cuda_graph_buckets as reference_buckets
from batchinv.reference.errors import ArgumentError, DTypeError

NAME = "cuda_graph_buckets"
#: Request kinds of a case's step: all decode, decode and prefill drawn at random (at least one
#: prefill), or all prefills of the longest length.
COMPOSITIONS: tuple[str, ...] = ("decode", "mixed", "prefill")
#: co_batch's numbers of other requests: up to 99, so that a step reaches max_requests = 100.
PLAN_CO_BATCH_SIZES: tuple[int, ...] = (1, 2, 7, 63, 99)
CONFIG_KEYS: tuple[str, ...] = ("max_requests", "max_tokens", "max_seq_len", "num_speculative_tokens", "mix")


def make_case(
    max_requests: int,
    max_tokens: int,
    max_seq_len: int,
    spec: int,
    mix: str,
    r: int,
    composition: str,
    longest: int,
    seed: int = 0,
) -> Case:
    """A case: a step of ``r`` requests of ``composition``, prefills of at most ``longest``."""
    axes = {
        "max_requests": max_requests,
        "max_tokens": max_tokens,
        "max_seq_len": max_seq_len,
        "num_speculative_tokens": spec,
        "mix": mix,
        "R": r,
        "composition": composition,
        "longest": longest,
    }
    return Case(NAME, axes, seed)


def cases(lane: Lane) -> Sequence[Case]:
    """The seed's max_requests = 100 (decode steps of 100, 70 and 5 requests), a 64-multiple
    max_requests, speculative decoding (2 and 4 tokens per decode request), mixed steps, a full
    prefill step of max_requests * max_seq_len tokens that is not a multiple of 64 (the mixed
    twin of the seed's regression) and a long-prompt configuration.  Cheap: no kernel."""
    c = make_case
    return [
        c(100, 512, 64, 0, "decode", 100, "decode", 1, seed=1),  # the seed's regression
        c(100, 512, 64, 0, "decode", 70, "decode", 1, seed=2),
        c(100, 512, 64, 0, "decode", 5, "decode", 1, seed=3),
        c(512, 1024, 128, 0, "decode", 33, "decode", 1, seed=4),
        c(100, 256, 64, 1, "decode", 48, "decode", 2, seed=5),
        c(100, 6400, 64, 0, "mixed", 40, "mixed", 64, seed=6),
        c(128, 8192, 4096, 0, "mixed", 2, "mixed", 4096, seed=7),
        c(100, 5000, 50, 0, "mixed", 100, "prefill", 50, seed=8),
        c(160, 2048, 512, 3, "mixed", 4, "mixed", 512, seed=9),
        c(100, 5000, 50, 0, "mixed", 1, "decode", 1, seed=10),
    ]


def config(axes: dict[str, Any] | Any) -> dict[str, Any]:
    """The configuration keywords of a case's axes."""
    return {k: axes[k] for k in CONFIG_KEYS}


def draw_step(
    composition: str, count: int, longest: int, decode_tokens: int, gen: torch.Generator
) -> tuple[list[int], list[int]]:
    """``(kinds, num_tokens)`` of ``count`` requests of ``composition``."""
    if composition == "decode":
        return [DECODE] * count, [decode_tokens] * count
    if composition == "prefill":
        return [PREFILL] * count, [longest] * count
    if composition != "mixed":
        raise ValueError(f"composition: expected one of {COMPOSITIONS}, got {composition!r}")
    kinds = [int(k) for k in torch.randint(2, (count,), generator=gen).tolist()]
    kinds[int(torch.randint(count, (1,), generator=gen))] = PREFILL
    lens = [int(n) for n in torch.randint(1, longest + 1, (count,), generator=gen).tolist()]
    tokens = [n if k == PREFILL else decode_tokens for k, n in zip(kinds, lens, strict=True)]
    tokens[kinds.index(PREFILL)] = longest
    return kinds, tokens


def build(case: Case, device: torch.device) -> Batch:
    """``rows``: ``kinds`` and ``num_tokens`` [R] int64 of the case's step; ``shared``: the
    configuration."""
    a = case.axes
    cfg = check_config(**config(a))
    gen = torch.Generator().manual_seed(case.seed)
    kinds, tokens = draw_step(str(a["composition"]), int(a["R"]), int(a["longest"]), cfg.decode_tokens, gen)
    rows = {
        "kinds": torch.tensor(kinds, dtype=torch.int64, device=device),
        "num_tokens": torch.tensor(tokens, dtype=torch.int64, device=device),
    }
    return Batch(rows, config(a))


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """The other requests of co_batch and slot: ``min(99, max_requests - 1)`` decode requests;
    with ``mix = "mixed"`` also as many decode and prefill requests, each prefill short enough
    that the case's longest request and 99 of them fit in ``max_tokens``."""
    a = case.axes
    count = min(max(PLAN_CO_BATCH_SIZES), int(a["max_requests"]) - 1)
    cfg = config(a)
    out = {
        "decode": make_case(**_case_args(cfg), r=count, composition="decode", longest=1, seed=case.seed + 11)
    }
    if a["mix"] == "mixed":
        room = (int(a["max_tokens"]) - int(a["longest"])) // max(PLAN_CO_BATCH_SIZES)
        short = max(1, min(int(a["max_seq_len"]), room))
        out["mixed"] = make_case(
            **_case_args(cfg), r=count, composition="mixed", longest=short, seed=case.seed + 13
        )
    return out


def _case_args(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_requests": cfg["max_requests"],
        "max_tokens": cfg["max_tokens"],
        "max_seq_len": cfg["max_seq_len"],
        "spec": cfg["num_speculative_tokens"],
        "mix": cfg["mix"],
    }


def error_cases(device: torch.device) -> Sequence[ErrorCase]:
    kinds = torch.tensor([0, 1, 0], dtype=torch.int64, device=device)
    tokens = torch.tensor([1, 7, 1], dtype=torch.int64, device=device)
    cfg = {"max_requests": 4, "max_tokens": 16, "max_seq_len": 8, "num_speculative_tokens": 0, "mix": "mixed"}
    ok = {"kinds": kinds, "num_tokens": tokens, **cfg}

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return [
        ErrorCase("kinds_float", {**ok, "kinds": kinds.float()}, DTypeError, r"'kinds'.*int.*float32"),
        ErrorCase("tokens_2d", {**ok, "num_tokens": tokens[None]}, ArgumentError, r"'num_tokens'.*1-D.*2-D"),
        ErrorCase(
            "lengths_differ", {**ok, "num_tokens": tokens[:2]}, ArgumentError, r"'num_tokens'.*\(3,\).*\(2,\)"
        ),
        ErrorCase(
            "kind_2",
            {**ok, "kinds": t([0, 2, 0])},
            ArgumentError,
            r"'kinds'.*0 \(decode\) or 1.*2 at request 1",
        ),
        ErrorCase(
            "prefill_on_decode_instance",
            {**ok, "mix": "decode"},
            ArgumentError,
            r"'kinds'.*decode requests only.*prefill at request 1",
        ),
        ErrorCase(
            "decode_tokens_not_spec_plus_one",
            {**ok, "num_tokens": t([2, 7, 1])},
            ArgumentError,
            r"'num_tokens'.*= 1 for a decode request.*2 at request 0",
        ),
        ErrorCase(
            "prefill_past_max_seq_len",
            {**ok, "num_tokens": t([1, 9, 1])},
            ArgumentError,
            r"'num_tokens'.*max_seq_len = 8.*9 at request 1",
        ),
        ErrorCase(
            "step_past_max_requests",
            {**ok, "kinds": t([0] * 5), "num_tokens": t([1] * 5)},
            ArgumentError,
            r"'kinds'.*max_requests = 4.*5",
        ),
        ErrorCase(
            "step_past_max_tokens",
            {**ok, "kinds": t([1, 1, 1]), "num_tokens": t([8, 8, 1])},
            ArgumentError,
            r"'num_tokens'.*max_tokens = 16.*17",
        ),
        ErrorCase(
            "max_tokens_below_a_full_decode_step",
            {**ok, "max_tokens": 3},
            ArgumentError,
            r"'max_tokens'.*>= max_requests \* \(num_speculative_tokens \+ 1\) = 4.*3",
        ),
        ErrorCase(
            "max_tokens_past_every_step",
            {**ok, "max_tokens": 33},
            ArgumentError,
            r"'max_tokens'.*<= max_requests \* max_seq_len = 32.*33",
        ),
        ErrorCase("mix_unknown", {**ok, "mix": "prefill"}, ArgumentError, r"'mix'.*one of.*'prefill'"),
        ErrorCase("max_requests_zero", {**ok, "max_requests": 0}, ArgumentError, r"'max_requests'.*>= 1.*0"),
        ErrorCase(
            "spec_bool",
            {**ok, "num_speculative_tokens": False},
            DTypeError,
            r"'num_speculative_tokens'.*int.*bool",
        ),
    ]


def config_strategy() -> Any:
    """A hypothesis strategy of configuration keywords: max_requests around multiples of 64
    (+-1, and the seed's 100), 0 to 3 speculative tokens, both mixes, max_tokens from a full
    decode step up to ``max_requests * max_seq_len`` (mixed) and around multiples of 64."""
    from hypothesis import strategies as st

    @st.composite
    def configs(draw: Any) -> dict[str, Any]:
        max_requests = draw(
            st.one_of(st.sampled_from((1, 2, 63, 64, 65, 100, 127, 128, 129, 512)), st.integers(1, 600))
        )
        spec = draw(st.integers(0, 3))
        mix = draw(st.sampled_from(("decode", "mixed")))
        max_seq_len = draw(st.one_of(st.sampled_from((1, 50, 63, 64, 65, 4096)), st.integers(1, 8192)))
        low = max_requests * (spec + 1)
        high = max_requests * max_seq_len if mix == "mixed" else 4 * low + 1000
        if high < low:  # a mixed configuration needs max_seq_len >= s + 1
            max_seq_len = spec + 1
            high = max_requests * max_seq_len
        near = [
            v
            for m in range(1, 3)
            for v in (64 * m * (low // 64 + 1) - 1, 64 * m * (low // 64 + 1))
            if low <= v <= high
        ]
        max_tokens = draw(st.one_of(st.sampled_from([low, high, *near]), st.integers(low, high)))
        return {
            "max_requests": max_requests,
            "max_tokens": max_tokens,
            "max_seq_len": max_seq_len,
            "num_speculative_tokens": spec,
            "mix": mix,
        }

    return configs()


def step_strategy(cfg: dict[str, Any]) -> Any:
    """A hypothesis strategy of an admissible step of ``cfg``: ``(kinds, num_tokens)`` lists
    (decode-only steps up to max_requests; with mix = "mixed", steps with prefills up to
    max_tokens)."""
    from hypothesis import strategies as st

    c = check_config(**cfg)

    @st.composite
    def steps(draw: Any) -> tuple[list[int], list[int]]:
        count = draw(
            st.one_of(
                st.sampled_from(sorted({1, c.max_requests, max(1, c.max_requests - 1)})),
                st.integers(1, c.max_requests),
            )
        )
        if c.mix == "decode" or draw(st.booleans()):
            return [DECODE] * count, [c.decode_tokens] * count
        kinds = draw(st.lists(st.sampled_from((DECODE, PREFILL)), min_size=count, max_size=count))
        kinds[0] = PREFILL
        budget = c.max_tokens - c.decode_tokens * kinds.count(DECODE)
        tokens = []
        for i, k in enumerate(kinds):
            if k == DECODE:
                tokens.append(c.decode_tokens)
                continue
            left = kinds[i + 1 :].count(PREFILL)  # each later prefill keeps at least one token
            top = max(1, min(c.max_seq_len, budget - left))
            n = draw(st.integers(1, top))
            budget -= n
            tokens.append(n)
        return kinds, tokens

    return steps()


COMPONENT = Component(
    name=NAME,
    summary="CUDA-graph buckets: validate-then-align, 64-multiple token counts; a step pads to the smallest holding bucket",
    reference=reference_buckets,
    fast=fast_buckets,
    baselines=(
        Baseline(
            name="align_then_validate",
            fn=align_then_validate,
            why=(
                "token counts aligned to 64 before validation: decode-only sizes not already a multiple "
                "of 64 are dropped, so with max_requests = 100 a decode step of 65 to 100 requests runs "
                "eager while a smaller one is graphed (on every lane)"
            ),
        ),
    ),
    cases=cases,
    build=build,
    agreement=Exact("integer plan: a table lookup, no arithmetic to round"),
    dtypes=(torch.int64,),
    error_cases=error_cases,
    requests=plan_model(neighbours=neighbours, co_batch_sizes=lambda lane: PLAN_CO_BATCH_SIZES),
)
