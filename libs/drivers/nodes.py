"""What failover needs from a cluster's nodes: keep the cluster's own
scheduler off a node while the platform has a fault open on it (cordon and
taint), let it back when the fault closes, and hear the node conditions the
cluster reports (NotReady, MemoryPressure, ...) as a fault source.

This is the node half of the driver interface (``libs/drivers/base.py`` is
the workers' half, hosted by the scheduler); failover hosts it.
``libs/drivers/k8s_nodes.py`` implements it for Kubernetes;
``LocalNodes`` is the local driver's, which has nothing to cordon (local
nodes have no scheduler but the platform's, and failover's quarantine
already keeps that one off the node) and reports no conditions.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from libs.logs import get_logger

# The node conditions watched, by the platform's name for the bad state.
# Kubernetes reports Ready (bad when False or Unknown) and the others (bad when True).
CONDITIONS = ("NotReady", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
_MARK_MAX = 50  # leaves room for a prefix within a 63-character name


def fault_mark(kind: str) -> str:
    """The name a fault kind is marked under on a node (a taint key's name
    part: letters, digits, ``-``, ``_``, ``.``; starts and ends with a letter
    or digit): ``alert:gpu_temp_high`` -> ``alert-gpu_temp_high``."""
    mark = re.sub(r"[^A-Za-z0-9_.-]", "-", kind)[:_MARK_MAX].strip("-_.")
    return mark or "fault"


class NodeView(BaseModel):
    """One node as the cluster reports it (only what failover judges)."""

    model_config = ConfigDict(frozen=True)

    name: str
    conditions: dict[str, bool] = Field(
        default_factory=dict, description="watched condition (CONDITIONS) -> bad now; a "
        "condition the node does not report is absent")
    messages: dict[str, str] = Field(default_factory=dict, description="condition -> "
                                     "what the node says about it")
    marks: frozenset[str] = Field(default_factory=frozenset,
                                  description="fault marks the platform put on the node")
    unschedulable: bool = False


class NodeUpdate(BaseModel):
    """What the node watch says: nodes that changed, nodes deleted, or (after
    a start or an expired watch) every node there is."""

    model_config = ConfigDict(frozen=True)

    nodes: tuple[NodeView, ...] = ()
    deleted: tuple[str, ...] = ()
    complete: bool = Field(default=False, description="nodes is every node: one absent is gone")


NodeSink = Callable[[NodeUpdate], Awaitable[None]]


class NodeDriver(Protocol):
    async def cordon(self, node: str, fault_kind: str, reason: str) -> bool:
        """Keep new work off ``node`` while a fault of ``fault_kind`` is open
        (idempotent); True when the node changed."""

    async def uncordon(self, node: str, fault_kind: str) -> bool:
        """Remove the mark of ``fault_kind``; when it was the platform's last,
        let work back on (unless someone else cordoned it). True when it changed."""

    async def watch(self, sink: NodeSink) -> None:
        """Start reporting node conditions to ``sink`` (returns at once)."""

    async def close(self) -> None:
        """Stop the watch."""


class LocalNodes:
    """The local driver's nodes: nothing to cordon, no conditions. Cordons are
    remembered (``cordoned``) and logged so an operator sees what would have
    happened on Kubernetes."""

    def __init__(self) -> None:
        self.cordoned: dict[str, dict[str, str]] = {}  # node -> fault mark -> reason
        self._log = get_logger(component="local-nodes")

    async def cordon(self, node: str, fault_kind: str, reason: str) -> bool:
        marks = self.cordoned.setdefault(node, {})
        if fault_mark(fault_kind) in marks:
            return False
        marks[fault_mark(fault_kind)] = reason
        self._log.info("local node: nothing to cordon (quarantine keeps jobs off it)",
                       node=node, kind=fault_kind)
        return True

    async def uncordon(self, node: str, fault_kind: str) -> bool:
        marks = self.cordoned.get(node, {})
        if marks.pop(fault_mark(fault_kind), None) is None:
            return False
        if not marks:
            self.cordoned.pop(node, None)
        return True

    async def watch(self, sink: NodeSink) -> None:
        return None  # local nodes report no conditions: heartbeats and probes judge them

    async def close(self) -> None:
        return None
