"""Nodes come back by themselves, on a real bus: a quarantined node is
benched again on a back-off and returns to ready when it passes; a fault an
operator closes (``primus-safe fault close``) sends its node to bench at
once; ``primus-safe node cordon|uncordon`` holds a node and lets it go, and
a cordoned node is left alone by the re-bench."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.events import (
    BenchRequest,
    BenchResult,
    BenchResultData,
    NodeStateChanged,
    parse_event,
)
from libs.inventory import local_hosts
from libs.records import FAULTS, NODES
from libs.settings import Settings
from services.bootstrap.app import Bootstrap
from services.failover.app import Failover
from tests.helpers import run_cli, stream_messages, until

pytestmark = pytest.mark.timeout(120)


class Agent:
    """Plays node-1's bench agent: answers each request with the next verdict."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.requests: list[BenchRequest] = []
        self.verdicts: list[bool | str] = []  # pass/fail, or "degraded" (a pass below its fleet)

    async def start(self) -> None:
        self.sub = await self.bus.nc.subscribe("safe.bench.*.request", cb=self._on)

    async def _on(self, msg: Any) -> None:
        event = parse_event(msg.data)
        assert isinstance(event, BenchRequest)
        self.requests.append(event)
        verdict = self.verdicts.pop(0) if self.verdicts else True
        passed = verdict is not False
        outcome = "degraded" if verdict == "degraded" else "healthy" if passed else "failed"
        await self.bus.publish(BenchResult(
            id=f"{event.id}-result", source="test", node=event.node, data=BenchResultData(
                level="quick", request_id=event.id, passed=passed,
                reason={"healthy": "all checks passed", "degraded": "GEMM 12% below its fleet",
                        "failed": "GEMM result wrong"}[outcome],
                device="cpu", device_count=1, gpu_model="cpu", duration_s=0.1,
                outcome=outcome)))  # type: ignore[arg-type]


async def settled(bus: Bus, durable: str) -> None:
    """Every event so far handled by ``durable`` (a fault injected before
    failover has heard the node become ready would be closed by that news)."""
    async def done() -> bool:
        info = await bus.js.consumer_info("CONTROL", durable)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await until(done, f"{durable} to catch up", timeout=20)


async def state_of(bus: Bus, node: str) -> Any:
    return await (await bus.records(NODES)).get(node)


