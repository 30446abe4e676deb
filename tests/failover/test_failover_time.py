"""Failover judges liveness on its own clock, and only for registered nodes.

The real ``primus-safe failover`` process is restarted six times against a
real nats-server while three registered nodes beat slowly: they fall silent
while failover is down and beat again only a while after it is back (within
a deadline), one with a clock hours behind and one in 2099. Beats sent
while failover is down are heard by no one (core NATS); none of that may
quarantine a healthy node. Then a node that really stops, the one whose clock says
2099, is caught, and a beat from a name bootstrap never registered opens
nothing."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
import pytest

from libs.bus import CONTROL, Bus
from libs.events import (
    BenchResult,
    BenchResultData,
    FaultOpened,
    HeartbeatData,
    NodeHeartbeat,
    parse_event,
)
from tests.helpers import ready_nodes, start_service, stop_process, wait_healthy

pytestmark = pytest.mark.timeout(300)

INTERVAL_S, MISSED = 1.0, 3  # a 3 s deadline
CLOCKS = {"gpu-1": timedelta(0), "gpu-2": timedelta(hours=-2),
          "gpu-3": datetime(2099, 1, 1, tzinfo=UTC) - datetime.now(UTC)}
# Before failover judged on its own clock, one start in three quarantined a
# healthy node: six rounds miss that with odds under 1 in 10.
ROUNDS = 6
ENV = {"PRIMUS_HEARTBEAT_INTERVAL_S": str(INTERVAL_S), "PRIMUS_HEARTBEAT_MISSED": str(MISSED)}


async def _beat(bus: Bus, node: str, seq: int) -> None:
    await bus.publish(NodeHeartbeat(source=f"bench-agent:{node}", node=node,
                                    time=datetime.now(UTC) + CLOCKS.get(node, timedelta(0)),
                                    data=HeartbeatData(seq=seq, pid=1, interval_s=INTERVAL_S)))


async def _faults_opened(bus: Bus) -> list[FaultOpened]:
    sub = await bus.js.pull_subscribe("safe.fault.*.opened", stream=CONTROL.name)
    out = []
    while True:
        try:
            msgs = await sub.fetch(100, timeout=0.5)
        except (nats.errors.TimeoutError, TimeoutError):
            break
        out += [e for m in msgs if isinstance(e := parse_event(m.data), FaultOpened)]
    await sub.unsubscribe()
    return out


async def test_restarts_with_slow_agents_quarantine_no_healthy_node(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    await ready_nodes(bus, {node: (8, "r1") for node in CLOCKS})
    seq = 0
    for round_ in range(ROUNDS):
        proc = start_service("failover", [], nats_url, tmp_path, **ENV)
        try:
            await wait_healthy(bus, "failover", timeout=60)
            await asyncio.sleep(1.5)  # slow agents: silent for half a deadline after the start
            for _ in range(3):
                seq += 1
                for node in CLOCKS:
                    await _beat(bus, node, seq)
                await asyncio.sleep(INTERVAL_S / 2)
            health = await wait_healthy(bus, "failover")
            assert health["down"] == [] and health["faults_open"] == [], (round_, health)
        finally:
            assert stop_process(proc, tmp_path / "failover.log") == 0
        assert await _faults_opened(bus) == [], f"a healthy node was judged in round {round_}"

    proc = start_service("failover", [], nats_url, tmp_path, **ENV)
    try:
        await wait_healthy(bus, "failover", timeout=60)
        # Health answers before the service's heartbeat listener (a
        # connection of its own) is subscribed: beat until it hears one.
        heard_by = time.monotonic() + 30
        while not (await wait_healthy(bus, "failover"))["beats_heard"]:
            assert time.monotonic() < heard_by, "failover never heard a heartbeat"
            seq += 1
            await _beat(bus, "gpu-1", seq)
            await asyncio.sleep(0.2)
        await _beat(bus, "ghost-1", 1)  # never registered
        deadline = time.monotonic() + 3 * MISSED * INTERVAL_S + 10
        while time.monotonic() < deadline:  # gpu-1 and gpu-2 beat on; gpu-3 (2099) stopped
            seq += 1
            for node in ("gpu-1", "gpu-2"):
                await _beat(bus, node, seq)
            if (await wait_healthy(bus, "failover"))["down"]:
                break
            await asyncio.sleep(INTERVAL_S / 2)
        health = await wait_healthy(bus, "failover")
        assert health["down"] == ["gpu-3"], health
        assert health["unknown_beats"] == 1 and health["unknown_nodes"] == ["ghost-1"]
        await asyncio.sleep(1)
        assert [f.node for f in await _faults_opened(bus)] == ["gpu-3"]
    finally:
        assert stop_process(proc, tmp_path / "failover.log") == 0


async def test_a_stamp_beyond_the_skew_is_flagged_in_health(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    await ready_nodes(bus, {"gpu-3": (8, "r1")})
    proc = start_service("failover", [], nats_url, tmp_path, PRIMUS_CLOCK_SKEW_S="5", **ENV)
    try:
        await wait_healthy(bus, "failover", timeout=60)
        for seq in range(3):  # the agent's verdicts, stamped by its clock in 2099
            await _beat(bus, "gpu-3", seq)
            await bus.publish(BenchResult(
                source="bench-agent:gpu-3", node="gpu-3", time=datetime.now(UTC) + CLOCKS["gpu-3"],
                data=BenchResultData(level="quick", passed=True, device="cpu", device_count=1,
                                     duration_s=0.1)))
        for _ in range(50):
            health = await wait_healthy(bus, "failover")
            if health["skewed_stamps"].get("bench-agent:gpu-3") == 3:
                break
            await asyncio.sleep(0.1)
        assert health["skewed_stamps"] == {"bench-agent:gpu-3": 3}
        assert health["down"] == []  # flagged, and still alive: its beats were heard
    finally:
        assert stop_process(proc, tmp_path / "failover.log") == 0
