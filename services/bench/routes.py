"""What the bench agent (one per node) and the bench coordinator hear, say
and keep."""

from __future__ import annotations

from libs.drivers.base import NODE_WORKERS
from libs.events import (
    BenchRequest,
    BenchResult,
    JobCancelled,
    JobCheckpoint,
    JobCompleted,
    JobDeleted,
    JobFailed,
    JobPlaced,
    JobStopped,
    LogRecord,
    NodeAgentStopping,
    NodeHeartbeat,
    NodeTelemetry,
    WorkerExited,
    WorkerLog,
)
from libs.records import BENCH, JOBS, NODES
from libs.routes import Consumer, On, Routes, Serve
from libs.topology import CONTROL
from services.bench.protocol import PAIR, PROGRESS, REPORT, SEARCH, SHARE, SWEEP, TURN

AGENT = Routes(
    service="bench-agent",
    summary="on every node: heartbeats, node telemetry, health probes, bench runs",
    consumes=(
        # One durable per node, filtered to its node's requests; a full level
        # with its retry takes long: never redelivered mid-run.
        Consumer("bench-agent-{node}", CONTROL, (On(BenchRequest, "on_bench_request"),),
                 batch=1, ack_wait_s=1800, summary="this node's bench requests"),
        # Placements and ends of every job (job subjects carry no node): which
        # job, attempt and rank holds each GPU here, for the telemetry. The
        # agent rebuilds them from the jobs bucket at start, so a new durable
        # starts a few minutes back, covering the read, not a month back.
        Consumer("bench-agent-jobs-{node}", CONTROL, (
            On(JobPlaced, "on_job_placed"),
            On(WorkerExited, "on_worker_exited"),
            *(On(e, "on_job_ended") for e in (JobCompleted, JobFailed, JobStopped, JobCancelled,
                                                JobDeleted)),
        ), replay_s=300, summary="placements on this node: who holds its GPUs"),
    ),
    # WorkerLog: its job pods' output on Kubernetes (pod_logs).
    publishes=(NodeHeartbeat, NodeAgentStopping, NodeTelemetry, BenchResult, LogRecord,
               WorkerLog, JobCheckpoint),
    reads=(JOBS,),  # the placements held when the agent starts
    # PAIR, SHARE, TURN: multi-node runs; NODE_WORKERS: does a job run here
    # (heavy probes are skipped then).
    calls=(PAIR, SHARE, TURN, PROGRESS, NODE_WORKERS),
)

COORDINATOR = Routes(
    service="bench-coordinator",
    summary="fleet-relative bench verdicts, retries, pairing, sweeps and the split search "
            "(one leader acts)",
    consumes=(
        Consumer("bench-coordinator", CONTROL, (On(BenchResult, "on_bench_result"),),
                 leader=True, summary="every node's runs, judged against the fleet"),
    ),
    publishes=(BenchRequest, BenchResult, LogRecord),
    owns=(BENCH,),
    reads=(NODES, JOBS),  # a partner's address; nodes that run a job are not benched
    serves=(
        Serve(REPORT, "on_report", queue="bench-coordinator", leader=True),
        Serve(PAIR, "on_pair", queue="bench-coordinator", leader=True),
        Serve(SEARCH, "on_search", queue="bench-coordinator", leader=True),
        Serve(SWEEP, "on_sweep", queue="bench-coordinator", leader=True),
        Serve(SHARE, "on_share", leader=True),
        Serve(TURN, None, leader=True),  # one subscription per sweep (sweep.py)
    ),
    leases=("bench-coordinator",),
)
