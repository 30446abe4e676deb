"""Core-NATS request-reply subjects the bootstrap service answers, shared by
the service and ``primus-safe bootstrap apply``.

Why request-reply and not events: only bootstrap may publish ``node.*`` and
write the ``nodes`` bucket, so the operator's ``apply`` asks it to drain
(the scheduler then moves the jobs away) and, once Kubespray's
remove-node.yml has run, to remove; the reply says at once whether the
service took the request. Subjects live under ``safe.query.*``, outside
every stream.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from libs.inventory import HostsFile
from libs.records import NodeRecord
from libs.routes import Endpoint, Reply, query

# How a node leaving the file is finally removed: by bootstrap itself once
# drained (nothing to undo on the machine), or after Kubespray's
# remove-node.yml ran (a cluster the platform built).
REMOVE_BY_KUBESPRAY = "kubespray"


class ApplyRequest(BaseModel):
    hosts: HostsFile
    remove_with: Literal["kubespray"] | None = None


class NodeChangeOut(BaseModel):
    node: str
    action: Literal["add", "update", "remove"]
    fields: list[str] = Field(default_factory=list)


class ApplyReply(Reply):
    changes: list[NodeChangeOut] = Field(default_factory=list)


class RemoveRequest(BaseModel):
    nodes: list[str]
    reason: str = ""


class RemoveReply(Reply):
    removed: list[str] = Field(default_factory=list)
    refused: dict[str, str] = Field(default_factory=dict, description="node -> why not")


APPLY = Endpoint(query("bootstrap.apply"), ApplyRequest, ApplyReply,
                 "take over an edited hosts file: register, change, drain (bootstrap apply)")
REMOVE = Endpoint(query("bootstrap.remove"), RemoveRequest, RemoveReply,
                  "Kubespray removed these drained nodes: announce node.removed")


def drained(record: NodeRecord | None) -> bool:
    """Whether a node waiting for removal has no job left (or is gone)."""
    return record is None or (record.state == "draining" and record.drained)
