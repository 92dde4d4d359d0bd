"""A toy row-wise component for the harness tests: ``x * 2`` over a seeded [rows, cols] batch,
with the planted subjects the tests hand to the sweep (M-dependent, crashing)."""

from __future__ import annotations

import torch

from batchinv.harness.registry import Baseline, Batch, Case, Component, ErrorCase

ROWS = 40


def build(case: Case, device) -> Batch:
    g = torch.Generator().manual_seed(case.seed)
    return Batch({"x": torch.randn(case.axes["rows"], case.axes["cols"], generator=g).to(device)})


def scale(x):
    return x * 2.0


def m_dependent(x):
    """Different bits below 17 rows: a batch prefix of M <= 16 finds it."""
    return x * 2.0 + (0.0 if x.shape[0] >= 17 else 2.0**-10)


def crashes(x):
    raise RuntimeError("planted crash")


def toy(fast=scale, baselines: tuple[Baseline, ...] | list[Baseline] = ()) -> Component:
    """The toy: two cases of ROWS x 8, the reference ``x * 2``, ``fast`` and ``baselines`` as given."""
    return Component(
        name="toy",
        summary="doubles each row",
        reference=scale,
        fast=fast,
        baselines=tuple(baselines),
        cases=lambda lane: [Case("toy", {"rows": ROWS, "cols": 8}, seed=s) for s in (0, 1)],
        build=build,
        error_cases=lambda device: [ErrorCase("none", {}, TypeError, "x")],
    )
