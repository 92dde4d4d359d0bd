"""The neighbour transforms of the ``neighbours`` check: the other units' contents rewritten.

The check (docs/DESIGN.md, "The checks") keeps a launch's shapes, layout and victim unit (a row
of a row-wise component, a request of a request-level one) and rewrites every *other* unit's
floating-point data with one of :data:`TRANSFORMS`: scaled by 1e3 and by 1e-3, +inf, -inf, NaN,
all zeros, max-normal, subnormal.  A kernel whose output row depends on a batch-wide statistic
(a dynamic FP8 scale from the amax over every co-batched token, an eps scaled by the batch max,
a pad row's NaN reaching real rows through a batch-wide stage) gives the victim other bits; a
batch-invariant one cannot.

What is rewritten: every floating-point tensor of ``Batch.rows`` at the other units' indices
(integer and bool rows -- lengths, block tables, ids -- are kept: they are the launch's shape,
not its contents), through :func:`rewrite_rows`; a component that also keeps per-unit
*parameters* in ``rows`` (the sampler's ``temperature`` and ``top_p``, whose range the subject
validates) names its contents in ``Component.content_rows`` and only those are rewritten;
shared operands (weights, eps, scales given to the launch) are the launch's configuration and
stay.  A request model may add the data it keeps
outside ``rows``: :meth:`batchinv.harness.requests.PagedLayout.rewrite_others` also rewrites
the pool tokens the other requests reference and the victim does not.

Special values are written as integer bit patterns (:mod:`batchinv.harness.bitpatterns`), so a
NaN is the quiet NaN of the dtype and a subnormal survives any float conversion on the way.
Every rewritten tensor keeps its shape, strides, storage offset and the bytes around it (a
column window of a NaN-filled buffer stays one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from batchinv.harness.bitpatterns import FORMATS, float_format, pattern
from batchinv.harness.registry import Batch

#: ``values(t) -> tensor of t's dtype and shape``, or None where the dtype cannot express the
#: transform (+-inf in float8_e4m3fn): the tensor is then kept.
Values = Callable[[torch.Tensor], "torch.Tensor | None"]


@dataclass(frozen=True)
class Transform:
    """One rewrite of the other units' contents.

    Attributes:
        label: how a failure names it: "victim row 3 beside neighbours <label> vs original
            neighbours" ("scaled by 1e3", "set to +inf", ...).
        values: the new contents of a tensor of other units' data (:data:`Values`).
    """

    label: str
    values: Values


def _scaled(factor: float) -> Values:
    def values(t: torch.Tensor) -> torch.Tensor:
        # fp64 product rounded once to the dtype (overflows to inf, or NaN in float8_e4m3fn,
        # like any kernel computing the product in the dtype would)
        return (t.to(torch.float64) * factor).to(t.dtype)

    return values


def _filled(name: str, fp8_name: str | None = None) -> Values:
    """Every element the catalogue value ``name`` (``fp8_name`` for formats without infinities;
    None: such formats keep the tensor)."""

    def values(t: torch.Tensor) -> torch.Tensor | None:
        fmt = float_format(t.dtype)
        wanted = name if fmt.has_inf else fp8_name
        if wanted is None:
            return None
        bits = pattern(t.dtype, wanted).bits
        signed = bits - (1 << fmt.width) if bits >= fmt.sign_mask else bits
        return torch.full(t.shape, signed, dtype=fmt.int_dtype, device=t.device).view(t.dtype)

    return values


#: The transforms, in the order the check runs them.
TRANSFORMS: tuple[Transform, ...] = (
    Transform("scaled by 1e3", _scaled(1e3)),
    Transform("scaled by 1e-3", _scaled(1e-3)),
    Transform("set to +inf", _filled("+inf")),
    Transform("set to -inf", _filled("-inf")),
    Transform("set to NaN", _filled("+quiet_nan", "+nan")),
    Transform("set to all zeros", _filled("+0", "+0")),
    Transform("set to max-normal", _filled("+max_normal", "+max_normal")),
    Transform("set to subnormal", _filled("+max_subnormal", "+max_subnormal")),
)
#: The cpu lane shares the transforms out over a component's first three cases (the
#: interpreter pays seconds per attention launch): the first case takes one that moves a
#: batch-wide amax or max, one that poisons a batch-wide stage and +inf; the second 1e-3, -inf
#: and zeros; the third max-normal and subnormal.  GPU lanes run every transform on every case.
CPU_TRANSFORM_GROUPS: tuple[tuple[Transform, ...], ...] = (
    (TRANSFORMS[0], TRANSFORMS[4], TRANSFORMS[2]),
    (TRANSFORMS[1], TRANSFORMS[3], TRANSFORMS[5]),
    (TRANSFORMS[6], TRANSFORMS[7]),
)


def rewritable(t: torch.Tensor) -> bool:
    """Whether the check rewrites ``t``'s contents: a floating-point dtype of the catalogue."""
    return t.dtype in FORMATS


