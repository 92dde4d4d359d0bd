"""Reference of ``sampler``: per-request seeded sampling whose token is exact in any batch.

Legend: R requests (rows), V the vocabulary (columns of ``logits``).

The sampling rule (docs/COMPONENTS.md, "sampler"), per request ``r``, on its own row only:

1. ``x = logits[r]`` read as fp32 (exact from bf16 / fp16); a NaN reads as ``-inf``, ``-0`` as
   ``+0``.  ``m = max(x)``.
2. ``temperature == 0``: greedy, the lowest id with ``x == m``; log-prob ``0`` (a point mass).
3. Weights, pinned in fp32 (every operation one IEEE round-to-nearest fp32 operation, in this
   order, no fused multiply-add): ``k = fp32(fp64(LOG2E) / fp64(T))``; ``t = 0`` where ``x == m``
   (this also covers ``x == m == +-inf``), else ``t = fp32(fp32(x - m) * k)`` (``t <= 0``);
   ``w = 0`` where ``t < -43.5`` (``-inf`` included), else the pinned ``exp2``: ``n =
   floor(fp32(t + 0.5))``, ``f = fp32(t - n)`` in ``[-0.5, 0.5]``, ``q`` the Cephes ``exp2f``
   polynomial by Horner (fp32 multiply, then fp32 add, :data:`EXP2_POLY`), ``p = fp32(fp32(f *
   q) + 1)`` in ``[2**-0.5, 2**0.5]``; the integer weight ``W = (int(p * 2**24) << 18) >> -n``
   (fixed point: ``W = 2**42`` is weight 1, the top token's).
4. Order: ``x`` descending, ties by the lower id.  ``top_k`` in ``(0, V)`` keeps the first
   ``top_k`` tokens of the order (``0`` or ``>= V``: all).  ``top_p < 1`` then keeps the shortest
   prefix of that order whose integer weight sum reaches ``thr = ceil(fp64(top_p) *
   fp64(total_k))`` (``total_k`` the kept weights' int64 sum; ``top_p == 1``: no filter).
5. Draw: Philox4x32-10 with key ``(seed & 0xffffffff, seed >> 32 & 0xffffffff)`` (the int64
   seed's two's-complement bits) and counter ``(step & 0xffffffff, step >> 32 & 0xffffffff, 0,
   0)``; ``u = ((r0 << 21) | (r1 >> 11)) * 2**-53``; ``target = min(floor(fp64(u *
   fp64(total))), total - 1)``, ``total`` the kept int64 weight sum.  The token is the first
   kept token, in id order, whose inclusive prefix sum of ``W`` exceeds ``target`` (inverse CDF
   over exactly the kept set; a token with ``W = 0`` is never drawn).
6. Log-prob: ``z_tok - logsumexp(z[kept])``, ``z = (x - m) / T`` in fp64 (``0`` where ``x == m``).

Everything that picks the token is integer arithmetic or a pinned IEEE fp32 / fp64 operation,
so the token is exact: the fast kernel's reductions (int64 sums, max, min) are associative,
and an fp32 operation computed in fp64 and rounded to fp32 is the IEEE fp32 result (+, -, *
with 53 >= 2 * 24 + 2 bits: Figueroa, "When is double rounding innocuous?", 1995), which is
how this reference computes them.  Only the log-prob is toleranced (:func:`tolerance_bound`).

NaN and infinities: a NaN logit is ``-inf``; ``+inf`` logits share the row's mass equally; a
row of ``-inf`` (and NaN) is a constant row: uniform over every token, greedy token 0.  Every
token is an id in ``[0, V)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from batchinv.reference.errors import MAX_WIDTH, ArgumentError, check_same_device, check_tensor

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: log2(e) as the fp64 constant the temperature's fp32 factor ``k`` is divided from.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: The Cephes ``exp2f`` polynomial on [-0.5, 0.5] (``2**f ~= 1 + f * q(f)``), highest degree
#: first, each coefficient the exact value of its fp32 rounding (so that no compiler rounds it).
EXP2_POLY: tuple[float, ...] = (
    0.00015353361959569156,
    0.0013398873852565885,
    0.00961843691766262,
    0.055503323674201965,
    0.24022647738456726,
    0.6931471824645996,
)
#: Fixed-point bits of a weight: weight 1 (the top token) is ``2**FIXED_BITS``.
FIXED_BITS = 42
#: Below this ``t`` (log2 of the weight), the weight is 0.
T_FLOOR = -43.5
#: The pinned exp2's relative error bound on [-0.5, 0.5] (Cephes exp2f: about 2 ULP; with the
#: fp32 Horner roundings under 2**-21, checked on a dense grid in tests/components/test_sampler.py).
EXP2_REL_ERROR = 2.0**-21
U32 = 2.0**-24

_MASK32 = 0xFFFFFFFF


def _check_vector(name: str, value: Any, dtypes: tuple[torch.dtype, ...], rows: int, device: Any) -> None:
    check_tensor(name, value, dtypes=dtypes, ndim=1)
    check_same_device(name, value, device)
    if value.shape[0] != rows:
        raise ArgumentError(name, f"shape ({rows},) (one per logits row)", tuple(value.shape))


def _first_bad(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


def check_sampler_args(logits: Any, temperature: Any, top_k: Any, top_p: Any, seeds: Any, step: Any) -> None:
    """Validate the sampler's arguments (both trees raise the same errors).

    Reads the per-request values (a host synchronisation on a GPU): a negative or non-finite
    temperature, a negative ``top_k`` or a ``top_p`` outside ``(0, 1]`` names the request.

    Raises:
        DTypeError: a non-tensor or a wrong dtype.
        ArgumentError: a wrong rank or length, ``V == 0`` or ``V > 2**20``, or a bad value.
        DeviceError: operands on different devices.
    """
    check_tensor("logits", logits, dtypes=LOGITS_DTYPES, ndim=2)
    rows, vocab = logits.shape
    if vocab < 1:
        raise ArgumentError("logits", "at least one column (V >= 1)", tuple(logits.shape))
    if vocab > MAX_WIDTH:
        raise ArgumentError("logits", f"V <= {MAX_WIDTH} columns", tuple(logits.shape))
    device = logits.device
    _check_vector("temperature", temperature, (torch.float32,), rows, device)
    _check_vector("top_k", top_k, (torch.int32, torch.int64), rows, device)
    _check_vector("top_p", top_p, (torch.float32,), rows, device)
    _check_vector("seeds", seeds, (torch.int64,), rows, device)
    _check_vector("step", step, (torch.int64,), rows, device)
    if rows == 0:
        return
    bad = ~(torch.isfinite(temperature) & (temperature >= 0))
    if bool(bad.any()):
        i = _first_bad(bad)
        raise ArgumentError("temperature", "finite values >= 0", f"{float(temperature[i])} at request {i}")
    bad = top_k < 0
    if bool(bad.any()):
        i = _first_bad(bad)
        raise ArgumentError("top_k", "values >= 0 (0: no top-k)", f"{int(top_k[i])} at request {i}")
    bad = ~((top_p > 0) & (top_p <= 1))
    if bool(bad.any()):
        i = _first_bad(bad)
        raise ArgumentError("top_p", "values in (0, 1] (1: no top-p)", f"{float(top_p[i])} at request {i}")


# --- the pieces of the rule -------------------------------------------------------------------


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
    Random123's constants), plain Python integers."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (
            ((p1 >> 32) ^ c1 ^ k0) & _MASK32,
            p1 & _MASK32,
            ((p0 >> 32) ^ c3 ^ k1) & _MASK32,
            p0 & _MASK32,
        )
        k0 = (k0 + 0x9E3779B9) & _MASK32
        k1 = (k1 + 0xBB67AE85) & _MASK32
    return c0, c1, c2, c3


def uniform53(seed: int, step: int) -> int:
    """The request's draw for ``(seed, step)``: 53 random bits (``u = uniform53 * 2**-53``)."""
    s, t = seed & 0xFFFFFFFFFFFFFFFF, step & 0xFFFFFFFFFFFFFFFF
    r0, r1, _, _ = philox4x32_10((t & _MASK32, t >> 32, 0, 0), (s & _MASK32, s >> 32))
    return (r0 << 21) | (r1 >> 11)


