"""Registry entry ``grouped_gemm``: the MoE grouped GEMM (docs/MOE.md, section 3), request-level
over tokens (a request = a token).

A :class:`Batch` holds ``rows = {"a": [T, K]}`` (``a_per_slot``: ``[T, k, K]``, the down
projection's per-(token, slot) input; dim 0 = tokens) and ``shared``: ``w [E, N, K]``, the align
tensors ``sorted_ids``, ``block_expert``, ``num_padded`` (built from the tokens' routing by
the ``moe_align`` component's reference, with ``block_m`` =
:func:`batchinv.fast.grouped_gemm.block_m` of the device: the one the fast path requires), ``top_k`` and ``a_per_slot``.  The routing is not an argument: :func:`_routing`
reads it back from the align tensors, so :func:`take` / :func:`concat` rebuild them for the new
token set -- that is where an expert's M changes.  Memory no token references is NaN: a NaN row
after ``a``'s last row (a sentinel id read as a row shows), and :func:`relocate` adds NaN gaps
between rows, a NaN K tail to ``w`` and garbage ids past ``num_padded``.

Routing of a case (axis ``home`` = h): each token's k distinct experts are drawn from the case's
*home* set of h experts (all E when h == E).  co_batch's other tokens (:func:`neighbours`):
``flood`` (routed inside the home set: the target's experts get M from 1 to T + co-batch),
``elsewhere`` (outside it: the target's experts hold its rows alone; only when h <= E - k) and
``random`` (uniform over all experts).

Values (axis ``values``): ``normal``; ``special`` (NaN, +-inf, +-0, subnormals injected into
``a``); ``cancel`` (a large activation and its negation that cancel: the fp32 summation order
shows through the bf16 rounding, so per-M reduction changes are visible on tiny shapes).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from batchinv.fast import grouped_gemm as fast_gemm
from batchinv.fast.baselines import grouped_gemm as bl
from batchinv.harness.bitpatterns import catalogue, inject
from batchinv.harness.lanes import Lane
from batchinv.harness.registry import (
    ALL_LANES,
    Baseline,
    Batch,
    Case,
    Component,
    ErrorCase,
    Outputs,
    RequestModel,
    Toleranced,
    token_co_batch_sizes,
)
from batchinv.harness.weights import seeded_normal
from batchinv.reference import grouped_gemm as ref_gemm
from batchinv.reference import moe_align as ref_align
from batchinv.reference.errors import ArgumentError, DeviceError, DTypeError

NAME = "grouped_gemm"
#: Baselines whose only unpinned choice is BLOCK_K: they vary under the interpreter only.
CPU_ONLY: frozenset[Lane] = frozenset({Lane.CPU})
SPECIAL_DENSITY = 0.01
#: The ``cancel`` cases' large activation (exact in bf16), see :func:`build`.
CANCEL = 2.0**17


def _case(
    e: int,
    k: int,
    n: int,
    kdim: int,
    t: int,
    home: int,
    per_slot: bool,
    values: str = "normal",
    seed: int = 0,
) -> Case:
    return Case(
        NAME,
        {
            "E": e,
            "top_k": k,
            "N": n,
            "K": kdim,
            "T": t,
            "home": home,
            "a_per_slot": per_slot,
            "values": values,
        },
        seed,
    )


def cases(lane: Lane) -> list[Case]:
    """cpu lane: tiny shapes (E 4..8, k 2, K 64..128 with partial K tiles, N 16..64, T <= 48);
    GPU lanes: the issue's shapes (gate/up N = 2 I, K = H; down N = H, K = I per slot) of
    Qwen3-30B-A3B (E 128, k 8, H 2048, I 768) and Mixtral (E 8, k 2, H 4096, I 14336)."""
    if not lane.is_gpu:
        return [
            _case(4, 2, 32, 100, 12, 2, False, values="cancel"),
            _case(8, 2, 64, 128, 10, 4, True, values="cancel", seed=1),
            _case(6, 2, 32, 72, 7, 3, True, values="special", seed=2),
            _case(8, 2, 48, 100, 1, 8, False, values="cancel", seed=3),
            # ordinary values: tight bounds of a few bf16 ulps, so agreement has precision (review)
            _case(6, 2, 40, 72, 9, 3, False, seed=4),
            # more tokens than any other cpu launch (a config keyed on T above 12 shows here)
            _case(4, 2, 16, 72, 48, 4, False, values="cancel", seed=5),
        ]
    return [
        _case(128, 8, 1536, 2048, 64, 128, False),
        _case(128, 8, 1536, 2048, 2048, 8, False, values="cancel", seed=1),
        _case(128, 8, 2048, 768, 64, 16, True, seed=2),
        _case(128, 8, 2048, 768, 33, 128, True, values="special", seed=3),
        _case(8, 2, 28672, 4096, 32, 8, False, seed=4),
        _case(8, 2, 4096, 14336, 32, 2, True, values="cancel", seed=5),
    ]


# --- routing <-> align tensors --------------------------------------------------------------------


def _align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sorted_ids, block_expert, num_padded)`` of ``topk_ids [T, k]`` (any integer dtype, CPU):
    the ``moe_align`` component's reference (:func:`batchinv.reference.moe_align.moe_align`,
    exact, and bitwise equal to the fast kernel by that component's agreement check), so the
    harness has one align implementation."""
    return ref_align.moe_align(topk_ids.to(torch.int32).cpu(), num_experts, block_m)


