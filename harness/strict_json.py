"""Strict JSON for reports: no ``NaN``/``Infinity`` tokens, which RFC 8259 does not allow and
many parsers (``jq``, JavaScript, Go) refuse.

A non-finite float (a worst ULP of ``inf`` when one side is NaN, say) is written as the string
``"inf"``, ``"-inf"`` or ``"nan"``; readers tell the figure from a number by its type.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

NON_FINITE = {math.inf: "inf", -math.inf: "-inf"}


def finite(value: Any) -> Any:
    """``value`` with every non-finite float inside (dicts, lists, tuples, dataclasses) replaced by
    its string name; other leaves that are not JSON types become ``str(value)``."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [finite(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return finite(dataclasses.asdict(value))
    return str(value)


def dumps(value: Any) -> str:
    """One line of strict JSON (``allow_nan=False`` after :func:`finite`)."""
    return json.dumps(finite(value), allow_nan=False)
