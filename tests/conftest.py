"""The suite's ``xdist_group`` marks under ``--dist loadgroup`` (``make test``) on pytest >= 9.2.

pytest-xdist (3.8) tells its scheduler a test's group by appending ``@<group>`` to the item's
node id in the worker (``item._nodeid = ...``); pytest 9.2 keeps node ids structured
(``Node._id``) and no longer reads ``_nodeid``, so the suffix is lost and every grouped test is
scheduled on its own (pytest-dev/pytest-xdist#1386, open; the fix, #1388, is not released).
Nothing fails: the groups' shared work just runs once per worker instead of once -- the two
sweeps of ``test_html_report.py``'s module fixture, the child pytest of
``test_pytest_report.py``, the world-2 and world-4 launches of
``test_all_reduce_distributed.py``, a case's build in ``test_components.py``.

This hook gives the ids the suffix xdist meant them to have, after xdist's own hook, and only
where xdist's did not take: the same group names, joined as xdist joins them.  Outside a
loadgroup worker, or where the suffix is already there (pytest < 9.2), it does nothing.
"""

from __future__ import annotations

import pytest


def _group_suffix(item: pytest.Item) -> str | None:
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "@" + "_".join(sorted(names)) if names else None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    result = yield  # every other implementation first, xdist's (trylast) included
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers under loadgroup
        return result
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2: structured node ids
    except ImportError:  # older pytest: xdist's suffix took
        return result
    for item in items:
        suffix = _group_suffix(item)
        if suffix is not None and not item.nodeid.endswith(suffix):
            try:
                item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
            except Exception:  # a private API that moved: grouping lost (time), never a failure
                return result
    return result