def copy_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same shape, strides and storage offset, over a copy of its whole
    storage (the bytes outside the view -- a strided window's NaN padding -- kept)."""
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        storage, t.storage_offset(), t.shape, t.stride()
    )


def rewrite_at(t: torch.Tensor, mask_or_index: torch.Tensor, transform: Transform) -> torch.Tensor | None:
    """``t`` (layout kept) with the elements selected along its leading dims by
    ``mask_or_index`` (a bool mask over the leading dims, or an index of dim 0) rewritten by
    ``transform``; None when the transform leaves them as they are (nothing selected, or a dtype
    it cannot express)."""
    selected = t[mask_or_index]
    if selected.numel() == 0:
        return None
    new_values = transform.values(selected)
    if new_values is None:
        return None
    fmt = float_format(t.dtype)
    out = copy_layout(t)
    out.view(fmt.int_dtype)[mask_or_index] = new_values.contiguous().view(fmt.int_dtype)
    return out


def content_names(batch: Batch, content_rows: Sequence[str] | None = None) -> tuple[str, ...]:
    """The ``rows`` tensors of ``batch`` that the check rewrites: ``content_rows`` (the
    component's :attr:`~batchinv.harness.registry.Component.content_rows`), or, when None, every
    floating-point rows tensor of the catalogue's formats.

    Raises:
        ValueError: a name of ``content_rows`` that is not a rows tensor of ``batch``, or not a
            floating-point one the transforms can rewrite (the message names it, the expected
            and the given dtype or the rows there are).
    """
    if content_rows is None:
        return tuple(name for name, t in batch.rows.items() if rewritable(t))
    for name in content_rows:
        if name not in batch.rows:
            raise ValueError(
                f"content_rows: {name!r} is not a rows tensor of the batch; its rows are {sorted(batch.rows)}"
            )
        if not rewritable(batch.rows[name]):
            raise ValueError(
                f"content_rows: {name!r} must be a floating-point tensor of "
                f"{sorted(str(d) for d in FORMATS)}; got {batch.rows[name].dtype}"
            )
    return tuple(content_rows)


def rewrite_rows(
    batch: Batch, keep: Sequence[int], transform: Transform, content_rows: Sequence[str] | None = None
) -> tuple[Batch, bool]:
    """``batch`` with its content rows (:func:`content_names`: ``content_rows``, else every
    floating-point ``rows`` tensor) rewritten by ``transform`` at the units not in ``keep``;
    the other rows (integer ids and lengths, per-unit parameters such as a temperature) and the
    shared operands as they are.  Also returns whether anything changed (False: no other unit,
    or no content a transform can express).

    Raises:
        ValueError: ``content_rows`` names a missing or non-floating-point rows tensor.
    """
    n = batch.num_rows
    kept = set(int(k) for k in keep)
    others = torch.tensor([i for i in range(n) if i not in kept], dtype=torch.long)
    rows, changed = dict(batch.rows), False
    names = content_names(batch, content_rows)
    if others.numel():
        for name in names:
            t = batch.rows[name]
            if t.dim() == 0:
                continue
            new = rewrite_at(t, others.to(t.device), transform)
            if new is not None:
                rows[name], changed = new, True
    return Batch(rows, batch.shared), changed


__all__ = [
    "CPU_TRANSFORM_GROUPS",
    "TRANSFORMS",
    "Transform",
    "content_names",
    "copy_layout",
    "rewritable",
    "rewrite_at",
    "rewrite_rows",
]
