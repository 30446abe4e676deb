"""KubernetesNodes: the node API (``libs/drivers/nodes.py``) on a real
cluster, hosted by failover. A fault the platform opens on a node cordons it
(``spec.unschedulable``) and adds one ``NoSchedule`` taint per fault kind,
``primus-safe/fault-<kind>``; closing the fault removes that taint, and the
last platform taint to go uncordons the node — but only if the platform
cordoned it: a node an operator cordoned by hand stays cordoned (the
``primus-safe/cordoned`` annotation says the platform did it). Each fault's
reason is kept in a ``primus-safe/fault-<kind>`` annotation for
``kubectl describe node``.

A list then watch of every Node (from the list's resourceVersion, with
bookmarks; listed again after 410 Gone; backing off on errors; never a poll
of every node) reports the watched conditions: Ready False/Unknown is
NotReady; MemoryPressure, DiskPressure, PIDPressure and NetworkUnavailable
are bad when True.

The first half is pure (what a node says, what patch to send); the shell
runs the official synchronous client in threads, as ``KubernetesDriver``
does. Patches are JSON merge patches carrying the node's resourceVersion,
so a patch computed from a stale read is refused (409) and made again from
a fresh one; ``spec.taints`` is sent whole (it has no merge key), as
``kubectl taint`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from libs.drivers.k8s_watch import Expired, version_of, watch_events
from libs.drivers.nodes import CONDITIONS, NodeSink, NodeUpdate, NodeView, fault_mark
from libs.logs import get_logger
from libs.tasks import cancel_and_wait

__all__ = ["KubernetesNodes", "cordon_patch", "read_node", "taint_key", "uncordon_patch"]

TAINT_PREFIX = "primus-safe/fault-"
CORDONED = "primus-safe/cordoned"  # the platform set spec.unschedulable (not an operator)
REASON_PREFIX = "primus-safe/fault-"  # annotation: the open fault's reason, per kind
_REASON_MAX = 512
_CONFLICT_RETRIES = 5

# ---------------------------------------------------------------------- pure


def taint_key(kind: str) -> str:
    return TAINT_PREFIX + fault_mark(kind)


def _taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _platform_marks(taints: list[dict[str, Any]]) -> set[str]:
    return {t["key"][len(TAINT_PREFIX):] for t in taints
            if str(t.get("key", "")).startswith(TAINT_PREFIX)}


def read_node(node: Mapping[str, Any]) -> NodeView:
    """The watched conditions of a Node object (pure)."""
    conditions: dict[str, bool] = {}
    messages: dict[str, str] = {}
    for c in (node.get("status") or {}).get("conditions") or []:
        kind, status = c.get("type"), c.get("status")
        if kind == "Ready":
            name, bad = "NotReady", status != "True"
        elif kind in CONDITIONS:
            name, bad = kind, status == "True"
        else:
            continue
        conditions[name] = bad
        messages[name] = str(c.get("message") or c.get("reason") or f"{kind}={status}")
    return NodeView(name=node["metadata"]["name"], conditions=conditions, messages=messages,
                    marks=frozenset(_platform_marks(_taints(node))),
                    unschedulable=bool((node.get("spec") or {}).get("unschedulable")))


def cordon_patch(node: Mapping[str, Any], kind: str, reason: str) -> dict[str, Any] | None:
    """The merge patch that cordons ``node`` and taints it for ``kind``;
    None when it already is (pure)."""
    key = taint_key(kind)
    taints = _taints(node)
    tainted = any(t.get("key") == key for t in taints)
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    if tainted and cordoned:
        return None
    meta = node["metadata"]
    spec: dict[str, Any] = {}
    annotations: dict[str, Any] = {}
    if not tainted:
        spec["taints"] = [*taints, {"key": key, "value": "", "effect": "NoSchedule"}]
        annotations[REASON_PREFIX + fault_mark(kind)] = f"{kind}: {reason}"[:_REASON_MAX]
    if not cordoned:
        spec["unschedulable"] = True
        annotations[CORDONED] = "true"
    return {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations},
            "spec": spec}


def uncordon_patch(node: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The merge patch that removes the taint of ``kind`` and, when no
    platform taint is left and the platform cordoned the node, uncordons
    it; None when there is nothing to do (pure)."""
    key = taint_key(kind)
    taints = _taints(node)
    rest = [t for t in taints if t.get("key") != key]
    ours = ((node["metadata"].get("annotations") or {}).get(CORDONED) == "true")
    release = ours and not _platform_marks(rest)
    if len(rest) == len(taints) and not release:
        return None
    spec: dict[str, Any] = {}
    annotations: dict[str, Any] = {}
    if len(rest) != len(taints):
        spec["taints"] = rest or None
        annotations[REASON_PREFIX + fault_mark(kind)] = None
    if release:
        spec["unschedulable"] = None
        annotations[CORDONED] = None
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                         "annotations": annotations}, "spec": spec}


