"""Tests of ``sampler`` (issue 27, section 4) beyond the registry's generic ones.

Expected values come from published test vectors (Random123's Philox4x32-10 answers), from the
definition written out by hand (greedy ties, the constant row, the +inf rule, plateaus at the
cut), or from the independent oracle (``harness/components/sampler.py``'s NumPy-fp32
transcription); never from the code under test.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchinv.fast.kernels.sampler as kernels
from batchinv.fast import sampler as launcher
from batchinv.fast.baselines.sampler import sort_ties
from batchinv.fast.device import interpreter_quiet
from batchinv.harness.compare import compare_tolerance
from batchinv.harness.components import sampler as component
from batchinv.harness.lanes import Lane
from batchinv.reference import sampler as ref

CPU = torch.device("cpu")


def requests(logits, temperature=1.0, top_k=0, top_p=1.0, seeds=None, step=None, device=CPU):
    """Per-request parameter vectors for ``logits [R, V]`` (scalars broadcast), on ``device``."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    r = logits.shape[0]

    def vec(v, dtype):
        t = torch.as_tensor(v, dtype=dtype)
        return t.expand(r).clone() if t.dim() == 0 else t

    args = {
        "logits": logits,
        "temperature": vec(temperature, torch.float32),
        "top_k": vec(top_k, torch.int64),
        "top_p": vec(top_p, torch.float32),
        "seeds": vec(torch.arange(r) * 7919 + 1 if seeds is None else seeds, torch.int64),
        "step": vec(torch.zeros(r) if step is None else step, torch.int64),
    }
    return {k: v.to(device) for k, v in args.items()}


# --- the RNG -----------------------------------------------------------------------------------


#: Random123's known answers for philox4x32_10 (kat_vectors): counter, key, output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.cpu
@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_the_reference_philox_gives_random123s_answers(counter, key, expected):
    assert ref.philox4x32_10(counter, key) == expected