def read_row(row: torch.Tensor) -> torch.Tensor:
    """A logits row as fp64 values of fp32 (exact), NaN read as -inf and -0 as +0."""
    x = row.to(torch.float32).to(torch.float64)
    x = torch.where(torch.isnan(x), torch.full_like(x, -math.inf), x)
    return torch.where(x == 0, torch.zeros_like(x), x)


def _f32(t: torch.Tensor) -> torch.Tensor:
    """Round fp64 values to fp32 (and back): one IEEE fp32 operation's result."""
    return t.to(torch.float32).to(torch.float64)


def temperature_factor(temperature: float) -> float:
    """``k = fp32(LOG2E / T)`` for ``T > 0`` (``+inf`` when the quotient overflows fp32)."""
    return float(torch.tensor(LOG2E / temperature, dtype=torch.float64).to(torch.float32))


def log2_weights(x: torch.Tensor, m: float, k: float) -> torch.Tensor:
    """``t`` of rule 3 (fp64 holding fp32 values): 0 where ``x == m``, else ``fp32(fp32(x - m) * k)``."""
    t = _f32(_f32(x - m) * k)
    return torch.where(x == m, torch.zeros_like(t), t)


def fixed_weights(t: torch.Tensor) -> torch.Tensor:
    """The int64 weights ``W`` of rule 3 from ``t`` (fp64 holding fp32 values)."""
    live = t >= T_FLOOR
    ts = torch.where(live, t, torch.zeros_like(t))
    n = torch.floor(_f32(ts + 0.5))
    f = _f32(ts - n)
    q = torch.full_like(f, EXP2_POLY[0])
    for c in EXP2_POLY[1:]:
        q = _f32(_f32(q * f) + c)
    p = _f32(_f32(f * q) + 1.0)
    mant = (p * 2.0**24).to(torch.int64)  # exact: p has 24 significant bits in [2**-0.5, 2**0.5]
    w = torch.bitwise_right_shift(torch.bitwise_left_shift(mant, 18), (-n).to(torch.int64))
    return torch.where(live, w, torch.zeros_like(w))


