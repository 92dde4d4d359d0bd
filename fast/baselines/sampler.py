"""Unpinned production samplers: the negative controls of ``sampler``.

Each has :func:`batchinv.fast.sampler.sampler`'s signature and outputs (``tokens [R]`` int64,
``logprob [R]`` fp32) and validates the same way; each leaves one thing unpinned:

* :func:`broadcast_seed`: the pinned kernel, but every request draws with the first request's
  seed (one seed broadcast to the batch, vLLM #50440): a request's draw follows its slot-0
  neighbour.
* :func:`batch_generator`: the production torch path (fp32 softmax, sort-based top-k / top-p as
  vLLM's ``apply_top_k_top_p``, exponential-race sampling ``argmax(p / q)``) with ``q`` drawn
  for the whole ``[R, V]`` batch from one generator seeded once per step: row r gets the
  generator's r-th block of draws, so the slot (and R) changes the draw.
* :func:`torch_multinomial`: the same filter, then ``torch.multinomial`` on the batch with one
  generator: the batch's rows consume one stream.
* :func:`sort_ties`: the same filter with a per-request generator seeded by ``(seed, step)``
  (the stream is the request's own), but top-k / top-p cut where ``torch.sort``'s unstable
  order puts the tie plateau: which tied tokens stay is whatever the sort returns.  On the
  CPU (and, for a given shape, on CUDA) that order is a function of the row alone, so no
  invariance check need see it: it breaks the documented tie rule (the lower id), which
  ``tests/components/test_sampler.py`` shows against the reference, and it is registered as a
  control reported, never required, to vary.
"""

from __future__ import annotations

import torch

from batchinv.fast.sampler import sampler as pinned_sampler
from batchinv.reference.sampler import check_sampler_args

__all__ = ["batch_generator", "broadcast_seed", "sort_ties", "torch_multinomial"]


def broadcast_seed(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pinned kernel with ``seeds[0]`` broadcast to every request (vLLM #50440).  NOT batch
    invariant: a request's draw uses the seed of whichever request sits at slot 0."""
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    if seeds.shape[0] == 0:
        return pinned_sampler(logits, temperature, top_k, top_p, seeds, step)
    return pinned_sampler(logits, temperature, top_k, top_p, seeds[:1].expand(seeds.shape[0]), step)


def _filtered_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """vLLM-style ``apply_top_k_top_p`` on the batch: fp32 ``logits / T``, an ascending
    ``torch.sort`` (unstable), top-k by the k-th largest value, top-p by the fp32 cumsum of the
    sorted probabilities (``<= 1 - p`` masked, the last kept), scattered back; softmax."""
    vocab = logits.shape[1]
    t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    x = torch.nan_to_num(logits.float(), nan=float("-inf")) / t[:, None]
    x_sort, idx = x.sort(dim=-1, descending=False)
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
    kth = x_sort.gather(1, (vocab - k)[:, None])
    x_sort = x_sort.masked_fill(x_sort < kth, float("-inf"))
    probs_sort = x_sort.softmax(dim=-1)
    cum = probs_sort.cumsum(dim=-1)
    mask = cum <= (1 - top_p)[:, None]
    mask[:, -1] = False
    x_sort = x_sort.masked_fill(mask, float("-inf"))
    x = torch.empty_like(x_sort).scatter_(1, idx, x_sort)
    return x.softmax(dim=-1)


def _finish(
    logits: torch.Tensor, temperature: torch.Tensor, probs: torch.Tensor, token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    greedy = torch.nan_to_num(logits.float(), nan=float("-inf")).argmax(dim=-1)
    token = torch.where(temperature == 0, greedy, token).to(torch.int64)
    lp = probs.gather(1, token[:, None])[:, 0].log()
    lp = torch.where(temperature == 0, torch.zeros_like(lp), lp).to(torch.float32)
    return token, lp


def _batch_gen(seeds: torch.Tensor, step: torch.Tensor) -> torch.Generator:
    gen = torch.Generator(device=seeds.device)
    gen.manual_seed((int(seeds[0]) * 1_000_003 + int(step[0])) & 0x7FFFFFFFFFFFFFFF)
    return gen


def batch_generator(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exponential-race sampling with ``q`` for the whole batch from one generator.  NOT batch
    invariant: row r's noise is the generator's r-th block (its slot)."""
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    if logits.shape[0] == 0:
        return pinned_sampler(logits, temperature, top_k, top_p, seeds, step)
    probs = _filtered_probs(logits, temperature, top_k, top_p)
    q = torch.empty_like(probs).exponential_(generator=_batch_gen(seeds, step))
    return _finish(logits, temperature, probs, (probs / q).argmax(dim=-1))


def torch_multinomial(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.multinomial`` on the batch's filtered probabilities, one generator.  NOT batch
    invariant: the rows consume one stream in slot order."""
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    if logits.shape[0] == 0:
        return pinned_sampler(logits, temperature, top_k, top_p, seeds, step)
    probs = _filtered_probs(logits, temperature, top_k, top_p)
    token = torch.multinomial(probs, 1, generator=_batch_gen(seeds, step))[:, 0]
    return _finish(logits, temperature, probs, token)


def sort_ties(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    step: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-request streams, but top-k / top-p ties at the cut kept as ``torch.sort`` returns
    them (not the lower id).  Batch-invariant where the sort's order is a function of the row
    (CPU); it breaks the tie rule, which the reference shows."""
    check_sampler_args(logits, temperature, top_k, top_p, seeds, step)
    if logits.shape[0] == 0:
        return pinned_sampler(logits, temperature, top_k, top_p, seeds, step)
    probs = _filtered_probs(logits, temperature, top_k, top_p)
    token = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for r in range(logits.shape[0]):
        gen = torch.Generator(device=logits.device)
        gen.manual_seed((int(seeds[r]) * 1_000_003 + int(step[r])) & 0x7FFFFFFFFFFFFFFF)
        q = torch.empty_like(probs[r]).exponential_(generator=gen)
        token[r] = (probs[r] / q).argmax()
    return _finish(logits, temperature, probs, token)
