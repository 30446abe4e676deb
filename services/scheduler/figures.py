"""The scheduler's figures on /metrics (``libs.metrics``).

Counted as they happen: cycle seconds, placements (decisions), preemptions.
Read at scrape time from the state the leader keeps: the queue per
workspace and priority class, jobs per status, nodes per state and GPUs
held by reservations. A standby replica keeps no state and says so with
``primus_scheduler_leader 0`` (sum over replicas to see the cluster).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, get_args

from prometheus_client.core import Metric

from libs.events import JobSpec
from libs.metrics import ServiceMetrics, gauge_family, settled
from services.scheduler.view import SchedulerState

PRIORITIES: tuple[str, ...] = get_args(JobSpec.model_fields["priority"].annotation)
# A cycle over 10,000 queued jobs stays under a second (bench/scheduler_scale.py).
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class SchedulerFigures:
    """The instruments a cycle updates."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.cycle_seconds = metrics.histogram(
            "scheduler_cycle_seconds", "time one scheduling cycle took (the policy's decision)",
            buckets=CYCLE_BUCKETS)
        self.placements = metrics.counter(
            "scheduler_placements", "gangs placed by a cycle (scheduling decisions)")
        self.preemptions = metrics.counter(
            "scheduler_preemptions", "running jobs a cycle preempted for a higher priority")

    def cycle(self, seconds: float, result: Any) -> None:
        self.cycle_seconds.observe(seconds)
        if result.placements:
            self.placements.inc(len(result.placements))
        if result.preemptions:
            self.preemptions.inc(len(result.preemptions))


def scheduler_families(state: SchedulerState, *, leading: bool,
                       workspaces: Iterable[str] = ()) -> Iterator[Metric]:
    """What the state says now. Reads only: called on the metrics server's thread.
    The queue has a series (0 when empty) for every configured workspace and
    priority class, so a dashboard shows an empty queue, not "no data"."""
    jobs = settled(lambda: list(state.jobs.values()))
    nodes = settled(lambda: list(state.nodes.values()))
    reservations = settled(lambda: list(state.reservations.values()))
    yield gauge_family("scheduler_leader", "1 on the replica that schedules", (),
                       [((), 1.0 if leading else 0.0)])
    queue = Counter(dict.fromkeys(((w, p) for w in workspaces for p in PRIORITIES), 0))
    queue.update((j.spec.workspace, j.spec.priority) for j in jobs if j.status == "pending")
    yield gauge_family("scheduler_queue_length", "jobs waiting to be placed",
                       ("workspace", "priority"), queue.items())
    by_status = Counter((j.spec.workspace, j.status) for j in jobs)
    yield gauge_family("scheduler_jobs", "jobs the scheduler keeps, by status",
                       ("workspace", "status"), by_status.items())
    yield gauge_family("scheduler_nodes", "nodes by onboarding state", ("state",),
                       Counter((n.state,) for n in nodes).items())
    held = sum(len(held) for held in reservations)
    yield gauge_family("scheduler_reserved_nodes",
                       "nodes held for a waiting gang (reservations)", (), [((), held)])
