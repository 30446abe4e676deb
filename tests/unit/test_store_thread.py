"""The collector's store thread (services/lens_collector/store_thread.py):
urgent work jumps the telemetry queued before it, never the one running;
results and errors come back to the awaiting coroutine; shutdown runs what
was queued first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from services.lens_collector.store_thread import StoreThread


async def test_urgent_work_goes_before_queued_telemetry() -> None:
    store = StoreThread()
    ran: list[str] = []
    gate = threading.Event()

    def job(name: str, wait: bool = False) -> str:
        if wait:
            gate.wait(5)
        ran.append(name)
        return name

    running = store.submit(lambda: job("telemetry-1", wait=True), urgent=False)
    await asyncio.sleep(0.05)  # it holds the thread now
    queued = [store.submit(lambda n=n: job(n), urgent=False)
              for n in ("telemetry-2", "telemetry-3")]
    urgent = [store.submit(lambda n=n: job(n), urgent=True) for n in ("events", "query")]
    gate.set()
    assert await asyncio.gather(running, *queued, *urgent) == [
        "telemetry-1", "telemetry-2", "telemetry-3", "events", "query"]
    assert ran == ["telemetry-1", "events", "query", "telemetry-2", "telemetry-3"]

    def broken() -> None:
        raise ValueError("no such table")

    with pytest.raises(ValueError, match="no such table"):
        await store.submit(broken, urgent=True)
    late = store.submit(lambda: time.sleep(0.1) or "last", urgent=False)
    await asyncio.to_thread(store.shutdown)
    assert await late == "last"