def kept_set(x: torch.Tensor, w: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The ids kept by top-k then top-p (rule 4), in the order (x descending, lower id first)."""
    vocab = x.shape[0]
    order = torch.sort(x, descending=True, stable=True).indices  # ties keep the lower id first
    if 0 < top_k < vocab:
        order = order[:top_k]
    if top_p < 1.0:
        cum = torch.cumsum(w[order], 0)  # int64: exact
        thr = math.ceil(float(top_p) * float(int(cum[-1])))
        last = int(torch.nonzero(cum >= thr)[0, 0])
        order = order[: last + 1]
    return order


def sample_row(
    row: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int, step: int
) -> tuple[int, float, dict[str, Any]]:
    """One request by the rule: ``(token, log-prob in fp64, details)``; ``details`` holds the
    kept ids, the weights and ``z`` (for the bound)."""
    x = read_row(row)
    m = float(x.max())
    first = int(torch.nonzero(x == m)[0, 0])
    if temperature == 0:
        return first, 0.0, {"kept": torch.tensor([first]), "z": None}
    k = temperature_factor(temperature)
    w = fixed_weights(log2_weights(x, m, k))
    kept = kept_set(x, w, top_k, top_p)
    total = int(w[kept].sum())
    target = min(math.floor((uniform53(seed, step) * 2.0**-53) * float(total)), total - 1)
    ids = torch.sort(kept).values
    cum = torch.cumsum(w[ids], 0)
    token = int(ids[int(torch.nonzero(cum > target)[0, 0])])
    z = torch.where(x == m, torch.zeros_like(x), (x - m) / temperature)
    logprob = float(z[token] - torch.logsumexp(z[kept], 0))
    return token, logprob, {"kept": kept, "z": z}


def _sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> Iterator[tuple[int, float, dict[str, Any]]]:
    """:func:`sample_row` of every request in order, on host copies of the arguments."""
    host = [t.detach().cpu() for t in (logits, temperature, top_k, top_p, seeds, step)]
    for r in range(logits.shape[0]):
        yield sample_row(
            host[0][r],
            float(host[1][r]),
            int(host[2][r]),
            float(host[3][r]),
            int(host[4][r]),
            int(host[5][r]),
        )


def sampler(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference sampler: plain Python per request, fp64 (the module docstring's rule).

    Parameters
    ----------
    logits : Tensor [R, V] float32, bfloat16 or float16, any strides; 1 <= V <= 2**20.
    temperature : Tensor [R] float32, finite, >= 0 (0: greedy).
    top_k : Tensor [R] int32 / int64, >= 0 (0 or >= V: no top-k).
    top_p : Tensor [R] float32 in (0, 1] (1: no top-p).
    seeds : Tensor [R] int64, the request's RNG key.
    step : Tensor [R] int64, the request's decode step (the RNG counter).

    Returns
    -------
    tokens : Tensor [R] int64, each in [0, V).
    logprob : Tensor [R] float64, the token's log-probability under the kept, tempered
        distribution (0 for greedy).

    Invariance: request r's outputs are a function of ``(logits[r], temperature[r], top_k[r],
    top_p[r], seeds[r], step[r])`` alone: never of its slot, R or the other requests.

    Raises
    ------
    DTypeError, ArgumentError, DeviceError: see :func:`check_sampler_args`.
    """
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    rows = logits.shape[0]
    tokens = torch.zeros(rows, dtype=torch.int64)
    logprob = torch.zeros(rows, dtype=torch.float64)
    for r, (tok, lp, _) in enumerate(_sample_rows(logits, temperature, top_k, top_p, seeds, step)):
        tokens[r], logprob[r] = tok, lp
    return tokens.to(logits.device), logprob.to(logits.device)


def tolerance_bound(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest allowed |fast - reference| per request: ``(0 for tokens, the log-prob bound)``.

    The fast log-prob is ``fp32(t_tok * ln2 - ln(total * 2**-42))`` in fp64 from the pinned
    integer weights.  Against the exact ``lp = z_tok - ln S`` (``S = sum exp(z)`` over the
    kept set, top weight 1):

    * ``t_tok`` carries three fp32 roundings of ``z_tok log2 e`` (``k``, ``x - m``, the
      product): ``|t ln2 - z| <= 3.01 u |z_tok|`` (u = 2**-24);
    * each kept weight is ``W / 2**42 = 2**t (1 + e)`` with ``|e| <= EXP2_REL_ERROR`` and a
      truncation of at most ``2**-42`` (a dropped weight ``< 2**-43.5`` as well); ``t`` is off
      by ``3.01 u |z_j| log2 e``, so ``|total 2**-42 - S| <= e S + 3.01 u (1 + e) sum_j
      exp(z_j) |z_j| + |kept| 2**-42 =: D`` (``e = EXP2_REL_ERROR (1 + 4u)``), and
      ``|ln(total 2**-42) - ln S| <= D / (S - D)``;
    * fp64 terms: ``2**-50 (|z_tok| + |ln S| + 1)``; the final fp32 rounding ``u |lp|``.

    Greedy requests (T = 0) are exact (0).  Every term is computed from the fp64 reference.
    """
    rows = logits.shape[0]
    tok_bound = torch.zeros(rows, dtype=torch.float64)
    lp_bound = torch.zeros(rows, dtype=torch.float64)
    for r, (tok, lp, info) in enumerate(_sample_rows(logits, temperature, top_k, top_p, seeds, step)):
        z = info["z"]
        if z is None:
            continue
        kept = info["kept"]
        zk = z[kept]
        ez = torch.exp(zk)
        s = float(ez.sum())
        finite = torch.isfinite(zk)
        spread = float((ez[finite] * zk[finite].abs()).sum())
        e = EXP2_REL_ERROR * (1 + 4 * U32)
        d = e * s + 3.01 * U32 * (1 + e) * spread + kept.numel() * 2.0**-42
        ln_term = d / (s - d) if s > d else math.inf
        zt = abs(float(z[tok]))
        lp_bound[r] = (
            3.01 * U32 * zt
            + ln_term
            + 2.0**-50 * (zt + abs(math.log(s)) + 1)
            + U32 * (abs(lp) + ln_term + 3.01 * U32 * zt)
        )
    device = logits.device
    return tok_bound.to(device), lp_bound.to(device)


__all__ = [
    "EXP2_POLY",
    "FIXED_BITS",
    "LOG2E",
    "check_sampler_args",
    "fixed_weights",
    "kept_set",
    "log2_weights",
    "philox4x32_10",
    "read_row",
    "sample_row",
    "sampler",
    "temperature_factor",
    "tolerance_bound",
    "uniform53",
]
