"""Core-NATS request-reply subjects the bootstrap service answers, shared by
the service and ``primus-safe bootstrap apply``, plus the pure reading of
its ``nodes`` bucket records.

Why request-reply and not events: only bootstrap may publish ``node.*`` and
write the ``nodes`` bucket, so the operator's ``apply`` asks it to drain
(the scheduler then moves the jobs away) and, once Kubespray's
remove-node.yml has run, to remove; the reply says at once whether the
service took the request. Subjects live under ``safe.query.*``, outside
every stream.
"""

from __future__ import annotations

from typing import Any

from libs.bus import QUERY_SUBJECT
from libs.inventory import HostSpec

# {"hosts": <hosts file as JSON>, "remove_with": "kubespray" | null}
#   -> {"ok", "changes": [{"node", "action", "fields"}]}
APPLY_SUBJECT = QUERY_SUBJECT.format(name="bootstrap.apply")
# {"nodes": [...], "reason": str} -> {"ok", "removed": [...], "refused": {node: why}}
REMOVE_SUBJECT = QUERY_SUBJECT.format(name="bootstrap.remove")

# How a node leaving the file is finally removed: by bootstrap itself once
# drained (nothing to undo on the machine), or after Kubespray's
# remove-node.yml ran (a cluster the platform built).
REMOVE_BY_KUBESPRAY = "kubespray"


def live_specs(records: list[dict[str, Any]]) -> dict[str, HostSpec]:
    """The node descriptions bootstrap acts on, by name (pure). Records of
    other writers or older shapes are skipped, never fatal."""
    out: dict[str, HostSpec] = {}
    for record in records:
        try:
            spec = HostSpec.model_validate(record["spec"])
        except (KeyError, TypeError, ValueError):
            continue
        out[spec.name] = spec
    return out


def drained(record: dict[str, Any] | None) -> bool:
    """Whether a node waiting for removal has no job left (or is gone)."""
    return record is None or (record.get("state") == "draining" and bool(record.get("drained")))
