"""Ending background tasks for sure.

On Python 3.11 a cancellation can be lost: ``asyncio.wait_for`` (which
nats-py's requests and JetStream publishes use) returns the awaited result
instead of raising when the cancel arrives in the same loop pass as that
result (CPython gh-86296, fixed in 3.12). A loop that lost its cancel runs on
(a heartbeat loop publishes its next beat), and a plain ``await task`` after
``task.cancel()`` waits for ever: a service's stop then overruns its limit and
the process is killed. ``cancel_and_wait`` cancels again until every task has
ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

# How long one cancel is given before it is sent again.
RECANCEL_S = 0.25


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object] | asyncio.Future[object] | None],
                          *, recancel_s: float = RECANCEL_S) -> list[BaseException]:
    """Cancel ``tasks`` (``None`` entries are skipped) and wait until each has
    ended, cancelling again those that go on. The errors the tasks ended with
    (not their cancellation) are returned for the caller to log."""
    tasks = [t for t in tasks if t is not None]
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_s)
    return [exc for t in tasks if not t.cancelled() and (exc := t.exception()) is not None]
