"""An independent statement of production grouped top-k routing, in plain Python (floats, lists).

The oracle of ``tests/components/test_moe_router_production.py``: it shares no code with
``batchinv`` (nor torch: the caller converts its inputs to Python floats) and follows the
published definition, not the project's reference:

* vLLM's ``grouped_topk`` (``vllm/model_executor/layers/fused_moe/fused_moe.py``, mirrored by
  ``grouped_topk_native`` in ``vllm-project/vllm-xpu-kernels`` ``tests/ops/grouped_topk.py``)::

      scores = softmax(gating_output) | sigmoid(gating_output)          # fp32, [T, E]
      if e_score_correction_bias is not None:
          original_scores = scores
          scores = scores + bias
          group_scores = scores.view(T, n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
      else:
          group_scores = scores.view(T, n_group, -1).max(dim=-1).values
      group_idx = topk(group_scores, k=topk_group)                       # the kept groups
      tmp_scores = scores masked to -inf (or 0) outside the kept groups
      topk_ids = topk(tmp_scores, k=topk)
      topk_weights = original_scores.gather(1, topk_ids) (or scores without a bias)
      if renormalize: topk_weights /= topk_weights.sum(-1)

* DeepSeek-V3's gate (``deepseek-ai/DeepSeek-V3`` ``inference/model.py``, ``Gate.forward``):
  the same group scores (``amax`` without a bias, the top-2 sum with one), the same mask and
  weights from the unbiased scores.

Where the published code leaves an order unspecified (``torch.topk`` on equal values) this
transcription breaks ties to the lower index (the project's rule); the scores used to *rank*
are rounded to fp32 as production computes them (one rounding of the exact score here), the
*weights* are returned unrounded (fp64) so a caller can judge them against its own bound.
NaN inputs are out of scope (the test feeds finite logits).
"""

from __future__ import annotations

import math
import struct

__all__ = ["fp32", "grouped_topk"]


def fp32(x: float) -> float:
    """``x`` rounded to the nearest fp32 value (ties to even), as a Python float."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _top(values: list[float], k: int, allowed: list[bool] | None = None) -> list[int]:
    """The indices of the ``k`` largest values (among ``allowed``), larger first, ties to the
    lower index."""
    index = [i for i in range(len(values)) if allowed is None or allowed[i]]
    return sorted(index, key=lambda i: (-values[i], i))[:k]


def _scores(logits: list[float], scoring: str) -> list[float]:
    """The exact (fp64) softmax or sigmoid scores of one token."""
    if scoring == "softmax":
        m = max(logits)
        exps = [math.exp(x - m) for x in logits]
        total = math.fsum(exps)
        return [e / total for e in exps]
    if scoring == "sigmoid":
        return [1.0 / (1.0 + math.exp(-x)) for x in logits]
    raise ValueError(f"scoring: expected 'softmax' or 'sigmoid', got {scoring!r}")


def grouped_topk(
    logits: list[float],
    top_k: int,
    scoring: str,
    renormalize: bool,
    n_group: int,
    topk_group: int,
    bias: list[float] | None = None,
) -> tuple[list[float], list[int]]:
    """One token's ``(weights, expert ids)`` under production grouped top-k (module docstring).

    Parameters
    ----------
    logits : list of float, length E (finite)
    top_k, n_group, topk_group : int (``n_group`` divides E)
    scoring : "softmax" or "sigmoid"
    renormalize : bool
    bias : list of float, length E, or None (``e_score_correction_bias``)

    Returns
    -------
    (weights, ids) : lists of length ``top_k``, best first: fp64 weights from the unbiased
    scores (renormalized by their sum when asked), and the expert ids.
    """
    num_experts = len(logits)
    size = num_experts // n_group
    exact = _scores(logits, scoring)
    scores = [fp32(s) for s in exact]  # production's fp32 scores
    if bias is not None:
        choice = [fp32(s + b) for s, b in zip(scores, bias, strict=True)]
        group_scores = []
        for g in range(n_group):
            members = choice[g * size : (g + 1) * size]
            best_two = sorted(members, reverse=True)[:2]
            group_scores.append(fp32(sum(best_two)))
    else:
        choice = scores
        group_scores = [max(choice[g * size : (g + 1) * size]) for g in range(n_group)]
    kept = set(_top(group_scores, topk_group))
    allowed = [e // size in kept for e in range(num_experts)]
    ids = _top(choice, top_k, allowed)
    weights = [exact[e] for e in ids]
    if renormalize:
        total = sum(weights)
        weights = [w / total for w in weights]
    return weights, ids
