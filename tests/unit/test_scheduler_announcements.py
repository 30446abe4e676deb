"""The scheduler's job events, built from the record alone: a redelivery or
a new leader builds the same event, with the same id."""

from __future__ import annotations

import pytest

from libs.events import JobCompleted, JobFailed, JobPlaced, JobPreempted, JobSpec, WorkerSlot
from libs.records import JobRecord
from services.scheduler.announcements import announcement, end_of
from services.scheduler.lifecycle import Announce


def record(**fields: object) -> JobRecord:
    return JobRecord(id="j-1", submitted_at=100.0, spec=JobSpec(
        name="j", workers=1, gpus_per_worker=1, command=["x"]), **fields)  # type: ignore[arg-type]


def test_the_same_record_gives_the_same_event_ids() -> None:
    job = record(status="running", attempt=2, slots=[WorkerSlot(rank=0, node="n1", gpus=1)])
    placed = announcement(job, Announce("placed"), now=130.0, preemption_grace_s=20)
    again = announcement(job, Announce("placed"), now=999.0, preemption_grace_s=20)
    assert isinstance(placed, JobPlaced) and placed.id == again.id == "j-1-placed-2"
    assert placed.data.workers == job.slots
    pre = announcement(job, Announce("preempted", "big-9"), now=130.0, preemption_grace_s=20)
    assert isinstance(pre, JobPreempted) and pre.id == "j-1-preempted-2"
    assert pre.data.preemptor == "big-9" and pre.data.grace_s == 20


def test_an_end_is_the_same_event_whether_announced_or_published_again() -> None:
    done = record(status="completed", attempt=1)
    first = announcement(done, Announce("completed"), now=160.0, preemption_grace_s=20)
    again = end_of(done, now=170.0)
    assert isinstance(first, JobCompleted) and type(again) is JobCompleted
    assert first.id == again.id == "j-1-completed" and first.data.duration_s == 60.0
    refused = record(status="failed", attempt=0, reason="unknown workspace 'x'")
    failed = end_of(refused, now=101.0)
    assert isinstance(failed, JobFailed) and failed.data.attempt == 1  # never attempt 0
    assert failed.data.reason == "unknown workspace 'x'"


def test_nothing_else_is_announced() -> None:
    with pytest.raises(ValueError, match="nothing to announce"):
        announcement(record(), Announce("bogus"), now=0.0,  # type: ignore[arg-type]
                     preemption_grace_s=1)
