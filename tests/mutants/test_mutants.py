"""The harness has teeth: every planted mutant (``tests/mutants``) fails the cpu-lane sweep.

Each mutant replaces its component's fast function (``dataclasses.replace``) and runs the
checks it is expected to fail (the others would only add minutes) on the component's own cpu
case list, case by case, as the sweep runs a case (:func:`batchinv.harness.checks.run_check`
on the component restricted to those checks).  Those checks must fail -- failures, never crashes
(a crash is an error row, not a detection) -- on every case its ``every_case`` names and on as
many cases and neighbour mixes as ``independent`` asks.  The cases ``every_case`` names run
first, then those ``try_first`` names, then the others in the case list's order, and the run stops at the first case after
which all of that holds (the cases after it could only add catches -- or a crash, which the
sweep reports as an error row; a timeout is never a catch here): every requirement is met by
failures alone, so the order cannot change the verdict, only how many cases run before it
(the cases that must fail are run whatever the order).  The shipped kernels pass
the same checks on every case (``tests/components/test_components.py::test_fast``: every
applicable check on every cpu case), so each mutant is caught for the planted reason.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from decode_plan_guards import GUARDS, GuardFailed

from batchinv.harness.checks import FAST, TIMEOUT, CheckResult, run_check
from batchinv.harness.compare import compare_exact, compare_tolerance
from batchinv.harness.components import matmul as matmul_component
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import Batch, Case, Component, get
from batchinv.reference import matmul as ref_matmul
from batchinv.reference.exact import round_once
from batchinv.reference.matmul import weight_kn
from mutants import LIFECYCLE_MUTANTS, MUTANTS, Mutant
from mutants.emulated import round_to_tf32


@dataclass(frozen=True)
class _OnlyChecks(Component):
    """A component whose sweep runs only ``only`` of its applicable checks."""

    only: tuple[str, ...] = ()

    def applicable_checks(self) -> tuple[str, ...]:
        return tuple(c for c in super().applicable_checks() if c in self.only)


def _restricted(
    component: Component, subject: object, checks: Sequence[str], replaces: str = "fast"
) -> _OnlyChecks:
    """``component`` with ``subject`` as its ``replaces`` field, running only ``checks``."""
    fields = {f.name: getattr(component, f.name) for f in dataclasses.fields(component)}
    restricted = _OnlyChecks(**{**fields, replaces: subject}, only=tuple(checks))
    assert set(checks) <= set(restricted.applicable_checks()), checks
    return restricted


def _summary(failures: Sequence[CheckResult]) -> str:
    return "\n".join(f"  {f.check} {f.status} [{f.case}]: {f.detail[:300]}" for f in failures[:8])


def _independent(mutant: Mutant, failures: Sequence[CheckResult]) -> tuple[set[str], set[str]]:
    """The cases and the neighbour mixes besides ``one_huge`` of the failing ``caught_by`` rows."""
    rows = [f for f in failures if f.check in mutant.caught_by]
    return {f.case for f in rows}, {_mix(label) for f in rows for label in f.where} - {"one_huge"}


def _caught(mutant: Mutant, failures: Sequence[CheckResult], wanted_left: int) -> bool:
    """Whether every requirement on the mutant holds already: each ``caught_by`` check failed,
    no case of ``every_case`` is still to run, and ``independent`` is met."""
    if not set(mutant.caught_by) <= {f.check for f in failures} or wanted_left:
        return False
    cases, mixes = _independent(mutant, failures)
    return len(cases) >= mutant.independent and len(mixes) >= mutant.independent


@pytest.mark.cpu
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_cpu_sweep_catches_the_mutant(mutant: Mutant) -> None:
    component = get(mutant.component)
    restricted = _restricted(component, mutant.build(), mutant.caught_by, mutant.replaces)
    listed = component.cases(Lane.CPU)
    wanted = [c for c in listed if mutant.every_case(c)] if mutant.every_case is not None else []
    assert mutant.every_case is None or wanted, f"{mutant.name}: no cpu case of the kind it must fail on"
    # the cases that must fail first: they run in any order, and the others only until the
    # requirements hold (a decode mutant's three order-exact cases are the last of eleven);
    # then the cases known to catch it cheaply (try_first), then the rest in the list's order
    first = [c for c in listed if c not in wanted and mutant.try_first is not None and mutant.try_first(c)]
    cases = [*wanted, *first, *(c for c in listed if c not in wanted and c not in first)]
    failures: list[CheckResult] = []
    for i, case in enumerate(cases):
        for check in mutant.caught_by:  # stateless subjects: the order of the checks is free
            r = run_check(restricted, FAST, check, case, Lane.CPU)
            assert r.status not in ("error", TIMEOUT), (
                f"{mutant.name} crashed (not a detection):\n{_summary([*failures, r])}"
            )
            if r.status == "fail":
                failures.append(r)
        if _caught(mutant, failures, sum(c in wanted for c in cases[i + 1 :])):
            break
    assert failures, f"{mutant.name} ({mutant.regression}) passed the cpu sweep"
    failing = {f.check for f in failures}
    assert set(mutant.caught_by) <= failing, f"expected {mutant.caught_by} to fail:\n{_summary(failures)}"
    caught = {(f.case, f.check) for f in failures}
    missed = [(c.id, ch) for c in wanted for ch in mutant.caught_by if (c.id, ch) not in caught]
    assert not missed, f"{mutant.name} passed on cases it must fail: {missed}"
    if mutant.independent:
        found, mixes = _independent(mutant, failures)
        assert len(found) >= mutant.independent and len(mixes) >= mutant.independent, (
            f"{mutant.name} caught by {len(found)} case(s) and {sorted(mixes)} besides one_huge "
            f"(at least {mutant.independent} of each wanted):\n{_summary(failures)}"
        )


def _mix(label: str) -> str:
    """The neighbour mix a request check's comparison names (``request 3 with 7 others
    (one_huge)``: ``one_huge``); ``own batch`` for one inside the case's own batch."""
    found = re.search(r"\(([^()]*)\)$", label)
    return found.group(1) if found else "own batch"


