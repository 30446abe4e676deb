"""What the scheduler hears, says and keeps."""

from __future__ import annotations

from libs.drivers.base import NODE_WORKERS
from libs.events import (
    JobCancelled,
    JobCancelRequested,
    JobCheckpoint,
    JobCompleted,
    JobDeleted,
    JobDeleteRequested,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobRecover,
    JobResumeRequested,
    JobStopped,
    JobStopRequested,
    JobSubmitted,
    LogRecord,
    NodeRegistered,
    NodeStateChanged,
    WorkerExited,
    WorkerStarted,
)
from libs.records import JOBS, NODES
from libs.routes import Consumer, On, Routes, Serve
from libs.topology import CONTROL
from services.scheduler.protocol import ADMISSION

ROUTES = Routes(
    service="scheduler",
    summary="job lifecycle, queues and placement; launches gangs through the cluster driver "
            "(one leader acts)",
    consumes=(
        Consumer("scheduler", CONTROL, (
            On(NodeRegistered, "on_node_registered"),
            On(NodeStateChanged, "on_node_state"),
            On(JobSubmitted, "on_job_submitted"),
            On(JobRecover, "on_job_recover"),
            On(WorkerExited, "on_worker_exited"),
            On(JobStopRequested, "on_job_command"),
            On(JobResumeRequested, "on_job_command"),
            On(JobCancelRequested, "on_job_command"),
            On(JobDeleteRequested, "on_job_command"),
        ), leader=True, summary="nodes, jobs and workers, in stream order"),
    ),
    # The cluster drivers run inside the scheduler and report the workers
    # they start and see exit; every service may ship its log lines.
    publishes=(JobPlaced, JobPending, JobPreempted, JobCompleted, JobFailed, JobStopped,
               JobCancelled, JobDeleted, WorkerStarted, WorkerExited, JobCheckpoint, LogRecord),
    # A job's end, looked up before it is published again (an outage may
    # have kept the first publish from going out).
    rereads=(JobCompleted, JobFailed),
    owns=(JOBS,),
    reads=(NODES,),
    serves=(Serve(ADMISSION, "on_admission", queue="scheduler", leader=True),
            Serve(NODE_WORKERS, "on_node_workers", queue="scheduler", leader=True)),
    leases=("scheduler",),
    # Every replica decides who may log in with a job's credential.
    auth_callout=True,
)
