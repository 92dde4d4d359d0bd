"""Tests of the fast kernels as torch operators (``torch.ops.batchinv.*``, ``fast/enable/ops.py``):
schema and fake implementations (``torch.library.opcheck``), the same bits in eager mode and
under ``torch.compile`` (Inductor keeps each operator as one opaque call), rows invariant along
M in the compiled graph, and runtime calls counted when they run, not when traced.

Expected values are the eager pinned functions' outputs (the registry checks those against
their references); here only the operator wrapping is under test.
"""

from __future__ import annotations

import pytest
import torch

from batchinv.fast.enable import ops
from batchinv.fast.topk import topk as fast_topk
from batchinv.harness.plugin import current_lane

DEVICE = torch.device("cuda" if current_lane().is_gpu else "cpu")
#: Inductor's own imports warn (torch.jit deprecations); the project runs with warnings as errors.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def any_lane(fn):
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def _operands(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(torch.bfloat16).to(DEVICE)

    return {"x": randn(rows, 64), "w": randn(32, 64), "b": randn(32), "g": randn(32)}


def _calls(t: dict[str, torch.Tensor]) -> list[tuple[object, tuple[object, ...]]]:
    bo = torch.ops.batchinv
    return [
        (bo.matmul, (t["x"], t["w"], t["b"], "linear", None)),
        (bo.matmul, (t["x"], t["w"].T.contiguous(), None, "mm", torch.float32)),
        (bo.rms_norm, (t["w"], t["g"].new_ones(64), 1e-6, -1)),
        (bo.fused_add_rms_norm, (t["x"], t["x"].flip(0), t["g"].new_ones(64), 1e-6, -1)),
        (bo.softmax, (t["x"], -1, False)),
        (bo.softmax, (t["x"], -1, True)),
        (bo.log_softmax, (t["x"], 1, False)),
        (bo.mean, (t["x"], -1, False, None)),
        (bo.mean, (t["x"], 1, True, torch.float32)),
    ]


@any_lane
def test_operators_pass_opcheck():
    for op, args in _calls(_operands(5)):
        result = torch.library.opcheck(
            op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
        )
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def _layer(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    bo = torch.ops.batchinv
    h = bo.matmul(x, w, b, "linear", None)
    n = bo.rms_norm(h, g, 1e-6, -1)
    return bo.softmax(n, -1, False), bo.log_softmax(n, -1, True), bo.mean(n, -1, True, torch.float32)


@any_lane
@torch.no_grad()
def test_compiled_graph_gives_the_eager_bits_and_keeps_rows_invariant():
    torch._dynamo.reset()
    compiled = torch.compile(_layer, fullgraph=True, dynamic=True)
    t = _operands(9, seed=1)
    eager = _layer(**t)
    before = ops.RUNTIME_CALLS.copy()
    full = compiled(**t)
    assert ops.RUNTIME_CALLS - before == {
        "matmul": 1,
        "rms_norm": 1,
        "softmax": 1,
        "log_softmax": 1,
        "mean": 1,
    }
    for e, c in zip(eager, full, strict=True):
        assert torch.equal(e, c)
    for rows in (1, 4):  # the first rows alone: the same bits (a recompile or a dynamic shape)
        part = compiled(**{**t, "x": t["x"][:rows]})
        for p, c in zip(part, full, strict=True):
            assert torch.equal(p, c[:rows]), rows


@any_lane
@torch.no_grad()
def test_inductor_does_not_lower_the_operators():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    t = _operands(3, seed=2)
    _, code = run_and_get_code(torch.compile(_layer, fullgraph=True), **t)
    text = "\n".join(code)
    for name in ("matmul", "rms_norm", "softmax", "log_softmax", "mean"):
        assert f"torch.ops.batchinv.{name}.default" in text, name


@pytest.mark.gpu
@torch.no_grad()
def test_modes_check_finds_torch_softmax_compiled_by_inductor_differs():
    # the modes check has teeth on a GPU: aten's softmax and Inductor's compiled softmax sum a
    # row in other orders (the negative control's other checks stop it before modes reaches it)
    from batchinv.harness.checks import run_check
    from batchinv.harness.registry import get

    comp = get("softmax")
    lane = current_lane()
    results = [run_check(comp, "torch_native", "modes", case, lane) for case in comp.cases(lane)]
    assert "fail" in [r.status for r in results], [(r.status, r.detail[:300]) for r in results[:3]]


def _topk_operands(rows: int, seed: int = 0, index_dtype: torch.dtype = torch.int64) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, 600, generator=gen)
    scores[:, ::3] = float("-inf")  # a -inf plateau: ties at the cutoff
    starts = torch.randint(0, 40, (rows,), generator=gen)
    ends = starts + torch.randint(0, 560, (rows,), generator=gen)
    return {
        "scores": scores.to(DEVICE),
        "row_starts": starts.to(index_dtype).to(DEVICE),
        "row_ends": ends.to(index_dtype).to(DEVICE),
    }


@any_lane
def test_topk_operator_passes_opcheck():
    t = _topk_operands(3)
    for k, index_dtype in ((512, torch.int64), (100, torch.int32)):  # the kernel; the reference path
        args = (*_topk_operands(3, index_dtype=index_dtype).values(), k)
        result = torch.library.opcheck(
            torch.ops.batchinv.topk,
            args,
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
        )
        assert set(result.values()) == {"SUCCESS"}, (k, result)
    assert torch.equal(torch.ops.batchinv.topk(*t.values(), 512), fast_topk(**t, k=512))


@any_lane
@torch.no_grad()
def test_topk_compiled_gives_the_eager_bits_and_counts_runtime_calls():
    torch._dynamo.reset()
    compiled = torch.compile(ops.topk_subject, fullgraph=True, dynamic=True)
    t = _topk_operands(5, seed=1)
    before = ops.RUNTIME_CALLS.copy()
    full = compiled(**t, k=512)
    assert ops.RUNTIME_CALLS - before == {"topk": 1}
    assert torch.equal(full, fast_topk(**t, k=512))
    for rows in (1, 4):
        part = compiled(**{name: v[:rows] for name, v in t.items()}, k=512)
        assert torch.equal(part, full[:rows]), rows
