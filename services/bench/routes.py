"""What the bench agent (one per node) and the bench coordinator hear, say
and keep."""

from __future__ import annotations

from libs.drivers.base import NODE_WORKERS
from libs.events import (
    BenchRequest,
    BenchResult,
    LogRecord,
    NodeAgentStopping,
    NodeHeartbeat,
    NodeTelemetry,
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
    ),
    publishes=(NodeHeartbeat, NodeAgentStopping, NodeTelemetry, BenchResult, LogRecord),
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