def test_mutants_are_named_once_and_mutate_registered_components() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    for m in MUTANTS:
        component = get(m.component)
        assert set(m.caught_by) <= set(component.applicable_checks()), m.name
        assert m.name.startswith(m.component), m.name


# --- the GPU cases' bounds, reasoned on the CPU ------------------------------------------------
#
# The GPU lanes cannot run here, but their matmul bound is a function of the inputs: the GPU
# cases are built on the CPU (their first rows), the kernel's arithmetic in the GPU's order is
# emulated in torch (fp32 inputs: one FMA per product; bf16/fp16: one fp32 step per 16-product
# MMA group), and each precision mutant (emulated the same way) must fall outside the judged
# bound -- or, on the exact cases, differ bitwise -- while the emulated shipped kernel stays in.

GPU_ROWS, GPU_COLS = 16, 64  # the block of outputs judged (each element's bound is its own)


def _gpu_block(case: Case) -> Batch:
    """GPU_ROWS x GPU_COLS outputs of a GPU case, built on the CPU: the case's weight and bias
    (seeded from the axes but ``rows``), GPU_ROWS rows of x drawn as the case draws them."""
    small = Case(case.component, {**case.axes, "rows": GPU_ROWS}, case.seed)
    batch = matmul_component.build(small, torch.device("cpu"))
    s = dict(batch.shared)
    s["weight"] = s["weight"][:GPU_COLS] if s["layout"] == "linear" else s["weight"][:, :GPU_COLS]
    s["bias"] = None if s["bias"] is None else s["bias"][:GPU_COLS]
    return Batch(batch.rows, s)


