"""Comparators: bitwise on integer views, and toleranced against an fp64 reference.

Bitwise comparison looks at raw bits, so it tells +0 from -0 and one NaN payload from another,
which ``torch.equal`` (value comparison, NaN != NaN) cannot.  Both comparators report the rows
that differ, the first differing (row, col) with both sides' hex bits and values, and the
distance in ULPs (units in the last place of the compared dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from batchinv.harness.bitpatterns import FORMATS, float_format


def int_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s raw bits as a signed integer tensor of the same width (integers unchanged)."""
    if tensor.dtype in FORMATS:
        return tensor.contiguous().view(float_format(tensor.dtype).int_dtype)
    if tensor.dtype == torch.float64:
        return tensor.contiguous().view(torch.int64)
    if tensor.dtype == torch.bool:
        return tensor.to(torch.int8)
    return tensor


def ordered_int(tensor: torch.Tensor) -> torch.Tensor:
    """A monotone int64 key of a float tensor: the difference of two keys is the ULP distance.

    Sign-magnitude bits map to ``magnitude`` for positive and ``-magnitude`` for negative values,
    so +0 and -0 share the key 0 (zero ULPs apart, though bitwise different).
    """
    fmt = float_format(tensor.dtype)
    bits = int_view(tensor).to(torch.int64) & fmt.all_ones
    magnitude = bits & (fmt.sign_mask - 1)
    return torch.where((bits & fmt.sign_mask) != 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ULP distance (float64; +inf where exactly one side is NaN, 0 where both are)."""
    dist = (ordered_int(a) - ordered_int(b)).abs().to(torch.float64)
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    dist = torch.where(a_nan & b_nan, torch.zeros_like(dist), dist)
    return torch.where(a_nan ^ b_nan, torch.full_like(dist, math.inf), dist)


def _hex(tensor: torch.Tensor) -> str:
    width = tensor.element_size() * 8
    value = int(int_view(tensor.reshape(1)).to(torch.int64)[0]) & ((1 << width) - 1)
    return f"0x{value:0{width // 4}x}"


def _value(tensor: torch.Tensor) -> str:
    item = tensor.reshape(()).item()
    return repr(item)


@dataclass
class Difference:
    """The first differing element: its (row, col) and both sides' bits and values."""

    row: int
    col: int
    expected_bits: str
    actual_bits: str
    expected_value: str
    actual_value: str
    #: what each side is: ("expected", "got") for agreement; for an invariance comparison the
    #: two launches (``("alone", "in a batch of 17")``), set by ``invariance.compare_outputs``
    names: tuple[str, str] = ("expected", "got")

    @property
    def where(self) -> str:
        """``"(row R, col C)"``: the first differing index."""
        return f"(row {self.row}, col {self.col})"

    def __str__(self) -> str:
        first, second = self.names
        return (
            f"first difference at (row {self.row}, col {self.col}): {first} {self.expected_bits} "
            f"({self.expected_value}), {second} {self.actual_bits} ({self.actual_value})"
        )


@dataclass
class BitwiseReport:
    """The result of a bitwise comparison of two tensors whose dim 0 is the row axis."""

    equal: bool
    rows_total: int
    rows_differing: int = 0
    differing_rows: list[int] = field(default_factory=list)
    first: Difference | None = None
    worst_ulp: float | None = None
    reason: str = ""

    def __str__(self) -> str:
        if self.equal:
            return f"bitwise equal ({self.rows_total} rows)"
        if self.reason:
            return self.reason
        ulp = "" if self.worst_ulp is None else f", worst {self.worst_ulp:g} ULP"
        return f"{self.rows_differing}/{self.rows_total} rows differ{ulp}; {self.first}"


def _rows_2d(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 0:
        return tensor.reshape(1, 1)
    return tensor.reshape(tensor.shape[0], math.prod(tensor.shape[1:]))


def compare_bitwise(expected: torch.Tensor, actual: torch.Tensor) -> BitwiseReport:
    """Compare two tensors bit for bit.

    Args:
        expected, actual: same dtype and shape; dim 0 is the row axis (a 0-d or 1-D tensor is one
            row per element); any device (``actual`` is moved to ``expected``'s device).

    Returns:
        A :class:`BitwiseReport`; ``equal`` is False on any dtype or shape mismatch (with the
        reason), or if any element's bits differ (+0 vs -0 and NaN payloads included).
    """
    rows = expected.shape[0] if expected.dim() else 1
    if expected.dtype != actual.dtype:
        return BitwiseReport(
            False, rows, rows, reason=f"dtype differs: expected {expected.dtype}, got {actual.dtype}"
        )
    if expected.shape != actual.shape:
        return BitwiseReport(
            False,
            rows,
            rows,
            reason=f"shape differs: expected {tuple(expected.shape)}, got {tuple(actual.shape)}",
        )
    exp2 = _rows_2d(expected.detach())
    act2 = _rows_2d(actual.detach().to(expected.device))
    diff = int_view(exp2) != int_view(act2)
    if exp2.numel() == 0 or not bool(diff.any()):
        return BitwiseReport(True, exp2.shape[0])
    row_mask = diff.any(dim=1)
    differing = row_mask.nonzero().flatten().tolist()
    row, col = (int(v) for v in diff.nonzero()[0])
    first = Difference(
        row, col, _hex(exp2[row, col]), _hex(act2[row, col]), _value(exp2[row, col]), _value(act2[row, col])
    )
    worst = None
    if expected.dtype in FORMATS:
        worst = float(ulp_distance(exp2[diff], act2[diff]).max())
    elif not expected.dtype.is_floating_point:
        worst = None
    return BitwiseReport(False, exp2.shape[0], len(differing), differing, first, worst)


def host_bools(flags: list[torch.Tensor]) -> list[bool]:
    """0-d bool tensors read to the host with one device-to-host copy per device (not one per
    flag): under a GPU shared by a sweep's workers each read can wait out other processes' time
    slices."""
    by_device: dict[torch.device, list[int]] = {}
    for i, flag in enumerate(flags):
        by_device.setdefault(flag.device, []).append(i)
    values = [False] * len(flags)
    for indices in by_device.values():
        for i, value in zip(indices, torch.stack([flags[i] for i in indices]).tolist(), strict=True):
            values[i] = bool(value)
    return values


def bitwise_equal(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Whether each (expected, actual) pair of the same dtype and shape has the same bits, read
    back in one copy per device (:func:`host_bools`).  ``actual`` is moved to ``expected``'s
    device.  For the details of a differing pair, :func:`compare_bitwise`."""
    differs = [
        (int_view(expected.detach()) != int_view(actual.detach().to(expected.device))).any()
        for expected, actual in pairs
    ]
    return [not d for d in host_bools(differs)]


@dataclass
class ToleranceReport:
    """The result of comparing a fast output against an fp64 reference within a bound."""

    within: bool
    rows_total: int
    rows_outside: int
    worst_abs: float
    worst_rel: float
    worst_ulp: float
    bound_at_worst: float
    first: Difference | None = None
    reason: str = ""
    #: max over finite elements of |actual - reference| / bound: how far below its bound the
    #: worst element sits (< 1 when within); +inf where an error meets a zero bound.
    worst_ratio: float = 0.0

    def __str__(self) -> str:
        head = (
            "within tolerance"
            if self.within
            else f"{self.rows_outside}/{self.rows_total} rows outside tolerance"
        )
        text = (
            f"{head}: worst abs {self.worst_abs:.3g} (bound there {self.bound_at_worst:.3g}), "
            f"worst rel {self.worst_rel:.3g}, worst {self.worst_ulp:g} ULP, "
            f"worst error / bound {self.worst_ratio:.3g}"
        )
        if self.reason:
            text += f"; {self.reason}"
        if self.first is not None and not self.within:
            text += f"; {self.first}"
        return text


def compare_tolerance(reference: torch.Tensor, actual: torch.Tensor, bound: torch.Tensor) -> ToleranceReport:
    """Compare ``actual`` against an fp64 ``reference`` elementwise: ``|actual - reference| <= bound``.

    Non-finite values must match exactly in class: a NaN where the reference has a NaN, the same
    infinity where the reference rounded to ``actual``'s dtype is infinite (a finite fp64 value past
    the dtype's range expects that infinity); any other non-finite ``actual`` fails, and so does any
    element whose bound is NaN.

    Args:
        reference: float64, dim 0 = rows.
        actual: any float dtype, same shape.
        bound: float64, broadcastable to the shape: the largest allowed absolute error per element.

    Returns:
        A :class:`ToleranceReport` with the worst absolute, relative and ULP error (the ULP in
        ``actual``'s dtype against the reference rounded to that dtype).
    """
    rows = reference.shape[0] if reference.dim() else 1
    if reference.shape != actual.shape:
        return ToleranceReport(
            False,
            rows,
            rows,
            math.inf,
            math.inf,
            math.inf,
            0.0,
            reason=f"shape differs: expected {tuple(reference.shape)}, got {tuple(actual.shape)}",
        )
    ref = _rows_2d(reference.detach().to(torch.float64))
    act_native = _rows_2d(actual.detach().to(reference.device))
    act = act_native.to(torch.float64)
    bnd = torch.broadcast_to(bound.to(ref.device, torch.float64), reference.shape).reshape(ref.shape)
    # Non-finite classes are compared against the reference rounded to the output dtype, so a
    # finite fp64 value that correctly rounds to +-inf there expects that infinity.
    ref_rounded = ref.to(act_native.dtype).to(torch.float64) if act_native.dtype.is_floating_point else ref
    ref_nan, act_nan = torch.isnan(ref), torch.isnan(act)
    ref_inf, act_inf = torch.isinf(ref_rounded), torch.isinf(act)
    class_mismatch = (ref_nan != act_nan) | (ref_inf != act_inf) | (ref_inf & act_inf & (ref_rounded != act))
    finite = torch.isfinite(ref_rounded) & torch.isfinite(act)
    err = torch.where(finite, (act - ref).abs(), torch.zeros_like(ref))
    # A finite element must be within its bound (a NaN bound admits nothing); a non-finite one
    # only has to match the reference's class (its bound, derived from a NaN, is often NaN).
    outside = class_mismatch | (finite & ~(err <= bnd))
    rel = torch.where(finite & (ref != 0), err / ref.abs(), torch.zeros_like(ref))
    worst_abs = float(err.max()) if err.numel() else 0.0
    worst_idx = int(err.reshape(-1).argmax()) if err.numel() else 0
    bound_at_worst = float(bnd.reshape(-1)[worst_idx]) if err.numel() else 0.0
    worst_rel = float(rel.max()) if rel.numel() else 0.0
    # err / bound where it is defined; an error against a zero bound is infinitely far out.
    ratio = torch.where(
        finite & (bnd > 0), err / torch.where(bnd > 0, bnd, torch.ones_like(bnd)), torch.zeros_like(err)
    )
    ratio = torch.where(finite & (bnd == 0) & (err > 0), torch.full_like(err, math.inf), ratio)
    worst_ratio = float(ratio.max()) if ratio.numel() else 0.0
    worst_ulp = 0.0
    if actual.dtype in FORMATS and ref.numel():
        ulps = ulp_distance(ref.to(actual.dtype), act_native)
        ulps = torch.where(finite, ulps, torch.zeros_like(ulps))
        worst_ulp = float(ulps.max())
    first = None
    if bool(outside.any()):
        row, col = (int(v) for v in outside.nonzero()[0])
        first = Difference(
            row,
            col,
            "fp64",
            _hex(act_native[row, col]),
            repr(float(ref[row, col])),
            _value(act_native[row, col]),
        )
    reason = "non-finite class mismatch" if bool(class_mismatch.any()) else ""
    return ToleranceReport(
        not bool(outside.any()),
        ref.shape[0],
        int(outside.any(dim=1).sum()) if outside.numel() else 0,
        worst_abs,
        worst_rel,
        worst_ulp,
        bound_at_worst,
        first,
        reason,
        worst_ratio,
    )


def compare_exact(expected: torch.Tensor, actual: torch.Tensor, mask: torch.Tensor) -> BitwiseReport:
    """Compare two tensors bit for bit on the elements where ``mask`` is true.

    A NaN matches any NaN there (sign and payload are not part of the contract: a GPU's default
    NaN differs from the interpreter's); every other value must have the same bits, +0 and -0
    included.  Elements outside ``mask`` are not compared.

    Args:
        expected, actual: same dtype and shape (dim 0 is the row axis).
        mask: bool, broadcastable to the shape.

    Returns:
        A :class:`BitwiseReport` over the masked elements (``rows_total`` counts every row).
    """
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return compare_bitwise(expected, actual)  # reports the mismatch
    act = actual.detach().to(expected.device)
    keep = torch.broadcast_to(mask.to(expected.device), expected.shape)
    if expected.dtype.is_floating_point:
        keep = keep & ~(torch.isnan(expected) & torch.isnan(act))
    return compare_bitwise(expected, torch.where(keep, act, expected))
