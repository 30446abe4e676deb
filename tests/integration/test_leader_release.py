"""A leader that stops cleanly hands its lease over, even when the stop comes
while a renewal is on its way (against a real JetStream KV bucket)."""

from __future__ import annotations

import asyncio
from typing import Any

from libs.bus import Bus
from libs.leader import LEASES_BUCKET, LeaderElection


async def test_a_stop_during_a_renewal_still_deletes_the_lease(bus: Bus) -> None:
    election = LeaderElection(bus, "scheduler", ttl_s=3, holder="sched-a")
    await election.start()
    await asyncio.wait_for(election.wait_elected(), 5)

    # The server applies the renewal; its reply reaches the leader late.
    # Stopping in between must not leave the delete at the old revision.
    applied = asyncio.Event()
    publish = bus.js.publish

    async def slow_reply(subject: str, payload: bytes = b"", **kw: Any) -> Any:
        ack = await publish(subject, payload, **kw)
        if subject.startswith(f"$KV.{LEASES_BUCKET}."):
            applied.set()
            await asyncio.sleep(0.3)
        return ack

    bus.js.publish = slow_reply  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(applied.wait(), 5)  # a renewal is in flight now
        await election.stop()
    finally:
        bus.js.publish = publish  # type: ignore[method-assign]

    kv = await bus.kv(LEASES_BUCKET)
    history = await kv.history("scheduler")
    assert str(history[-1].operation) == "DEL", history  # released, not left to expire
    assert not election.is_leader
