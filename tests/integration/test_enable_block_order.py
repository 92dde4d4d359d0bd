"""``enable()`` blocks of one thread closed out of order (a breaker's finding, issue 25).

Two asyncio tasks (or two generators) of one thread each open a block; the first task's block is
the outer one.  When it exits first, the second task's block is still open but nothing is
pinned any more (the torch-function mode and the aten registration are gone): its ``mm`` ran
unpinned and uncounted, and its own exit raised a bare ``IndexError``.  Now the outer exit
raises :class:`~batchinv.fast.enable.state.BlockOrderError`, as does the late inner exit, and the
thread's state is clean for the next block.  Cost on the cpu lane: well under a second.
"""

from __future__ import annotations

import asyncio

import pytest

from batchinv.fast.enable import state
from batchinv.fast.enable.aten_override import enable
from batchinv.fast.enable.state import BlockOrderError

pytestmark = pytest.mark.cpu


def test_blocks_of_two_tasks_closed_out_of_order_raise_a_typed_error():
    log: dict[str, object] = {}

    async def first(opened: asyncio.Event, second_opened: asyncio.Event) -> None:
        try:
            with enable():
                opened.set()
                await second_opened.wait()  # the second task opens its block inside this one
        except BlockOrderError as exc:
            log["first"] = exc
        log["first_left_registered"] = state.registered()

    async def second(opened: asyncio.Event, second_opened: asyncio.Event) -> None:
        await opened.wait()
        try:
            with enable():
                second_opened.set()
                await asyncio.sleep(0)  # the first task's block exits now
                await asyncio.sleep(0)
        except BlockOrderError as exc:
            log["second"] = exc

    async def main() -> None:
        opened, second_opened = asyncio.Event(), asyncio.Event()
        await asyncio.gather(first(opened, second_opened), second(opened, second_opened))

    asyncio.run(main())
    assert isinstance(log.get("first"), BlockOrderError), log
    assert isinstance(log.get("second"), BlockOrderError), log
    assert log["first_left_registered"] is False
    assert state.frames() == [] and not state.registered()
    with enable(strict=False):  # the next block of this thread opens and closes cleanly
        assert len(state.frames()) == 1 and state.registered()
    assert state.frames() == [] and not state.registered()
