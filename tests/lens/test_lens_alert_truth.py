"""Alerts tell the truth about a job's life: no hang or throughput alert
after a job ended (its last rows arrive after the end), a job that never
reports is hung from its placement, a new attempt is judged afresh, and a
collector restart neither repeats an open alert nor adds a copy of it.

Scenarios as data against the pure engine, then the collector itself on a
real nats-server and the chDB engine, restarted in the middle."""

from __future__ import annotations

import asyncio
from typing import Any

from libs.bus import Bus
from libs.events import (
    JobCompleted,
    JobEndedData,
    JobPlaced,
    JobPlacedData,
    JobTelemetry,
    JobTelemetryData,
    WorkerSlot,
)
from libs.settings import Settings
from services.lens_collector.alerts import AlertConfig, AlertEngine, JobReading, Transition
from services.lens_collector.app import LensCollector
from tests.helpers import until

CONFIG = AlertConfig(job_hang_s=300, checkpoint_max_age_s=100_000, throughput_min_history=3,
                     throughput_for_s=0)


def opened(transitions: list[Transition]) -> list[tuple[str, str]]:
    return [(t.rule, t.key) for t in transitions if t.state == "open"]


def test_a_completed_job_whose_last_rows_arrive_late_is_not_hung() -> None:
    engine = AlertEngine(CONFIG)
    engine.job_window(0, {"j1": JobReading(iteration=10, throughput=100.0)})
    engine.job_states(5, {"j1": ("job.completed", 4)})
    # The rows of its last seconds are stored after the end was.
    engine.job_window(8, {"j1": JobReading(iteration=11, throughput=1.0)})
    assert opened(engine.tick(10_000)) == [] and engine.open_alerts() == []


def test_a_job_that_never_reports_is_hung_from_its_placement() -> None:
    engine = AlertEngine(CONFIG)
    assert engine.job_states(100, {"j1": ("job.placed", 100)}) == []
    assert opened(engine.tick(399)) == []
    [hang] = engine.tick(401)
    assert (hang.rule, hang.key, hang.state) == ("job_hang", "j1", "open")
    assert hang.message.startswith("no new iteration for 301 s")


def test_preemption_stops_the_watch_and_a_new_attempt_starts_over() -> None:
    engine = AlertEngine(CONFIG)
    engine.job_states(0, {"j1": ("job.placed", 0)})
    for t in range(10, 60, 10):
        engine.job_window(t, {"j1": JobReading(iteration=t * 2, throughput=100.0)})
    engine.job_states(60, {"j1": ("job.preempted", 60)})
    assert opened(engine.tick(1000)) == []  # queued again: silence is no hang
    engine.job_states(1000, {"j1": ("job.placed", 1000)})
    # Resumed from the checkpoint at 50, below the 80 it had reached: that is progress.
    engine.job_window(1010, {"j1": JobReading(iteration=51, throughput=100.0)})
    assert opened(engine.tick(1200)) == []
    assert opened(engine.tick(1311)) == [("job_hang", "j1")]


def test_the_same_state_twice_and_an_older_placement_change_nothing() -> None:
    engine = AlertEngine(CONFIG)
    engine.job_states(0, {"j1": ("job.placed", 0)})
    engine.job_states(10, {"j1": ("job.completed", 10)})
    assert engine.job_states(20, {"j1": ("job.completed", 10)}) == []
    assert engine.job_states(20, {"j1": ("job.placed", 0)}) == []  # the end is newer
    assert opened(engine.tick(10_000)) == []


def test_ending_closes_hang_and_throughput_alerts() -> None:
    engine = AlertEngine(CONFIG)
    for t in range(0, 40, 10):
        engine.job_window(t, {"j1": JobReading(iteration=t, throughput=100.0)})
    assert opened(engine.job_window(40, {"j1": JobReading(iteration=40, throughput=10.0)})) == [
        ("throughput_low", "j1")]
    assert opened(engine.tick(400)) == [("job_hang", "j1")]
    closed = engine.job_states(401, {"j1": ("job.failed", 401)})
    assert sorted((t.rule, t.state) for t in closed) == [("job_hang", "closed"),
                                                         ("throughput_low", "closed")]


