"""The events the scheduler publishes about a job, built from its record:
pure, so that a redelivery or a new leader builds the very same event (the
same id, which JetStream de-duplicates)."""

from __future__ import annotations

from libs.events import (
    Event,
    JobCancelled,
    JobChangedData,
    JobCompleted,
    JobDeleted,
    JobEndedData,
    JobFailed,
    JobPlaced,
    JobPlacedData,
    JobPreempted,
    JobPreemptedData,
    JobStopped,
)
from libs.records import JobRecord
from services.scheduler.lifecycle import Announce

SOURCE = "scheduler"


def announcement(job: JobRecord, what: Announce, *, now: float,
                 preemption_grace_s: float) -> Event:
    """The event that says ``what`` happened to ``job``."""
    changed = JobChangedData(attempt=job.attempt, reason=job.reason, by=job.stopped_by)
    match what.what:
        case "placed":
            return JobPlaced(id=f"{job.id}-placed-{job.attempt}", source=SOURCE, job=job.id,
                             data=JobPlacedData(attempt=job.attempt, workers=job.slots))
        case "preempted":
            return JobPreempted(
                id=f"{job.id}-preempted-{job.attempt}", source=SOURCE, job=job.id,
                data=JobPreemptedData(attempt=job.attempt, preemptor=what.detail,
                                      grace_s=preemption_grace_s))
        case "completed" | "failed":
            return end_of(job, now=now, ended=what.what)
        case "stopped":
            return JobStopped(id=f"{job.id}-stopped-{job.stops}", source=SOURCE, job=job.id,
                              data=changed)
        case "cancelled":
            return JobCancelled(id=f"{job.id}-cancelled", source=SOURCE, job=job.id,
                                data=changed)
        case "deleted":
            return JobDeleted(id=f"{job.id}-deleted", source=SOURCE, job=job.id, data=changed)
    raise ValueError(f"nothing to announce as {what.what!r}")


def end_of(job: JobRecord, *, now: float, ended: str | None = None
           ) -> JobCompleted | JobFailed:
    """A job's end, ``ended`` ("completed" or "failed", its status unless
    given); published again when a redelivered exit finds it missing from
    the stream."""
    duration = max(0.0, now - job.submitted_at)
    if (ended or job.status) == "completed":
        return JobCompleted(id=f"{job.id}-completed", source=SOURCE, job=job.id,
                            data=JobEndedData(attempt=job.attempt, duration_s=duration))
    # The contract has no attempt 0: a job refused before any placement is 1.
    return JobFailed(id=f"{job.id}-failed", source=SOURCE, job=job.id,
                     data=JobEndedData(attempt=max(1, job.attempt), duration_s=duration,
                                       reason=job.reason))
