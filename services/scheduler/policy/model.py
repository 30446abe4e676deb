"""The nouns the scheduling policy reasons about, and the answers it gives.

These are plain frozen dataclasses with slots rather than pydantic models: a
cycle at 12,500 nodes and 10,000 queued jobs builds and reads them tens of
thousands of times, and validation already happened at the edge (the service
shell decodes events into these). Everything here is immutable input or
output; the mutable, incrementally updated view lives in ``state``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# A node the placement may use is ready; a quarantined one comes back once it
# passes bench again (it counts for admission); anything else is unready.
NodeState = Literal["ready", "quarantined", "unready"]
QueuePolicy = Literal["fifo", "balance"]
UnitScope = Literal["node", "rack"]
Slot = tuple[str, int]
"""(node name, GPUs) for one worker rank: the core's own form of a
``libs.events.WorkerSlot``, converted in ``services/scheduler/view.py``."""

DEFAULT_PRIORITIES: Mapping[str, int] = {"low": 100, "medium": 500, "high": 1000}


@dataclass(frozen=True, slots=True)
class Node:
    """One schedulable machine. Only ``state == "ready"`` nodes are ever used."""

    name: str
    gpus: int
    gpu_model: str
    rack: str = ""
    switch: str = ""
    ip: str = ""
    state: NodeState = "ready"
    pool: str = "default"
    degraded: bool = False
    """Passed bench, but below its fleet: used only when healthy nodes cannot
    hold a gang (with ``degraded_nodes: never`` it is not ready at all)."""


@dataclass(frozen=True, slots=True)
class Workspace:
    """A tenant: a queue with its own policy and a GPU quota over node pools.

    ``quota_gpus`` caps the workspace's GPUs in use (None: no cap). When
    ``quota_by_model`` is not empty only the models it lists may be used, each
    up to its own cap. ``node_pools`` selects the pools its jobs may run on
    (empty: every pool). ``preemption`` lets its higher-priority jobs preempt
    its lower-priority ones (and, with ``cross_workspace_preemption`` in the
    config, be preempted by other workspaces' jobs).
    """

    name: str
    quota_gpus: int | None = None
    quota_by_model: Mapping[str, int] = field(default_factory=dict, hash=False)
    node_pools: frozenset[str] = frozenset()
    queue_policy: QueuePolicy = "fifo"
    preemption: bool = True


@dataclass(frozen=True, slots=True)
class Job:
    """A gang: ``workers`` workers of ``gpus_per_worker`` GPUs each, all or none.

    ``unit_workers`` consecutive ranks form a parallelism unit (TP x PP group)
    that must not straddle ``unit_scope`` (one node, or one rack).
    ``gpu_models`` lists the models the job accepts (empty: any one model; a
    gang never mixes models). ``recovering`` jobs (re-placed after a fault)
    are served first and avoid ``exclude_nodes``. ``preempted`` jobs were
    evicted by a higher-priority job and sort at the head of their priority
    class. ``expected_runtime_s`` is an optional estimate used only to let a
    job backfill into capacity held for a blocked head job. Running jobs
    must carry ``started_at``: it gates ``min_runtime_s`` and prices
    preemption (a running job without it is never preempted).
    """

    id: str
    workspace: str
    workers: int
    gpus_per_worker: int
    priority: str = "medium"
    submitted_at: float = 0.0
    max_retry: int = 0
    retries: int = 0
    min_runtime_s: float = 0.0
    preemptible: bool = True
    gpu_models: frozenset[str] = frozenset()
    unit_workers: int = 1
    unit_scope: UnitScope = "node"
    recovering: bool = False
    preempted: bool = False
    exclude_nodes: frozenset[str] = frozenset()
    prefer_nodes: frozenset[str] = frozenset()
    started_at: float | None = None
    expected_runtime_s: float | None = None

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True, slots=True)
class Allocation:
    """A running job and where its ranks are. ``terminating``: it was told to
    checkpoint and stop (preempted or cancelled) and has not released yet."""

    job: Job
    slots: tuple[Slot, ...]
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle looks at, as of one instant."""

    nodes: Sequence[Node]
    workspaces: Sequence[Workspace]
    running: Sequence[Allocation] = ()
    pending: Sequence[Job] = ()
    reservations: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Nodes held for blocked jobs by the previous cycle (its
    ``CycleResult.reservations``): jobs placed ahead of their owner avoid
    them when they fit as well elsewhere, so a drain is not refilled."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of the policy; defaults suit a 1,000-node cluster.

    ``max_reservations`` bounds how many blocked jobs hold capacity per
    cycle (one per queue, or its whole-node jobs' claims);
    ``max_preemption_attempts`` bounds victim searches per cycle (each is a
    what-if over the snapshot); ``max_victim_checks`` bounds the fit checks
    one search may run.
    """

    priorities: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PRIORITIES))
    preemption: bool = True
    cross_workspace_preemption: bool = False
    max_reservations: int = 8
    whole_node_holds: int = 2
    """How many one-node jobs of a balance queue that fill a whole node hold
    capacity at once, ahead of smaller jobs before them (0: only the first
    blocked job of each queue holds)."""
    max_preemption_attempts: int = 32
    max_victim_checks: int = 64
    preempt_larger_jobs: bool = False
    """Let a job preempt a job holding more GPUs than it asks for."""
    fragmentation_aware: bool = True
    """Place single-node requests where they fragment the cluster least for
    the mix of jobs running and queued (see ``fragmentation``); off: the
    tightest node."""


@dataclass(frozen=True, slots=True)
class Pending:
    """Why a job still waits, and where it stands (1 = next in its workspace)."""

    position: int
    reason: str
    code: str


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``victim`` for ``preemptor``: checkpoint it, then queue
    ``requeue`` (at the head of its class, retry budget untouched)."""

    victim: str
    preemptor: str
    requeue: Job


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one cycle decided. ``placements`` start now; ``nominations`` are
    planned placements that wait for preempted jobs to release GPUs (they
    are also listed in ``pending``); ``reservations`` are the nodes held for
    blocked jobs, to pass back in the next ``Snapshot``."""

    placements: Mapping[str, tuple[Slot, ...]]
    preemptions: tuple[Preemption, ...]
    pending: Mapping[str, Pending]
    nominations: Mapping[str, tuple[Slot, ...]] = field(default_factory=dict)
    reservations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    step_seconds: Mapping[str, float] = field(default_factory=dict)
