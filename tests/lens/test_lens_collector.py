"""lens-collector against a real nats-server and the chDB engine, in this
process: telemetry and control events land in their tables, bad messages
are dead-lettered with the reason, alerts open as lens.alert events that are
stored too, and the ``primus-safe lens`` verbs read it all over the bus."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from libs.bus import DEADLETTER, REASON_HEADER, Bus, dlq_subject
from libs.events import (
    JobChangedData,
    JobCommandData,
    JobCompleted,
    JobEndedData,
    JobStopped,
    JobStopRequested,
    JobTelemetry,
    JobTelemetryData,
    LogRecord,
    LogRecordData,
)
from libs.settings import Settings
from services.lens_collector.alerts import AlertConfig, ThresholdRule
from services.lens_collector.app import LensCollector
from tests.helpers import lens_rows as lens
from tests.helpers import run_cli, running_collector, until
from tests.lens.lens_seed import node_event

HOT = AlertConfig(gpu_temp_c=ThresholdRule(above=65, clear_below=60), job_hang_s=3600,
                  checkpoint_max_age_s=3600, node_down_s=3600)


@pytest.fixture
async def collector(nats_url: str, clickhouse_dsn: str, database: str
                    ) -> AsyncIterator[tuple[LensCollector, Bus]]:
    async with running_collector(nats_url, clickhouse_dsn, database, alerts=HOT,
                                 alert_interval_s=0.5) as running:
        yield running


async def test_telemetry_events_logs_and_alerts_end_to_end(
        collector: tuple[LensCollector, Bus], bus: Bus, nats_url: str, tmp_path: Path) -> None:
    service, _ = collector
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    for k in range(5):
        await bus.publish(node_event("node-a", now, k))  # GPUs at 60..70 C: one is hot
        await bus.publish(JobTelemetry(source="sdk", job="j1", node="node-a", data=JobTelemetryData(
            rank=0, iteration=k, loss=1.0 / (k + 1), throughput=100.0, step_time_s=0.1)))
    await bus.publish(JobTelemetry(source="sdk", job="j1", node="node-a", data=JobTelemetryData(
        rank=0, iteration=5, checkpoint_path="/ckpt/5", checkpoint_bytes=1024,
        checkpoint_duration_s=0.5)))
    await bus.publish(LogRecord(source="training", node="node-a", job="j1", data=LogRecordData(
        level="info", message="epoch done", service="training")))
    await bus.js.publish("safe.telemetry.node.node-a", b'{"type": "telemetry.node"}',
                         headers={"Nats-Msg-Id": "bad"})

    async def stored() -> list[dict[str, Any]]:
        rows = {r["table"]: r for r in await lens(bus, "table_counts")}
        ok = rows["gpu_metrics"]["rows"] == 20 and rows["job_metrics"]["rows"] == 6
        return [rows] if ok and rows["logs"]["rows"] == 1 else []

    counts = (await until(stored, "telemetry in ClickHouse"))[0]
    assert all(r["rows"] == r["distinct_ids"] for r in counts.values())
    sub = await bus.js.pull_subscribe(dlq_subject("lens-collector"), stream=DEADLETTER.name)
    [dead] = await sub.fetch(1, timeout=5)
    assert "invalid event" in dead.headers[REASON_HEADER]

    async def alerted() -> list[dict[str, Any]]:
        return [a for a in await lens(bus, "alerts", node="node-a")
                if a["rule"] == "gpu_temp_high"]

    alerts = await until(alerted, "a GPU temperature alert", timeout=30)
    assert alerts[0]["state"] == "open" and alerts[0]["severity"] == "warning"
    control = await bus.js.stream_info("CONTROL")
    assert control.state.messages >= 1  # the alert is a CONTROL event, stored as history
    await bus.publish(JobStopRequested(source="cli", job="j1", data=JobCommandData(
        by="ops@login-1", reason="kernel upgrade")))
    await bus.publish(JobStopped(source="scheduler", job="j1", data=JobChangedData(
        attempt=1, reason="stopped by ops@login-1: kernel upgrade", by="ops@login-1")))
    await bus.publish(JobCompleted(source="scheduler", job="j1", data=JobEndedData(
        attempt=1, duration_s=5)))

    async def ended() -> bool:
        return any(e["type"] == "job.completed" for e in await lens(bus, "events", job="j1"))

    await until(ended, "the job's lifecycle in the history")

    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(tmp_path / "state"))
    shown = await asyncio.to_thread(run_cli, "lens", "job", "j1", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["summary"]["last_iteration"] == 5 and job["summary"]["checkpoints"] == 1
    assert job["checkpoints"][0]["checkpoint_bytes"] == 1024
    # (published within a millisecond of each other: Lens orders equal times by id)
    assert sorted(e["type"] for e in job["lifecycle"]) == [
        "job.completed", "job.stop", "job.stopped"]
    text = await asyncio.to_thread(run_cli, "lens", "job", "j1", env=env)
    assert "iterations up to 5" in text.stdout
    assert "job.stopped" in text.stdout and "by ops@login-1: kernel upgrade" in text.stdout
    node = json.loads((await asyncio.to_thread(run_cli, "lens", "node", "node-a", "--json",
                                               env=env)).stdout)
    assert len(node["gpus"]) == 4 and node["summary"]["gpus"] == 4
    timeline = json.loads((await asyncio.to_thread(
        run_cli, "lens", "events", "--job", "j1", "--json", env=env)).stdout)
    assert {"metric", "log"} <= {r["kind"] for r in timeline}
    report = tmp_path / "report.html"
    made = await asyncio.to_thread(run_cli, "lens", "report", "--job", "j1", "-o", str(report),
                                   env=env)
    assert made.returncode == 0, made.stderr
    html = report.read_text()
    assert html.count("data:image/png;base64,") >= 2 and "/ckpt/5" in html
    missing = await asyncio.to_thread(run_cli, "lens", "job", "nope", env=env)
    assert missing.returncode == 1 and "no telemetry for job 'nope'" in missing.stderr
    health = service.health()
    assert health["refused"] == 1 and health["alerts_published"] >= 1


async def test_replicas_share_the_telemetry_consumer(nats_url: str, clickhouse_dsn: str,
                                                     database: str, bus: Bus) -> None:
    """Two collectors with the same durable split the stream: nothing twice."""
    from datetime import UTC, datetime

    services = []
    for _ in range(2):
        b = await Bus.connect(nats_url, "lens-collector")
        s = LensCollector(Settings(nats_url=nats_url, clickhouse_dsn=clickhouse_dsn,
                                   clickhouse_database=database), evaluate_alerts=False,
                          batch=50, fill_s=0.05)
        await s.start(b)
        services.append((s, b))
    try:
        now = datetime.now(UTC)
        for k in range(400):
            await bus.publish(node_event(f"n{k % 40}", now, k).model_copy(
                update={"id": f"e{k}"}))

        async def done() -> bool:
            return sum(s.rows_written["ingest_node"] for s, _ in services) >= 400

        await until(done, "both replicas to store everything")
        shares = [s.rows_written["ingest_node"] for s, _ in services]
        assert sum(shares) == 400 and all(shares)  # both took a share
        rows = {r["table"]: r for r in await lens(bus, "table_counts")}
        assert rows["node_metrics"]["rows"] == rows["node_metrics"]["distinct_ids"] == 400
    finally:
        for s, b in services:
            await b.stop_consuming()
            await s.stop()
            await b.close()
