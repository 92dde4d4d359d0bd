"""A real client of ``batchinv.enable()``: Hugging Face causal LMs built from configs with
random weights (no download), a dense Llama-style model and a Mixtral-style MoE model.

The contract under test (issue 14): the greedy next-token logits of one prompt are bitwise
equal when the prompt runs alone and inside a right-padded batch with other prompts of other
lengths, in eager mode (both lanes) and compiled (GPU lane), inside ``batchinv.enable()``.
Without ``enable()`` the same comparison is the negative control: on the GPU it must find a
difference (cuBLAS and the attention's reduction length change with the batch).

Padding changes more than M: every attention row of the batch has the padded length, so the
``QK^T`` product gets more columns, the softmax longer rows (masked entries exactly 0 after
exp) and the ``PV`` product a longer K whose extra terms are exact zeros.  The pinned kernels
keep a row's bits through that because their configs do not change in the tested range (the
matmul's table is keyed on N <= 512 buckets, the softmax's on row lengths <= 256 on GPUs) and
zero terms appended to a fixed-order fp32 sum leave it unchanged.  Position ids are given
explicitly (0..len-1 per prompt), as a server does.

Attention runs through ``attn_implementation="eager"`` (matmul + softmax, both pinned): right
padding keeps a row's bits (zeros appended to fixed-order sums), left padding does not (see
``test_transformers_generate.py``, where the default ``sdpa`` runs ``batchinv::sdpa``).  The last
test checks that ``sdpa`` runs pinned under ``strict`` and what it refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import batchinv
from batchinv.fast.enable.function_mode import UnpinnedOpError
from batchinv.harness.plugin import current_lane

transformers = pytest.importorskip("transformers", reason="the 'models' extra (pip install batchinv[models])")

GPU = current_lane().is_gpu
DEVICE = torch.device("cuda" if GPU else "cpu")
DTYPE = torch.bfloat16 if GPU else torch.float32  # the interpreter's fp32 keeps the cpu lane fast


@dataclass(frozen=True)
class Geometry:
    """Model size and the batches tried, per lane."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    prompt_len: int
    max_other_len: int
    other_counts: tuple[int, ...]  # how many other prompts share the batch, one batch each


CPU_GEOMETRY = Geometry(64, 128, 2, 4, 2, 128, 9, 24, (1, 2, 5))
# GPU: the MLP width (4096 -> 11008), where cuBLAS changes algorithm and split-K with M
# (a 7-token prompt alone against thousands of padded tokens); at width 512 it did not (run 23).
GPU_GEOMETRY = Geometry(4096, 11008, 2, 32, 8, 4096, 7, 96, (1, 2, 3, 7, 15, 31, 64))
GEOMETRY = GPU_GEOMETRY if GPU else CPU_GEOMETRY


def _llama(g: Geometry) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=g.vocab,
        hidden_size=g.hidden,
        intermediate_size=g.intermediate,
        num_hidden_layers=g.layers,
        num_attention_heads=g.heads,
        num_key_value_heads=g.kv_heads,
        max_position_embeddings=256,
        pad_token_id=0,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config)


def _mixtral(g: Geometry) -> torch.nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=g.vocab,
        hidden_size=g.hidden,
        intermediate_size=g.intermediate // 2,
        num_hidden_layers=g.layers,
        num_attention_heads=g.heads,
        num_key_value_heads=g.kv_heads,
        max_position_embeddings=256,
        num_local_experts=8,
        num_experts_per_tok=2,
        pad_token_id=0,
        attn_implementation="eager",
    )
    return transformers.MixtralForCausalLM(config)


MODELS: dict[str, Callable[[Geometry], torch.nn.Module]] = {"llama": _llama, "mixtral": _mixtral}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name](GEOMETRY).to(DEVICE, DTYPE).eval()


def _batches(g: Geometry) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The prompt (row 0 of every batch) and one right-padded batch per ``other_counts`` entry:
    ``(input_ids, attention_mask)``, the others of random lengths 1..max_other_len (some shorter,
    some longer than the prompt), token 0 the padding."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, g.vocab, (g.prompt_len,), generator=gen)
    batches = []
    for count in (0, *g.other_counts):
        lengths = torch.randint(1, g.max_other_len + 1, (count,), generator=gen).tolist()
        seqs = [prompt] + [torch.randint(1, g.vocab, (n,), generator=gen) for n in lengths]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
        batches.append((ids.to(DEVICE), mask.to(DEVICE)))
    return prompt, batches