@triton.jit
def _philox_probe(seed_ptr, c_ptr, out_ptr):
    seed = tl.load(seed_ptr)
    c0 = tl.load(c_ptr).to(tl.uint32)
    c1 = tl.load(c_ptr + 1).to(tl.uint32)
    c2 = tl.load(c_ptr + 2).to(tl.uint32)
    c3 = tl.load(c_ptr + 3).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(out_ptr, r0.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + 1, r1.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + 2, r2.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + 3, r3.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_tritons_philox_is_random123s_with_the_seed_split_into_the_key(counter, key, expected, device):
    """The kernel's stream: ``tl.philox(seed, ...)`` keys Philox4x32-10 with (seed's low word,
    its high word), the reference's rule."""
    seed = key[0] | (key[1] << 32)
    seed -= 2**64 if seed >= 2**63 else 0
    dev = device
    out = torch.zeros(4, dtype=torch.int64, device=dev)
    with interpreter_quiet():
        _philox_probe[(1,)](
            torch.tensor([seed], dtype=torch.int64, device=dev),
            torch.tensor(counter, dtype=torch.int64, device=dev),
            out,
        )
    assert tuple(out.tolist()) == expected


@pytest.mark.cpu
@pytest.mark.gpu
def test_the_draw_is_keyed_by_seed_and_step_and_never_by_the_slot(device):
    """The same request twice in one launch (slots 0 and 3) draws the same token; its other
    steps draw other tokens of a flat row (the stream advances with the step)."""
    flat = torch.zeros(6, 64)
    args = requests(flat, seeds=[5, 9, 11, 5, 5, 5], step=[3, 3, 3, 3, 4, 5], device=device)
    tokens, logprob = launcher.sampler(**args)
    assert tokens[0] == tokens[3]
    assert len({int(tokens[0]), int(tokens[4]), int(tokens[5])}) > 1
    assert torch.allclose(logprob.double().cpu(), torch.full((6,), -math.log(64), dtype=torch.float64))
    expected = component.oracle(**args)[0]
    assert torch.equal(tokens, expected)


# --- the pinned arithmetic -----------------------------------------------------------------------


@pytest.mark.cpu
def test_the_kernel_uses_the_reference_constants():
    poly = (kernels.C0, kernels.C1, kernels.C2, kernels.C3, kernels.C4, kernels.C5)
    assert tuple(c.value for c in poly) == ref.EXP2_POLY
    assert kernels.T_FLOOR.value == ref.T_FLOOR and kernels.LN2.value == ref.LN2
    assert all(float(np.float32(c)) == c for c in ref.EXP2_POLY)  # exact fp32 values


@pytest.mark.cpu
def test_the_pinned_exp2_is_within_its_stated_error():
    """``W / 2**42`` against ``2**t`` in fp64 on 2**17 points of [-30, 0] and the reduction's
    edges (t = n +- 0.5): within EXP2_REL_ERROR relative plus the 2**-42 truncation."""
    grid = torch.linspace(-30.0, 0.0, 2**17, dtype=torch.float64)
    edges = torch.arange(-30, 1, dtype=torch.float64) + 0.5
    t = torch.cat([grid, edges, edges - 2**-20, -edges.abs()]).clamp(max=0.0).float().double()
    w = ref.fixed_weights(t).double() * 2.0**-42
    exact = torch.exp2(t)
    err = (w - exact).abs()
    assert bool((err <= ref.EXP2_REL_ERROR * exact + 2.0**-42).all()), float((err / exact).max())
    assert int(ref.fixed_weights(torch.zeros(1, dtype=torch.float64))) == 2**42  # weight 1 exactly


@pytest.mark.cpu
def test_an_fp32_operation_done_in_fp64_and_rounded_is_the_ieee_fp32_result():
    """The reference's premise (double rounding is innocuous for +, -, * at 53 >= 2*24 + 2):
    NumPy's fp32 arithmetic and the reference's fp64-then-round agree on random operands."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 30, 20000))).astype(np.float32)
    b = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 30, 20000))).astype(np.float32)
    for op in (np.add, np.subtract, np.multiply):
        direct = op(a, b)
        via64 = op(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
        assert np.array_equal(direct.view(np.int32), via64.view(np.int32))


# --- the documented rules, by hand -----------------------------------------------------------------


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("impl", [launcher.sampler, ref.sampler], ids=["fast", "reference"])
def test_the_rules_written_out(impl, device):
    inf, nan = math.inf, math.nan
    rows = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0],  # 0: greedy: the lower id of the tie at the max -> 1
            [nan, -inf, nan, -inf],  # 1: greedy on the constant row -> 0
            [nan, -inf, nan, -inf],  # 2: sampled: uniform over every token (NaN reads -inf)
            [0.0, inf, 5.0, inf],  # 3: +inf share the mass: token 1 or 3, log-prob -ln 2
            [2.0, 7.0, 7.0, -1.0],  # 4: top_k 1: the lower id of the tie -> 1
            [2.0, 7.0, 7.0, -1.0],  # 5: top_p tiny: the first token of the order -> 1
            [4.0, 4.0, 4.0, 4.0],  # 6: top_p 1/2 on a plateau: ids 0, 1 kept, log-prob -ln 2
            [4.0, 4.0, 4.0, 4.0],  # 7: top_k 3 on a plateau: ids 0..2, log-prob -ln 3
        ]
    )
    args = requests(
        rows,
        temperature=[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5],
        top_k=[0, 0, 0, 0, 1, 0, 0, 3],
        top_p=[1.0, 1.0, 1.0, 1.0, 1.0, 1e-6, 0.5, 1.0],
        device=device,
    )
    tokens, logprob = impl(**args)
    lp = logprob.double()
    assert tokens[0] == 1 and lp[0] == 0.0
    assert tokens[1] == 0 and lp[1] == 0.0
    assert 0 <= tokens[2] < 4 and abs(lp[2] + math.log(4)) < 1e-6
    assert int(tokens[3]) in (1, 3) and abs(lp[3] + math.log(2)) < 1e-6
    assert tokens[4] == 1 and abs(lp[4]) < 1e-6
    assert tokens[5] == 1 and abs(lp[5]) < 1e-6
    assert int(tokens[6]) in (0, 1) and abs(lp[6] + math.log(2)) < 1e-6
    assert int(tokens[7]) in (0, 1, 2) and abs(lp[7] + math.log(3)) < 1e-6
    assert tokens.dtype == torch.int64


@pytest.mark.cpu
@pytest.mark.gpu
def test_a_tie_plateau_at_the_cut_keeps_the_lower_ids_and_every_kept_id_is_drawn(device):
    """12 draws of a 6-token plateau cut to 3 by top_k, and to 2 by top_p = 0.3: only ids 0..2
    (0..1) appear, each of them at least once (the oracle agrees token for token)."""
    rows = torch.full((24, 6), 1.5)
    args = requests(
        rows, top_k=[3] * 12 + [0] * 12, top_p=[1.0] * 12 + [0.3] * 12, step=torch.arange(24), device=device
    )
    tokens, _ = launcher.sampler(**args)
    assert set(tokens[:12].tolist()) == {0, 1, 2}
    assert set(tokens[12:].tolist()) == {0, 1}
    assert torch.equal(tokens, component.oracle(**args)[0])


@pytest.mark.cpu
@pytest.mark.gpu
@pytest.mark.parametrize("impl", [launcher.sampler, ref.sampler], ids=["fast", "reference"])
def test_one_token_vocabulary(impl, device):
    args = requests(
        torch.tensor([[3.0], [math.nan], [-math.inf]]),
        temperature=[0.0, 1.0, 2.0],
        top_k=[0, 1, 0],
        device=device,
    )
    tokens, logprob = impl(**args)
    assert tokens.tolist() == [0, 0, 0] and logprob.abs().max() < 1e-6


# --- tiles, pivots and the launcher ---------------------------------------------------------------


@pytest.mark.cpu
def test_many_tiles_and_another_pivot_count_give_the_same_bits(monkeypatch):
    """The cpu lane's cases fit one tile; here V = 100 runs in tiles of 32 with a 4-way cut
    search (the GPU tables' multi-tile paths: the argmax, the cumsums and the cuts carried
    across tiles) and must give the shipped config's bits and the oracle's tokens."""
    batch = component.build(
        component.make_case(5, 100, "float32", "plateau,special,normal,peaked", "all", 21), CPU
    )
    kwargs = {
        **batch.kwargs(),
        "temperature": torch.tensor([0.6, 1.3, 0.7, 0.0, 1.0]),
        "top_k": torch.tensor([7, 3, 0, 0, 0]),
        "top_p": torch.tensor([0.9, 1.0, 0.5, 1.0, 1.0]),
    }
    shipped = launcher.sampler(**kwargs)
    monkeypatch.setattr(launcher, "sampler_config", lambda arch_name, vocab: (32, 4, 1))
    tiled = launcher.sampler(**kwargs)
    assert torch.equal(shipped[0], tiled[0])
    assert torch.equal(shipped[1].view(torch.int32), tiled[1].view(torch.int32))
    assert torch.equal(tiled[0], component.oracle(**kwargs)[0])


@pytest.mark.cpu
def test_the_launch_config_is_keyed_on_the_vocabulary_alone():
    assert list(inspect.signature(launcher.sampler_config).parameters) == ["arch_name", "vocab"]
    for v in (1, 2, 1000, 151936, 2**20):
        block, npiv, _ = launcher.sampler_config("sm90", v)
        assert block <= triton.next_power_of_2(v) and npiv >= 2


@pytest.mark.cpu
@pytest.mark.gpu
def test_a_strided_logits_view_reads_only_its_elements(device):
    batch = component.build(component.make_case(3, 40, "bfloat16", "normal,special", "all", 5), device)
    moved = component.relocate(batch, torch.Generator())
    assert moved.rows["logits"].stride() != batch.rows["logits"].stride()
    a, b = launcher.sampler(**batch.kwargs()), launcher.sampler(**moved.kwargs())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32))


# --- the oracle, the bound and the tie baseline ---------------------------------------------------


@pytest.mark.cpu
@pytest.mark.parametrize("case", component.cases(Lane.CPU), ids=lambda c: c.id)
def test_the_reference_is_the_independent_oracle(case):
    batch = component.build(case, CPU)
    r_tok, r_lp = ref.sampler(**batch.kwargs())
    o_tok, o_lp = component.oracle(**batch.kwargs())
    assert torch.equal(r_tok, o_tok)
    assert torch.allclose(r_lp, o_lp, rtol=0, atol=1e-12)


@pytest.mark.cpu
def test_the_bound_catches_a_bf16_probability():
    """The log-prob bound's negative control: the fast log-prob of a probability rounded to
    bf16 (a 16-bit intermediate) lies outside it."""
    batch = component.build(component.make_case(4, 64, "float32", "normal", "all", 31), CPU)
    kwargs = {**batch.kwargs(), "temperature": torch.ones(4), "top_k": torch.zeros(4, dtype=torch.int64)}
    kwargs["top_p"] = torch.ones(4)
    _, lp_ref = ref.sampler(**kwargs)
    _, bound = ref.tolerance_bound(**kwargs)
    _, lp_fast = launcher.sampler(**kwargs)
    assert compare_tolerance(lp_ref, lp_fast, bound).within
    downgraded = torch.log(torch.exp(lp_fast.double()).to(torch.bfloat16).double()).float()
    assert not compare_tolerance(lp_ref, downgraded, bound).within


@pytest.mark.cpu
def test_sort_ties_breaks_the_tie_rule(device):
    """The tie baseline is invariant on the CPU (its sort's order is the row's own) but keeps
    the tied tokens torch.sort puts last, not the lower ids: on an 8-token plateau cut in half
    by top_p some draw falls outside ids 0..3, which the rule keeps.  CPU only: on the H200
    (run 59) CUDA's sort kept this plateau in id order (a stable radix sort), so the baseline
    kept ids 0..3 there, as the rule does."""
    args = requests(torch.full((16, 8), 2.0), top_p=0.5, step=torch.arange(16), device=device)
    ref_tokens = ref.sampler(**args)[0]
    assert set(ref_tokens.tolist()) <= {0, 1, 2, 3}
    assert not set(sort_ties(**args)[0].tolist()) <= {0, 1, 2, 3}


@pytest.mark.cpu
def test_sort_ties_cannot_vary_on_the_cpu_lane_its_sorts_tie_order_is_the_rows_own():
    """Why ``sort_ties`` is reported, never required, on the cpu lane: CPU ``torch.sort``'s
    order inside a tie plateau is not the stable order (so the baseline breaks the tie rule,
    above), but it is the same for the row alone, beside other rows at any slot and read
    through a strided view; with per-request streams, a top-p cut inside the plateau gives the
    baseline's bits alone and at every slot of a batch.  If torch ever changes that, this fails
    and the control can be made required on the cpu lane."""
    g = torch.Generator().manual_seed(7)
    for v in (64, 4096):
        row = torch.randint(0, 4, (v,), generator=g).float() * 0.5
        alone = row[None].sort(dim=-1).indices[0]
        assert not torch.equal(alone, row.sort(stable=True).indices)  # ties not in id order
        for r in (2, 9):
            batch = torch.randn(r, v, generator=g)
            batch[r // 2] = row
            wide = torch.full((r, 2 * v + 1), math.nan)
            wide[:, 1::2] = batch
            for view in (batch, wide[:, 1::2]):
                assert torch.equal(view.sort(dim=-1).indices[r // 2], alone)
    plateau = torch.full((1, 8), 2.0)
    single = requests(plateau, top_p=0.5, seeds=[41], step=[3])
    want = sort_ties(**single)
    for slot in range(4):
        others = torch.randn(4, 8, generator=g)
        others[slot] = plateau[0]
        batch = requests(others, top_p=0.5, seeds=[41] * 4, step=[3] * 4)
        got = sort_ties(**batch)
        assert int(got[0][slot]) == int(want[0][0])
        assert torch.equal(got[1][slot : slot + 1].view(torch.int32), want[1].view(torch.int32))


# --- properties ----------------------------------------------------------------------------------


@pytest.mark.cpu
@pytest.mark.gpu
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fast_tokens_are_the_reference_tokens_and_in_range(data, lane, device):
    kwargs = data.draw(component.strategy(lane, device)).kwargs()
    tokens, logprob = launcher.sampler(**kwargs)
    r_tok, r_lp = ref.sampler(**kwargs)
    vocab = kwargs["logits"].shape[1]
    assert torch.equal(tokens, r_tok)
    assert bool(((tokens >= 0) & (tokens < vocab)).all())
    assert compare_tolerance(r_lp, logprob, ref.tolerance_bound(**kwargs)[1]).within


@pytest.mark.cpu
def test_a_production_vocabulary_with_plateaus_nan_and_inf_on_the_cpu_lane():
    """V = 151936 (Qwen's vocabulary; the cpu strategy stops at 4096) in bf16, once (the
    interpreter pays ~4 s per request, ~20 s with a top-p cut, so none here): a four-level tie
    plateau cut inside its second level by top_k, a constant row of -inf and NaN (uniform), and
    NaN / -inf / -0 sprinkled over a normal row.  Tokens are the
    reference's (the plateau's also the oracle's), every one in [0, V), never a NaN or -inf id."""
    v = 151936
    g = torch.Generator().manual_seed(151936)
    plateau = torch.randint(0, 4, (v,), generator=g).float() * 0.5
    constant = torch.full((v,), -math.inf)
    constant[torch.rand(v, generator=g) < 0.3] = math.nan
    sprinkled = torch.randn(v, generator=g) * 3
    pick = torch.rand(v, generator=g)
    sprinkled[pick < 0.1] = math.nan
    sprinkled[(pick >= 0.1) & (pick < 0.2)] = -math.inf
    sprinkled[(pick >= 0.2) & (pick < 0.25)] = -0.0
    rows = torch.stack([plateau, constant, sprinkled]).to(torch.bfloat16)
    args = requests(
        rows.float(),
        temperature=[0.9, 1.0, 1.3],
        top_k=[50000, 0, 0],  # the top level holds ~38k tokens: the cut falls in the second
        seeds=[3, -5, 2**62],
        step=[0, 1, 2**33],
    )
    args["logits"] = rows
    tokens, _ = launcher.sampler(**args)
    assert torch.equal(tokens, ref.sampler(**args)[0])
    first = {k: t[:1] for k, t in args.items()}
    assert torch.equal(tokens[:1], component.oracle(**first)[0])
    assert bool(((tokens >= 0) & (tokens < v)).all())
    assert float(rows[0, tokens[0]]) >= 1.0  # the top two levels only
    assert not math.isnan(float(rows[2, tokens[2]])) and float(rows[2, tokens[2]]) > -math.inf


# --- the GPU build (compiled ahead of time: no GPU needed) ----------------------------------------

_AOT = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from batchinv.fast.kernels.sampler import sampler_kernel
from batchinv.fast.sampler import sampler_config
block, npiv, warps = sampler_config("sm90", 151936)
sig = {"logits_ptr": "*bf16", "temperature_ptr": "*fp32", "k_ptr": "*fp32", "top_k_ptr": "*i64",
       "top_p_ptr": "*fp32", "seeds_ptr": "*i64", "step_ptr": "*i64", "tokens_ptr": "*i64",
       "logprob_ptr": "*fp32", "V": "i32", "stride_r": "i64", "stride_v": "i64",
       "BLOCK": "constexpr", "NPIV": "constexpr"}
out = {}
for fusion in (False, True):
    src = ASTSource(sampler_kernel, sig, constexprs={"BLOCK": block, "NPIV": npiv})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "enable_fp_fusion": fusion})
    out[str(fusion)] = len(re.findall(r"\\bfma\\.[a-z]+\\.f32", k.asm["ptx"]))
print(json.dumps(out))
"""


@pytest.mark.cpu
def test_the_kernel_builds_for_sm90_without_fused_multiply_adds(tmp_path):
    """The kernel compiles for an H200 (sm90, ahead of time, no GPU needed), and launched as the
    launcher launches it (``enable_fp_fusion=False``) its PTX has no fp32 FMA -- with fusion on
    the pinned Horner steps would contract into FMAs, as the second build shows."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["False"] == 0 and counts["True"] > 0, counts
    assert "enable_fp_fusion=False" in inspect.getsource(launcher.sampler)
