"""Tests of the batch-invariant matmul (``matmul``): the config table never keyed on M, IEEE fp32
by default, NaN-prefilled outputs, both layouts, bias before the final rounding, fp32 output
from bf16 without a bf16 round trip, 64-bit offsets, bad input, hypothesis properties.

Expected values are the fp64 reference with the derived bound, or small cases worked out by
hand in the comments; never the code under test.  The registry-driven checks (agreement,
invariance sweeps, negative controls) live in ``tests/components/test_components.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import tempfile

import pytest
import torch
from hypothesis import given, settings

from batchinv.fast import matmul_config
from batchinv.fast.baselines.matmul import split_k_count
from batchinv.fast.device import interpreting
from batchinv.fast.matmul import linear, matmul, mm, plan
from batchinv.harness.components import matmul as component_module
from batchinv.harness.lanes import Lane
from batchinv.harness.plugin import current_lane
from batchinv.harness.registry import m_sweep
from batchinv.reference.errors import ArgumentError, DeviceError
from batchinv.reference.matmul import matmul as reference
from batchinv.reference.matmul import tight_bound, tolerance_bound

LANE = current_lane()
DEVICE = torch.device("cuda" if LANE.is_gpu else "cpu")
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def any_lane(fn):
    """Runs on the cpu lane (interpreter) and on GPU lanes."""
    return pytest.mark.cpu(pytest.mark.gpu(fn))


def randn(*shape: int, seed: int, dtype: torch.dtype = F32, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(DEVICE)


def assert_within_bound(out, x, w, bias=None, *, layout="linear", out_dtype=None):
    ref = reference(x, w, bias, layout=layout, out_dtype=out_dtype)
    bound = tolerance_bound(x, w, bias, layout=layout, out_dtype=out_dtype, reference=ref)
    err = (out.double() - ref).abs()
    assert bool(torch.isfinite(out).all()), "non-finite output for finite inputs"
    worst = float((err / bound).max())
    assert worst <= 1.0, f"error {float(err.max()):.3g} exceeds the bound by {worst:.3g}x"
    return worst


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


# --- the config table -------------------------------------------------------------------------


def test_reduction_tree_is_never_keyed_on_m():
    """reduction_tree takes (arch, dtype, n, k) and an FP8 problem's scale layout, nothing else;
    no tree rule has an M field;
    and the launch plan's tree is the same at every M of every lane's sweep, while the
    execution moves with M (split-K at decode, a walk above) on the GPU tables."""
    params = list(inspect.signature(matmul_config.reduction_tree).parameters)
    assert params == ["arch", "dtype", "n", "k", "scale_layout"]
    for cls in (matmul_config.TreeRule, matmul_config.ReductionTree):
        names = {f.name.lower() for f in dataclasses.fields(cls)}
        assert not any(name in ("m", "max_m", "min_m") for name in names), names
    ms = sorted(set(m_sweep(Lane.SM90)) | {3, 100, 1000, 4097, 65536})
    for n, k in [(256, 4096), (4096, 4096), (257, 1000), (14336, 4096), (64, 64)]:
        for dtype in (BF16, F16, F32):
            trees = {plan(m, n, k, dtype, torch.device("cpu")).config.tree for m in ms}
            assert len(trees) == 1, f"(N={n}, K={k}, {dtype}): trees differ across M: {trees}"
            for arch_key in ("sm90", "sm100"):
                execs = {matmul_config.select_config(arch_key, dtype, n, k, m).execution for m in ms}
                assert matmul_config.select_config(arch_key, dtype, n, k, 1).execution.split_k
                assert len(execs) > 1 and execs <= set(matmul_config.executions(arch_key, dtype, n))


def test_tree_table_rows_as_documented():
    """The sm90 trees tuning run 29 chose: 4 chunks of 1024 by default (the router too), 3 of 1536
    for 14336x4096, 4 of 3584 for 4096x14336, 16 of 256 for IEEE fp32; a K shorter than a chunk
    is one chunk; other architectures one chunk."""
    cases = {
        (BF16, 4096, 4096): (64, 1024, 4),
        (F16, 2688, 4096): (64, 1024, 4),
        (BF16, 14336, 4096): (64, 1536, 3),
        (BF16, 4096, 14336): (64, 3584, 4),
        (BF16, 256, 7168): (64, 1024, 7),
        (F32, 256, 4096): (32, 256, 16),
        (BF16, 4096, 100): (64, 1024, 1),
    }
    for (dtype, n, k), (block_k, chunk_k, chunks) in cases.items():
        tree = matmul_config.reduction_tree("sm90", dtype, n, k)
        assert (tree.block_k, tree.chunk_k, tree.num_chunks(k)) == (block_k, chunk_k, chunks), (dtype, n, k)
    assert matmul_config.reduction_tree("sm80", BF16, 4096, 4096).num_chunks(4096) == 1
    for rule in matmul_config.TREE_TABLE:
        assert rule.tree.chunk_k % rule.tree.block_k == 0


@pytest.mark.parametrize(
    "bad",
    [
        lambda: matmul_config.ReductionTree(48, 96),
        lambda: matmul_config.ReductionTree(32, 48),
        lambda: matmul_config.ReductionTree(32, 0),
        lambda: matmul_config.Execution(24, 64),
        lambda: matmul_config.Execution(16, 64, num_warps=0),
        lambda: matmul_config.Execution(16, 64, split_k=1),
        lambda: matmul_config.Execution(16, 64, programs_per_sm=0),
        lambda: matmul_config.Execution(16, 64, split_k=True, programs_per_sm=2),
        lambda: matmul_config.MatmulConfig(None, matmul_config.Execution(16, 64)),  # type: ignore[arg-type]
        lambda: matmul_config.MatmulConfig(matmul_config.ReductionTree(32, 64), "16x64"),  # type: ignore[arg-type]
    ],
)
def test_config_fields_are_checked(bad):
    with pytest.raises(ArgumentError):
        bad()


def test_config_argument_is_checked():
    with pytest.raises(ArgumentError, match="'config'"):
        plan(2, 16, 32, F32, torch.device("cpu"), config=(16, 16, 16))


def test_table_has_a_small_n_router_entry_per_gpu_arch():
    for arch_key in ("sm90",):
        router = matmul_config.select_config(arch_key, F32, 256, 4096, 4096).execution
        dense = matmul_config.select_config(arch_key, F32, 4096, 4096, 4096).execution
        assert router != dense
        # the router splits K at every M (run 54: 128x128 split tiles above M = 256); dense N walks
        assert router.split_k and not dense.split_k


def test_split_k_baseline_split_depends_on_m():
    """The negative control is unpinned for the right reason: its split count is a function of M."""
    assert {split_k_count(m, 4096, 64) for m in (1, 32, 128)} == {4, 2, 1}


# --- precision ------------------------------------------------------------------------------------


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (fp32) rounded to TF32's 10 mantissa bits (round half away from zero on the bits)."""
    b = t.contiguous().view(torch.int32)
    return ((b + 0x1000) & ~0x1FFF).view(F32)


