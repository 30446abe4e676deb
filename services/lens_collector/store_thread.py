"""The store's one thread, with two lanes.

chDB is one engine per process, driven from one thread: history inserts,
telemetry inserts, the alert rules' queries and the CLI's queries all take
turns there. A telemetry insert of a full batch (100,000 GPU rows) holds it
for about half a second, and up to two wait their turn, so a FIFO queue
would make a node's state change or an operator's query wait behind a
second of telemetry. Here small work goes first: anything ``urgent`` runs
before every telemetry batch still queued (never preempting the one that
runs). Telemetry cannot starve: urgent work is a few small inserts and
queries a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

URGENT, BULK, STOP = 0, 1, 2


class StoreThread:
    def __init__(self, name: str = "clickhouse") -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO within a lane
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], *, urgent: bool) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put((URGENT if urgent else BULK, next(self._order), (fn, loop, future)))
        return future

    def shutdown(self) -> None:
        """After everything already queued, in either lane."""
        self._queue.put((STOP, next(self._order), None))
        self._thread.join()

    def _run(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            fn, loop, future = item
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                _settle(loop, future, exc=exc)
            else:
                _settle(loop, future, result=result)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], *,
            result: Any = None, exc: BaseException | None = None) -> None:
    def done() -> None:
        if future.done():  # the awaiting coroutine was cancelled
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(done)
