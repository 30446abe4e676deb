"""Which nodes run training now (pure): bench never disturbs them.

A sweep, a split search or an operator's ``bench run`` saturates GPUs, HBM
and the network for a minute or more; on a node that runs a job it would
slow the job and measure the job's load instead of the node. Such nodes are
skipped (a sweep) or refused (a search, ``bench run``) unless the operator
says ``--force``.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.records import JobRecord


def busy_nodes(jobs: Iterable[JobRecord]) -> dict[str, str]:
    """node -> the job holding GPUs on it (running or stopping)."""
    out: dict[str, str] = {}
    for job in jobs:
        if job.holds_gpus:
            for node in job.nodes:
                out.setdefault(node, job.id)
    return out


def why_busy(node: str, job: str) -> str:
    return (f"node {node} runs job {job}: a bench would disturb it (wait, drain it with "
            f"primus-safe node drain {node}, or --force)")
