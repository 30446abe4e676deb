"""New nodes onboard with the standard level, and a node whose GPUs pass
every check on the node but sit below their model's peak floor is
quarantined before it takes a job: bootstrap keeps a node whose standard
bench passed on its agent in preflight until bench-coordinator (real, on a
real bus) gives the fleet verdict; without a verdict in time the agent's own
result stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.events import BenchRequest, BenchResult, BenchResultData, Figure, parse_event
from libs.inventory import local_hosts
from libs.records import NODES
from libs.settings import Settings
from services.bench.coordinator import BenchCoordinator
from services.bootstrap.app import Bootstrap
from services.bootstrap.onboarding import awaits_verdict, verdict_overdue
from tests.helpers import fail_once, stream_messages, until

pytestmark = pytest.mark.timeout(120)
MI300X = "AMD Instinct MI300X"


class Agents:
    """Plays every node's bench agent: a passing standard run whose bf16 GEMM
    is the node's entry in ``tflops`` (TFLOPS at 8192^3)."""

    def __init__(self, bus: Bus, tflops: dict[str, float]) -> None:
        self.bus, self.tflops = bus, tflops
        self.requests: list[BenchRequest] = []

    async def start(self) -> None:
        self.sub = await self.bus.nc.subscribe("safe.bench.*.request", cb=self._on)

    async def _on(self, msg: Any) -> None:
        event = parse_event(msg.data)
        assert isinstance(event, BenchRequest)
        self.requests.append(event)
        await self.bus.publish(BenchResult(
            id=f"{event.id}-result", source="test", node=event.node, data=BenchResultData(
                level=event.data.level, request_id=event.id, passed=True,
                reason="all checks passed", device="rocm", device_count=1, gpu_model=MI300X,
                duration_s=30.0, outcome="healthy", attempt=event.data.attempt,
                retry_of=event.data.retry_of, figures=[Figure(
                    name="gemm_bf16_8192_tflops", value=self.tflops[event.node],
                    unit="TFLOPS")])))


async def state(bus: Bus, node: str) -> str | None:
    record = await (await bus.records(NODES)).get(node)
    return record.state if record is not None else None


def test_only_a_judged_levels_pass_on_the_node_waits_for_the_verdict() -> None:
    assert awaits_verdict("preflight", level="standard", passed=True, judged_by="agent")
    assert awaits_verdict("repair", level="full", passed=True, judged_by="agent")
    assert not awaits_verdict("preflight", level="quick", passed=True, judged_by="agent")
    assert not awaits_verdict("preflight", level="standard", passed=False, judged_by="agent")
    assert not awaits_verdict("preflight", level="standard", passed=True,
                              judged_by="coordinator")
    assert not awaits_verdict("ready", level="standard", passed=True, judged_by="agent")
    assert verdict_overdue("preflight", 100.0, 99.0) is None  # not yet
    assert verdict_overdue("preflight", 100.0, 100.0) is True  # its own pass stands
    assert verdict_overdue("quarantined", 100.0, 101.0) is False  # moved on: clear the wait
    assert verdict_overdue("preflight", None, 1e9) is None


async def test_a_gpu_under_its_peak_floor_is_quarantined_before_it_takes_a_job(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, rebench_attempts=0)
    assert settings.onboarding_bench_level == "standard"  # the default
    # node-1: a healthy MI300X; node-2: a third of its bf16 peak, everything
    # else passing (the floor is 35% of 1307.4 TFLOPS).
    agents = Agents(bus, {"node-1": 700.0, "node-2": 400.0})
    await agents.start()
    coordinator, bootstrap = await start_both(settings, bus, bus)
    try:
        reason = await node_2_quarantined(bus)
        assert {r.data.level for r in agents.requests} == {"standard"}
        assert "below the floor" in reason, reason
        # node-2 was never ready: it went from preflight straight to quarantine.
        states = [parse_event(m.data).data.state  # type: ignore[attr-defined]
                  for m in await stream_messages(bus, "safe.node.node-2.state")]
        assert "ready" not in states and states[-1] == "quarantined", states
    finally:
        await bootstrap.stop()
        await coordinator.stop()


async def test_without_a_verdict_in_time_the_nodes_own_pass_stands(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, bench_verdict_wait_s=2.0,
                        rebench_first_s=0.4)
    agents = Agents(bus, {"node-1": 700.0})
    await agents.start()
    bootstrap = Bootstrap(settings, local_hosts(1))  # and no coordinator runs
    await bootstrap.start(bus)
    try:
        async def waiting() -> bool:
            record = await (await bus.records(NODES)).get("node-1")
            return record is not None and record.verdict_due_at is not None \
                and record.state == "preflight"

        await until(waiting, "node-1 to wait for its verdict", timeout=15)

        async def ready() -> bool:
            return await state(bus, "node-1") == "ready"

        await until(ready, "the node's own pass to stand", timeout=15)
        record = await (await bus.records(NODES)).get("node-1")
        assert record.verdict_due_at is None and "no fleet verdict within 2 s" in record.reason
    finally:
        await bootstrap.stop()


async def _leads(coordinator: BenchCoordinator) -> bool:
    return coordinator.election is not None and coordinator.election.is_leader


async def start_both(settings: Settings, coordinator_bus: Bus,
                     bus: Bus) -> tuple[BenchCoordinator, Bootstrap]:
    """The coordinator, once it leads, then bootstrap with two local hosts."""
    coordinator = BenchCoordinator(settings)
    bootstrap = Bootstrap(settings, local_hosts(2))
    await coordinator.start(coordinator_bus)
    await until(lambda: _leads(coordinator), "the coordinator to lead", timeout=20)
    await bootstrap.start(bus)
    return coordinator, bootstrap


async def node_2_quarantined(bus: Bus) -> str:
    """Once node-1 is ready and node-2 quarantined: node-2's reason."""
    async def settled() -> dict[str, str | None] | None:
        now = {n: await state(bus, n) for n in ("node-1", "node-2")}
        return now if now == {"node-1": "ready", "node-2": "quarantined"} else None

    await until(settled, "node-1 ready and node-2 quarantined", timeout=30)
    return (await (await bus.records(NODES)).get("node-2")).reason


async def test_a_verdict_that_could_not_be_sent_is_sent_when_the_result_comes_again(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """The coordinator's verdict on node-2 is lost once (NATS away when it is
    sent): the agent's result comes again, is judged again and the verdict
    goes out. The coordinator used to hold the run as judged already, so it
    sent nothing, and bootstrap let node-2's own pass stand: ready, below
    the floor."""
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, rebench_attempts=0,
                        bench_verdict_wait_s=8.0)
    agents = Agents(bus, {"node-1": 700.0, "node-2": 400.0})
    await agents.start()
    own = await Bus.connect(nats_url, "bench-coordinator")
    own.publish, lost = fail_once(  # type: ignore[method-assign]
        own.publish, lambda event: isinstance(event, BenchResult) and event.node == "node-2"
        and event.data.judged_by == "coordinator")
    coordinator, bootstrap = await start_both(settings, own, bus)
    try:
        reason = await node_2_quarantined(bus)
        assert lost, "the verdict on node-2 was never sent"
        assert "below the floor" in reason, reason
    finally:
        await bootstrap.stop()
        await coordinator.stop()
        await own.close()