async def test_quarantined_nodes_are_rebenched_and_operators_hold_them(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, rebench_first_s=1.0,
                        rebench_max_interval_s=4.0, rebench_attempts=3,
                        heartbeat_missed=10_000)  # this test's agent does not beat
    agent = Agent(bus)
    await agent.start()
    bootstrap = Bootstrap(settings, local_hosts(1))
    failover = Failover(settings)
    await bootstrap.start(bus)
    await failover.start(bus)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_NATS_URL"] = nats_url
    try:
        async def ready() -> bool:
            record = await state_of(bus, "node-1")
            return record is not None and record.state == "ready"

        await until(ready, "onboarding")

        # A fault quarantines the node; the re-bench fails once, then passes.
        await settled(bus, "failover")
        agent.verdicts = [False, True]
        quarantined_at = time.time()
        await failover._act(failover.book.observe(
            "bench_failed", "node-1", bad=True, now=quarantined_at, reason="probe"))

        async def quarantined() -> bool:
            record = await state_of(bus, "node-1")
            return record.state == "quarantined" and record.next_rebench_at is not None

        await until(quarantined, "the fault to quarantine the node", timeout=10)
        await until(ready, "the node to pass a re-bench and come back", timeout=20)
        rebenches = [r for r in agent.requests if r.data.reason.startswith("re-bench")]
        assert [r.data.reason for r in rebenches] == [
            "re-bench 1 of 3 after quarantine", "re-bench 2 of 3 after quarantine"]
        assert all(r.data.expires_at is not None for r in rebenches)
        states = [parse_event(m.data).data.state  # type: ignore[attr-defined]
                  for m in await stream_messages(bus, "safe.node.node-1.state")]
        assert states[-5:] == ["quarantined", "repair", "quarantined", "repair", "ready"]
        record = await state_of(bus, "node-1")
        assert record.rebench_attempts == 0 and record.next_rebench_at is None

        # An operator's cordon: the node is held (the scheduler places nothing
        # there), a fault on it quarantines it but no re-bench runs while held.
        cordon = await asyncio.to_thread(run_cli, "node", "cordon", "node-1", "--reason",
                                         "bad DIMM", "--json", env=env)
        assert cordon.returncode == 0, cordon.stderr
        assert json.loads(cordon.stdout)["cordoned"] is True
        record = await state_of(bus, "node-1")
        assert record.cordoned and "bad DIMM" in record.cordoned_by
        listing = await asyncio.to_thread(run_cli, "nodes", env=env)
        assert "ready,cordoned" in listing.stdout
        again = await asyncio.to_thread(run_cli, "node", "cordon", "node-1", "--json", env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False
        asked = len(agent.requests)
        await settled(bus, "failover")
        await failover._act(failover.book.observe(
            "bench_failed", "node-1", bad=True, now=time.time(), reason="probe again"))

        async def quarantined_again() -> bool:
            return (await state_of(bus, "node-1")).state == "quarantined"

        await until(quarantined_again, "the second fault", timeout=10)
        await asyncio.sleep(2.5)
        assert len(agent.requests) == asked  # held: not benched
        uncordon = await asyncio.to_thread(run_cli, "node", "uncordon", "node-1", env=env)
        assert uncordon.returncode == 0 and "node node-1 uncordoned" in uncordon.stdout
        await until(ready, "the uncordoned node's overdue re-bench", timeout=20)

        # Every re-bench fails: after the last one the node waits for an
        # operator, whose `fault close` sends it to bench at once.
        await settled(bus, "failover")
        agent.verdicts = [False] * 3
        await failover._act(failover.book.observe(
            "bench_failed", "node-1", bad=True, now=time.time(), reason="probe once more"))

        async def given_up() -> bool:
            record = await state_of(bus, "node-1")
            return record.state in ("quarantined", "repair") and record.rebench_attempts == 3 \
                and record.next_rebench_at is None and not agent.verdicts

        await until(given_up, "three failed re-benches", timeout=30)
        await settled(bus, "failover")
        [open_fault] = [f for f in (await (await bus.records(FAULTS)).load()).values()
                        if f.status != "closed" and f.reason == "probe once more"]
        closed = await asyncio.to_thread(run_cli, "fault", "close", open_fault.fault_id,
                                         "--reason", "DIMM replaced", env=env)
        assert closed.returncode == 0, closed.stderr
        assert f"fault {open_fault.fault_id} closed" in closed.stdout
        await until(ready, "the node to come back through bench after the close", timeout=20)
        assert any(r.data.reason == f"fault {open_fault.fault_id} closed"
                   for r in agent.requests)
        record = await (await bus.records(FAULTS)).get(open_fault.fault_id)
        assert record is not None and record.closed_by and record.close_reason == "DIMM replaced"
        again = await asyncio.to_thread(run_cli, "fault", "close", open_fault.fault_id, env=env)
        assert again.returncode == 0 and "already closed" in again.stdout

        unknown = await asyncio.to_thread(run_cli, "node", "drain", "node-9", env=env)
        assert unknown.returncode == 1 and "node node-9 not found" in unknown.stderr
        gone = await asyncio.to_thread(run_cli, "fault", "close", "nope", env=env)
        assert gone.returncode == 1 and "fault nope not found" in gone.stderr
        states = [parse_event(m.data) for m in await stream_messages(bus, "safe.node.node-1.state")]
        assert any(isinstance(e, NodeStateChanged) and not e.data.schedulable for e in states)
    finally:
        await failover.stop()
        await bootstrap.stop()
        await agent.sub.unsubscribe()



async def test_a_failing_probe_quarantines_through_failover_and_its_recovery_does_not_return(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """The probe_failed rule has its producer: a probe report from the agent
    opens a fault (bootstrap does not act on probes itself); the probe's
    recovery report does not bring the node back: a bench run does."""
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, rebench_first_s=600,
                        heartbeat_missed=10_000)
    agent = Agent(bus)
    await agent.start()
    bootstrap = Bootstrap(settings, local_hosts(1))
    failover = Failover(settings)
    await bootstrap.start(bus)
    await failover.start(bus)
    try:
        async def in_state(state: str) -> bool:
            record = await state_of(bus, "node-1")
            return record is not None and record.state == state

        await until(lambda: in_state("ready"), "onboarding")

        def probe(passed: bool) -> BenchResult:
            return BenchResult(source="test", node="node-1", data=BenchResultData(
                level="quick", passed=passed, trigger="probe", device="cpu", device_count=1,
                gpu_model="cpu", duration_s=0.0, outcome="healthy" if passed else "failed",
                reason="temp ok" if passed else "temp failed 3 time(s) in a row: 101 °C"))

        await bus.publish(probe(False))
        await until(lambda: in_state("quarantined"), "the probe fault to quarantine the node")
        [fault] = (await (await bus.records(FAULTS)).load()).values()
        assert fault.kind == "probe_failed" and "101 °C" in fault.reason
        await bus.publish(probe(True))
        await settled(bus, "bootstrap")
        assert await in_state("quarantined")  # a probe's recovery is not a bench pass
    finally:
        await failover.stop()
        await bootstrap.stop()
        await agent.sub.unsubscribe()


async def test_a_degraded_verdict_marks_the_node_and_a_healthy_one_clears_it(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, heartbeat_missed=10_000)
    agent = Agent(bus)
    agent.verdicts = ["degraded"]
    await agent.start()
    bootstrap = Bootstrap(settings, local_hosts(1))
    await bootstrap.start(bus)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_NATS_URL"] = nats_url
    try:
        async def degraded() -> bool:
            record = await state_of(bus, "node-1")
            return record is not None and record.state == "ready" and record.degraded

        await until(degraded, "the degraded verdict")
        listing = await asyncio.to_thread(run_cli, "nodes", env=env)
        assert "ready,degraded" in listing.stdout and "12% below its fleet" in listing.stdout
        said = [parse_event(m.data) for m in await stream_messages(bus, "safe.node.node-1.state")]
        assert any(isinstance(e, NodeStateChanged) and e.data.degraded for e in said)
        await bootstrap._request_bench("node-1", cause="again")  # the next run is healthy

        async def healthy() -> bool:
            record = await state_of(bus, "node-1")
            return record.state == "ready" and not record.degraded

        await until(healthy, "a healthy verdict to clear it")
    finally:
        await bootstrap.stop()
        await agent.sub.unsubscribe()
