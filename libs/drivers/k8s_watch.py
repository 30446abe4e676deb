"""Reading one Kubernetes watch response: the part the pod watch
(``kubernetes``) and the node watch (``k8s_nodes``) share. Each caller lists,
watches from the list's resourceVersion, and lists again when the server
says the version is too old."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from kubernetes.watch.watch import iter_resp_lines


class Expired(Exception):
    """410 Gone: the watch's resourceVersion is too old; list again."""


def watch_events(resp: Any, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of a watch response as (type, object), as they arrive:
    ADDED, MODIFIED, DELETED and BOOKMARK. Raises ``Expired`` on 410 and
    RuntimeError on any other ERROR event (the caller backs off)."""
    for line in iter_resp_lines(resp):
        if not line:
            continue
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(obj.get("message") or "")
            raise RuntimeError(f"{what} watch error: {obj.get('message') or obj}")
        yield str(kind), obj


def version_of(obj: Mapping[str, Any], default: str) -> str:
    """The object's resourceVersion: where a watch resumes after it."""
    return (obj.get("metadata") or {}).get("resourceVersion") or default
