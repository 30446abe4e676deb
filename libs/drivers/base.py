"""What the scheduler needs from a cluster: launch a placed gang, stop it,
and hear about its workers. The Kubernetes driver and the LocalDriver (named
nodes on this machine) both implement it; worker lifecycle comes back as
``worker.started`` / ``worker.exited`` events handed to a callback that the
hosting service publishes. The node half (cordon and taint a node while a
fault is open, watch node conditions) is ``NodeDriver`` in
``libs.drivers.nodes``; failover hosts it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel, Field

from libs.drivers.nodes import NodeDriver, NodeUpdate  # the node half: failover hosts it
from libs.events import Event, JobSpec, WorkerSlot
from libs.routes import Endpoint, Reply, query

__all__ = ["NODE_WORKERS", "ClusterDriver", "EventSink", "LaunchRefused", "NodeDriver",
           "NodeUpdate", "NodeWorkers", "NodeWorkersRequest"]

EventSink = Callable[[Event], Awaitable[None]]


class LaunchRefused(Exception):
    """The cluster cannot start the gang yet and nothing was created (a
    Secret or claim the job names does not exist): the job waits, no retry
    spent, and is tried again later. ``str()`` says what is missing."""


class NodeWorkersRequest(BaseModel):
    node: str


class NodeWorkers(Reply):
    """The driver's view of one node: do the workers placed there still run?
    Failover asks before it evacuates a node whose agent fell silent."""

    node: str = ""
    workers: int = Field(default=0, description="workers the driver started there that run now")
    alive: bool = Field(default=False, description="the node still runs them (local: their "
                        "processes live; Kubernetes: the node is Ready and their pods run)")
    detail: str = ""


# Answered by the scheduler leader, which hosts the driver.
NODE_WORKERS = Endpoint(query("scheduler.workers"), NodeWorkersRequest, NodeWorkers,
                        "does a node still run its workers? (failover asks about a node "
                        "whose agent is silent before it evacuates it)")


class ClusterDriver(Protocol):
    async def launch(self, job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot]) -> None:
        """Start every worker of the gang that is not started yet (idempotent
        per attempt and rank); report each start and exit to the sink."""

    def ignored(self, spec: JobSpec) -> list[str]:
        """The fields of ``spec`` this driver cannot honour (the scheduler
        says so once, in ``explain``)."""

    async def stop(self, job: str, *, grace_s: float = 10.0) -> None:
        """Stop every worker of the job: SIGTERM, then SIGKILL after the grace period."""

    async def node_workers(self, node: str) -> NodeWorkers:
        """Whether the workers placed on ``node`` still run there, as the
        cluster sees it (not as the node's agent says)."""

    async def adopt(self) -> int:
        """After a restart, pick up workers started by an earlier instance so
        their exits are still reported; returns how many."""

    async def detach(self) -> None:
        """Stop watching, leave workers running (the next instance adopts them)."""

    async def close(self) -> None:
        """Stop everything this driver started."""
