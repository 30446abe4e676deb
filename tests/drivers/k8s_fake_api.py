"""A tiny Kubernetes API server for the drivers' tests. It records every
request so tests can assert exactly what the real client sent over HTTP,
and what RBAC verb each request needs (``Call.rbac``).

What it serves, answering as the real API server does:

- namespaced ``pods``, ``services``, ``secrets`` and
  ``persistentvolumeclaims``: create, get, delete, list by label selector
  (namespaces are not told apart: names are unique per test);
- a pod (or service) watch whose events the test scripts with ``push``;
- cluster-scoped ``nodes``: get, list, watch and PATCH. Node changes made
  through ``put_node`` / ``set_condition`` or a PATCH get a resourceVersion
  and go into a history a watch replays from the version it asks for;
  ``expire_node_history`` compacts it (a watch from before gets 410 Gone),
  ``bookmark`` adds a BOOKMARK, ``end_node_watches`` ends open watches the
  way their timeout does. PATCH takes a JSON merge patch, or a strategic
  merge patch applied as one (the same for maps and for lists without a
  merge key, such as ``spec.taints``); a ``metadata.resourceVersion`` in
  the patch is a precondition (409 Conflict when the node changed).

Watch responses are chunked, as the real API server's are, so the client
reads each event as it is written."""

from __future__ import annotations

import asyncio
import json
import queue
import re
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

NAMESPACED = ("pods", "services", "secrets", "persistentvolumeclaims")
_PATH = re.compile(rf"/api/v1/namespaces/([^/]+)/({'|'.join(NAMESPACED)})(?:/([^/]+))?")
_NODES = re.compile(r"/api/v1/nodes(?:/([^/]+))?")
_KINDS = {"pods": "Pod", "services": "Service", "secrets": "Secret",
          "persistentvolumeclaims": "PersistentVolumeClaim", "nodes": "Node"}
_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    version: str | None = None  # resourceVersion a list answered with
    names: list[str] = field(default_factory=list)  # what a list returned
    content_type: str = ""

    def rbac(self) -> tuple[str, str, str, str]:
        """(scope, apiGroup, resource, verb) the request needs, as the API
        server's authorizer names it: scope is "namespaced" or "cluster"."""
        path = self.path.split("?")[0]
        if (m := _PATH.fullmatch(path)) is not None:
            scope, resource, name = "namespaced", m.group(2), m.group(3)
        elif (m := _NODES.fullmatch(path)) is not None:
            scope, resource, name = "cluster", "nodes", m.group(1)
        else:
            raise ValueError(f"no RBAC mapping for {self.method} {self.path}")
        verb = {"POST": "create", "DELETE": "delete" if name else "deletecollection",
                "PATCH": "patch", "PUT": "update"}.get(self.method)
        if self.method == "GET":
            verb = "get" if name else ("watch" if self.query.get("watch") == "true" else "list")
        if verb is None:
            raise ValueError(f"no RBAC verb for {self.method}")
        return scope, "", resource, verb


def selector_matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if (labels.get(key) != value) if eq else (key not in labels):
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def condition_node(name: str, *, ready: str = "True", labels: dict[str, str] | None = None,
                   **pressures: str) -> dict[str, Any]:
    """A Node as the kubelet reports it: Ready, and the pressure conditions
    False unless given (``MemoryPressure="True"``)."""
    conditions = [{"type": "Ready", "status": ready, "reason": "KubeletReady"
                   if ready == "True" else "KubeletNotReady", "message": f"Ready={ready}"}]
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"):
        status = pressures.get(kind, "False")
        conditions.append({"type": kind, "status": status, "reason": f"{kind}={status}",
                           "message": f"kubelet says {kind} is {status}"})
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "labels": labels or {}}, "spec": {},
            "status": {"conditions": conditions}}


