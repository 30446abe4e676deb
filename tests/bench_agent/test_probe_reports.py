"""A failing probe's report goes out even when naming the devices fails
too, and one the bus did not take is made again.

On a node whose GPU has faulted, the runtime call that names the devices
can fail as well (torch raises "HIP error: ..." from get_device_name): the
report that quarantines the node must not depend on it. The agent talks to
a real nats-server; only the device query is made to fail, as it does on
such a node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.settings import Settings
from services.bench import probes
from services.bench.agent import BenchAgent
from services.bench.config import CheckConfig
from services.bench.schedule import ProbeSchedule, Report, Start
from tests.bench_agent.stack import bench_results


async def test_a_probe_report_goes_out_when_the_devices_cannot_be_named(
        bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = await bench_results(bus, "safe.bench.n1.result")

    def faulted() -> tuple[str, int, str, str]:
        raise RuntimeError("HIP error: an illegal memory access was encountered")

    monkeypatch.setattr(probes, "detect_device", faulted)
    agent = BenchAgent(Settings(state_dir=tmp_path), "n1")
    agent.bus = bus
    agent.expected_devices = 8
    await agent._report_probe(Report("temp", failed=True, consecutive=3,
                                     detail="gpu 2: 101 °C > 95 °C"))
    for _ in range(50):
        if results:
            break
        await asyncio.sleep(0.1)
    assert len(results) == 1
    data = results[0].data
    assert data.trigger == "probe" and not data.passed and data.outcome == "failed"
    assert "temp" in data.reason and "101 °C > 95 °C" in data.reason
    assert (data.device, data.device_count) == ("unknown", 8)
    assert agent.probe_reports == 1


async def test_a_report_the_bus_did_not_take_is_made_at_the_next_failure(
        nats_url: str, tmp_path: Path) -> None:
    agent = BenchAgent(Settings(state_dir=tmp_path), "n1")
    agent.schedule = ProbeSchedule([CheckConfig(
        name="temp", kind="gpu_temperature", interval_s=10, timeout_s=5,
        failures_before_report=1)], now=0.0)
    run = agent.schedule.due(0.0)[0]
    assert isinstance(run, Start)
    report = agent.schedule.finished("temp", run.run, "failed", "101 °C > 95 °C")
    assert report is not None and agent.schedule.states["temp"].reported

    gone = await Bus.connect(nats_url, "test-closed")
    await gone.close()
    agent.bus = gone
    await agent._report_probe(report)
    assert agent.probe_reports == 0
    assert not agent.schedule.states["temp"].reported  # the next failure says it again