@any_lane
def test_fp32_is_ieee_by_default():
    """Full-mantissa fp32 operands: the default path meets the fp32 bound; the same bound is
    exceeded by TF32 operand rounding (simulated exactly in fp64), so a TF32 kernel would fail."""
    x, w = randn(64, 64, seed=1), randn(48, 64, seed=2)
    assert_within_bound(matmul(x, w), x, w)
    ref = reference(x, w)
    tf32_result = reference(_tf32(x), _tf32(w))  # exact products of TF32-rounded operands
    bound = tolerance_bound(x, w, reference=ref)
    assert float(((tf32_result - ref).abs() / bound).max()) > 4.0


@pytest.mark.gpu
@pytest.mark.negative_control
def test_tf32_on_request_fails_the_ieee_bound():
    """On a GPU, precision="tf32" must actually be TF32: it exceeds the fp32 bound the default meets."""
    x, w = randn(64, 64, seed=1), randn(48, 64, seed=2)
    out = matmul(x, w, precision="tf32")
    ref = reference(x, w)
    assert float(((out.double() - ref).abs() / tolerance_bound(x, w, reference=ref)).max()) > 1.0


# --- outputs, layouts, bias, dtypes ----------------------------------------------------------


@any_lane
@pytest.mark.parametrize(
    ("m", "n", "k", "num_sms"), [(1, 70, 40, None), (65, 80, 130, 1), (33, 130, 64, 3), (130, 17, 16, 2)]
)
def test_nan_prefilled_output_is_fully_written(m, n, k, num_sms):
    x, w = randn(m, k, seed=m, dtype=BF16), randn(n, k, seed=n, dtype=BF16)
    out = torch.full((m, n), float("nan"), dtype=BF16, device=DEVICE)
    result = matmul(x, w, num_sms=num_sms, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert not bool(torch.isnan(out).any()), f"{int(torch.isnan(out).sum())} elements never written"
    assert_within_bound(out, x, w)


@any_lane
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_both_layouts_and_strided_operands_meet_the_bound(dtype):
    x, w_nk = randn(40, 72, seed=3, dtype=dtype), randn(56, 72, seed=4, dtype=dtype)
    assert_within_bound(linear(x, w_nk), x, w_nk)
    w_kn = w_nk.t().contiguous()
    assert_within_bound(mm(x, w_kn), x, w_kn, layout="mm")
    x_strided = randn(40, 144, seed=5, dtype=dtype)[:, ::2]  # stride_ak = 2
    assert_within_bound(mm(x_strided, w_nk.t()), x_strided, w_nk.t(), layout="mm")
    if not LANE.is_gpu:  # the interpreter loads the same values through either layout
        assert torch.equal(bits(linear(x, w_nk)), bits(mm(x, w_kn)))


def _hand_case(out_dtype, bias_value):
    # x = [1, 1, 0, ...], weight row = [256, 1, 0, ...]: the fp32 dot is exactly 257.
    x = torch.zeros(1, 16, dtype=BF16, device=DEVICE)
    x[0, :2] = 1
    w = torch.zeros(1, 16, dtype=BF16, device=DEVICE)
    w[0, 0], w[0, 1] = 256, 1
    bias = None if bias_value is None else torch.tensor([bias_value], dtype=BF16, device=DEVICE)
    return matmul(x, w, bias, out_dtype=out_dtype)


@any_lane
def test_bias_is_added_in_fp32_before_the_single_rounding():
    # 257 + 0.5 = 257.5 in fp32 rounds to bf16 258 (ULP 2 at 256).  Rounding first would give
    # bf16(257) = 256 (a tie, to even), then 256 + 0.5 -> 256.
    assert _hand_case(None, 0.5).item() == 258.0


@any_lane
def test_fp32_output_from_bf16_is_not_rounded_through_bf16():
    # The fp32 accumulator 257 is returned as is; through bf16 it would be 256.
    assert _hand_case(F32, None).item() == 257.0
    x, w = randn(32, 128, seed=6, dtype=BF16), randn(40, 128, seed=7, dtype=BF16)
    out = matmul(x, w, out_dtype=F32)
    assert out.dtype == F32
    assert_within_bound(out, x, w, out_dtype=F32)
    ref = reference(x, w)
    bound = tolerance_bound(x, w, out_dtype=F32, reference=ref)
    round_trip = out.to(BF16).to(F32)
    assert float(((round_trip.double() - ref).abs() / bound).max()) > 10.0, (
        "the bound cannot see a bf16 round trip"
    )


@any_lane
def test_empty_dimensions():
    x, w, b = randn(0, 32, seed=8), randn(24, 32, seed=9), randn(24, seed=10)
    assert matmul(x, w).shape == (0, 24)
    x0, w0 = randn(5, 0, seed=11), randn(24, 0, seed=12)
    assert torch.equal(matmul(x0, w0), torch.zeros(5, 24, device=DEVICE))
    assert torch.equal(matmul(x0, w0, b), b.expand(5, 24))


# --- 64-bit offsets -----------------------------------------------------------------------------


@any_lane
def test_row_offsets_past_2_31_use_64_bit_arithmetic():
    """Row 2 of x starts 2 * (2**30 + 64) elements in: 32-bit offsets would wrap.  On the cpu
    lane the operand is a view of a sparse memory-mapped file (about 12 KiB touched)."""
    stride, k = 2**30 + 64, 16
    size = 2 * stride + k
    with tempfile.TemporaryDirectory() as tmp:
        if DEVICE.type == "cpu":
            storage = torch.from_file(os.path.join(tmp, "sparse.bin"), shared=True, size=size, dtype=F32)
        else:
            storage = torch.empty(size, dtype=F32, device=DEVICE)
        x = storage.as_strided((3, k), (stride, 1))
        x.copy_(randn(3, k, seed=13))
        w = randn(24, k, seed=14)
        out = matmul(x, w)
        assert_within_bound(out, x.contiguous(), w)
        del x, storage


# --- bad input ----------------------------------------------------------------------------------


@any_lane
def test_bad_launch_arguments_name_the_argument():
    x, w = randn(4, 32, seed=15), randn(8, 32, seed=16)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ArgumentError, match="'num_sms'"):
            matmul(x, w, num_sms=bad)
    with pytest.raises(ArgumentError, match="'out'"):
        matmul(x, w, out=torch.empty(4, 9, device=DEVICE))
    with pytest.raises(ArgumentError, match="'out'"):
        matmul(x, w, out=torch.empty(4, 8, dtype=BF16, device=DEVICE))


