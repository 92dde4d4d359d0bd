"""The ``sdpa_attention`` component: dense attention with SDPA's signature, each query row over
its own visible keys (:mod:`batchinv.fast.sdpa_attention`, what ``enable()`` runs for
``F.scaled_dot_product_attention``).

A :class:`Batch` holds each request (a sequence) canonically, unpadded (``rows``, dim 0 =
requests): ``q`` (R, q_max, Hq, D) -- row i < q_lens[r] is its query at position
``lens[r] - q_lens[r] + i``, the rest NaN --, ``k``, ``v`` (R, L_max, Hkv, D) -- keys 0 ..
lens[r] - 1, the rest NaN --, ``q_lens``, ``lens`` and ``pad`` (R,) int32 (extra padding
positions); ``shared``: ``scale``, ``side`` ("left" or "right") and ``mask`` ("bool" or
"additive", 0 / finfo.min as Hugging Face builds them).  The registry's functions have SDPA's
signature; :func:`padded` lays a batch out as one padded SDPA launch -- every request padded to
the launch's widest (``max(lens + pad)`` keys, ``max(q_lens + pad)`` query rows) on ``side``,
padding positions finite noise, the mask causal inside each request -- and gathers each
request's real rows back, so any two layouts of the same requests compare row for row.

Checks: agreement (toleranced: decode_attention's derived bound, row for row), co_batch, slot,
placement (the same requests with other pads and the other side), **padding** (a
:class:`~batchinv.harness.registry.PaddingModel`: left and right padding by 0..300 positions,
alone and beside sequences of other lengths) and repeat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchinv.fast import sdpa_attention as fast_attention
from batchinv.fast.baselines import sdpa_attention as baselines
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    GPU_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    PaddingModel,
    RequestModel,
    Toleranced,
)
from batchinv.reference import decode_attention as ref_decode
from batchinv.reference import sdpa_attention as ref_attention
from batchinv.reference.errors import ArgumentError, DTypeError

NAME = "sdpa_attention"
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: How a case draws (q_len, length) per request: ``prefill`` q_len = length (a prompt);
#: ``decode`` q_len 1; ``mixed`` q_len in [1, length].
MIXES: tuple[str, ...] = ("prefill", "decode", "mixed")


def _case(**axes: Any) -> Case:
    return Case(NAME, axes)


def cases(lane: Lane) -> list[Case]:
    """The sweep's cases (axes: R, Hq, Hkv, D, dtype, mix, longest, mask, side)."""
    if lane is Lane.CPU:
        rows = [
            # Two requests (two padding targets), few heads and rows: the interpreter pays ~25 ms
            # per program (one per row and kv head, one merge per row and head), and the padding
            # check launches each target about ten times.  Prefill rows cross the chunk (16),
            # decode keys the split (32).
            (2, 2, 1, 16, "bfloat16", "prefill", 18, "bool", "left"),
            (2, 4, 2, 16, "float16", "decode", 40, "additive", "left"),
            (2, 2, 2, 32, "bfloat16", "mixed", 20, "bool", "right"),
        ]
    else:
        rows = [
            (4, hq, hkv, d, dtype, mix, longest, mask, "left")
            for dtype in DTYPES
            for hq, hkv in ((32, 8), (16, 4))
            for d in (64, 128, 256)
            for mix, longest, mask in (
                ("prefill", 512, "bool"),
                ("decode", 2048, "additive"),
                ("mixed", 300, "bool"),
            )
        ]
    return [
        _case(R=r, Hq=hq, Hkv=hkv, D=d, dtype=dtype, mix=mix, longest=longest, mask=mask, side=side)
        for r, hq, hkv, d, dtype, mix, longest, mask, side in rows
    ]


def _plan(mix: str, count: int, longest: int, gen: torch.Generator) -> list[tuple[int, int]]:
    lens = [int(v) for v in torch.randint(1, longest + 1, (count,), generator=gen)]
    if count:
        lens[0] = longest  # the longest request sets the launch's width
    if mix == "prefill":
        return [(n, n) for n in lens]
    if mix == "decode":
        return [(1, n) for n in lens]
    if mix == "mixed":
        return [(int(torch.randint(1, n + 1, (1,), generator=gen)), n) for n in lens]
    raise ValueError(f"mix: expected one of {MIXES}, got {mix!r}")