def _routing(batch: Batch) -> torch.Tensor:
    """``topk_ids [T, k]`` (CPU int64) read back from the batch's align tensors."""
    s = batch.shared
    a = batch.rows["a"]
    t, k = a.shape[0], int(s["top_k"])
    ids = s["sorted_ids"].cpu().to(torch.int64)
    used = int(s["num_padded"].cpu()[0])
    bm = (ids.numel() - t * k) // s["w"].shape[0] + 1
    experts = s["block_expert"].cpu().to(torch.int64).repeat_interleave(bm)[:used]
    ids = ids[:used]
    keep = ids < t * k
    out = torch.full((t * k,), -1, dtype=torch.int64)
    out[ids[keep]] = experts[keep]
    return out.view(t, k)


def _nan_tail(a: torch.Tensor) -> torch.Tensor:
    """``a`` (dim 0 = tokens) copied into a buffer one NaN token longer: a read of the sentinel
    row (``T`` or ``T * k``) sees NaN."""
    buf = torch.full((a.shape[0] + 1, *a.shape[1:]), math.nan, dtype=a.dtype, device=a.device)
    buf[: a.shape[0]] = a
    return buf[: a.shape[0]]


def _assemble(a: torch.Tensor, topk_ids: torch.Tensor, shared: dict[str, Any]) -> Batch:
    """A batch of tokens ``a`` routed by ``topk_ids``, align tensors built for its lane."""
    w = shared["w"]
    bm = fast_gemm.block_m(w.device)
    ids, be, npad = _align(topk_ids, w.shape[0], bm)
    dev = w.device
    return Batch(
        {"a": _nan_tail(a)},
        {**shared, "sorted_ids": ids.to(dev), "block_expert": be.to(dev), "num_padded": npad.to(dev)},
    )


def _weight_seed(axes: dict[str, Any]) -> int:
    key = {name: axes[name] for name in ("E", "top_k", "N", "K", "a_per_slot")}
    return zlib.crc32(repr(sorted(key.items())).encode())


def _home_set(axes: dict[str, Any]) -> torch.Tensor:
    """The case's home experts: ``home`` of the E experts, a fixed draw of the shape axes."""
    gen = torch.Generator().manual_seed(_weight_seed(axes) + 17)
    return torch.randperm(int(axes["E"]), generator=gen)[: int(axes["home"])]


