"""Liveness at fleet size, in small: the real failover process judges 2,000
registered nodes that beat once a second on core NATS (one lean publisher
plays their agents). Ten fall silent at once: exactly those ten get a
fault, each within the 3 s deadline plus half a second, and no other node
is touched while the rest beat on. (``bench/control_plane.py`` is the same
at 12,500 nodes with every service.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.events import (
    HeartbeatData,
    NodeHeartbeat,
    NodeRegistered,
    NodeRegisteredData,
    encode_event,
    parse_event,
)
from libs.natsfast import FastPublisher
from tests.helpers import start_service, stop_process, until, wait_healthy

pytestmark = pytest.mark.timeout(180)

NODES, KILLED, SLICES = 2000, 10, 20
DEADLINE_S = 3.0  # 1 s beats, 3 missed


def _frame(event: NodeHeartbeat | NodeRegistered) -> bytes:
    return FastPublisher.frame(event.subject.encode(), encode_event(event), event.id.encode())


async def test_ten_silent_nodes_among_two_thousand_are_caught_in_time_and_no_other(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    names = [f"n-{i:04d}" for i in range(NODES)]
    beats = [_frame(NodeHeartbeat(source=f"bench-agent:{n}", node=n, data=HeartbeatData(
        seq=1, pid=1, interval_s=1.0))) for n in names]
    out = FastPublisher(nats_url, name="agents")
    await out.start()
    silent: set[int] = set()
    stop = asyncio.Event()

    async def agents() -> None:
        start, second = time.time(), 0
        while not stop.is_set():
            for part in range(SLICES):
                await asyncio.sleep(max(0.0, start + second + part / SLICES - time.time()))
                out.write(b"".join(beats[i] for i in range(part, NODES, SLICES)
                                   if i not in silent))
                await out.flush()
            second += 1

    opened: dict[str, float] = {}

    async def on_fault(msg: object) -> None:
        with contextlib.suppress(Exception):
            event = parse_event(msg.data)  # type: ignore[attr-defined]
            if event.type == "fault.opened" and event.node:
                opened.setdefault(event.node, event.time.timestamp())

    await bus.nc.subscribe("safe.fault.*.opened", cb=on_fault)
    await bus.flush()
    proc = start_service("failover", [], nats_url, tmp_path, PRIMUS_HEARTBEAT_INTERVAL_S="1",
                         PRIMUS_HEARTBEAT_MISSED="3")
    task = asyncio.create_task(agents())
    try:
        await wait_healthy(bus, "failover", timeout=60)
        for i in range(0, NODES, 500):  # bootstrap's registrations
            out.write(b"".join(_frame(NodeRegistered(
                source="bootstrap", node=n, data=NodeRegisteredData(
                    ip=f"10.1.{j // 256}.{j % 256}", gpu_model="MI300X", gpu_count=8)))
                for j, n in enumerate(names[i:i + 500], i)))
            await out.flush()

        async def watching() -> bool:
            health = await wait_healthy(bus, "failover")
            return health["watched_nodes"] == NODES and health["beats_heard"] > 2 * NODES

        await until(watching, "failover to watch and hear every node", timeout=60)
        await asyncio.sleep(DEADLINE_S + 1)  # every node has been judged alive a while
        killed_at = time.time()
        silent.update(range(0, NODES, NODES // KILLED))
        victims = {names[i] for i in silent}
        await until(lambda: asyncio.sleep(0, victims <= set(opened)), "every silent node",
                    timeout=DEADLINE_S + 10)
        await asyncio.sleep(2)  # anything else would show by now
        assert set(opened) == victims
        late = {n: round(t - killed_at, 2) for n, t in opened.items()
                if t - killed_at > DEADLINE_S + 0.5}
        assert not late, f"faults later than the deadline allows: {late}"
        health = await wait_healthy(bus, "failover")
        assert set(health["down"]) == victims and health["beats_link"] == "lean"
        assert health["beats_connected"]
    finally:
        stop.set()
        await task
        await out.stop()
        assert stop_process(proc, tmp_path / "failover.log") == 0
