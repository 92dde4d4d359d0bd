"""Reference MoE router: exact fp32 selection keys, stable sorts, fp64 weights (docs/MOE.md, 1).

Dimension legend:
    T: num_tokens    rows of the launch (one token each)
    E: num_experts   columns of ``logits``
    k: top_k         routed experts per token (slots)
    G: n_group       expert groups (DeepSeek-V3 grouped top-k); S = E / G experts per group

Selection.  Each expert gets an fp32 *selection value* ``v``:

* ``scoring="softmax"``: ``v = logit`` (softmax is monotone), NaNs with their own bits;
* ``scoring="sigmoid"``: ``v = fp32(sigmoid64(logit)) [+ bias]``: ``sigmoid64(x) =
  1 / (1 + exp(-x))`` in fp64 (``x`` the fp32 logit read exactly), rounded once to fp32, then
  one fp32 add of ``correction_bias`` when given; a NaN ``v`` is canonicalized to the quiet NaN
  0x7fc00000 (its bits after fp64 arithmetic are not portable).

Ranking is by :func:`batchinv.reference.topk.monotone_key` of ``v`` (``-0`` as ``+0``, positive
NaNs above ``+inf``, negative NaNs below ``-inf``), exact ties to the lower expert id.

Groups (``n_group > 1``), as vLLM's ``grouped_topk`` and DeepSeek-V3's group-limited routing
(``MoEGate`` / ``Gate``) rank them: without a correction bias a group's score is its best
expert's value (the largest key of the group: softmax being monotone, the best logit ranks as
the best softmax score); with a bias it is ``fp32(a + b)`` where ``a``, ``b`` are the values of
the group's two best keys (biased sigmoid values, read back from the keys, so ``-0`` reads
``+0``; ``a`` alone when ``S == 1``).  The ``topk_group`` groups with the largest keys of their
score are kept (ties to the lower group) and the ``k`` experts are chosen among the kept groups'
experts only (never an expert of a dropped group, never a duplicate id).

NaN groups rank as the ungrouped path ranks NaN experts.  Without a bias a group's key is its
best expert's key, so a group holding a positive NaN ranks above every group without one, and a
group whose experts are all negative NaNs ranks below every group with a non-NaN expert (a
negative NaN ranks below ``-inf``).  With a bias every NaN value is the canonical positive NaN
(sigmoid values are canonicalized), ranking above ``+inf``; a NaN sum (a NaN member, or ``+inf +
-inf``) is canonicalized to it too, so such a group ranks above every group with a non-NaN sum.

Weights: the chosen experts' scores in fp64 -- softmax over all E ``exp(x - m) / sum_e exp(x_e -
m)`` with ``m`` the largest non-NaN logit, or ``sigmoid64(x)`` (never the bias) -- divided by
their sum over slots j = 0..k-1 (added in slot order) when ``renormalize``.  The reference
returns them in fp64: the contract's output is that value rounded once to fp32.  IEEE
propagation: a row with a NaN or ``+inf`` logit, or with every logit ``-inf``, has NaN softmax
weights (the ids are still defined by the keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from batchinv.reference.errors import (
    MAX_SIZE,
    ArgumentError,
    DTypeError,
    check_int,
    check_same_device,
    check_tensor,
)
from batchinv.reference.exact import round_once
from batchinv.reference.topk import monotone_key

__all__ = [
    "CANONICAL_NAN_BITS",
    "SCORINGS",
    "Routing",
    "group_keys",
    "moe_router",
    "route",
    "selection_keys",
    "selection_values",
    "value_of_key",
]

#: The scoring functions of the contract.
SCORINGS: tuple[str, ...] = ("softmax", "sigmoid")
#: The quiet NaN every computed NaN selection value is replaced by (sigmoid values, group sums).
CANONICAL_NAN_BITS = 0x7FC00000
_MAGNITUDE_MASK = 0x7FFFFFFF


def _integral(name: str, value: Any) -> int:
    """The one integer rule (:func:`~batchinv.reference.errors.check_int`); the ranges are
    checked by the caller."""
    return check_int(name, value, -MAX_SIZE - 1)


@dataclass(frozen=True)
class Routing:
    """The routing choice of :func:`moe_router` (and of the MoE layer), validated in one place.

    The public functions keep their keyword arguments; each builds one ``Routing`` from them and
    calls :meth:`validate` (or :meth:`for_logits`) once, then passes the validated object on.

    Attributes:
        top_k: experts per token, in ``[1, E]`` and at most ``topk_group * E / n_group``.
        scoring: "softmax" or "sigmoid".
        renormalize: divide the chosen scores by their slot-order sum.
        correction_bias: float32 ``[E]`` (sigmoid only) or None.
        n_group, topk_group: grouped top-k (1, 1: plain top-k).
    """

    top_k: int
    scoring: str = "softmax"
    renormalize: bool = False
    correction_bias: torch.Tensor | None = None
    n_group: int = 1
    topk_group: int = 1

    @property
    def grouped(self) -> bool:
        """Whether groups are dropped before the selection (``n_group > 1`` and some not kept)."""
        return self.n_group > 1 and self.topk_group < self.n_group

    def validate(self, num_experts: int, device: torch.device | None = None) -> Routing:
        """This choice checked against ``num_experts`` (and the logits' ``device`` when given),
        with its integral fields as Python ints.

        Raises:
            DTypeError: an integral field that is not one (or a bool), ``renormalize`` not a
                bool, ``correction_bias`` not float32.
            ArgumentError: ``scoring`` not "softmax" or "sigmoid"; ``top_k < 1`` or ``top_k >
                E``; ``n_group < 1`` or not dividing E; ``topk_group`` outside ``[1, n_group]``;
                ``top_k`` more than the kept groups hold (``topk_group * E / n_group``);
                ``correction_bias`` not ``[E]`` or given with softmax.
            DeviceError: ``correction_bias`` on another device than ``device``, or on meta.
        """
        if not isinstance(self.scoring, str) or self.scoring not in SCORINGS:
            raise ArgumentError("scoring", "'softmax' or 'sigmoid'", self.scoring)
        if not isinstance(self.renormalize, bool):
            raise DTypeError("renormalize", "a bool", type(self.renormalize).__name__)
        top_k = _integral("top_k", self.top_k)
        if top_k < 1 or top_k > num_experts:
            raise ArgumentError("top_k", f"an int in [1, E = {num_experts}]", top_k)
        n_group = _integral("n_group", self.n_group)
        if n_group < 1 or num_experts % n_group:
            raise ArgumentError("n_group", f"an int >= 1 dividing E = {num_experts}", n_group)
        topk_group = _integral("topk_group", self.topk_group)
        if topk_group < 1 or topk_group > n_group:
            raise ArgumentError("topk_group", f"an int in [1, n_group = {n_group}]", topk_group)
        kept = topk_group * (num_experts // n_group)
        if top_k > kept:
            raise ArgumentError(
                "top_k", f"at most topk_group * E / n_group = {kept} (the kept experts)", top_k
            )
        bias = self.correction_bias
        if bias is not None:
            if self.scoring != "sigmoid":
                raise ArgumentError("correction_bias", "None with scoring='softmax'", "a tensor")
            check_tensor("correction_bias", bias, dtypes=(torch.float32,), ndim=1)
            if bias.shape[0] != num_experts:
                raise ArgumentError("correction_bias", f"length E = {num_experts}", bias.shape[0])
            if device is not None:
                check_same_device("correction_bias", bias, device)
        return replace(self, top_k=top_k, n_group=n_group, topk_group=topk_group)

    def for_logits(self, logits: Any) -> Routing:
        """Check ``logits`` (float32 ``[T, E]``), then :meth:`validate` against its E and device.

        Raises:
            DTypeError: ``logits`` not a float32 tensor; see :meth:`validate`.
            ArgumentError: ``logits`` not 2-D; see :meth:`validate`.
            DeviceError: ``logits`` on the meta device; see :meth:`validate`.
        """
        check_tensor("logits", logits, dtypes=(torch.float32,), ndim=2)
        return self.validate(logits.shape[1], logits.device)


def _canonical_nan(v: torch.Tensor) -> torch.Tensor:
    nan = torch.tensor(CANONICAL_NAN_BITS, dtype=torch.int32, device=v.device).view(torch.float32)
    return torch.where(torch.isnan(v), nan, v)


def sigmoid64(x: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-x))`` in fp64, ``x`` read exactly (this formula, not ``torch.sigmoid``)."""
    x64 = x.to(torch.float64)
    return 1.0 / (1.0 + torch.exp(-x64))


def selection_values(
    logits: torch.Tensor, scoring: str, correction_bias: torch.Tensor | None
) -> torch.Tensor:
    """The fp32 selection value of every expert ``[T, E]`` (see the module docstring)."""
    if scoring == "softmax":
        return logits.resolve_neg()
    v = sigmoid64(logits).to(torch.float32)  # [T, E] one rounding
    if correction_bias is not None:
        v = v + correction_bias.resolve_neg()[None, :]  # one fp32 add
    return _canonical_nan(v)


def selection_keys(logits: torch.Tensor, scoring: str, correction_bias: torch.Tensor | None) -> torch.Tensor:
    """int32 ``[T, E]``: :func:`monotone_key` of :func:`selection_values`."""
    return monotone_key(selection_values(logits, scoring, correction_bias))


def value_of_key(key: torch.Tensor) -> torch.Tensor:
    """The fp32 value of a monotone key (its inverse; ``-0`` comes back as ``+0``)."""
    bits = torch.where(key < 0, key ^ _MAGNITUDE_MASK, key)
    return bits.view(torch.float32)


def group_keys(key: torch.Tensor, n_group: int, pair: bool) -> torch.Tensor:
    """int32 ``[T, G]``: the key of each group's score (see the module docstring).

    ``pair`` (a correction bias is given): the fp32 sum of the group's two best values, a NaN
    sum canonicalized; otherwise the group's best key itself (vLLM's ``max`` over the group).
    """
    num_tokens, num_experts = key.shape
    grouped = key.reshape(num_tokens, n_group, num_experts // n_group)  # [T, G, S]
    best = torch.sort(grouped, dim=2, descending=True, stable=True).values  # [T, G, S]
    if not pair or grouped.shape[2] == 1:
        return best[:, :, 0]
    total = value_of_key(best[:, :, 0].contiguous()) + value_of_key(best[:, :, 1].contiguous())  # fp32
    return monotone_key(_canonical_nan(total))


def _ranked(key: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Columns ordered by (eligible, key descending, column ascending): two stable sorts."""
    by_key = torch.sort(key, dim=1, descending=True, stable=True).indices
    first = torch.sort(eligible.gather(1, by_key).to(torch.int8), dim=1, descending=True, stable=True)
    return by_key.gather(1, first.indices)


def moe_router(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to its ``top_k`` experts (reference; fp64 weights).

    Args:
        logits: float32 ``[T, E]``, any strides, every bit pattern allowed.
        top_k: integral in ``[1, E]`` (and ``<= topk_group * E / n_group``).
        scoring: "softmax" or "sigmoid".
        renormalize: divide the chosen scores by their sum (fp64, slot order).
        correction_bias: float32 ``[E]`` (sigmoid only) or None: added to the fp32 sigmoid for
            the selection, never to the weights (DeepSeek-V3's ``e_score_correction_bias``).
        n_group, topk_group: grouped top-k (1, 1: plain top-k).

    Returns:
        ``(topk_weights float64 [T, k], topk_ids int32 [T, k])``: slot j holds the j-th best
        expert (key descending, ties to the lower id).  The fast kernel returns the weights
        rounded once to fp32.  A token's outputs depend on its own logits only (row-wise).

    Raises:
        DTypeError, ArgumentError, DeviceError: see :meth:`Routing.for_logits`.

    Source:
        docs/MOE.md section 1; keys as :mod:`batchinv.reference.topk`; grouped top-k as vLLM's
        ``grouped_topk`` (vllm/model_executor/layers/fused_moe) and DeepSeek-V3's ``Gate``
        (inference/model.py): group score = the best score without a bias, the sum of the two
        best biased scores with one.
    """
    routing = Routing(top_k, scoring, renormalize, correction_bias, n_group, topk_group)
    return route(logits, routing.for_logits(logits))


def route(logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moe_router` on a ``routing`` already validated against ``logits`` (no checks)."""
    top_k, scoring, correction_bias = routing.top_k, routing.scoring, routing.correction_bias
    n_group, topk_group = routing.n_group, routing.topk_group
    num_tokens, num_experts = logits.shape
    device = logits.device
    key = selection_keys(logits, scoring, correction_bias)  # [T, E] int32
    eligible = torch.ones(num_tokens, num_experts, dtype=torch.bool, device=device)
    if routing.grouped and num_tokens:
        gkey = group_keys(key, n_group, correction_bias is not None)  # [T, G]
        order = torch.sort(gkey, dim=1, descending=True, stable=True).indices  # [T, G]
        kept = torch.zeros(num_tokens, n_group, dtype=torch.bool, device=device)
        kept.scatter_(1, order[:, :topk_group], True)
        eligible = kept.repeat_interleave(num_experts // n_group, dim=1)  # [T, E]
    ids = _ranked(key, eligible)[:, :top_k]  # [T, k] int64
    assert bool(eligible.gather(1, ids).all()), "an expert of a dropped group was chosen"

    x64 = logits.resolve_neg().to(torch.float64)  # [T, E]
    chosen = x64.gather(1, ids)  # [T, k]
    if scoring == "softmax":
        finite_or_inf = torch.where(torch.isnan(x64), torch.full_like(x64, float("-inf")), x64)
        m = finite_or_inf.amax(dim=1, keepdim=True) if num_experts else x64[:, :1]  # [T, 1]
        total = torch.exp(x64 - m).sum(dim=1, keepdim=True)  # [T, 1]
        p = torch.exp(chosen - m) / total  # [T, k]
    else:
        p = sigmoid64(chosen)
    if routing.renormalize:
        denom = p[:, 0]
        for j in range(1, top_k):
            denom = denom + p[:, j]
        p = p / denom[:, None]
    return p, ids.to(torch.int32)


# --- tolerance ---------------------------------------------------------------------------------

#: fp64's unit roundoff.
U64 = 2.0**-53
#: A score below fp64's normal range (``2^-1022``) may be off by its whole value: exp's subnormal
#: results carry absolute, not relative, errors and sigmoid's ``exp(-x)`` may overflow to inf on
#: one side only at its edge.  Absolute slack per score (both sides): far below fp32's 2^-150.
SCORE_ABS = 2.0**-1021


def weights_envelope(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    *,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` float64 ``[T, k]``: the fp32 values a fast weight may take (both ends in),
    for a kernel that computes :func:`moe_router`'s fp64 weights and rounds them once to fp32.

    Both sides compute the same fp64 operations in the same order except two: ``exp`` (libm,
    NumPy or libdevice, each within 1 fp64 ULP of the true value, so two of them within
    ``2^-51`` relative) and the softmax denominator's summation order over E positive terms
    (each order within ``(E - 1) u64`` of the exact sum).  A chosen score then differs by at most
    ``d = (2 E + 8) u64`` relative, a renormalized weight by ``2 d`` plus its slot sum's
    ``k u64``: ``delta = (4 E + 2 k + 16) u64``, plus ``2 u64`` for forming ``v +- s`` below.
    Absolute: :data:`SCORE_ABS` per score; renormalized, ``(k + 2) SCORE_ABS / S`` with ``S`` the
    reference's sum of the chosen scores (infinite where ``S < 2^-1000``: no such row in the
    cases).  So the kernel's fp64 weight lies in ``[v - s, v + s]``, ``s = delta |v| + abs``, and
    it is rounded once (to nearest) to fp32: rounding is monotone, so the fast weight is one of
    the fp32 values from ``lo = fp32(v - s)`` to ``hi = fp32(v + s)``.  For these ``s`` (~2^-44
    relative) that is ``fp32(v)`` alone, or the two fp32 neighbours of ``v`` where a rounding
    midpoint lies within ``s`` of ``v``: never a full ULP away from the correctly rounded value.

    Parameters
    ----------
    logits, top_k, scoring, renormalize, correction_bias, n_group, topk_group :
        The arguments of :func:`moe_router` (logits float32 ``[T, E]``).
    weights : Tensor [T, k], float64
        The reference weights ``v``: :func:`moe_router`'s first output for these arguments.

    Returns
    -------
    (lo, hi) : Tensors [T, k], float64 (values of fp32), on ``weights``' device; NaN where ``v``
    is NaN.

    Source: the derivation above (fp64 libm accuracy; Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., section 4.2, for the summation orders).
    """
    num_experts = logits.shape[1]
    top_k = int(top_k)
    delta = (4 * num_experts + 2 * top_k + 18) * U64
    absolute = torch.full_like(weights[:, :1], SCORE_ABS)
    if bool(renormalize):
        scores, _ = moe_router(logits, top_k, scoring, False, correction_bias, n_group, topk_group)
        total = scores.sum(dim=1, keepdim=True)  # [T, 1]
        big = total >= 2.0**-1000
        absolute = torch.where(big, (top_k + 2) * SCORE_ABS / torch.where(big, total, 1.0), math.inf)
    slack = delta * weights.abs() + absolute
    return round_once(weights - slack, torch.float32).double(), round_once(
        weights + slack, torch.float32
    ).double()


def weights_bound(
    logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    *,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Per-element bound of ``|fast - reference|`` for the weights (the ids are exact: bound 0).

    The distance from the reference ``v`` to the farther end of :func:`weights_envelope`: it
    admits the fp32 values of the envelope and no other (the next fp32 value beyond either end
    is farther from ``v`` than the other end), so a weight off by one ULP from the correctly
    rounded value fails wherever the fp64 slack cannot move the rounding, at the top of a binade
    (where half an fp32 ULP of ``v`` is a full ULP below it) as anywhere else.

    Parameters
    ----------
    logits, top_k, scoring, renormalize, correction_bias, n_group, topk_group :
        The arguments of :func:`moe_router`.
    weights : Tensor [T, k], float64
        :func:`moe_router`'s first output for these arguments.

    Returns
    -------
    Tensor [T, k], float64: NaN where the reference is NaN (there only the class is compared).

    Source: :func:`weights_envelope`.
    """
    lo, hi = weights_envelope(
        logits, top_k, scoring, renormalize, correction_bias, n_group, topk_group, weights=weights
    )
    return torch.maximum(weights - lo, hi - weights)
