"""The scheduler's policy core: pure functions from a snapshot to decisions.

No I/O, no clock, no bus: the service shell builds a ``Snapshot`` from its
event-sourced view, calls ``schedule`` once per cycle and acts on the
``CycleResult`` (binds placements, checkpoints and requeues preemption
victims, publishes reasons). Everything here is tested directly.
"""

from .cycle import Cycle, Outcome, schedule
from .model import (
    DEFAULT_PRIORITIES,
    Allocation,
    CycleResult,
    Job,
    Node,
    NodeState,
    Pending,
    Preemption,
    QueuePolicy,
    SchedulerConfig,
    Slot,
    Snapshot,
    UnitScope,
    Workspace,
)
from .ordering import order_queue, queue_key
from .placement import Found, Shortfall, find_placement
from .preemption import VictimChoice, eligible, select_victims
from .request import Invalid, Request, build_request
from .state import ClusterState, Plan
from .topology import ip_key

__all__ = [
    "DEFAULT_PRIORITIES",
    "Allocation",
    "ClusterState",
    "Cycle",
    "CycleResult",
    "Found",
    "Invalid",
    "Job",
    "Node",
    "NodeState",
    "Outcome",
    "Pending",
    "Plan",
    "Preemption",
    "QueuePolicy",
    "Request",
    "SchedulerConfig",
    "Shortfall",
    "Snapshot",
    "UnitScope",
    "VictimChoice",
    "Slot",
    "Workspace",
    "build_request",
    "eligible",
    "find_placement",
    "ip_key",
    "order_queue",
    "queue_key",
    "schedule",
    "select_victims",
]
