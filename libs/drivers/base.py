"""What the scheduler needs from a cluster: launch a placed gang, stop it,
and hear about its workers. The Kubernetes driver and the LocalDriver (named
nodes on this machine) both implement it; worker lifecycle comes back as
``worker.started`` / ``worker.exited`` events handed to a callback that the
hosting service publishes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from libs.events import Event, JobSpec, WorkerSlot

EventSink = Callable[[Event], Awaitable[None]]


class ClusterDriver(Protocol):
    async def launch(self, job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot]) -> None:
        """Start every worker of the gang that is not started yet (idempotent
        per attempt and rank); report each start and exit to the sink."""

    async def stop(self, job: str, *, grace_s: float = 10.0) -> None:
        """Stop every worker of the job: SIGTERM, then SIGKILL after the grace period."""

    async def adopt(self) -> int:
        """After a restart, pick up workers started by an earlier instance so
        their exits are still reported; returns how many."""

    async def detach(self) -> None:
        """Stop watching, leave workers running (the next instance adopts them)."""

    async def close(self) -> None:
        """Stop everything this driver started."""