class FakeKubeApi:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.pvcs: dict[str, dict[str, Any]] = {}
        # name -> Node; assigning here directly changes GET/list answers without a
        # watch event; put_node / set_condition / PATCH also record one.
        self.nodes: dict[str, dict[str, Any]] = {}
        self.fail_create: dict[str, int] = {}  # object name -> HTTP status to answer
        self.fail_patch: dict[str, int] = {}  # node name -> HTTP status to answer PATCH with
        self.watches_opened = 0  # pod/service watches
        self.node_watches_opened = 0
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._node_log: list[tuple[int, dict[str, Any]]] = []  # (version, watch event)
        self._node_compacted = 0  # a node watch from an older version gets 410 Gone
        self._node_watch_gen = 0  # bumped by end_node_watches / expire_node_history
        self._node_changed = threading.Condition()
        self._closed = threading.Event()
        self._lock = threading.RLock()
        self._version = 1000
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self)

            do_POST = do_DELETE = do_PATCH = do_GET

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed.set()
        with self._node_changed:
            self._node_changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def push(self, kind: str, obj: dict[str, Any]) -> None:
        """Script one pod watch event; an ERROR event ends that watch response."""
        with self._lock:
            self._version += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self._events.put({"type": kind, "object": obj})

    def requests(self, *, method: str | None = None, watch: bool | None = None,
                 path: str | None = None) -> list[Call]:
        with self._lock:
            calls = list(self.calls)
        return [c for c in calls if (method is None or c.method == method)
                and (watch is None or (c.query.get("watch") == "true") == watch)
                and (path is None or c.path == path or c.path.startswith(path + "/"))]

    # ------------------------------------------------------------------ nodes (scripting)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def put_node(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a Node (ADDED or MODIFIED for watches)."""
        with self._lock:
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in self.nodes else "ADDED"
            return self._node_event(kind, json.loads(json.dumps(obj)))

    def set_condition(self, name: str, kind: str, status: str) -> dict[str, Any]:
        """The kubelet reports condition ``kind`` of node ``name`` as ``status``."""
        with self._lock:
            obj = json.loads(json.dumps(self.nodes[name]))
            conditions = obj.setdefault("status", {}).setdefault("conditions", [])
            for c in conditions:
                if c["type"] == kind:
                    c.update(status=status, message=f"kubelet says {kind} is {status}")
                    break
            else:
                conditions.append({"type": kind, "status": status})
            return self._node_event("MODIFIED", obj)

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._node_event("DELETED", self.nodes[name])

    def bookmark(self) -> int:
        """A BOOKMARK at a new version (sent to watches that allow bookmarks)."""
        with self._lock:
            self._version += 1
            event = {"type": "BOOKMARK", "object": {
                "kind": "Node", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._version)}}}
            self._append_node_log(event)
            return self._version

    def expire_node_history(self) -> None:
        """Compaction: node history before now is gone; open node watches get
        410 Gone, and so does a watch from any version before now."""
        with self._lock:
            self._version += 1
            self._node_compacted = self._version
            self._node_log.clear()
        with self._node_changed:
            self._node_watch_gen += 1
            self._node_changed.notify_all()

    def end_node_watches(self) -> None:
        """Open node watches end cleanly, as when their timeoutSeconds passes."""
        with self._node_changed:
            self._node_watch_gen += 1
            self._node_changed.notify_all()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = obj
        self._append_node_log({"type": kind, "object": json.loads(json.dumps(obj))})
        return obj

    def _append_node_log(self, event: dict[str, Any]) -> None:
        self._node_log.append((self._version, event))
        with self._node_changed:
            self._node_changed.notify_all()

    # ------------------------------------------------------------------ serving

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        query = dict(parse_qsl(url.query))
        raw = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        call = Call(req.command, url.path, query, json.loads(raw) if raw else None,
                    content_type=(req.headers.get("Content-Type") or "").split(";")[0])
        with self._lock:
            self.calls.append(call)
        nodes = _NODES.fullmatch(url.path)
        if nodes is not None:
            return self._handle_nodes(req, call, nodes.group(1))
        match = _PATH.fullmatch(url.path)
        if match is None:
            return self._reply(req, call, 404, _status(404, "NotFound", url.path))
        _, resource, name = match.groups()
        store = {"pods": self.pods, "services": self.services, "secrets": self.secrets,
                 "persistentvolumeclaims": self.pvcs}[resource]
        kind = _KINDS[resource]
        if req.command == "GET" and name is None and query.get("watch") == "true":
            return self._stream(req, call)
        with self._lock:
            if req.command == "GET" and name is None:
                return self._list(req, call, kind, store)
            if req.command == "GET":
                if name not in store:
                    return self._reply(req, call, 404, _status(404, "NotFound", name))
                return self._reply(req, call, 200, store[name])
            if req.command == "POST" and name is None:
                name = call.body["metadata"]["name"]
                if name in self.fail_create:
                    code = self.fail_create[name]
                    return self._reply(req, call, code, _status(code, "Forbidden", name))
                if name in store:
                    return self._reply(req, call, 409, _status(409, "AlreadyExists", name))
                self._version += 1
                obj = json.loads(raw)
                obj["metadata"].update(resourceVersion=str(self._version), uid=f"uid-{name}")
                store[name] = obj
                return self._reply(req, call, 201, obj)
            if req.command == "DELETE" and name is not None:
                if name not in store:
                    return self._reply(req, call, 404, _status(404, "NotFound", name))
                self._version += 1
                return self._reply(req, call, 200, store.pop(name))
        return self._reply(req, call, 405, _status(405, "MethodNotAllowed", url.path))

    def _list(self, req: BaseHTTPRequestHandler, call: Call, kind: str,
              store: dict[str, dict[str, Any]]) -> None:
        items = [o for o in store.values()
                 if selector_matches(o["metadata"].get("labels") or {},
                                     call.query.get("labelSelector", ""))]
        call.version, call.names = str(self._version), [o["metadata"]["name"] for o in items]
        body = {"kind": f"{kind}List", "apiVersion": "v1",
                "metadata": {"resourceVersion": call.version}, "items": items}
        return self._reply(req, call, 200, body)

    def _handle_nodes(self, req: BaseHTTPRequestHandler, call: Call, name: str | None) -> None:
        if req.command == "GET" and name is None and call.query.get("watch") == "true":
            return self._stream_nodes(req, call)
        with self._lock:
            if req.command == "GET" and name is None:
                return self._list(req, call, "Node", self.nodes)
            found = self.nodes.get(name or "")
            if name is None or req.command not in ("GET", "PATCH"):
                return self._reply(req, call, 405, _status(405, "MethodNotAllowed", call.path))
            if found is None:
                return self._reply(req, call, 404, _status(404, "NotFound", name))
            if req.command == "GET":
                return self._reply(req, call, 200, found)
            if name in self.fail_patch:
                code = self.fail_patch[name]
                return self._reply(req, call, code, _status(code, "Forbidden", name))
            if call.content_type not in _MERGE_PATCHES or not isinstance(call.body, dict):
                return self._reply(req, call, 415, _status(415, "UnsupportedMediaType",
                                                            call.content_type))
            wanted = (call.body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != found["metadata"]["resourceVersion"]:
                return self._reply(req, call, 409, _status(409, "Conflict", name))
            patched = merge_patch(found, call.body)
            return self._reply(req, call, 200, self._node_event("MODIFIED", patched))

    def _reply(self, req: BaseHTTPRequestHandler, call: Call, code: int,
               body: dict[str, Any]) -> None:
        call.status = code
        data = json.dumps(body).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _open_stream(self, req: BaseHTTPRequestHandler, call: Call) -> None:
        call.status = 200
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Transfer-Encoding", "chunked")
        req.send_header("Connection", "close")
        req.end_headers()
        req.close_connection = True

    @staticmethod
    def _write(req: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
        line = json.dumps(event).encode() + b"\n"
        req.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        req.wfile.flush()

    def _stream(self, req: BaseHTTPRequestHandler, call: Call) -> None:
        with self._lock:
            self.watches_opened += 1
        self._open_stream(req, call)
        try:
            while not self._closed.is_set():
                try:
                    event = self._events.get(timeout=0.05)
                except queue.Empty:
                    continue
                self._write(req, event)
                if event["type"] == "ERROR":
                    break
            req.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away

    def _stream_nodes(self, req: BaseHTTPRequestHandler, call: Call) -> None:
        """Events after the asked version, then live ones, until the watch's
        timeoutSeconds, end_node_watches, or 410 Gone."""
        bookmarks = call.query.get("allowWatchBookmarks") == "true"
        deadline = time.monotonic() + float(call.query.get("timeoutSeconds") or 1800)
        asked = call.query.get("resourceVersion") or "0"
        with self._lock:
            self.node_watches_opened += 1
            gen = self._node_watch_gen
            if asked == "0":  # "any version": every node as ADDED, then what follows
                sent, backlog = self._version, [
                    {"type": "ADDED", "object": n} for n in self.nodes.values()]
            elif int(asked) < self._node_compacted:
                sent, backlog = -1, []
            else:
                sent, backlog = int(asked), []
        self._open_stream(req, call)
        try:
            if sent < 0:
                self._write(req, {"type": "ERROR", "object": _status(
                    410, "Expired", f"too old resource version: {asked}")})
                req.wfile.write(b"0\r\n\r\n")
                return
            for event in backlog:
                self._write(req, event)
            while not self._closed.is_set() and time.monotonic() < deadline:
                with self._lock:
                    new = [(v, e) for v, e in self._node_log if v > sent]
                    expired = self._node_compacted > sent and self._node_watch_gen != gen
                    ended = self._node_watch_gen != gen
                if expired:
                    self._write(req, {"type": "ERROR", "object": _status(
                        410, "Expired", "too old resource version")})
                    break
                if ended:  # what was not sent yet, the next watch replays
                    break
                for version, event in new:
                    sent = version
                    if event["type"] != "BOOKMARK" or bookmarks:
                        self._write(req, event)
                with self._node_changed:
                    self._node_changed.wait(0.05)
            req.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, which can take seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


def _status(code: int, reason: str, what: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": f"{reason}: {what}"}


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Until ``check()`` holds (the API server and the watches run in threads)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)
