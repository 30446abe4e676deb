"""What failover hears, says and keeps."""

from __future__ import annotations

from libs.drivers.base import NODE_WORKERS
from libs.events import (
    BenchResult,
    FaultClosed,
    FaultCloseRequested,
    FaultMitigated,
    FaultOpened,
    FaultRecovered,
    JobCancelled,
    JobCheckpoint,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobPreempted,
    JobProgress,
    JobRecover,
    JobStopped,
    JobTelemetry,
    LensAlert,
    LogRecord,
    NodeAgentStopping,
    NodeHeartbeat,
    NodeRegistered,
    NodeStateChanged,
    WorkerExited,
)
from libs.records import FAULTS, JOBS, NODES
from libs.routes import Consumer, On, Routes
from libs.topology import CONTROL, TELEMETRY

ROUTES = Routes(
    service="failover",
    summary="fault detection and recovery: opens, mitigates and closes faults, times them",
    consumes=(
        Consumer("failover", CONTROL, (
            On(NodeAgentStopping, "on_agent_stopping"),
            On(NodeRegistered, "on_node_registered"),
            On(NodeStateChanged, "on_node_state"),
            On(JobPlaced, "on_job_placed"),
            On(JobCompleted, "on_job_ended"),
            On(JobFailed, "on_job_ended"),
            On(JobPreempted, "on_job_ended"),
            On(JobStopped, "on_job_ended"),
            On(JobCancelled, "on_job_ended"),
            On(BenchResult, "on_bench_result"),
            On(WorkerExited, "on_worker_exited"),
            On(LensAlert, "on_lens_alert"),
            On(FaultCloseRequested, "on_fault_close"),
            On(JobProgress, "on_job_progress"),
            On(JobCheckpoint, "on_job_checkpoint"),
        ), batch=256, summary="every fault source, in stream order"),
        Consumer("failover-steps", TELEMETRY, (On(JobTelemetry, "on_job_steps"),),
                 mode="batch", batch=1024,
                 summary="training steps: the first after a recovery ends it"),
    ),
    publishes=(FaultOpened, FaultMitigated, FaultRecovered, FaultClosed, JobRecover, LogRecord),
    owns=(FAULTS,),
    reads=(NODES, JOBS),  # only registered nodes are judged; where jobs run at start
    # Before evacuating a node whose agent is silent: do its workers still run?
    calls=(NODE_WORKERS,),
    # Heartbeats: core NATS, heard by libs.beats (no stream keeps them).
    listens=(NodeHeartbeat,),
)
