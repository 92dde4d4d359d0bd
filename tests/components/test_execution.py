"""Tests of the shared execution vocabulary (``batchinv.fast.execution``) and of the three
tables that use it (matmul / FP8 GEMM, softmax / log_softmax, topk).

The property ``config_equivalence`` rests on: every execution a launcher can pick, at any
number of rows, is among those the table enumerates (and so among those the check runs); and
the shape lookup that gives a table takes no row count.  No kernel runs here.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from batchinv.fast import matmul_config
from batchinv.fast import softmax as fast_softmax
from batchinv.fast import topk as fast_topk
from batchinv.fast.execution import (
    ANY_M,
    MBucket,
    UpTo,
    check_positive_int,
    check_power_of_two,
    every_execution,
    select_by_m,
)
from batchinv.reference.errors import ArgumentError

ARCHES = ("interp", "sm90", "sm100", "sm80")
ROW_PARAMS = {"m", "num_rows", "rows", "max_m"}


def _ms(table: tuple[MBucket[object], ...]) -> list[int]:
    """Every bucket edge of ``table`` and one past it, plus 1 and a large M."""
    edges = {r.max_m for r in table if r.max_m is not None}
    return sorted({1, 1 << 20, *edges, *(e + 1 for e in edges)})


def test_select_by_m_takes_the_first_bucket_holding_m():
    table = (UpTo(4, "a"), UpTo(16, "b"), UpTo(8, "shadowed"))
    assert [select_by_m(table, m, "z") for m in (1, 4, 5, 16, 17)] == ["a", "a", "b", "b", "z"]
    assert select_by_m((*table, UpTo(ANY_M, "c")), 10**9, "z") == "c"
    assert select_by_m((), 3, "z") == "z"


def test_every_execution_names_the_fallback_only_where_it_is_reachable():
    table = (UpTo(4, "a"), UpTo(16, "b"), UpTo(8, "a"))
    assert every_execution(table, "z") == ("a", "b", "z")
    assert every_execution((*table, UpTo(ANY_M, "c")), "z") == ("a", "b", "c")
    assert every_execution((), "z") == ("z",)


def test_field_checks_raise_argument_errors_naming_the_field():
    check_power_of_two("block_n", 64, 16)
    check_positive_int("stages", 3)
    for bad in (0, 3, 8, True, 16.0):
        with pytest.raises(ArgumentError, match="'block_n'"):
            check_power_of_two("block_n", bad, 16)
    for bad in (0, -1, False, 1.0):
        with pytest.raises(ArgumentError, match="'stages'"):
            check_positive_int("stages", bad)


def test_rules_are_frozen_m_buckets():
    rules = (
        *matmul_config.EXECUTION_TABLE,
        *(r for rules in fast_softmax.EXECUTION_TABLE.values() for r in rules),
        *fast_topk.ROW_BUCKET_TABLE,
    )
    assert isinstance(matmul_config.EXECUTION_TABLE, tuple)
    for rule in rules:
        assert isinstance(rule, MBucket), rule
        with pytest.raises(dataclasses.FrozenInstanceError):
            rule.max_m = 1  # type: ignore[misc]
        assert rule.max_m is None or (isinstance(rule.max_m, int) and rule.max_m >= 1), rule


@pytest.mark.parametrize(
    "lookup",
    [matmul_config.execution_table, fast_softmax.execution_table, fast_topk.execution_table],
    ids=["matmul", "softmax", "topk"],
)
def test_the_shape_lookup_takes_no_rows(lookup):
    assert not ROW_PARAMS & set(inspect.signature(lookup).parameters)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_matmul_picks_only_executions_config_equivalence_runs(dtype):
    for arch in ARCHES:
        for n in (16, 256, 512, 513, 2688, 4096, 8192, 8193, 14336, 151936):
            table = matmul_config.execution_table(arch, dtype, n)
            runs = set(matmul_config.executions(arch, dtype, n))
            for m in _ms(table):
                assert matmul_config.select_execution(arch, dtype, n, m) in runs, (arch, dtype, n, m)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_picks_only_executions_config_equivalence_runs(op):
    for arch in ARCHES:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for n_cols in (1, 128, 1024, 1025, 31999, 32000, 129280):
                table = fast_softmax.execution_table(arch, dtype, n_cols, op)
                runs = set(fast_softmax.equivalence_executions(arch, dtype, n_cols, op))
                assert set(fast_softmax.table_executions(arch, dtype, n_cols, op)) <= runs
                for m in _ms(table):
                    picked = fast_softmax.softmax_execution(arch, dtype, n_cols, m, op)
                    assert picked in runs, (arch, dtype, n_cols, m, op)


def test_topk_selects_through_its_row_buckets():
    """select_config (which reads CONFIGS / ROW_CONFIGS through row_bucket) and the table of
    execution_table agree at every bucket edge, and every config picked is one of EXECUTIONS
    at the bucket's small-launch config."""
    for arch in (*ARCHES, "generic"):
        for k in fast_topk.ENVELOPE_K:
            for num_cols in (1, 512, 513, 2049, 8192):
                table = fast_topk.execution_table(arch, k, num_cols)
                base = fast_topk.select_config(arch, k, num_cols)
                variants = {e.config(base) for e in fast_topk.EXECUTIONS.values()}
                for m in _ms(table):
                    picked = fast_topk.select_config(arch, k, num_cols, m)
                    assert picked == select_by_m(table, m, base) and picked in variants