def test_a_restart_keeps_one_alert_per_condition() -> None:
    first = AlertEngine(CONFIG)
    first.job_window(0, {"j1": JobReading(iteration=5)})
    [hang] = first.tick(301)
    second = AlertEngine(CONFIG)
    # What the store holds: the open alert, and a copy an older release added.
    copy = Transition(rule="job_hang", state="open", key="j1", opened_at=900.0, at=900.0,
                      job="j1", message="no new iteration")
    closed = second.restore([copy, hang], at=1000)
    assert [(t.alert_id, t.state) for t in closed] == [(copy.alert_id, "closed")]
    # It learns what the job did before, without closing or opening anything...
    second.learn_job("j1", JobReading(iteration=5), last_report=0)
    assert second.tick(1000) == []
    assert second.open_alerts() == [("job_hang", "j1")]
    # ... and closes the one alert when the job moves again.
    [moved] = second.job_window(1005, {"j1": JobReading(iteration=6)})
    assert (moved.alert_id, moved.state) == (hang.alert_id, "closed")


# --------------------------------------------------------------------------- the collector


async def _alerts(bus: Bus, job: str) -> list[dict[str, Any]]:
    reply = await bus.request("safe.query.lens.query", {"query": "alerts", "params": {"job": job}},
                              timeout_s=20)
    assert reply["ok"], reply
    return [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]


async def test_the_collector_flags_a_silent_job_and_nothing_after_the_end_or_a_restart(
        nats_url: str, bus: Bus, clickhouse_dsn: str, database: str) -> None:
    settings = Settings(nats_url=nats_url, clickhouse_dsn=clickhouse_dsn,
                        clickhouse_database=database)
    config = AlertConfig(job_hang_s=3, checkpoint_max_age_s=100_000, node_down_s=100_000)

    async def start() -> tuple[LensCollector, Bus]:
        own = await Bus.connect(nats_url, "lens-collector")
        service = LensCollector(settings, alerts=config, alert_interval_s=0.5, fill_s=0.05)
        await service.start(own)
        return service, own

    async def stop(service: LensCollector, own: Bus) -> None:
        await own.stop_consuming()
        await service.stop()
        await own.close()

    slot = [WorkerSlot(rank=0, node="node-a", gpus=1)]
    service, own = await start()
    try:
        # j-done reports, completes, and its last row is stored after the end.
        await bus.publish(JobPlaced(source="scheduler", job="j-done",
                                    data=JobPlacedData(attempt=1, workers=slot)))
        for it in range(3):
            await bus.publish(JobTelemetry(source="sdk", job="j-done", node="node-a",
                                           data=JobTelemetryData(rank=0, iteration=it)))
        await bus.publish(JobCompleted(source="scheduler", job="j-done",
                                       data=JobEndedData(attempt=1, duration_s=3)))
        await bus.publish(JobTelemetry(source="sdk", job="j-done", node="node-a",
                                       data=JobTelemetryData(rank=0, iteration=3)))
        # j-silent is placed and never says a word.
        await bus.publish(JobPlaced(source="scheduler", job="j-silent",
                                    data=JobPlacedData(attempt=1, workers=slot)))

        async def silent_hung() -> list[dict[str, Any]]:
            return [a for a in await _alerts(bus, "j-silent")
                    if a["rule"] == "job_hang" and a["state"] == "open"]
        [hang] = await until(silent_hung, "a hang alert for the silent job")
    finally:
        await stop(service, own)

    service, own = await start()  # a restart: nothing new, nothing twice
    try:
        await asyncio.sleep(config.job_hang_s + 4)
        assert [a["alert_id"] for a in await _alerts(bus, "j-silent")] == [hang["alert_id"]]
        assert await _alerts(bus, "j-done") == []
        await bus.publish(JobCompleted(source="scheduler", job="j-silent",
                                       data=JobEndedData(attempt=1, duration_s=9)))

        async def closed() -> list[dict[str, Any]]:
            return [a for a in await _alerts(bus, "j-silent") if a["state"] == "closed"]
        [done] = await until(closed, "the hang alert to close")
        assert done["alert_id"] == hang["alert_id"]
        await asyncio.sleep(config.job_hang_s + 2)
        assert len(await _alerts(bus, "j-silent")) == 1 and await _alerts(bus, "j-done") == []
    finally:
        await stop(service, own)
