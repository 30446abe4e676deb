"""Every job fault closes when its job ends: a Lens hang alert opened a job
fault (and a restart) that stayed open for good after the job completed.
Failover runs in-process on a real nats-server; the events are the real
ones the scheduler and Lens publish."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
import pytest

from libs.bus import CONTROL, Bus
from libs.events import (
    Event,
    FaultClosed,
    FaultOpened,
    JobCompleted,
    JobEndedData,
    JobPreempted,
    JobPreemptedData,
    JobRecover,
    LensAlert,
    LensAlertData,
    parse_event,
)
from libs.settings import Settings
from services.failover.app import Failover

pytestmark = pytest.mark.timeout(60)


def _hang(job: str) -> LensAlert:
    return LensAlert(source="lens-collector", job=job, data=LensAlertData(
        alert_id=f"job_hang-{job}", rule="job_hang", state="open", severity="critical",
        subject_key=job, message="no progress for 300 s", opened_at=datetime.now(UTC)))


async def _control(bus: Bus, subject: str) -> list[Event]:
    sub = await bus.js.pull_subscribe(subject, stream=CONTROL.name)
    out: list[Event] = []
    while True:
        try:
            msgs = await sub.fetch(100, timeout=0.3)
        except (nats.errors.TimeoutError, TimeoutError):
            break
        out += [parse_event(m.data) for m in msgs]
    await sub.unsubscribe()
    return out


async def _until(bus: Bus, subject: str, n: int) -> list[Event]:
    deadline = time.monotonic() + 15
    while len(found := await _control(bus, subject)) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return found


@pytest.mark.parametrize("ends", ["completed", "preempted"])
async def test_a_job_fault_closes_when_its_job_ends(
        nats_url: str, bus: Bus, tmp_path: Path, ends: str) -> None:
    failover = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "state"))
    await failover.start(bus)
    try:
        await bus.publish(_hang("job-7"))
        [opened] = await _until(bus, "safe.fault.*.opened", 1)
        assert isinstance(opened, FaultOpened) and opened.data.scope == "job"
        assert [type(e) for e in await _until(bus, "safe.job.job-7.recover", 1)] == [JobRecover]
        assert failover.health()["faults_open"] == [opened.data.fault_id]

        end: Event = (JobCompleted(source="scheduler", job="job-7",
                                   data=JobEndedData(attempt=1, duration_s=60.0))
                      if ends == "completed" else
                      JobPreempted(source="scheduler", job="job-7", data=JobPreemptedData(
                          attempt=1, preemptor="job-8", grace_s=5.0)))
        await bus.publish(end)
        [closed] = await _until(bus, "safe.fault.*.closed", 1)
        assert isinstance(closed, FaultClosed) and closed.data.fault_id == opened.data.fault_id
        assert failover.health()["faults_open"] == []
        record = json.loads((await (await bus.kv("faults")).get(opened.data.fault_id)).value)
        assert record["status"] == "closed" and record["closed_at"] is not None
    finally:
        await failover.stop()


def _log_alert(rule: str, fault_class: str, *, job: str | None = None,
               node: str | None = None) -> LensAlert:
    return LensAlert(source="lens-collector", job=job, node=node, data=LensAlertData(
        alert_id=f"{rule}-{job or node}", rule=rule, state="open", severity="critical",
        subject_key=job or node or "", message=f"{fault_class}: a line", opened_at=datetime.now(
            UTC), fault_class=fault_class))  # type: ignore[arg-type]


async def test_an_infra_log_alert_restarts_its_job_and_a_user_one_does_not(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    # No rule in the configuration names these log rules: their class decides.
    failover = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "state"))
    await failover.start(bus)
    try:
        await bus.publish(_log_alert("log_traceback", "user", job="job-u"))
        await bus.publish(_log_alert("log_out_of_memory", "user", job="job-u"))
        await bus.publish(_log_alert("log_collective_timeout", "infra", job="job-i"))
        [opened] = await _until(bus, "safe.fault.*.opened", 1)
        assert opened.data.kind == "alert:log_collective_timeout" and opened.data.jobs == ["job-i"]
        assert opened.data.scope == "job"
        assert [e.job for e in await _until(bus, "safe.job.*.recover", 1)] == ["job-i"]
        await asyncio.sleep(0.5)  # the user alerts opened nothing meanwhile
        assert [e.job for e in await _control(bus, "safe.job.*.recover")] == ["job-i"]
        assert len(await _control(bus, "safe.fault.*.opened")) == 1
    finally:
        await failover.stop()