def _gpu_order(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    *,
    operand: str = "exact",
    accumulate: torch.dtype = torch.float32,
    drop_last: bool = False,
) -> torch.Tensor:
    """fp32 accumulation in the GPU kernel's order ([M, K] @ [K, N]); variants for mutants."""
    x64, w64 = x.double(), w.double()
    if operand == "tf32":
        x64, w64 = round_to_tf32(x.float()).double(), round_to_tf32(w.float()).double()
    k = x.shape[1] - (1 if drop_last else 0)
    acc = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float32)
    if x.dtype == torch.float32 and accumulate == torch.float32:  # one FMA per product
        products = x64[:, :k, None] * w64[None, :k]  # exact in fp64 (24 x 24 bits), [M, K, N]
        for i in range(k):
            acc = (acc.double() + products[:, i]).float()  # the exact product added, one rounding
    else:  # one 16-product MMA step at a time, its sum formed exactly, added with one rounding
        steps = -(-k // 16)
        xp = torch.zeros(x.shape[0], steps * 16, dtype=torch.float64)
        xp[:, :k] = x64[:, :k]
        wp = torch.zeros(steps * 16, w.shape[1], dtype=torch.float64)
        wp[:k] = w64[:k]
        groups = torch.bmm(xp.view(-1, steps, 16).transpose(0, 1), wp.view(steps, 16, -1))  # [ng, M, N]
        for group in groups.float():
            acc = (acc + group).to(accumulate).float()
    if bias is not None:
        acc = acc + bias.float()[None, :]
    return acc.to(out_dtype)


def _judged(batch: Batch, out: torch.Tensor) -> bool:
    """Whether ``out`` passes matmul agreement on ``batch`` as a GPU lane would judge it."""
    s = batch.shared
    x = batch.rows["x"]
    ref = ref_matmul.matmul(x, s["weight"], s["bias"], layout=s["layout"], out_dtype=s["out_dtype"])
    kw = {"layout": s["layout"], "out_dtype": s["out_dtype"], "reference": ref}
    hard = ref_matmul.tolerance_bound(x, s["weight"], s["bias"], **kw)
    tight = ref_matmul.tight_bound(x, s["weight"], s["bias"], **kw, group=16)
    mask = matmul_component.exact(batch, (ref,))[0]
    judged = torch.where(mask, torch.full_like(hard, math.inf), torch.minimum(hard, tight))
    within = compare_tolerance(ref, out, judged).within
    return within and compare_exact(round_once(ref, out.dtype), out, mask).equal


@pytest.mark.cpu
@pytest.mark.parametrize("case", matmul_component.cases(Lane.SM90), ids=lambda c: c.id)
def test_gpu_matmul_cases_judge_the_precision_mutants(case: Case) -> None:
    batch = _gpu_block(case)
    s = batch.shared
    x, w, bias, out_dtype = batch.rows["x"], weight_kn(s["weight"], s["layout"]), s["bias"], s["out_dtype"]
    assert _judged(batch, _gpu_order(x, w, bias, out_dtype)), "the emulated shipped kernel fails"
    variants = {
        "dropped_last_product": _gpu_order(x, w, bias, out_dtype, drop_last=True),
        "low_precision_accumulation": _gpu_order(
            x, w, bias, out_dtype, accumulate=torch.float16 if x.dtype == torch.float16 else torch.bfloat16
        ),
    }
    if x.dtype == torch.float32:
        variants["tf32_operands"] = _gpu_order(x, w, bias, out_dtype, operand="tf32")
    if out_dtype == torch.float32:
        variants["bf16_logits"] = _gpu_order(x, w, bias, out_dtype).to(torch.bfloat16).float()
    passed = [name for name, out in variants.items() if _judged(batch, out)]
    assert not passed, f"{case.id}: {passed} pass a GPU case of their dtype"


# --- the plan lifecycle's mutants: judged by its guards, not by the sweep -----------------------
#
# A lifecycle is a sequence of calls over time (cold start, record, build, install, the kernel's
# read), which no single launch of the sweep shows: each lifecycle mutant names the guards of
# tests/support/decode_plan_guards.py that must fail on it -- with GuardFailed, the property broken, never
# another exception -- while the shipped lifecycle passes every guard (tests/components/test_decode_partition_plan.py
# runs each as the test of its name).


@pytest.mark.cpu
@pytest.mark.parametrize("mutant", LIFECYCLE_MUTANTS, ids=[m.name for m in LIFECYCLE_MUTANTS])
def test_the_lifecycle_guards_catch_the_mutant(mutant: Mutant) -> None:
    subject = mutant.build()
    for name in mutant.caught_by:
        with pytest.raises(GuardFailed):
            GUARDS[name](subject)


def test_lifecycle_mutants_name_guards_and_every_guard_catches_one() -> None:
    names = [m.name for m in (*MUTANTS, *LIFECYCLE_MUTANTS)]
    assert len(names) == len(set(names))
    for m in LIFECYCLE_MUTANTS:
        get(m.component)
        assert m.replaces == "lifecycle" and m.name.startswith(m.component), m.name
        assert m.caught_by and set(m.caught_by) <= set(GUARDS), m.name
    assert {g for m in LIFECYCLE_MUTANTS for g in m.caught_by} == set(GUARDS)
    assert all(m.replaces != "lifecycle" for m in MUTANTS)
