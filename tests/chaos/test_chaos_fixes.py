"""Regression tests for the bugs the chaos runs found, each at the smallest
scale that shows it (the chaos run itself shows it end to end).

One fix has no smaller test than its chaos run: a scheduler killed while a
gang was stopping never finished the stop (a rank stuck on its dead peer
ran on, and the stop timeout placed the next attempt beside it). Replay:
``PRIMUS_CHAOS_SEEDS=14 PRIMUS_CHAOS_KILLS=6 pytest tests/chaos``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path

from libs.bus import Bus
from libs.drivers.local import LocalDriver
from libs.embedded import NatsServer
from libs.events import Event, JobSpec, WorkerSlot, parse_event
from services.failover.rules import HeartbeatMonitor


def test_a_bus_outage_of_the_monitor_does_not_count_as_silence() -> None:
    """Seed 1: nats-server down for 4.9 s made failover open heartbeat faults
    on every node (and bootstrap quarantined the whole fleet)."""
    mon = HeartbeatMonitor(interval_s=1.0, missed=3)
    for node in ("a", "b"):
        mon.watch(node, 9.0)  # registered: only those are judged
        mon.beat(node, 10.0)
    mon.blind(11.0)  # the monitor's bus went down ...
    mon.blind(15.0)  # ... and was still down here
    assert mon.check(15.5) == []  # 5.5 s without a beat, but 0.5 s of hearing
    mon.beat("a", 16.0)
    assert mon.check(17.9) == []
    missed = mon.check(18.1)  # b: 3.1 s of hearing nothing
    assert [m.node for m in missed] == ["b"]
    assert missed[0].last_seen == 10.0  # detection is still timed from its last beat
    mon.blind(12.0)  # an older blind spot moves nothing back
    assert mon.deaf_until == 15.0


async def test_a_worker_exit_during_a_bus_outage_is_still_reported(tmp_path: Path) -> None:
    """A worker that ends while nats-server is down (longer than a JetStream
    request waits) must still be reported once the bus is back: the
    scheduler holds its gang until every rank's exit is known."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    bus = await Bus.connect(server.url, "driver")
    await bus.ensure_topology()
    driver = LocalDriver(tmp_path / "state", bus.publish, nats_url=server.url)
    spec = JobSpec(name="j", workers=1, command=["python", "-c", "import time; time.sleep(1)"])
    try:
        await driver.launch("j", 1, spec, [WorkerSlot(rank=0, node="n1", gpus=0)])
        server.kill()
        await asyncio.sleep(7)  # the worker ends meanwhile; a request times out after 5 s
        server.start(tmp_path / "nats.log")
        pids = tmp_path / "state" / "pids" / "n1"
        deadline = time.monotonic() + 15
        types: list[str] = []
        while time.monotonic() < deadline and ("worker.exited" not in types
                                                or list(pids.glob("[0-9]*"))):
            await asyncio.sleep(0.3)
            with contextlib.suppress(Exception):
                last = (await bus.js.stream_info("CONTROL")).state.last_seq
                types = [parse_event((await bus.js.get_msg("CONTROL", s)).data).type
                         for s in range(1, last + 1)]
        assert types == ["worker.started", "worker.exited"]  # once, despite the retries
        # Its watcher lived to see the exit published: the pid file is gone.
        assert not list(pids.glob("[0-9]*"))
    finally:
        await driver.close()
        await bus.close()
        server.stop()


async def test_an_adopted_worker_is_announced_once(tmp_path: Path) -> None:
    """Seed 14 (6 kills): a scheduler restarted 2 minutes after a worker
    started announced that start again; JetStream had forgotten the id (its
    de-duplication window is 120 s), so the stream held it twice. A worker
    whose start was never announced (the driver died first) still is."""
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    state = tmp_path / "state"
    first = LocalDriver(state, sink, nats_url="nats://127.0.0.1:1")
    spec = JobSpec(name="j", workers=1, command=["python", "-c", "import time; time.sleep(2)"])
    await first.launch("j", 1, spec, [WorkerSlot(rank=0, node="n1", gpus=0)])
    await first.detach()  # the scheduler dies; its worker runs on
    # A worker whose driver died between starting and announcing it.
    unannounced = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    (state / "pids" / "n2").mkdir(parents=True)
    (state / "pids" / "n2" / str(unannounced.pid)).write_text("j 1 1\n")
    second = LocalDriver(state, sink, nats_url="nats://127.0.0.1:1")
    try:
        assert await second.adopt() == 2
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sum(e.type == "worker.exited" for e in events) < 2:
            await asyncio.sleep(0.2)
        assert sorted((e.type, e.node) for e in events) == [
            ("worker.exited", "n1"), ("worker.exited", "n2"),
            ("worker.started", "n1"), ("worker.started", "n2")]
    finally:
        await second.close()
        unannounced.wait()
