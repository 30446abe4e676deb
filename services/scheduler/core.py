"""The scheduler's in-memory view and its decisions (pure: no I/O, no clock).

``SchedulerState`` is rebuilt from events; ``plan`` looks at it and returns
what to do this cycle: which pending jobs to place where (all-or-nothing),
and for the rest, a reason and a queue position. The shell publishes the
decisions and tells the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from libs.events import JobSpec, WorkerSlot

PRIORITY = {"low": 0, "medium": 1, "high": 2}
JobStatus = Literal["pending", "running", "completed", "failed"]


@dataclass
class NodeView:
    name: str
    gpus: int
    gpu_model: str
    ip: str
    rack: str
    state: str = "registered"


@dataclass
class JobRecord:
    id: str
    spec: JobSpec
    submitted_at: float
    status: JobStatus = "pending"
    attempt: int = 0
    slots: list[WorkerSlot] = field(default_factory=list)
    exits: dict[int, int] = field(default_factory=dict)
    reason: str = ""
    position: int = 0
    not_before: float = 0.0  # retry backoff: not placed before this time


@dataclass
class SchedulerState:
    nodes: dict[str, NodeView] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)

    def used_gpus(self) -> dict[str, int]:
        used = dict.fromkeys(self.nodes, 0)
        for job in self.jobs.values():
            if job.status == "running":
                for slot in job.slots:
                    used[slot.node] = used.get(slot.node, 0) + slot.gpus
        return used

    def free_gpus(self) -> dict[str, int]:
        used = self.used_gpus()
        return {n.name: n.gpus - used[n.name] for n in self.nodes.values() if n.state == "ready"}


@dataclass(frozen=True)
class Placement:
    job: str
    slots: list[WorkerSlot]


@dataclass(frozen=True)
class Pending:
    job: str
    position: int
    reason: str


@dataclass(frozen=True)
class Plan:
    placements: list[Placement]
    pending: list[Pending]


def queue_order(jobs: list[JobRecord]) -> list[JobRecord]:
    """Higher priority first, then earlier submission, then id (stable ties)."""
    return sorted(jobs, key=lambda j: (-PRIORITY[j.spec.priority], j.submitted_at, j.id))


def _ip_key(ip: str) -> tuple[int, ...]:
    return tuple(int(p) for p in ip.split(".")) if ip.count(".") == 3 else (0,)


def fit_gang(spec: JobSpec, nodes: list[NodeView], free: dict[str, int]) -> list[WorkerSlot] | str:
    """Place every worker or none; returns the slots or why it cannot."""
    usable = [n for n in nodes if n.name in free
              and (spec.gpu_model is None or n.gpu_model == spec.gpu_model)]
    if not usable:
        want = f" with GPU model {spec.gpu_model}" if spec.gpu_model else ""
        return f"no ready node{want}"
    # One worker per node keeps local workers apart; prefer one rack, then IP order.
    per_rack: dict[str, list[NodeView]] = {}
    for node in sorted(usable, key=lambda n: (n.rack, _ip_key(n.ip))):
        if free[node.name] >= spec.gpus_per_worker:
            per_rack.setdefault(node.rack, []).append(node)
    racks = sorted(per_rack.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if racks and len(racks[0][1]) >= spec.workers:
        chosen = racks[0][1][: spec.workers]
    else:
        chosen = [n for _, group in racks for n in group][: spec.workers]
    if len(chosen) < spec.workers:
        fitting = sum(len(g) for _, g in racks)
        return (f"needs {spec.workers} node(s) with {spec.gpus_per_worker} free device(s) each; "
                f"{fitting} of {len(usable)} ready node(s) have that now")
    return [WorkerSlot(rank=i, node=n.name, gpus=spec.gpus_per_worker)
            for i, n in enumerate(chosen)]


def retry_backoff_s(attempt: int) -> float:
    """Wait before attempt ``attempt + 1``: 5 s, 10 s, 20 s … capped at 5 min.
    Long enough that failover has quarantined a dead node before the retry."""
    return min(300.0, 5.0 * 2 ** max(0, attempt - 1))


def plan(state: SchedulerState, now: float) -> Plan:
    """One cycle: FIFO by priority; the queue stops at the first job that
    cannot be placed, so a big job is not starved by smaller ones behind it."""
    free = state.free_gpus()
    nodes = list(state.nodes.values())
    placements: list[Placement] = []
    pending: list[Pending] = []
    blocked: str | None = None
    queue = queue_order([j for j in state.jobs.values() if j.status == "pending"])
    for position, job in enumerate(queue, start=1):
        if job.not_before > now:
            pending.append(Pending(job.id, position - len(placements),
                                   f"retry {job.attempt + 1} in {job.not_before - now:.0f} s"))
            continue
        if blocked is not None:
            pending.append(Pending(job.id, position - len(placements),
                                   f"waiting behind {blocked} (FIFO)"))
            continue
        fitted = fit_gang(job.spec, nodes, free)
        if isinstance(fitted, str):
            blocked = job.id
            pending.append(Pending(job.id, position - len(placements), fitted))
            continue
        for slot in fitted:
            free[slot.node] -= slot.gpus
        placements.append(Placement(job.id, fitted))
    return Plan(placements, pending)