def build(case: Case, device: torch.device) -> Batch:
    """The batch of ``case``: a deterministic function of its axes and seed."""
    a = case.axes
    gen = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[a["dtype"]]
    r_count, hq, hkv, d = a["R"], a["Hq"], a["Hkv"], a["D"]
    plan = _plan(a["mix"], r_count, min(a["longest"], a.get("cap") or a["longest"]), gen)
    q_max = l_max = a["longest"]  # fixed widths: every batch of the case and its neighbours joins
    q = torch.full((r_count, q_max, hq, d), math.nan, dtype=dtype)
    k = torch.full((r_count, l_max, hkv, d), math.nan, dtype=dtype)
    v = torch.full((r_count, l_max, hkv, d), math.nan, dtype=dtype)
    for r, (ql, n) in enumerate(plan):
        q[r, :ql] = torch.randn(ql, hq, d, generator=gen).to(dtype)
        k[r, :n] = torch.randn(n, hkv, d, generator=gen).to(dtype)
        v[r, :n] = torch.randn(n, hkv, d, generator=gen).to(dtype)
    rows = {
        "q": q,
        "k": k,
        "v": v,
        "q_lens": torch.tensor([n for n, _ in plan], dtype=torch.int32),
        "lens": torch.tensor([n for _, n in plan], dtype=torch.int32),
        "pad": torch.zeros(r_count, dtype=torch.int32),
    }
    shared = {"scale": 1.0 / math.sqrt(d), "side": a["side"], "mask": a["mask"]}
    return Batch({name: t.to(device) for name, t in rows.items()}, shared)


# --- the padded layout ---------------------------------------------------------------------------


def _noise(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, salt: int) -> torch.Tensor:
    """Finite padding values, a function of the launch's shape (never NaN: a kernel may multiply
    a masked position's value by an exact 0); drawn on ``device`` (GBs on GPU lanes)."""
    gen = torch.Generator(device=device).manual_seed(1_000_003 * salt + sum(shape))
    return (4 * torch.randn(shape, generator=gen, device=device)).to(dtype)


def layout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: torch.Tensor,
    lens: torch.Tensor,
    pad: torch.Tensor,
    side: str,
    mask_kind: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """One padded SDPA launch of the canonical rows: ``(query [R, Hq, Wq, D], key, value [R, Hkv,
    Wk, D], attn_mask [R, 1, Wq, Wk], query offsets)`` -- query and key are transposed views of
    ``[R, W, H, D]`` buffers, Hugging Face's layout."""
    r_count, _, hq, d = q.shape
    hkv = k.shape[2]
    ql = [int(x) for x in q_lens.tolist()]
    kl = [int(x) for x in lens.tolist()]
    extra = [int(x) for x in pad.tolist()]
    wq = max((a + b for a, b in zip(ql, extra, strict=True)), default=1)
    wk = max((a + b for a, b in zip(kl, extra, strict=True)), default=1)
    query = _noise((r_count, wq, hq, d), q.dtype, q.device, 1)
    key = _noise((r_count, wk, hkv, k.shape[3]), k.dtype, k.device, 2)
    value = _noise((r_count, wk, v.shape[2], v.shape[3]), v.dtype, v.device, 3)
    q_offs = [wq - ql[r] if side == "left" else 0 for r in range(r_count)]
    k_offs = [wk - kl[r] if side == "left" else 0 for r in range(r_count)]
    for r in range(r_count):
        query[r, q_offs[r] : q_offs[r] + ql[r]] = q[r, : ql[r]]
        key[r, k_offs[r] : k_offs[r] + kl[r]] = k[r, : kl[r]]
        value[r, k_offs[r] : k_offs[r] + kl[r]] = v[r, : kl[r]]
    # Query row i of request r (position lens - q_lens + i) sees keys k_off .. k_off + position.
    dev = q.device
    q_off, k_off = (torch.tensor(x, dtype=torch.long, device=dev)[:, None] for x in (q_offs, k_offs))
    q_len, k_len = (torch.tensor(x, dtype=torch.long, device=dev)[:, None] for x in (ql, kl))
    i = torch.arange(wq, device=dev)[None, :] - q_off  # (R, Wq): the row's index among the real ones
    real = (i >= 0) & (i < q_len)
    last = k_off + k_len - q_len + i  # (R, Wq): the row's last visible key
    j = torch.arange(wk, device=dev)[None, None, :]
    allowed = real[..., None] & (j >= k_off[..., None]) & (j <= last[..., None])  # (R, Wq, Wk)
    allowed = allowed[:, None]
    offsets = q_offs
    if mask_kind == "bool":
        attn_mask = allowed
    else:
        attn_mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        attn_mask.masked_fill_(~allowed, torch.finfo(q.dtype).min)
    return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask, offsets