@pytest.mark.cpu
def test_cpu_tensors_without_the_interpreter_raise_device_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not interpreting()
    with pytest.raises(DeviceError, match="'x'"):
        matmul(torch.zeros(2, 16), torch.zeros(4, 16))


# --- properties ---------------------------------------------------------------------------------


@any_lane
@settings(max_examples=12, deadline=None)
@given(batch=component_module.COMPONENT.strategy(LANE, DEVICE))
def test_property_agreement_and_prefix_invariance(batch):
    kwargs = batch.kwargs()
    out = matmul(**kwargs)
    ref = reference(**kwargs)
    bound = tolerance_bound(
        kwargs["x"],
        kwargs["weight"],
        kwargs["bias"],
        layout=kwargs["layout"],
        out_dtype=kwargs["out_dtype"],
        reference=ref,
    )
    assert bool(((out.double() - ref).abs() <= bound).all())
    m = max(1, batch.num_rows // 2)
    prefix = matmul(**{**kwargs, "x": kwargs["x"][:m]})
    assert torch.equal(bits(prefix), bits(out[:m]))
    assert torch.equal(bits(matmul(**kwargs, num_sms=1)), bits(out))


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_give_the_same_bits():
    """No host sync or allocation outside the caching allocator in the fast path: it captures,
    and replay on new inputs copied into the captured buffers equals an eager call."""
    x, w, b = (
        randn(33, 4096, seed=20, dtype=BF16),
        randn(256, 4096, seed=21, dtype=BF16),
        randn(256, seed=22, dtype=BF16),
    )
    eager_first = matmul(x, w, b, out_dtype=F32)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = matmul(x, w, b, out_dtype=F32)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    assert torch.equal(bits(captured), bits(eager_first))
    x.copy_(randn(33, 4096, seed=23, dtype=BF16))
    graph.replay()
    assert torch.equal(bits(captured), bits(matmul(x, w, b, out_dtype=F32)))


# --- regressions (adversarial review) -----------------------------------------------------------


def _neg_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor equal to ``t`` whose values are stored negated behind the negative bit."""
    z = torch.complex(torch.zeros_like(t), -t)  # imag = -t
    view = z.conj().imag  # the negation of -t, as a flag only
    assert view.is_neg()
    return view


@pytest.mark.cpu
@pytest.mark.gpu
def test_strided_and_expanded_bias_are_read_through_their_strides(device):
    gen = torch.Generator().manual_seed(40)
    x, w = torch.randn(5, 32, generator=gen).to(device), torch.randn(24, 32, generator=gen).to(device)
    strided = torch.randn(48, generator=gen).to(device)[::2]  # stride 2
    expanded = torch.tensor([1.5], device=device).expand(24)  # stride 0, one element allocated
    for bias in (strided, expanded):
        assert_within_bound(matmul(x, w, bias), x, w, bias)
        assert_within_bound(matmul(x, w.t(), bias, layout="mm"), x, w.t(), bias, layout="mm")


@pytest.mark.cpu
@pytest.mark.gpu
def test_enable_routes_f_linear_with_a_strided_bias_correctly(device):
    import batchinv.fast

    gen = torch.Generator().manual_seed(41)
    x, w = torch.randn(5, 32, generator=gen).to(device), torch.randn(24, 32, generator=gen).to(device)
    bias = torch.randn(48, generator=gen).to(device)[::2]
    with batchinv.fast.enable() as stats:
        out = torch.nn.functional.linear(x, w, bias)
        out3 = torch.nn.functional.linear(x.reshape(1, 5, 32), w, bias)
    assert stats.pinned["matmul"] == 2 and sum(stats.fallback.values()) == 0  # both linears, pinned
    assert_within_bound(out, x, w, bias)
    assert_within_bound(out3.reshape(5, 24), x, w, bias)


@pytest.mark.cpu
@pytest.mark.gpu
def test_negative_bit_views_are_resolved_before_the_launch(device):
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(2, 600, generator=gen).to(device)
    w = torch.randn(24, 600, generator=gen).to(device)
    b = torch.randn(24, generator=gen).to(device)
    for xi, wi, bi in ((_neg_view(x), w, b), (x, _neg_view(w), b), (x, w, _neg_view(b))):
        assert_within_bound(matmul(xi, wi, bi), x, w, b)
        assert_within_bound(reference(xi, wi, bi), x, w, b)
    import batchinv.fast

    with batchinv.fast.enable():
        out = torch.nn.functional.linear(_neg_view(x), w, _neg_view(b))
    assert_within_bound(out, x, w, b)


@pytest.mark.cpu
@pytest.mark.gpu
def test_out_that_aliases_an_input_or_itself_is_refused(device):
    from batchinv.reference.errors import DTypeError

    gen = torch.Generator().manual_seed(43)
    x, w = torch.randn(8, 128, generator=gen).to(device), torch.randn(128, 128, generator=gen).to(device)
    with pytest.raises(ArgumentError, match=r"'out'.*x"):
        matmul(x, w, out=x)
    with pytest.raises(ArgumentError, match=r"'out'.*weight"):
        matmul(x, w[:, :8].t(), layout="linear", out=w[:8, :8].t())  # out in weight's storage
    bias = torch.randn(8 * 128 + 128, generator=gen).to(device)
    with pytest.raises(ArgumentError, match=r"'out'.*bias"):
        matmul(x, w, bias[:128], out=bias[128:].view(8, 128))
    with pytest.raises(ArgumentError, match=r"'out'.*overlap"):
        matmul(x, w, out=torch.empty(1, 128, device=device).expand(8, 128))  # rows race
    with pytest.raises(ArgumentError, match=r"'out'.*negative.*is_neg\(\)=True"):
        matmul(x, w, out=_neg_view(torch.empty(8, 128, device=device)))
    with pytest.raises(DTypeError, match=r"'out'.*Tensor.*list"):
        matmul(x, w, out=[1])
    transposed = torch.full((128, 8), float("nan"), device=device).t()  # column-major: allowed
    assert matmul(x, w, out=transposed).data_ptr() == transposed.data_ptr()
    assert_within_bound(transposed, x, w)


@pytest.mark.cpu
@pytest.mark.gpu
def test_dtype_messages_list_each_allowed_dtype_once(device):
    from batchinv.reference.errors import DTypeError

    x, w = torch.zeros(2, 8, device=device), torch.zeros(4, 8, device=device)
    with pytest.raises(DTypeError) as bias_err:
        matmul(x, w, torch.zeros(4, dtype=F16, device=device))
    assert "float32 or float32" not in str(bias_err.value) and "float32" in bias_err.value.expected
    with pytest.raises(DTypeError) as out_err:
        matmul(x, w, out_dtype=F16)
    assert "or float32" not in str(out_err.value), str(out_err.value)
    with pytest.raises(DTypeError, match=r"bfloat16.*or float32"):
        matmul(x.to(BF16), w.to(BF16), out_dtype=F16)


# --- the tight bound and the exact envelope -------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "group", "dtype"), [(1024, 128, F32), (4096, 16, F32), (4096, 16, BF16), (1000, 16, F16)]
)
def test_the_tight_bound_is_below_the_rigorous_one(k, group, dtype):
    """Below the any-order bound at production K (at small K it may not be: the agreement
    judges the smaller of the two); at K = 4096 a few percent of it on random data, so a TF32
    operand rounding (a random 2**-11 of each product, ~2**-11 sqrt(K) |x||w| in all) exceeds it."""
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    w = (torch.randn(32, k, generator=torch.Generator().manual_seed(k + 1)) / k**0.5).to(dtype)
    ref = reference(x, w, out_dtype=F32)
    hard = tolerance_bound(x, w, out_dtype=F32, reference=ref)
    tight = tight_bound(x, w, out_dtype=F32, reference=ref, group=group)
    assert (tight <= hard).all()
    if k == 4096:
        assert float((tight / hard).max()) < 0.1
    if dtype == F32:
        x32, w32 = x.view(torch.int32), w.view(torch.int32)
        tf32 = [((t + 0xFFF + ((t >> 13) & 1)) & ~0x1FFF).view(F32) for t in (x32, w32)]
        err = (reference(*tf32, out_dtype=F32) - ref).abs()
        assert float((err / tight).max()) > 1.0


def test_exact_cases_are_held_bitwise_and_random_ones_are_not():
    exact_case = next(c for c in component_module.cases(Lane.SM90) if c.axes["values"] == "exact")
    small = dataclasses.replace(exact_case, axes={**exact_case.axes, "rows": 8})
    batch = component_module.build(small, torch.device("cpu"))
    s = batch.shared
    ref = reference(batch.rows["x"], s["weight"], s["bias"], layout=s["layout"], out_dtype=s["out_dtype"])
    assert component_module.exact(batch, (ref,))[0].all()
    normal = component_module.build(component_module.cases(Lane.CPU)[0], torch.device("cpu"))
    s = normal.shared
    ref = reference(normal.rows["x"], s["weight"], s["bias"], layout=s["layout"], out_dtype=s["out_dtype"])
    assert not component_module.exact(normal, (ref,))[0].any()


# --- TMA reads --------------------------------------------------------------------------------


@any_lane
def test_tma_reads_give_the_pointer_reads_bits_and_fall_back_where_unaligned():
    """A TMA execution reads the same values as pointers: equal bits where the operands allow
    descriptors (16-bit, unit inner stride, 16-byte aligned), and the pointer path (equal bits
    again) where they do not: a column slice starting at an odd element, an odd row stride."""
    from batchinv.fast import matmul as launcher
    from batchinv.fast.matmul_config import Execution, MatmulConfig, reduction_tree

    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 161, generator=gen).to(BF16).to(device)
    w = torch.randn(72, 161, generator=gen).to(BF16).to(device)
    key = "interp" if interpreting() else matmul_config_arch(device)
    cases = [
        (x[:, :160].contiguous(), w[:, :160].contiguous()),  # aligned: descriptors
        (x[:, 1:], w[:, 1:]),  # base 2 bytes past alignment, odd row stride: pointers
        (x[:, :152].contiguous(), w[:, :152]),  # the weight's row stride 322 bytes: pointers
    ]
    seen = set()
    for xs, ws in cases:
        tree = reduction_tree(key, BF16, ws.shape[0], ws.shape[1])
        pointer = MatmulConfig(tree, Execution(64, 64))
        tma = MatmulConfig(tree, Execution(64, 64, tma=True))
        p = plan(xs.shape[0], ws.shape[0], xs.shape[1], BF16, device, config=tma)
        aligned = all(t.data_ptr() % 16 == 0 and (t.stride(0) * 2) % 16 == 0 for t in (xs, ws))
        assert (launcher._descriptors(xs, ws, "linear", p) is not None) == aligned
        seen.add(aligned)
        got = matmul(xs, ws, config=tma)
        want = matmul(xs, ws, config=pointer)
        assert torch.equal(bits(got), bits(want))
    assert seen == {True, False}


@any_lane
@pytest.mark.parametrize("num_sms", [1, 3])
def test_a_walk_of_two_programs_per_sm_gives_the_bits_of_one(num_sms):
    """``programs_per_sm`` doubles a walk's persistent grid (each program takes every other tile
    of the one-program walk), never the bits: more tiles than programs on both, so the programs
    really share the tiles out differently."""
    from batchinv.fast.matmul_config import Execution, MatmulConfig, reduction_tree

    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    x, w = randn(70, 130, seed=5, dtype=BF16).to(device), randn(90, 130, seed=6, dtype=BF16).to(device)
    key = "interp" if interpreting() else matmul_config_arch(device)
    tree = reduction_tree(key, BF16, 90, 130)
    one, two = (MatmulConfig(tree, Execution(16, 32, programs_per_sm=p)) for p in (1, 2))
    p1, p2 = (plan(70, 90, 130, BF16, device, num_sms, config=c) for c in (one, two))
    assert (p1.grid, p2.grid) == (num_sms, 2 * num_sms) and p2.num_tiles > p2.grid
    assert two.execution.name.endswith(" grid2")
    assert torch.equal(
        bits(matmul(x, w, num_sms=num_sms, config=two)), bits(matmul(x, w, num_sms=num_sms, config=one))
    )


def matmul_config_arch(device: torch.device) -> str:
    from batchinv.fast.device import arch

    return arch(device)


@any_lane
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_tma_reads_of_the_linear_weight_sum_a_k_step_in_the_pointer_order(dtype):
    """The linear layout's TMA weight tile is loaded ``[N, K]`` and transposed; the products of a
    K step must still be added in the pointer path's order.  ``1 + 31 * 2**-24``: added one by one
    in increasing k every ``2**-24`` is lost (ties to even); added pairwise (what numpy's sum did
    for the interpreter's transposed fp16 tile) they survive, so the order shows in the bits."""
    from batchinv.fast.matmul_config import Execution, MatmulConfig, ReductionTree

    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    x = torch.full((1, 32), 2.0**-24)
    x[0, 0] = 1.0
    x, w = x.to(dtype).to(device), torch.ones(16, 32, dtype=dtype, device=device)
    tree = ReductionTree(32, 32)
    got = matmul(x, w, out_dtype=F32, config=MatmulConfig(tree, Execution(16, 16, tma=True)))
    want = matmul(x, w, out_dtype=F32, config=MatmulConfig(tree, Execution(16, 16)))
    assert torch.equal(bits(got), bits(want)), (got[0, 0].item(), want[0, 0].item())


@any_lane
def test_expanded_or_oversized_operands_read_through_pointers():
    """An expanded (stride-0) x and a tile past the TMA box limit get no descriptors; the
    pointer reads give the bits of the contiguous operand."""
    from batchinv.fast import matmul as launcher
    from batchinv.fast.matmul_config import Execution, MatmulConfig, reduction_tree

    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    key = "interp" if interpreting() else matmul_config_arch(device)
    gen = torch.Generator().manual_seed(4)
    row = torch.randn(1, 64, generator=gen).to(BF16).to(device)
    w = torch.randn(32, 64, generator=gen).to(BF16).to(device)
    cfg = MatmulConfig(reduction_tree(key, BF16, 32, 64), Execution(16, 16, tma=True))
    expanded = row.expand(20, 64)
    p = plan(20, 32, 64, BF16, device, config=cfg)
    assert launcher._descriptors(expanded, w, "linear", p) is None
    assert torch.equal(
        bits(matmul(expanded, w, config=cfg)), bits(matmul(expanded.contiguous(), w, config=cfg))
    )
    wide = MatmulConfig(cfg.tree, Execution(16, 512, tma=True))
    assert (
        launcher._descriptors(expanded.contiguous(), w, "linear", plan(20, 32, 64, BF16, device, config=wide))
        is None
    )


@any_lane
@pytest.mark.parametrize("num_chunks", [3, 4, 8, 10])
def test_split_chunk_sums_are_added_one_by_one_in_chunk_order(num_chunks):
    """The split execution's second kernel adds the chunk sums ``((0 + c0) + c1) + ...`` in chunk
    order, and so does the walk (a kernel that loads several chunks before adding them must keep
    that order).  Chunk sums chosen so every other grouping rounds differently: 2**24, 1, 1, -2**24,
    then 1s.  By hand, in fp32: 2**24 + 1 rounds to 2**24 (ties to even) twice, minus 2**24 is 0,
    then each 1 adds exactly: ``num_chunks - 4`` (3 chunks: 2**24).  Pairing the first four
    instead gives (2**24 + 1) + (1 - 2**24) = 2**24 - (2**24 - 1) = 1, one more."""
    from batchinv.fast.device import arch
    from batchinv.fast.matmul_config import Execution, MatmulConfig, reduction_tree

    tree = reduction_tree(arch(DEVICE), F32, 32, 1)  # the arch's fp32 tree; K sized from its chunk
    k = num_chunks * tree.chunk_k
    chunk_sums = [2.0**24, 1.0, 1.0, -(2.0**24)] + [1.0] * (num_chunks - 4)
    x = torch.zeros(2, k, dtype=F32)
    for c, value in enumerate(chunk_sums[:num_chunks]):
        x[:, c * tree.chunk_k] = value  # one nonzero product per chunk: the chunk's sum, exactly
    w = torch.ones(32, k, dtype=F32)
    expected = 2.0**24 if num_chunks == 3 else float(num_chunks - 4)
    real_tree = reduction_tree(arch(DEVICE), F32, 32, k)
    for execution in (Execution(16, 16, split_k=True), Execution(16, 16)):
        out = matmul(x.to(DEVICE), w.to(DEVICE), config=MatmulConfig(real_tree, execution))
        assert torch.equal(out.cpu(), torch.full((2, 32), expected)), (execution.name, out[0, 0].item())
