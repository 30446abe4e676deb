"""A tiny Kubernetes API server for the driver's tests: just pods and
services in namespaces (create, delete, list by label selector) and a pod
watch whose events the test scripts. It records every request so tests can
assert exactly what the real client sent over HTTP.

Watch responses are chunked, as the real API server's are, so the client
reads each event as it is written."""

from __future__ import annotations

import json
import queue
import re
import socketserver
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

_PATH = re.compile(r"/api/v1/namespaces/([^/]+)/(pods|services)(?:/([^/]+))?")
_NODE = re.compile(r"/api/v1/nodes/([^/]+)")


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    version: str | None = None  # resourceVersion a list answered with
    names: list[str] = field(default_factory=list)  # what a list returned


def selector_matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if (labels.get(key) != value) if eq else (key not in labels):
            return False
    return True


class FakeKubeApi:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> Node (GET /api/v1/nodes/NAME)
        self.fail_create: dict[str, int] = {}  # object name -> HTTP status to answer
        self.watches_opened = 0
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._version = 1000
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self)

            do_POST = do_DELETE = do_GET

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
        self._server.shutdown()
        self._server.server_close()

    def push(self, kind: str, obj: dict[str, Any]) -> None:
        """Script one watch event; an ERROR event ends that watch response."""
        with self._lock:
            self._version += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self._events.put({"type": kind, "object": obj})

    def requests(self, *, method: str | None = None, watch: bool | None = None) -> list[Call]:
        with self._lock:
            calls = list(self.calls)
        return [c for c in calls if (method is None or c.method == method)
                and (watch is None or (c.query.get("watch") == "true") == watch)]

    # ------------------------------------------------------------------ serving

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        query = dict(parse_qsl(url.query))
        raw = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        call = Call(req.command, url.path, query, json.loads(raw) if raw else None)
        with self._lock:
            self.calls.append(call)
        node = _NODE.fullmatch(url.path)
        if node is not None and req.command == "GET":
            with self._lock:
                found = self.nodes.get(node.group(1))
            if found is None:
                return self._reply(req, call, 404, _status(404, "NotFound", node.group(1)))
            return self._reply(req, call, 200, found)
        match = _PATH.fullmatch(url.path)
        if match is None:
            return self._reply(req, call, 404, _status(404, "NotFound", url.path))
        _, resource, name = match.groups()
        store = self.pods if resource == "pods" else self.services
        kind = "Pod" if resource == "pods" else "Service"
        if req.command == "GET" and name is None and query.get("watch") == "true":
            return self._stream(req, call)
        with self._lock:
            if req.command == "GET" and name is None:
                items = [o for o in store.values()
                         if selector_matches(o["metadata"].get("labels") or {},
                                             query.get("labelSelector", ""))]
                call.version, call.names = str(self._version), [o["metadata"]["name"]
                                                                for o in items]
                body = {"kind": f"{kind}List", "apiVersion": "v1",
                        "metadata": {"resourceVersion": call.version}, "items": items}
                return self._reply(req, call, 200, body)
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

    def _reply(self, req: BaseHTTPRequestHandler, call: Call, code: int,
               body: dict[str, Any]) -> None:
        call.status = code
        data = json.dumps(body).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _stream(self, req: BaseHTTPRequestHandler, call: Call) -> None:
        call.status = 200
        with self._lock:
            self.watches_opened += 1
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Transfer-Encoding", "chunked")
        req.send_header("Connection", "close")
        req.end_headers()
        req.close_connection = True
        try:
            while not self._closed.is_set():
                try:
                    event = self._events.get(timeout=0.05)
                except queue.Empty:
                    continue
                line = json.dumps(event).encode() + b"\n"
                req.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                req.wfile.flush()
                if event["type"] == "ERROR":
                    break
            req.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, which can take seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


def _status(code: int, reason: str, what: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": f"{reason}: {what}"}