def _prompt_logits(
    model: Callable[..., object], prompt_len: int, ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Row 0's next-token logits (its last real position); positions 0..len-1 for every row."""
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions)
    return out.logits[0, prompt_len - 1].clone()


def _differing_batches(model: Callable[..., object]) -> list[int]:
    """Batch sizes whose row-0 logits differ bitwise from the prompt run alone."""
    prompt, batches = _batches(GEOMETRY)
    alone, *rest = (_prompt_logits(model, len(prompt), ids, mask) for ids, mask in batches)
    bits = torch.int16 if alone.dtype == torch.bfloat16 else torch.int32
    return [
        ids.shape[0]
        for (ids, _), got in zip(batches[1:], rest, strict=True)
        if not torch.equal(got.view(bits), alone.view(bits))
    ]


def _compiled(model: torch.nn.Module) -> Callable[..., object]:
    torch._dynamo.reset()
    return torch.compile(model, dynamic=True)


lanes = pytest.mark.parametrize("name", sorted(MODELS))


@pytest.mark.cpu
@pytest.mark.gpu
@lanes
@torch.no_grad()
def test_prompt_logits_are_batch_invariant_inside_enable_eager(name):
    model = _model(name)
    with batchinv.enable() as stats:
        differing = _differing_batches(model)
    assert differing == [], f"{name}: row 0 differs inside batches of {differing} prompts"
    assert not stats.fallback, stats
    assert stats.pinned["matmul"] > 0 and stats.pinned["bmm"] > 0 and stats.pinned["softmax"] > 0, stats
    if name == "mixtral":
        assert stats.pinned["grouped_mm"] > 0, stats


@pytest.mark.gpu
@lanes
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's imports
@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo's notes on HF internals
@torch.no_grad()
def test_prompt_logits_are_batch_invariant_inside_enable_compiled(name):
    model = _model(name)
    with batchinv.enable() as stats:
        differing = _differing_batches(_compiled(model))
    assert differing == [], f"{name}: compiled, row 0 differs inside batches of {differing} prompts"
    assert not stats.fallback, stats
    assert stats.pinned["matmul"] > 0 and stats.pinned["bmm"] > 0, stats


@pytest.mark.gpu
@lanes
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@torch.no_grad()
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_negative_control_without_enable_the_prompt_logits_vary_with_the_batch(name, mode):
    model = _model(name)
    differing = _differing_batches(model if mode == "eager" else _compiled(model))
    assert differing, f"{name} {mode}: the negative control found no difference without enable()"


@pytest.mark.cpu
@pytest.mark.gpu
@torch.no_grad()
def test_strict_enable_pins_sdpa_attention_and_refuses_what_it_cannot_pin():
    """Hugging Face's default ``sdpa`` runs ``batchinv::sdpa`` under ``strict``; a mask whose
    visible keys are not one range per row, an additive mask with other values (ALiBi-like) and
    dropout are refused by name (and fall back, counted, without ``strict``)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=128,  # head dim 64: in the kernel's table on every lane
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).to(DEVICE, DTYPE).eval()
    ids = torch.randint(1, 64, (1, 5), device=DEVICE)
    with batchinv.enable() as stats:
        model(ids)
    assert stats.pinned["sdpa"] == 1 and not stats.fallback, stats
    q = torch.randn(1, 2, 4, 64, device=DEVICE, dtype=DTYPE)
    gapped = torch.ones(1, 1, 4, 4, dtype=torch.bool, device=DEVICE)
    gapped[..., 2, 1] = False  # row 2 sees keys 0 and 2..3: two ranges
    alibi = torch.zeros(1, 1, 4, 4, dtype=DTYPE, device=DEVICE)
    alibi[..., 0] = -0.5
    refused = {
        "row 2": {"attn_mask": gapped},
        "additive values": {"attn_mask": alibi},
        "dropout_p": {"dropout_p": 0.1},
    }
    for why, kwargs in refused.items():
        with batchinv.enable(), pytest.raises(UnpinnedOpError, match=f"scaled_dot_product_attention.*{why}"):
            F.scaled_dot_product_attention(q, q, q, **kwargs)
        with batchinv.enable(strict=False) as stats:
            F.scaled_dot_product_attention(q, q, q, **kwargs)
        assert stats.fallback["scaled_dot_product_attention"] == 1, (why, stats)
