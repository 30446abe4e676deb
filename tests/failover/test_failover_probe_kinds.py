"""A health probe's report carries its catalogue fault kind: an operator's
rule for ``probe:<kind>`` governs it (here: record a host-setting fault
without taking the node out of service), and a kind no rule names is the
ordinary probe_failed fault (quarantine). Failover in-process on a real
nats-server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats.errors
import pytest

from libs.bus import CONTROL, Bus
from libs.events import BenchCheck, BenchResult, BenchResultData, FaultOpened, parse_event
from libs.settings import Settings
from services.failover.app import Failover
from services.failover.faults import FailoverRules, FaultRule, bench_fault_kind

pytestmark = pytest.mark.timeout(60)


def report(node: str, fault: str) -> BenchResult:
    return BenchResult(source=f"bench-agent/{node}", node=node, data=BenchResultData(
        level="quick", passed=False, reason=f"health probe x ({fault}) failed 2 time(s)",
        device="cpu", device_count=1, duration_s=0.0, outcome="failed", trigger="probe",
        fault_kind=fault, checks=[BenchCheck(name="x", status="failed", detail="bad")]))


async def opened(bus: Bus, n: int) -> list[FaultOpened]:
    deadline = time.monotonic() + 15
    while True:
        sub = await bus.js.pull_subscribe("safe.fault.*.opened", stream=CONTROL.name)
        found: list[FaultOpened] = []
        try:
            while True:
                msgs = await sub.fetch(100, timeout=0.3)
                found += [e for m in msgs if isinstance(e := parse_event(m.data), FaultOpened)]
        except (nats.errors.TimeoutError, TimeoutError):
            pass
        await sub.unsubscribe()
        if len(found) >= n or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


def test_which_kind_a_failing_bench_result_is() -> None:
    rules = FailoverRules(rules=[FaultRule(kind="probe:host_setting", failover=False)])
    assert bench_fault_kind(rules, probe=True, fault_kind="host_setting") == "probe:host_setting"
    assert bench_fault_kind(rules, probe=True, fault_kind="rdma_port_down") == "probe_failed"
    assert bench_fault_kind(rules, probe=True, fault_kind=None) == "probe_failed"
    assert bench_fault_kind(rules, probe=False, fault_kind="host_setting") == "bench_failed"


async def test_a_probe_fault_kind_follows_its_own_rule_or_the_default(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {kind: probe_failed}\n"
                     "  - {kind: 'probe:host_setting', failover: false}\n")
    failover = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "s",
                                 failover_rules=rules))
    await failover.start(bus)
    try:
        await bus.publish(report("gpu-1", "host_setting"))
        await bus.publish(report("gpu-2", "rdma_port_down"))
        found = {f.node: f.data for f in await opened(bus, 2)}
        assert found["gpu-1"].kind == "probe:host_setting" and not found["gpu-1"].quarantine
        assert found["gpu-2"].kind == "probe_failed" and found["gpu-2"].quarantine
    finally:
        await failover.stop()
