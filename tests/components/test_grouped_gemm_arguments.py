"""The grouped GEMM's config helpers refuse bad arguments with typed errors naming them
(``block_m``, ``layer_block_m``, ``select_config``, ``grouped_gemm(config=)``,
``GroupedGemmConfig``), and ``config_equivalence`` catches a planted BLOCK_K that follows
block_m on the cpu lane.  From an adversarial review of the issue-9 commits (branch
``review-moe2``, where each of these was a strict xfail)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from batchinv.fast import grouped_gemm as fast_gemm
from batchinv.harness.checks import FAST, run_check
from batchinv.harness.components import grouped_gemm as component
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import get
from batchinv.reference.errors import ArgumentError

pytestmark = pytest.mark.cpu

CPU = torch.device("cpu")


def test_block_m_nan_num_rows_is_a_typed_error():
    # mean = nan: no `mean <= limit` holds, next() raises a bare StopIteration (a RuntimeError
    # inside a generator) instead of ArgumentError naming 'num_rows'
    with pytest.raises(ArgumentError, match="'num_rows'"):
        fast_gemm.block_m(CPU, num_rows=float("nan"), num_experts=4)


@pytest.mark.parametrize(
    "num_rows",
    [True, 3.5, torch.tensor(5)],
    ids=["bool", "float", "tensor"],
)
def test_block_m_num_rows_must_be_a_host_int(num_rows):
    # the docstring: "a host integer: CUDA-graph safe"; a (CUDA) tensor is compared on the host
    # (a sync, a capture failure), a bool or a fraction is a caller's bug
    with pytest.raises(ArgumentError, match="'num_rows'"):
        fast_gemm.block_m(CPU, num_rows=num_rows, num_experts=4)


@pytest.mark.parametrize("num_experts", [True, 2.5, math.inf], ids=["bool", "float", "inf"])
def test_block_m_num_experts_must_be_a_positive_int(num_experts):
    with pytest.raises(ArgumentError, match="'num_experts'"):
        fast_gemm.block_m(CPU, num_rows=8, num_experts=num_experts)


def test_block_m_num_experts_without_num_rows_is_refused():
    # the pair is documented as going together (num_rows without num_experts is refused)
    with pytest.raises(ArgumentError, match="'num_rows'"):
        fast_gemm.block_m(CPU, num_experts=4)


def test_block_m_dtype_error_names_dtype():
    # today: "argument 'device': expected an architecture of the grouped GEMM table (...), got
    # 'interp'" -- the device is fine, the dtype is not, and the given value is not the dtype
    with pytest.raises(ArgumentError, match=r"'dtype'.*float16"):
        fast_gemm.block_m(CPU, torch.float16)


@pytest.mark.parametrize(("num_tokens", "top_k"), [(-3, -2), (-1, 0)], ids=["negatives", "zero_k"])
def test_layer_block_m_refuses_negative_tokens_or_top_k(num_tokens, top_k):
    # (-3) * (-2) = 6 rows: a positive num_rows, so block_m's own check never sees the sign
    with pytest.raises(ArgumentError, match=r"'num_tokens'|'top_k'"):
        fast_gemm.layer_block_m(CPU, num_tokens, top_k, 4)


def _batch():
    return component.build(component._case(4, 2, 32, 64, 3, 4, False, seed=5), CPU)


def test_grouped_gemm_config_of_another_type_is_a_typed_error():
    with pytest.raises(ArgumentError, match="'config'"):
        fast_gemm.grouped_gemm(**_batch().kwargs(), config={"block_m": 16})


@pytest.mark.parametrize("field", ["num_warps", "num_stages"])
def test_grouped_gemm_config_nonpositive_pipeline_is_refused(field):
    # GroupedGemmConfig.__post_init__ checks the tile sizes only; the interpreter ignores warps
    # and stages, so the cpu lane accepts a config a GPU compile would reject
    kw = _batch().kwargs()
    cfg = fast_gemm.select_config("interp", torch.bfloat16, 16, 32, 64)
    with pytest.raises((ArgumentError, ValueError), match=field):
        fast_gemm.grouped_gemm(**kw, config=replace(cfg, **{field: 0}))


def test_select_config_float_block_m_is_a_typed_error():
    # 16.0 in {16: ...} is True, then GroupedGemmConfig's `value & (value - 1)` raises TypeError
    with pytest.raises(ArgumentError, match="block_m"):
        fast_gemm.select_config("interp", torch.bfloat16, 16.0, 32, 64)


def test_config_equivalence_catches_a_block_k_that_follows_block_m(monkeypatch):
    """Planted by hand (review item 3): select_config gives BLOCK_K 32 at block_m 32 on the
    interpreter.  config_equivalence compares every block_m of the tile table, each realigned,
    so the cancel cases must fail naming the 32 config."""
    shipped = fast_gemm.select_config

    def planted(arch_key, dtype, block_m, n, k):
        cfg = shipped(arch_key, dtype, block_m, n, k)
        return replace(cfg, block_k=32) if (arch_key, block_m) == ("interp", 32) else cfg

    comp = get("grouped_gemm")
    case = comp.cases(Lane.CPU)[0]  # values="cancel": the summation order shows after bf16
    assert case.axes["values"] == "cancel"
    assert run_check(comp, FAST, "config_equivalence", case, Lane.CPU).status == "pass"
    monkeypatch.setattr(fast_gemm, "select_config", planted)
    result = run_check(comp, FAST, "config_equivalence", case, Lane.CPU)
    assert result.status == "fail"
    assert result.where == ["config 32x32x32 w4 s3"], result.where