def padded(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` (SDPA's signature) on a canonical batch: one padded launch (:func:`layout`), each
    request's real rows gathered back to ``o (R, q_max, Hq, D)``, zeros in its padding rows."""

    def subject(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_lens: torch.Tensor,
        lens: torch.Tensor,
        pad: torch.Tensor,
        scale: Any,
        side: str,
        mask: str,
    ) -> torch.Tensor:
        query, key, value, attn_mask, offsets = layout(q, k, v, q_lens, lens, pad, side, mask)
        out = fn(query, key, value, attn_mask=attn_mask, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
        o = torch.zeros(q.shape, dtype=out.dtype, device=out.device)
        for r, (off, n) in enumerate(zip(offsets, (int(x) for x in q_lens.tolist()), strict=True)):
            o[r, :n] = out[r, :, off : off + n].transpose(0, 1)
        return o

    subject.__name__ = getattr(fn, "__name__", NAME)
    subject.__qualname__ = subject.__name__
    subject.__doc__ = f"Padded-launch adapter of {subject.__name__} (harness/components/sdpa_attention.py)."
    return subject


# --- the request model ---------------------------------------------------------------------------


def take(batch: Batch, requests: Sequence[int]) -> Batch:
    """A batch of just those requests (repeats allowed), the case's widths kept."""
    idx = torch.tensor(list(requests), dtype=torch.long, device=batch.rows["q"].device)
    return Batch({name: t.index_select(0, idx) for name, t in batch.rows.items()}, dict(batch.shared))


def _widen(t: torch.Tensor, width: int) -> torch.Tensor:
    if t.shape[1] >= width:
        return t
    tail = torch.full(
        (t.shape[0], width - t.shape[1], *t.shape[2:]), math.nan, dtype=t.dtype, device=t.device
    )
    return torch.cat([t, tail], dim=1)


def concat(parts: Sequence[Batch]) -> Batch:
    """Every part's requests in order, in one launch (rows widened with NaN to the widest); the
    first part's ``side`` and ``mask``."""
    q_max = max(p.rows["q"].shape[1] for p in parts)
    l_max = max(p.rows["k"].shape[1] for p in parts)
    rows = {
        "q": torch.cat([_widen(p.rows["q"], q_max) for p in parts]),
        "k": torch.cat([_widen(p.rows["k"], l_max) for p in parts]),
        "v": torch.cat([_widen(p.rows["v"], l_max) for p in parts]),
        **{name: torch.cat([p.rows[name] for p in parts]) for name in ("q_lens", "lens", "pad")},
    }
    return Batch(rows, dict(parts[0].shared))


def relocate(batch: Batch, generator: torch.Generator) -> Batch:
    """The same requests with other padding: random extra pads in [0, 64] and the other side."""
    rows = dict(batch.rows)
    rows["pad"] = torch.randint(0, 65, rows["pad"].shape, generator=generator).to(rows["pad"])
    shared = {**batch.shared, "side": "right" if batch.shared["side"] == "left" else "left"}
    return Batch(rows, shared)


def repad(batch: Batch, side: str, pads: Sequence[int]) -> Batch:
    """The padding model's layout: ``side`` padding, ``pads[r]`` extra positions for request r."""
    rows = dict(batch.rows)
    rows["pad"] = torch.tensor(list(pads), dtype=torch.int32, device=rows["pad"].device)
    return Batch(rows, {**batch.shared, "side": side})


#: Other requests of co_batch, slot and padding (name, mix, cap on the lengths; 0: the case's
#: longest): short prompts, decode steps and ragged q_lens, within the case's widths.
NEIGHBOUR_MIXES: tuple[tuple[str, str, int], ...] = (
    ("short", "prefill", 8),
    ("decode", "decode", 0),
    ("mixed", "mixed", 0),
)


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """One neighbour case per :data:`NEIGHBOUR_MIXES` entry, ``case``'s shape axes and widths
    (``longest``, so that :func:`concat` joins them), derived seeds."""
    a = dict(case.axes)
    r_count = 4 if lane.is_gpu else 2
    out = {}
    for i, (name, mix, cap) in enumerate(NEIGHBOUR_MIXES):
        axes = {**a, "R": r_count, "mix": mix, "cap": cap}
        out[name] = Case(case.component, axes, seed=case.seed + 7919 * (i + 1))
    return out


def co_batch_sizes(lane: Lane) -> tuple[int, ...]:
    """3, 15 and 47 others on GPU lanes (Hugging Face batches of 4, 16 and 48; a dense launch
    pads every request to the widest, and the fp64 reference holds each (Hq, Wq, Wk) score
    block); 1 and 2 on the cpu lane (the interpreter runs every padded row)."""
    return (1, 3, 15, 47) if lane.is_gpu else (1, 2)


# --- agreement -----------------------------------------------------------------------------------


def bound(batch: Batch, reference: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """decode_attention's derived bound, row for row: request r's keys as a one-request paged
    cache of page size 1, its q_len rows as decode's q_len rows (the same per-row program); 0
    in the padding rows (exactly 0 there)."""
    from batchinv.fast.decode_attention import decode_attention_config
    from batchinv.fast.device import arch

    rows = batch.rows
    q = rows["q"]
    config = decode_attention_config(arch(q.device), q.shape[-1], q.dtype)
    o_bound = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    scale = batch.shared["scale"]
    for r, (ql, n) in enumerate(zip(rows["q_lens"].tolist(), rows["lens"].tolist(), strict=True)):
        k_cache = rows["k"][r, :n].unsqueeze(1).contiguous()  # (n, 1, Hkv, D)
        v_cache = rows["v"][r, :n].unsqueeze(1).contiguous()
        table = torch.arange(n, dtype=torch.int32, device=q.device)[None]
        lens = torch.tensor([n], dtype=torch.int32, device=q.device)
        q_r = rows["q"][r : r + 1, :ql]
        ref = ref_decode.decode_attention(q_r, k_cache, v_cache, table, lens, scale)
        o_r, _ = ref_decode.attention_bound(
            q_r,
            k_cache,
            v_cache,
            table,
            lens,
            scale,
            reference=(reference[0][r : r + 1, :ql], ref[1]),
            split_tokens=config.split_tokens,
            block_n=config.block_n,
        )
        o_bound[r, :ql] = o_r[0]
    return (o_bound,)


def out_dtypes(batch: Batch) -> tuple[torch.dtype, ...]:
    return (batch.rows["q"].dtype,)


# --- error inputs --------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs and the typed error each must raise (fast and reference alike): through the
    adapter, so only what a padded launch can carry (the SDPA-level errors are tested directly)."""
    base = build(
        _case(
            R=2, Hq=4, Hkv=2, D=16, dtype="bfloat16", mix="prefill", longest=8, mask="bool", side="left"
        ).with_seed(3),
        device,
    )
    good = base.kwargs()

    def bad(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    q, k = good["q"], good["k"]
    return [
        ErrorCase("q_float64", bad(q=q.double()), DTypeError, "'query'"),
        ErrorCase("kv_dtype_mismatch", bad(k=k.half()), DTypeError, "'key'"),
        ErrorCase("head_dim_mismatch", bad(k=k[..., :8], v=good["v"][..., :8]), ArgumentError, "'key'"),
        ErrorCase(
            "heads_not_dividing",
            bad(k=k[:, :, :1].expand(-1, -1, 3, -1), v=good["v"][:, :, :1].expand(-1, -1, 3, -1)),
            ArgumentError,
            "'key'",
        ),
        ErrorCase("scale_nan", bad(scale=math.nan), ArgumentError, "'scale'"),
    ]


COMPONENT = Component(
    name=NAME,
    summary="dense attention with SDPA's signature, each query row over its own visible keys (left/right padding invariant)",
    reference=padded(ref_attention.sdpa_attention),
    fast=padded(fast_attention.sdpa_attention),
    baselines=(
        Baseline(
            "torch_sdpa",
            padded(baselines.torch_sdpa),
            "F.scaled_dot_product_attention as torch dispatches it: tiles and splits at absolute "
            "positions of the padded row, so padding before a sequence regroups its keys",
            expected_to_vary_on=GPU_LANES,
        ),
        Baseline(
            "eager_pinned_matmul",
            padded(baselines.eager_pinned_matmul),
            "Hugging Face's eager attention with pinned matmuls and softmax (inside enable()): left "
            "padding moves a row's keys across the probs @ V product's fixed K tiles",
            expected_to_vary_on=GPU_LANES,
            timed=False,
        ),
        Baseline(
            "absolute_splits",
            padded(baselines.absolute_splits),
            "the pinned kernel with its splits counted from key 0 of the padded row instead of the "
            "row's first visible key (a FlashAttention-style kernel's tiling)",
            # The cpu lane's bf16 / fp16 outputs hide the interpreter's fp32 regrouping (rarely a
            # rounded bit moves) and its index walk over every padded slot costs minutes there:
            # GPU lanes only; tests/harness/test_harness_padding.py shows its teeth in fp32.
            expected_to_vary_on=GPU_LANES,
            lanes=GPU_LANES,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "softmax of fp32 scores and an fp32 split merge cannot equal the fp64 reference; the bound "
        "is decode_attention's (reference.decode_attention.attention_bound), row for row: a row "
        "runs decode's per-row program over its own keys",
        out_dtypes=out_dtypes,
    ),
    dtypes=(torch.bfloat16, torch.float16),
    error_cases=error_cases,
    requests=RequestModel(
        take=take, concat=concat, relocate=relocate, neighbours=neighbours, co_batch_sizes=co_batch_sizes
    ),
    padding=PaddingModel(repad),
)
