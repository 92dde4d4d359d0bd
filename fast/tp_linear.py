"""The row-parallel linear at any tensor-parallel (TP) degree, emulated in one process.

A row-parallel linear (Megatron's ``RowParallelLinear``: attention's output projection, the MLP's
down projection) gives each of T ranks a K slice of ``x`` and of the weight; the ranks' partial
products are summed by an all-reduce.  The pinned matmul's reduction tree
(:mod:`batchinv.fast.matmul_config`) is K in chunks of ``chunk_k``, each chunk summed from zero
in ``BLOCK_K`` steps, the chunk sums added *in chunk order* to a total that starts at zero: a
chain, not a balanced tree.  One fp32 partial per rank cannot give its bits for T > 1
(``(c0 + c1) + (c2 + c3)`` is another association than ``((c0 + c1) + c2) + c3``), whatever the
order of the all-reduce.  What can, and what this module does:

* each rank's K slice is a whole number of the tree's chunks (``T`` divides the chunk count;
  another degree is refused with an :class:`~batchinv.reference.errors.ArgumentError`);
* each rank computes, with the pinned matmul on its slice, the fp32 sum of each of its chunks
  (the same launches' config as the single-rank call: the tree of the full K, the execution of
  M): exactly the chunk sums the single-rank kernel forms (a split-K execution keeps them in its
  workspace);
* the all-reduce carries those fp32 chunk sums (a gather of ``chunks / T`` partials per rank),
  and adds them in chunk order -- rank 0's first, ..., rank T-1's last -- to a total that
  starts at zero; then the bias in fp32 and one rounding to the output dtype, as the kernel.

So the output is bitwise the single-rank pinned matmul's at every degree that divides the chunk
count: on the interpreter (chunks of 64) K = 512 has 8 chunks (TP 1, 2, 4, 8); on sm90 the
16-bit tree's 1024-wide chunks give K = 8192 TP up to 8, K = 4096 up to 4, and the
4096 x 14336 down projection's 3584-wide chunks TP 1, 2 and 4 (:data:`TREE_TABLE` decides).
The price is the all-reduce's volume, ``chunks / T`` fp32 partials per rank instead of one (a
reduction tree built for TP -- leaves per rank, a fixed tree across them, TBIK, arXiv
2511.17826 -- would send one; it is not the shipped tree).

No kernel of its own: the pinned matmul per chunk, then the split execution's chunk-sum kernel
(:func:`batchinv.fast.matmul.sum_chunks`) over the gathered chunk sums: the same fp32 adds, bias
add and rounding as the single-rank kernel, NaN payloads included (torch's own adds pick another
NaN payload than the interpreter's).
"""

from __future__ import annotations

import torch

from batchinv.fast.matmul import matmul, plan, sum_chunks
from batchinv.fast.matmul_config import MatmulConfig
from batchinv.reference.errors import ArgumentError
from batchinv.reference.matmul import validate


def rank_slices(k: int, chunk_k: int, tp_degree: int) -> list[list[slice]]:
    """Per rank, the K slices of its chunks (rank ``r`` holds chunks ``r * C / T`` to
    ``(r + 1) * C / T - 1`` of the ``C = ceil(K / chunk_k)`` chunks, the last possibly short).

    Raises:
        ArgumentError: ``tp_degree`` not a positive int dividing the chunk count.
    """
    if isinstance(tp_degree, bool) or not isinstance(tp_degree, int) or tp_degree < 1:
        raise ArgumentError("tp_degree", "a positive int (the number of emulated ranks) or None", tp_degree)
    chunks = max(1, -(-k // chunk_k))
    if chunks % tp_degree:
        raise ArgumentError(
            "tp_degree",
            f"a divisor of the reduction tree's {chunks} chunks of K = {k} (chunk_k = {chunk_k}): "
            "each rank's K slice must hold whole chunks",
            tp_degree,
        )
    per = chunks // tp_degree
    return [
        [slice(j * chunk_k, min(k, (j + 1) * chunk_k)) for j in range(r * per, (r + 1) * per)]
        for r in range(tp_degree)
    ]


def tp_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    layout: str = "linear",
    out_dtype: torch.dtype | None = None,
    tp_degree: int | None = None,
) -> torch.Tensor:
    """``out = x @ W (+ bias)`` as a row-parallel linear over ``tp_degree`` emulated ranks, with
    the single-rank pinned matmul's bits at every degree (module docstring).

    Parameters
    ----------
    x : Tensor [M, K]
        bf16, fp16 or fp32 (as :func:`batchinv.fast.matmul.matmul`).
    weight : Tensor [N, K] (``layout="linear"``) or [K, N] (``layout="mm"``)
    bias : Tensor [N], optional
        Added once, after the reduction (rank 0's in Megatron), in fp32.
    layout : {"linear", "mm"}
    out_dtype : torch.dtype, optional
        ``x``'s dtype (default) or fp32.
    tp_degree : int, optional
        The number of ranks K is split across; a divisor of the tree's chunk count.  None: the
        single-rank pinned matmul itself.

    Returns
    -------
    Tensor [M, N] of ``out_dtype``
        Bitwise invariant along the TP degree (every degree dividing the chunk count, and
        None), M, row position, neighbours and repeated calls: the pinned matmul's tree.

    Raises
    ------
    ArgumentError
        ``tp_degree`` not a positive int dividing the chunk count; the matmul's argument errors.
    DTypeError, DeviceError
        As :func:`batchinv.fast.matmul.matmul`.

    Source
    ------
    Megatron-LM's ``RowParallelLinear`` (K-sharded weight, all-reduce of the partials, bias
    after); the bit-exact decomposition follows the matmul's split-K (issue 27, section 5).
    """
    if tp_degree is None:
        return matmul(x, weight, bias, layout=layout, out_dtype=out_dtype)
    args = validate(x, weight, bias, layout, out_dtype, "ieee")
    config = plan(args.m, args.n, args.k, x.dtype, x.device).config  # the single-rank launch's
    slices = rank_slices(args.k, config.tree.chunk_k, tp_degree)
    if args.m == 0 or args.n == 0:
        return matmul(x, weight, bias, layout=layout, out_dtype=out_dtype)
    gathered = [[_chunk_sum(x, weight, layout, ks, config) for ks in rank] for rank in slices]
    # the all-reduce: every rank's chunk sums gathered in rank order (each rank's in chunk order),
    # added in that order from zero by the split execution's own chunk-sum kernel, bias, rounding
    ws = torch.stack([partial for rank in gathered for partial in rank])  # [chunks, M, N] fp32
    return sum_chunks(ws, bias, args.out_dtype)


def _chunk_sum(
    x: torch.Tensor, weight: torch.Tensor, layout: str, ks: slice, config: MatmulConfig
) -> torch.Tensor:
    """The fp32 sum of one chunk (``K`` slice ``ks``) by the pinned matmul under ``config``:
    one chunk of the full-K tree, summed from zero in its ``BLOCK_K`` steps."""
    w = weight[:, ks] if layout == "linear" else weight[ks, :]
    return matmul(x[:, ks], w, None, layout=layout, out_dtype=torch.float32, config=config)
