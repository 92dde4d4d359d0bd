"""Adversarial subjects the judge's guard missed (issue 25, a breaker's findings).

* a subject that rebinds a name in its component's reference module (``exact_row_sums`` in
  ``batchinv.reference.mean``) or a torch function the reference calls (``torch.tensor``) so
  that the reference computes the subject's wrong answer: an error naming the change, never a
  pass, and the name is back afterwards, so a later subject is judged by the real reference;
* a subject that raises a ``BaseException`` other than ``KeyboardInterrupt`` (``GeneratorExit``)
  is an ``error`` row, not a crash of ``check_subject`` without a row.

Cost on the cpu lane: ``mean``'s agreement check on its six cheap cases, five times, about 3 s.
"""

from __future__ import annotations

import pytest
import torch

import batchinv.reference.mean as reference_mean
from batchinv.harness import check_subject
from batchinv.reference.mean import mean as exact_mean

pytestmark = pytest.mark.cpu

COMPONENT = "mean"


def good(x, dim=-1, keepdim=False, dtype=None):
    """A correct mean: the exact mean rounded once to the output dtype."""
    return exact_mean(x, dim, keepdim, dtype).to(dtype or x.dtype)


def zeros(x, dim=-1, keepdim=False, dtype=None):
    """A wrong mean: zero for every row."""
    shape = (*x.shape[:-1], 1) if keepdim else x.shape[:-1]
    return torch.zeros(shape, dtype=dtype or x.dtype)


def rebinding_reference_module(x, dim=-1, keepdim=False, dtype=None):
    """Zeros, and the reference's exact sums made zeros too (a name in its own module)."""
    reference_mean.exact_row_sums = lambda finite: [0] * finite.shape[0]
    return zeros(x, dim, keepdim, dtype)


_TENSOR = torch.tensor


def _zero_tensor(data, *args, **kwargs):
    if isinstance(data, list) and kwargs.get("dtype") is torch.float64:
        return torch.zeros(len(data), dtype=torch.float64)
    return _TENSOR(data, *args, **kwargs)


def replacing_torch_tensor(x, dim=-1, keepdim=False, dtype=None):
    """Zeros, and ``torch.tensor`` (which the reference builds its means with) made to give zeros."""
    torch.tensor = _zero_tensor
    return zeros(x, dim, keepdim, dtype)


def raising_generator_exit(x, dim=-1, keepdim=False, dtype=None):
    raise GeneratorExit("a subject's own BaseException")


@pytest.fixture
def names_restored():
    exact_row_sums = reference_mean.exact_row_sums
    yield
    reference_mean.exact_row_sums = exact_row_sums
    torch.tensor = _TENSOR


@pytest.mark.parametrize(
    ("subject", "moved"),
    [
        (rebinding_reference_module, "batchinv.reference.mean.exact_row_sums rebound"),
        (replacing_torch_tensor, "torch.tensor rebound"),
    ],
)
def test_subject_rebinding_what_the_reference_calls_neither_passes_nor_poisons(
    names_restored, subject, moved
):
    report = check_subject(COMPONENT, subject, lane="cpu", checks=["agreement"])
    statuses = {r.status for r in report.results}
    assert "pass" not in statuses and not report.ok, report.summary()
    assert statuses == {"error"}, report.summary()
    assert all(moved in r.detail for r in report.results), report.summary()
    later = check_subject(COMPONENT, good, lane="cpu", checks=["agreement"])
    assert later.ok, later.summary()
    wrong = check_subject(COMPONENT, zeros, lane="cpu", checks=["agreement"])
    assert {r.status for r in wrong.results} == {"fail"}, wrong.summary()


def test_subject_raising_generator_exit_is_an_error_row():
    report = check_subject(COMPONENT, raising_generator_exit, lane="cpu", checks=["agreement"])
    assert report.results and {r.status for r in report.results} == {"error"}, report.summary()
    assert all("GeneratorExit" in r.detail for r in report.results), report.summary()


class _LateRebind:
    """Rebinds the reference's exact sums to zeros when it is dropped: after the subject's call
    has returned and the guard has checked, as a thread the subject left running would."""

    def __del__(self):
        reference_mean.exact_row_sums = lambda finite: [0] * finite.shape[0]


def rebinding_after_the_call(x, dim=-1, keepdim=False, dtype=None):
    out = zeros(x, dim, keepdim, dtype)
    out.late = _LateRebind()  # dropped with the output, after the comparison
    return out


def test_a_change_made_outside_the_subjects_calls_is_an_error_not_a_later_pass(names_restored):
    report = check_subject(COMPONENT, rebinding_after_the_call, lane="cpu", checks=["agreement"])
    statuses = {r.status for r in report.results}
    assert "pass" not in statuses and not report.ok, report.summary()
    assert any("outside the subject's calls" in r.detail for r in report.results), report.summary()
    later = check_subject(COMPONENT, good, lane="cpu", checks=["agreement"])
    assert later.ok, later.summary()
