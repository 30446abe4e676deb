"""A leader that stops cleanly hands its lease over, even when the stop comes
while a renewal is on its way, and a follower outlives a failing abdicate
(against a real JetStream KV bucket)."""

from __future__ import annotations

import asyncio
from typing import Any

from libs.bus import Bus
from libs.leader import LEASES_BUCKET, LeaderElection, follow
from libs.tasks import cancel_and_wait


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


async def test_a_failing_abdicate_does_not_end_the_follower(bus: Bus) -> None:
    """A replica whose abdicate raised must still lead its next term: a
    dead follower would keep winning the lease and never lead again."""
    election = LeaderElection(bus, "follower-test", ttl_s=2, holder="replica-a")
    terms: list[int] = []
    abdicated: list[str] = []

    async def lead(term: int) -> None:
        terms.append(term)

    async def abdicate(reason: str) -> None:
        abdicated.append(reason)
        raise RuntimeError("could not stop what it led")

    await election.start()
    await asyncio.wait_for(election.wait_elected(), 5)
    task = await follow(election, lead=lead, abdicate=abdicate)
    try:
        assert len(terms) == 1
        await election.resign("testing")
        for _ in range(100):  # the lease is free: taken again within a tick
            if len(terms) == 2:
                break
            await asyncio.sleep(0.1)
        assert abdicated == ["testing"]
        assert len(terms) == 2 and terms[1] > terms[0], terms
        assert not task.done()
    finally:
        await cancel_and_wait([task])
        await election.stop()
