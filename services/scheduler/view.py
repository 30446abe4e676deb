"""The scheduler's own records and their translation into the policy's
snapshot (pure: no I/O, the clock is passed in).

``SchedulerState`` is the shell's memory: nodes as bootstrap described them
and jobs with their lifecycle, both as the shared records of
``libs.records``. Each cycle ``snapshot`` turns it into the frozen
``policy.Snapshot``; jobs the policy should not see yet (retry back-off,
unknown workspace) are answered here with their own reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from libs.events import WorkerSlot
from libs.records import JobRecord, NodeRecord
from services.scheduler import node_holds, policy

_NODE_STATE: dict[str, policy.NodeState] = {"ready": "ready", "quarantined": "quarantined"}


@dataclass
class SchedulerState:
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    reservations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    holds: dict[str, node_holds.Hold] = field(default_factory=dict)  # nodes a driver found down


def policy_job(job: JobRecord) -> policy.Job:
    """The one place a job record becomes the placement core's job."""
    s = job.spec
    return policy.Job(
        id=job.id, workspace=s.workspace, workers=s.workers, gpus_per_worker=s.gpus_per_worker,
        priority=s.priority, submitted_at=job.submitted_at, max_retry=s.max_retry,
        retries=job.retries, min_runtime_s=s.min_runtime_s, preemptible=s.preemptible,
        gpu_models=frozenset({s.gpu_model}) if s.gpu_model else frozenset(),
        unit_workers=s.unit_workers, unit_scope=s.unit_scope, recovering=job.recovering,
        preempted=job.preempted, exclude_nodes=frozenset(job.exclude_nodes),
        prefer_nodes=frozenset(job.prefer_nodes), started_at=job.started_at,
        expected_runtime_s=s.expected_runtime_s,
    )


def policy_slots(slots: list[WorkerSlot]) -> tuple[policy.Slot, ...]:
    """A gang's slots in the placement core's terms, rank order kept."""
    return tuple((s.node, s.gpus) for s in sorted(slots, key=lambda s: s.rank))


def worker_slots(slots: tuple[policy.Slot, ...],
                 models: Mapping[str, str] | None = None) -> list[WorkerSlot]:
    """A placement's slots as the contract's: rank i is the i-th slot;
    ``models``: node -> GPU model (which device resource a pod asks for)."""
    models = models or {}
    return [WorkerSlot(rank=i, node=node, gpus=gpus, gpu_model=models.get(node, ""))
            for i, (node, gpus) in enumerate(slots)]


def policy_nodes(state: SchedulerState, degraded_nodes: str = "last",
                 held: frozenset[str] = frozenset()) -> list[policy.Node]:
    """Every registered node, in the policy's terms (only ready ones are used):
    the one place a node record becomes the placement core's node. A
    cordoned node is not ready, nor is one ``held`` (its driver found it
    down, failover has not judged it yet); a degraded one is used last, or
    (``never``) not at all."""
    def node_state(n: NodeRecord) -> policy.NodeState:
        if n.cordoned or n.name in held or (n.degraded and degraded_nodes == "never"):
            return "unready"
        return _NODE_STATE.get(n.state, "unready")

    return [policy.Node(name=n.name, gpus=n.spec.gpu_count, gpu_model=n.spec.gpu_model,
                        rack=n.spec.rack, switch=n.spec.switch, ip=n.spec.ip,
                        state=node_state(n), pool=n.spec.pool, degraded=n.degraded)
            for n in state.nodes.values()]


def snapshot(state: SchedulerState, workspaces: list[policy.Workspace], now: float,
             degraded_nodes: str = "last") -> tuple[policy.Snapshot, dict[str, policy.Pending]]:
    """The policy's view, and the pending jobs answered before the policy."""
    known = {w.name for w in workspaces}
    nodes = policy_nodes(state, degraded_nodes, node_holds.held(state.holds, now))
    running, pending = [], []
    held: dict[str, policy.Pending] = {}
    for job in state.jobs.values():
        if job.holds_gpus:
            running.append(policy.Allocation(
                job=policy_job(job), slots=policy_slots(job.slots),
                terminating=job.status == "stopping"))
        elif job.status == "pending":
            if job.spec.workspace not in known:
                held[job.id] = policy.Pending(
                    1, f"workspace {job.spec.workspace!r} is not configured; known: "
                       f"{', '.join(sorted(known))}", "invalid")
            elif job.not_before > now and job.blocked:
                at = time.strftime("%H:%M:%S", time.gmtime(job.not_before))
                held[job.id] = policy.Pending(
                    1, f"cannot launch: {job.blocked}; tried again at {at} UTC",
                    "launch-blocked")
            elif job.not_before > now:
                # Fixed for the whole wait: a pending reason is published on change.
                at = time.strftime("%H:%M:%S", time.gmtime(job.not_before))
                held[job.id] = policy.Pending(
                    1, f"retry {job.retries} of {job.spec.max_retry} after a back-off, at "
                       f"{at} UTC", "backoff")
            else:
                pending.append(policy_job(job))
    snap = policy.Snapshot(nodes=nodes, workspaces=workspaces, running=running,
                           pending=pending, reservations=dict(state.reservations))
    return snap, held


def used_gpus(state: SchedulerState) -> dict[str, int]:
    """GPUs held per node by running and terminating jobs (for invariants)."""
    used = dict.fromkeys(state.nodes, 0)
    for job in state.jobs.values():
        if job.holds_gpus:
            for slot in job.slots:
                used[slot.node] = used.get(slot.node, 0) + slot.gpus
    return used
