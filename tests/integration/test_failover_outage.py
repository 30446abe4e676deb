"""Failover during a NATS outage: a fault decided while the bus is down is
published once it is back, not forgotten (the fault book had already moved
on, so nothing would ever decide it again); health shows the heartbeat link
down meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.embedded import NatsServer
from libs.events import FaultOpened, parse_event
from libs.settings import Settings
from services.failover.app import Failover


async def test_a_fault_decided_while_nats_is_down_goes_out_when_it_is_back(
        tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    bus = await Bus.connect(server.url, "failover")
    await bus.ensure_topology()
    failover = Failover(Settings(nats_url=server.url, state_dir=tmp_path / "state",
                                 heartbeat_interval_s=0.5))
    await failover.start(bus)
    try:
        server.kill()
        for _ in range(100):  # the client notices the server is gone
            if not bus.nc.is_connected:
                break
            await asyncio.sleep(0.05)
        decisions = failover.book.observe("heartbeat_missed", "gpu-03", bad=True,
                                          now=time.time(), reason="no heartbeat")
        [opened] = [d for d in decisions if d.action == "open"]
        with pytest.raises(Exception):  # noqa: B017 - a timeout or a connection error
            await asyncio.wait_for(failover._act(decisions), 3)
        assert failover.health()["decisions_unsent"] == len(decisions)
        # No beat can arrive now, and health says so rather than nothing.
        for _ in range(100):
            if not failover.health()["beats_connected"]:
                break
            await asyncio.sleep(0.05)
        assert failover.health()["beats_connected"] is False
        # The same observation again decides nothing new: the book moved on.
        assert failover.book.observe("heartbeat_missed", "gpu-03", bad=True,
                                     now=time.time()) == []

        server.restart()
        deadline = time.monotonic() + 30
        while failover.health()["decisions_unsent"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert failover.health()["decisions_unsent"] == 0
        while not failover.health()["beats_connected"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert failover.health()["beats_connected"] is True
        check = await Bus.connect(server.url, "check")
        try:
            msg = await check.js.get_last_msg("CONTROL", "safe.fault.gpu-03.opened")
            event = parse_event(msg.data)
            assert isinstance(event, FaultOpened) and event.id == opened.fault.fault_id
            record = await (await check.kv("faults")).get(opened.fault.fault_id)
            assert json.loads(record.value)["fault_id"] == opened.fault.fault_id
        finally:
            await check.close()
    finally:
        await failover.stop()
        await bus.close()
        server.stop()