# ---------------------------------------------------------------------- shell


class KubernetesNodes:
    def __init__(self, *, api_client: client.ApiClient | None = None,
                 watch_timeout_s: int = 300) -> None:
        if api_client is None:
            from libs.drivers.kubernetes import load_api_client
            api_client = load_api_client()
            self._owns_client = True
        else:
            self._owns_client = False
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self.watch_timeout_s = watch_timeout_s
        self._thread: threading.Thread | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._last: dict[str, NodeView] = {}  # the watch thread's: what was reported
        self._log = get_logger(component="k8s-nodes")

    # ------------------------------------------------------------------ cordon

    async def cordon(self, node: str, fault_kind: str, reason: str) -> bool:
        return await asyncio.to_thread(
            self._change, node, lambda obj: cordon_patch(obj, fault_kind, reason))

    async def uncordon(self, node: str, fault_kind: str) -> bool:
        return await asyncio.to_thread(
            self._change, node, lambda obj: uncordon_patch(obj, fault_kind))

    def _change(self, node: str, make: Any) -> bool:
        """Read the node, patch it as ``make`` says; a conflict (it changed
        since the read) reads it again. A node that is gone has nothing to change."""
        for _ in range(_CONFLICT_RETRIES):
            try:
                obj = json.loads(self._core.read_node(node, _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    self._log.info("no such node; nothing to change", node=node)
                    return False
                raise
            patch = make(obj)
            if patch is None:
                return False
            try:
                resp = self._core.patch_node(node, patch, _preload_content=False,
                                             _content_type="application/merge-patch+json")
                resp.data  # noqa: B018 (read: frees the connection)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                if exc.status == 404:
                    return False
                raise
            self._log.info("node patched", node=node, spec=patch["spec"])
            return True
        raise RuntimeError(f"node {node} kept changing; {_CONFLICT_RETRIES} patches refused")

    # ------------------------------------------------------------------ watch

    async def watch(self, sink: NodeSink) -> None:
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[NodeUpdate] = asyncio.Queue()
        self._consumer = asyncio.create_task(self._consume(queue, sink))
        self._thread = threading.Thread(target=self._watch_forever, args=(loop, queue),
                                        name="k8s-node-watch", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.shutdown()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        await cancel_and_wait([self._consumer])
        if self._owns_client:
            self._api_client.close()

    async def _consume(self, queue: asyncio.Queue[NodeUpdate], sink: NodeSink) -> None:
        while True:
            update = await queue.get()
            try:
                await sink(update)
            except Exception:
                self._log.exception("node update not handled")

    def _post(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[NodeUpdate],
              update: NodeUpdate) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, update)
        except RuntimeError:  # the loop is closed: nobody listens
            self._stopping.set()

    def _watch_forever(self, loop: asyncio.AbstractEventLoop,
                       queue: asyncio.Queue[NodeUpdate]) -> None:
        """List, then watch from the list's resourceVersion; on 410 Gone list
        again; on errors back off and resume from the last version seen."""
        version: str | None = None
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                if version is None:
                    listing = json.loads(self._core.list_node(_preload_content=False).data)
                    version = listing["metadata"]["resourceVersion"]
                    views = tuple(read_node(n) for n in listing["items"])
                    self._last = {v.name: v for v in views}
                    self._post(loop, queue, NodeUpdate(nodes=views, complete=True))
                version = self._watch_once(loop, queue, version)
                backoff = 0.5
            except Exception as exc:
                if self._stopping.is_set():
                    break
                if isinstance(exc, ApiException) and exc.status == 410:
                    version = None
                    continue
                self._log.warning("node watch failed", error=repr(exc))
                self._stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def _watch_once(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[NodeUpdate],
                    version: str) -> str | None:
        """One watch request; returns the version to resume from, None to list again."""
        resp = self._core.list_node(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s, _preload_content=False,
            _request_timeout=self.watch_timeout_s + 30)
        with self._lock:
            self._stream = resp
        try:
            if self._stopping.is_set():
                return version
            for kind, obj in watch_events(resp, "node"):
                version = version_of(obj, version)
                if kind == "DELETED":
                    name = obj["metadata"]["name"]
                    self._last.pop(name, None)
                    self._post(loop, queue, NodeUpdate(deleted=(name,)))
                elif kind in ("ADDED", "MODIFIED"):
                    view = read_node(obj)
                    # A node's status is rewritten often (heartbeats, images):
                    # only a change of what failover judges is reported.
                    if self._last.get(view.name) != view:
                        self._last[view.name] = view
                        self._post(loop, queue, NodeUpdate(nodes=(view,)))
            return version
        except Expired:
            return None  # our version is too old: list again
        finally:
            with self._lock:
                self._stream = None
            with contextlib.suppress(Exception):
                resp.release_conn()