def _draw_routing(t: int, k: int, pool: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    rows = [pool[torch.randperm(pool.numel(), generator=gen)[:k]] for _ in range(t)]
    return torch.stack(rows) if rows else torch.zeros(0, k, dtype=torch.int64)


def build(case: Case, device: torch.device) -> Batch:
    """The batch of ``case``: w from a seed of the shape axes (so co-batched cases share it; on a
    GPU drawn there), routing and ``a`` from ``case.seed``; axis ``routing`` (neighbour cases
    only): ``home`` (default), ``away`` (outside the home set) or ``all``."""
    ax = dict(case.axes)
    e, k, n, kdim, t = (int(ax[x]) for x in ("E", "top_k", "N", "K", "T"))
    per_slot = bool(ax["a_per_slot"])
    wseed = _weight_seed(ax)
    wgen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(wseed)
    w = seeded_normal((e, n, kdim), wgen, 1 / math.sqrt(kdim), device)
    w[..., -1] = w[..., 0]  # (the cancel cases' design; harmless elsewhere)
    gen = torch.Generator().manual_seed(case.seed)
    home = _home_set(ax)
    kind = ax.get("routing", "home")
    if kind == "home":
        pool = home
    elif kind == "away":
        mask = torch.ones(e, dtype=torch.bool)
        mask[home] = False
        pool = mask.nonzero().flatten()
    else:
        pool = torch.arange(e)
    topk_ids = _draw_routing(t, k, pool, gen)
    shape = (t, k, kdim) if per_slot else (t, kdim)
    a = torch.randn(shape, generator=gen).to(torch.bfloat16)
    if ax["values"] == "special":
        patterns = [p for p in catalogue(torch.bfloat16) if "max_normal" not in p.name]
        a = inject(a, patterns, SPECIAL_DENSITY * 5, gen)
    elif ax["values"] == "cancel":
        # +-CANCEL at k = 0 and its negation at k = K - 1 (w's columns 0 and K - 1 are equal):
        # they cancel exactly at the end, but every partial sum between is ~CANCEL |w|, so fp32
        # rounding there is visible after the bf16 rounding -- another summation order or
        # grouping changes the bits (it would hide behind bf16 on ordinary data).
        sign = (torch.randint(2, shape[:-1], generator=gen) * 2 - 1).to(torch.bfloat16)
        a[..., 0] = sign * CANCEL
        a[..., -1] = -sign * CANCEL
    shared = {"w": w, "top_k": k, "a_per_slot": per_slot}
    return _assemble(a.to(device), topk_ids, shared)


# --- the request model ---------------------------------------------------------------------------


def take(batch: Batch, requests: Sequence[int] | torch.Tensor) -> Batch:
    """The tokens at ``requests`` (in that order, repeats allowed), align tensors rebuilt."""
    idx = torch.as_tensor(
        list(requests) if not isinstance(requests, torch.Tensor) else requests, dtype=torch.long
    )
    a = batch.rows["a"]
    topk = _routing(batch).index_select(0, idx)
    shared = {k: v for k, v in batch.shared.items() if k not in ("sorted_ids", "block_expert", "num_padded")}
    return _assemble(a.index_select(0, idx.to(a.device)), topk, shared)


def concat(parts: Sequence[Batch]) -> Batch:
    """The tokens of every part in order, in one launch (align tensors rebuilt); the parts must
    share ``w``, ``top_k`` and ``a_per_slot``."""
    first = parts[0].shared
    for p in parts[1:]:
        s = p.shared
        if s["top_k"] != first["top_k"] or s["a_per_slot"] != first["a_per_slot"]:
            raise ValueError("concat: parts with different top_k / a_per_slot")
        if s["w"] is not first["w"] and not torch.equal(s["w"], first["w"]):
            raise ValueError("concat: parts with different expert weights")
    a = torch.cat([p.rows["a"] for p in parts])
    topk = torch.cat([_routing(p) for p in parts])
    shared = {k: v for k, v in first.items() if k not in ("sorted_ids", "block_expert", "num_padded")}
    return _assemble(a, topk, shared)


def relocate(batch: Batch, generator: torch.Generator) -> Batch:
    """The same tokens in other memory: ``a``'s rows apart by a NaN gap (and a NaN row past the
    end), ``w`` with a NaN K tail per row, ids past ``num_padded`` random (never read)."""
    a = batch.rows["a"]
    kdim = a.shape[-1]
    gap = 1 + int(torch.randint(8, (1,), generator=generator))
    buf = torch.full((a.shape[0] + 1, *a.shape[1:-1], kdim + gap), math.nan, dtype=a.dtype, device=a.device)
    buf[: a.shape[0], ..., :kdim] = a
    w = batch.shared["w"]
    wbuf = torch.full((*w.shape[:-1], w.shape[-1] + gap), math.nan, dtype=w.dtype, device=w.device)
    wbuf[..., : w.shape[-1]] = w
    ids = batch.shared["sorted_ids"].clone()
    used = int(batch.shared["num_padded"].cpu()[0])
    valid = a.shape[0] * int(batch.shared["top_k"])
    tail = ids.numel() - used
    if tail:
        ids[used:] = torch.randint(valid + 1, (tail,), generator=generator, dtype=torch.int32).to(ids.device)
    return Batch(
        {"a": buf[: a.shape[0], ..., :kdim]},
        {**batch.shared, "w": wbuf[..., : w.shape[-1]], "sorted_ids": ids},
    )


#: Other tokens per neighbour case (co_batch cycles them to reach its sizes): few on the cpu
#: lane (slot launches all of them with the target; the interpreter is slow), 32 on GPU lanes.
NEIGHBOUR_TOKENS = {False: 4, True: 32}


def neighbours(case: Case, lane: Lane) -> dict[str, Case]:
    """The other tokens of co_batch and slot, one case per routing mix (the case's shape axes,
    derived seeds): ``flood`` (inside the home set: the target's experts get the co-batch's
    rows), ``elsewhere`` (outside it, when the complement has k experts) and ``random``."""
    ax = dict(case.axes)
    count = NEIGHBOUR_TOKENS[lane.is_gpu]
    kinds = {"flood": "home", "elsewhere": "away", "random": "all"}
    if int(ax["E"]) - int(ax["home"]) < int(ax["top_k"]):
        del kinds["elsewhere"]
    out = {}
    for i, (mix, routing) in enumerate(kinds.items()):
        axes = {**ax, "T": count, "values": "normal", "routing": routing}
        out[mix] = Case(case.component, axes, seed=case.seed + 7919 * (i + 1))
    return out


# --- agreement ---------------------------------------------------------------------------------


def accumulation_group(batch: Batch) -> int:
    """Products per accumulation step: the interpreter's BLOCK_K tile (one ``tl.sum``), 16 on a
    GPU (a tensor-core MMA's k-step)."""
    a = batch.rows["a"]
    if a.device.type != "cuda":
        w = batch.shared["w"]
        return fast_gemm.select_config("interp", a.dtype, 16, w.shape[1], w.shape[2]).block_k
    return 16


def bound(batch: Batch, reference: Outputs) -> Outputs:
    """Any-order fp32 bound per element (:func:`batchinv.reference.grouped_gemm.tolerance_bound`)."""
    return (ref_gemm.tolerance_bound(**batch.kwargs(), reference=reference[0]),)


def tight(batch: Batch, reference: Outputs) -> Outputs:
    """The judged bound: increasing k by groups of :func:`accumulation_group`."""
    return (
        ref_gemm.tolerance_bound(**batch.kwargs(), reference=reference[0], group=accumulation_group(batch)),
    )


# --- config_equivalence ----------------------------------------------------------------------


def _realigned(fn: Any, block_m: int) -> Any:
    """``fn`` run on the batch's routing aligned again with ``block_m`` (the same tokens, slots
    and experts; other padding and blocks)."""

    def call(**kw: Any) -> torch.Tensor:
        batch = Batch({"a": kw["a"]}, {k: v for k, v in kw.items() if k != "a"})
        ids, be, npad = _align(_routing(batch), kw["w"].shape[0], block_m)
        dev = kw["w"].device
        moved = {**kw, "sorted_ids": ids.to(dev), "block_expert": be.to(dev), "num_padded": npad.to(dev)}
        return fn(**moved)

    return call


def configs(batch: Batch, lane: Lane) -> dict[str, Any]:
    """Every execution the launcher can pick for the batch's (N, K) besides the one it ran:
    each ``block_m`` of the device's tile table (the routing aligned again with it) with its
    tile, and on GPU lanes each with the other warps count and one stage fewer.  Always the
    table's BLOCK_K.  Named ``BMxBNxBK wW sS``."""
    w = batch.shared["w"]
    key = fast_gemm.arch_key(w.device)
    n, kdim = int(w.shape[1]), int(w.shape[2])
    rows = int(batch.rows["a"].shape[0]) * int(batch.shared["top_k"])
    ran_bm = (int(batch.shared["sorted_ids"].shape[0]) - rows) // int(w.shape[0]) + 1  # the align's
    ran = fast_gemm.select_config(key, torch.bfloat16, ran_bm, n, kdim)
    out: dict[str, Any] = {}
    for bm in sorted(fast_gemm.TILES[key]):
        cfg = fast_gemm.select_config(key, torch.bfloat16, bm, n, kdim)
        variants = [cfg]
        if lane.is_gpu:
            variants.append(
                replace(cfg, num_warps=8 if cfg.num_warps == 4 else 4, num_stages=max(2, cfg.num_stages - 1))
            )
        for v in variants:
            if v == ran:
                continue
            name = f"{v.block_m}x{v.block_n}x{v.block_k} w{v.num_warps} s{v.num_stages}"
            out[name] = _realigned(functools.partial(fast_gemm.grouped_gemm, config=v), bm)
    return out


# --- error inputs --------------------------------------------------------------------------------


def error_cases(device: torch.device) -> list[ErrorCase]:
    """Bad inputs and the typed error each must raise (fast and reference alike)."""
    good_batch = build(_case(4, 2, 32, 64, 3, 4, False, seed=5), device)
    good = good_batch.kwargs()

    def bad(**changes: Any) -> dict[str, Any]:
        return {**good, **changes}

    a, w, ids, be, npad = good["a"], good["w"], good["sorted_ids"], good["block_expert"], good["num_padded"]
    valid = a.shape[0] * 2
    out_of_range = ids.clone()
    out_of_range[0] = valid + 1
    negative = ids.clone()
    negative[0] = -1
    duplicated = ids.clone()
    duplicated[1] = duplicated[0]
    bad_expert = be.clone()
    bad_expert[0] = 4
    bad_tail = be.clone()
    bad_tail[-1] = 0
    # the align of the same routing with a block_m the device's tile table lacks: valid for the
    # reference, refused by the fast path
    half_ids, half_be, half_np = _align(
        _routing(good_batch), 4, 2 * max(fast_gemm.TILES[fast_gemm.arch_key(device)])
    )
    return [
        ErrorCase("k_mismatch", bad(w=w[..., :32]), ArgumentError, "'w'.*K = 64"),
        ErrorCase("w_not_3d", bad(w=w[0]), ArgumentError, "'w'.*3-D"),
        ErrorCase("a_not_2d", bad(a=a[None]), ArgumentError, "'a'"),
        ErrorCase("a_float32", bad(a=a.float()), DTypeError, "'a'"),
        ErrorCase("w_float16", bad(w=w.half()), DTypeError, "'w'"),
        ErrorCase("ids_int64", bad(sorted_ids=ids.long()), DTypeError, "'sorted_ids'"),
        ErrorCase("block_expert_int64", bad(block_expert=be.long()), DTypeError, "'block_expert'"),
        ErrorCase("num_padded_int64", bad(num_padded=npad.long()), DTypeError, "'num_padded'"),
        ErrorCase("top_k_float", bad(top_k=2.0), DTypeError, "'top_k'"),
        ErrorCase("top_k_zero", bad(top_k=0), ArgumentError, "'top_k'"),
        ErrorCase("per_slot_rows", bad(top_k=2, a_per_slot=True, a=a[:3]), ArgumentError, "'a'"),
        ErrorCase("id_out_of_range", bad(sorted_ids=out_of_range), ArgumentError, "'sorted_ids'"),
        ErrorCase("id_negative", bad(sorted_ids=negative), ArgumentError, "'sorted_ids'"),
        ErrorCase("id_repeated", bad(sorted_ids=duplicated), ArgumentError, "'sorted_ids'"),
        ErrorCase("expert_out_of_range", bad(block_expert=bad_expert), ArgumentError, "'block_expert'"),
        ErrorCase("expert_past_num_padded", bad(block_expert=bad_tail), ArgumentError, "'block_expert'"),
        ErrorCase("block_expert_length", bad(block_expert=be[:-1]), ArgumentError, "'block_expert'"),
        ErrorCase("sorted_ids_length", bad(sorted_ids=ids[:-1]), ArgumentError, "'sorted_ids'"),
        ErrorCase(
            "num_padded_not_block_multiple",
            bad(num_padded=npad + 1),
            ArgumentError,
            "'num_padded'",
        ),
        ErrorCase(
            "block_m_not_the_devices",
            bad(
                sorted_ids=half_ids.to(device), block_expert=half_be.to(device), num_padded=half_np.to(device)
            ),
            ArgumentError,
            "'block_expert'.*block_m one of",
            applies_to=("fast",),
        ),
        ErrorCase("w_on_meta", bad(w=w.to("meta")), DeviceError, "'w'"),
        ErrorCase(
            "ids_other_device",
            bad(sorted_ids=ids.to("meta") if device.type == "cpu" else ids.cpu()),
            DeviceError,
            "'sorted_ids'",
        ),
    ]


COMPONENT = Component(
    name=NAME,
    summary="MoE grouped GEMM over align-sorted (token, slot) rows, one expert per BLOCK_M block",
    reference=ref_gemm.grouped_gemm,
    fast=fast_gemm.grouped_gemm,
    baselines=(
        Baseline(
            "split_k_small_m",
            bl.split_k_small_m,
            "split-K for experts with a small M (4 K slices at M <= 1, 2 at M <= 3 on the interpreter; "
            "16 / 64 on GPUs), fp32 partials added pairwise after: another reduction tree per expert M",
            expected_to_vary_on=ALL_LANES,
        ),
        Baseline(
            "bucket_block_k",
            bl.bucket_block_k,
            "a per-M-bucket config (vLLM's tuned configs per batch bucket): BLOCK_K halved for experts "
            "whose M is at or below the bucket threshold (identical bits on the H200: BLOCK_K is not a "
            "reduction choice for tensor-core dots there, fast/baselines/grouped_gemm.py)",
            expected_to_vary_on=CPU_ONLY,
        ),
        Baseline(
            "token_count_configs",
            bl.token_count_configs,
            "the config, BLOCK_K included, from the launch's token count (vLLM's tuned per-T tables): a "
            "token's summation order follows how many tokens share the launch (on the interpreter; identical "
            "bits on the H200, as bucket_block_k)",
            expected_to_vary_on=CPU_ONLY,
        ),
        Baseline(
            "other_block_k",
            bl.other_block_k,
            "config_equivalence's negative control: the table's config with half its BLOCK_K (another "
            "association of each fp32 sum on the interpreter; identical bits on the H200)",
            expected_to_vary_on=CPU_ONLY,
            config_control=True,
        ),
        Baseline(
            "two_k_slices",
            bl.two_k_slices,
            "config_equivalence's negative control on every lane: K always cut in two slices whose fp32 "
            "partials are added after (batch-invariant, but another summation tree)",
            expected_to_vary_on=ALL_LANES,
            config_control=True,
        ),
    ),
    cases=cases,
    build=build,
    agreement=Toleranced(
        bound,
        "a K-long fp32 dot of exact bf16 products and one rounding to bf16 cannot equal the fp64 "
        "reference; per expert the matmul bound (reference.matmul.tolerance_bound: gamma_K |a| |w| + "
        "underflow + one bf16 rounding) of its gathered rows",
        out_dtypes=lambda batch: (torch.bfloat16,),
        tight_bound=tight,
        tight_justification=(
            "the kernel adds the K products to one fp32 accumulator in increasing k, BLOCK_K at a time "
            "(the interpreter's tl.sum) or 16 (an MMA k-step): reference.matmul.tight_bound of each "
            "expert's gathered rows in that grouping"
        ),
    ),
    lanes=ALL_LANES,
    dtypes=(torch.bfloat16,),
    error_cases=error_cases,
    requests=RequestModel(
        take=take,
        concat=concat,
        relocate=relocate,
        neighbours=neighbours,
        co_batch_sizes=token_co_batch_sizes,
    ),
    configs=configs,
)
