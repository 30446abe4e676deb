"""The order in which pending jobs are considered.

Recovering jobs first (a gang that lost a node is already paying for idle
GPUs elsewhere and for lost progress), then higher priority, then jobs
re-queued after preemption (at the head of their class), then earlier
submission, then id, so that ties always break the same way and two cycles
over the same snapshot decide the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .model import Job

_UNKNOWN_PRIORITY = -(2**62)


def queue_key(job: Job, priorities: Mapping[str, int]) -> tuple[int, int, int, float, str]:
    submitted = job.submitted_at if not math.isnan(job.submitted_at) else math.inf
    return (0 if job.recovering else 1,
            -priorities.get(job.priority, _UNKNOWN_PRIORITY),
            0 if job.preempted else 1,
            submitted,
            job.id)


def order_queue(pending: Iterable[Job], priorities: Mapping[str, int],
                running: Iterable[str] = ()) -> list[Job]:
    """Pending jobs in decision order; duplicates and running ids dropped."""
    skip = set(running)
    unique: dict[str, Job] = {}
    for job in pending:
        if job.id not in skip and job.id not in unique:
            unique[job.id] = job
    return sorted(unique.values(), key=lambda j: queue_key(j, priorities))
