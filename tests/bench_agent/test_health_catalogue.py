"""The node-health catalogue as the agent runs it: on by default at each
probe's own schedule, configurable per probe (options checked by name, a
kind switched off, an action changed), a misconfigured probe refused at load
with the file, the probe and the field; and on this machine, through a real
agent on a real bus, every probe runs and none fails (no RDMA, NVMe or GPU
here: not applicable, never failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.bus import Bus
from libs.settings import Settings
from libs.specs import SpecError, load_model
from services.bench import probes
from services.bench.config import BenchConfig, CheckConfig, GpuLimits
from services.bench.health import CATALOGUE
from tests.bench_agent.stack import bench_results
from tests.helpers import until

pytestmark = pytest.mark.timeout(120)


def test_every_catalogue_probe_runs_by_default_at_its_own_schedule() -> None:
    scheduled = {c.kind: c for c in BenchConfig().scheduled_probes()}
    assert set(scheduled) == set(CATALOGUE) and len(CATALOGUE) >= 10
    for kind, entry in CATALOGUE.items():
        spec = scheduled[kind]
        assert spec.interval_s == entry.interval_s
        assert spec.failures_before_report == entry.consecutive
        assert spec.action == entry.action and spec.fault_kind == entry.fault
        assert entry.severity in ("critical", "warning") and entry.summary
    assert BenchConfig().scheduled_probes(catalogue=False) == []
    assert BenchConfig(health_catalogue=False).scheduled_probes() == []


def test_a_configured_probe_replaces_the_default_and_others_can_be_switched_off() -> None:
    config = BenchConfig.model_validate({
        "probes": [{"name": "rails", "kind": "rdma_ports", "interval_s": 10,
                    "options": {"min_rate_gbps": 400}}],
        "health_off": ["host_settings"]})
    scheduled = {c.kind: c for c in config.scheduled_probes()}
    assert "host_settings" not in scheduled
    rails = scheduled["rdma_ports"]
    assert rails.name == "rails" and rails.interval_s == 10
    assert rails.options["min_rate_gbps"] == 400  # the rest keep their defaults
    assert rails.failures_before_report == CATALOGUE["rdma_ports"].consecutive


def test_misconfigured_probes_are_refused_with_the_file_probe_and_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="probe rails .rdma_ports. has no option min_rate"):
        CheckConfig.model_validate({"name": "rails", "kind": "rdma_ports",
                                    "options": {"min_rate": 400}})
    with pytest.raises(ValueError, match="no catalogue probe rdma_port;"):
        BenchConfig.model_validate({"health_off": ["rdma_port"]})
    bad = tmp_path / "bench.yaml"
    bad.write_text("probes:\n  - {name: mounts, kind: mounts, interval_s: -5}\n")
    with pytest.raises(SpecError) as caught:
        load_model(bad, BenchConfig)
    text = str(caught.value)
    assert str(bad) in text and "interval_s" in text and "probes" in text
    bad.write_text("probes:\n  - {name: x, kind: no_such_probe}\n")
    with pytest.raises(SpecError, match="kind"):
        load_model(bad, BenchConfig)


def test_findings_map_to_checks_and_a_broken_probe_is_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = GpuLimits()
    missing = probes.run_check("mounts", expected=None, limits=limits, timeout_s=5,
                               name="scratch", options={"paths": [str(tmp_path / "nowhere")]})
    assert missing.status == "failed" and "nowhere" in missing.detail
    none = probes.run_check("nvme_health", expected=None, limits=limits, timeout_s=5)
    assert none.status == "skipped" and none.detail.startswith("not applicable: ")

    def boom(_: object) -> None:
        raise KeyError("port_state")

    entry = CATALOGUE["rdma_ports"]
    monkeypatch.setitem(CATALOGUE, "rdma_ports", type(entry)(**{**entry.__dict__, "run": boom}))
    broken = probes.run_check("rdma_ports", expected=None, limits=limits, timeout_s=5)
    assert broken.status == "unavailable" and broken.detail.startswith("unknown: KeyError")


async def test_the_catalogue_runs_on_this_machine_through_an_agent_and_fails_nothing(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    from services.bench.agent import BenchAgent

    config = tmp_path / "bench.yaml"
    config.write_text("probes:\n" + "".join(
        f"  - {{name: {kind}, kind: {kind}, interval_s: 0.5, timeout_s: 20}}\n"
        for kind in sorted(CATALOGUE)))
    reports = await bench_results(bus, "safe.bench.*.result")
    agent = BenchAgent(Settings(nats_url=nats_url, state_dir=tmp_path), "here", config)
    await agent.start(bus)
    try:
        async def all_ran() -> dict[str, dict[str, object]] | None:
            states = agent.schedule.snapshot()
            return states if all(s["runs"] >= 2 and s["last"] for s in states.values()) \
                else None

        states = await until(all_ran, "every catalogue probe to run twice", timeout=60)
        assert set(states) == set(CATALOGUE)
        failed = {n: s["detail"] for n, s in states.items() if s["last"] == "failed"}
        assert not failed, failed
        assert not reports
    finally:
        await agent.stop()
