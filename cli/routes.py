"""What the operator's CLI (``primus-safe``) may say and ask on the bus: its
NATS user's permissions and the AsyncAPI operations come from here too."""

from __future__ import annotations

from libs.events import (
    BenchRequest,
    BenchResult,
    FaultCloseRequested,
    JobCancelRequested,
    JobDeleteRequested,
    JobResumeRequested,
    JobStopRequested,
    JobSubmitted,
    NodeCordonRequested,
    NodeDrainRequested,
    NodeHeartbeat,
    NodeProvisioned,
    NodeUncordonRequested,
)
from libs.records import BUCKETS
from libs.routes import Empty, Endpoint, HealthReply, Routes, Serve
from services.bench.protocol import PROGRESS, REPORT, SEARCH, SWEEP
from services.bootstrap.protocol import APPLY, REMOVE
from services.lens_collector.protocol import LENS_QUERY
from services.scheduler.protocol import ADMISSION

ANY_HEALTH = Endpoint("safe.health.>", Empty, HealthReply, "any service's health")

ROUTES = Routes(
    service="cli",
    summary="the operator's primus-safe verbs: submit, stop, resume, cancel, delete, listings, "
            "bench, lens, bootstrap apply",
    publishes=(JobSubmitted, JobStopRequested, JobResumeRequested, JobCancelRequested,
               JobDeleteRequested, NodeCordonRequested, NodeUncordonRequested,
               NodeDrainRequested, FaultCloseRequested, NodeProvisioned, BenchRequest),
    reads=BUCKETS,
    calls=(ADMISSION, APPLY, REMOVE, LENS_QUERY, REPORT, SEARCH, SWEEP, ANY_HEALTH),
    # bench run --wait watches its node's results and progress; up waits for heartbeats.
    listens=(BenchResult, NodeHeartbeat),
    # bench run reads the results stored while its connection was down.
    rereads=(BenchResult,),
    serves=(Serve(PROGRESS, None),),
    service_shell=False,
)
