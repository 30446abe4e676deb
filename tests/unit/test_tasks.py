"""cancel_and_wait ends a task whose cancellation Python 3.11 lost."""

from __future__ import annotations

import asyncio
import sys

import pytest

from libs.tasks import cancel_and_wait


def _loop_that_waits_with_wait_for(futures: list[asyncio.Future[int]]):  # type: ignore[no-untyped-def]
    """A loop like a heartbeat's: each pass waits on a reply through wait_for."""
    async def run() -> None:
        while True:
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            futures.append(fut)
            await asyncio.wait_for(fut, 5)
    return run()


async def test_a_cancel_that_arrives_with_the_reply_is_sent_again() -> None:
    futures: list[asyncio.Future[int]] = []
    task = asyncio.create_task(_loop_that_waits_with_wait_for(futures))
    await asyncio.sleep(0.01)
    futures[-1].set_result(1)  # the reply and the cancel land in the same loop pass
    task.cancel()
    if sys.version_info < (3, 12):  # the very loss this guards against
        done, _ = await asyncio.wait([task], timeout=0.3)
        assert not done, "one cancel was enough: Python no longer loses it here"
    errors = await asyncio.wait_for(cancel_and_wait([task], recancel_s=0.05), 5)
    assert task.cancelled() and errors == []


async def test_errors_are_returned_and_none_and_finished_tasks_are_fine() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    async def sleeps() -> None:
        await asyncio.sleep(60)

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    asleep = asyncio.create_task(sleeps())
    errors = await cancel_and_wait([failed, None, asleep])
    assert [type(e) for e in errors] == [ValueError] and asleep.cancelled()
    assert await cancel_and_wait([]) == []


@pytest.mark.parametrize("swallowed", [1, 3])
async def test_a_task_that_swallows_cancels_still_ends(swallowed: int) -> None:
    seen = 0

    async def stubborn() -> None:
        nonlocal seen
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen += 1
                if seen > swallowed:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], recancel_s=0.02), 5)
    assert task.cancelled() and seen == swallowed + 1
