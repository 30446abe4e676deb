"""KubernetesDriver: the ClusterDriver for a real cluster. A placed gang
becomes a headless Service and one Pod per rank bound to the node the
platform's scheduler chose; a list+watch of every worker pod turns pod status
into ``worker.started`` / ``worker.exited`` events, each emitted once.

The official (synchronous) ``kubernetes`` client runs in threads: one call
per ``asyncio.to_thread`` for create/delete/list, and one long-lived thread
for the watch, which hands raw pod objects to an asyncio task that maps them
(``k8s_manifests.read_worker_pod``) and calls the sink in order.

Choices an operator should know:

- ``WorkerStarted.data.pid`` is 0: the process lives in a container on
  another machine and its pid means nothing here.
- A pod that disappears or fails without a container termination record
  (deleted, evicted, node lost) is reported with exit code -9 (killed), so
  the scheduler ends the attempt as it does for a killed local worker.
- A pod deleted while no driver watched (found missing when a new leader
  launches its attempt again) is reported ``lost``; it is not created again,
  and the scheduler runs the gang as a new attempt without spending a retry.
- Before anything is created, the Secrets and claims a job names are read
  (and the nodes' labels for its node_selector): a missing one raises
  ``LaunchRefused`` and the scheduler keeps the job pending. With job
  credentials, each job's NATS login is a Secret of its own, deleted (by
  name) when the job stops.
- ``close()`` only stops the watch. Pods outlive the scheduler process on
  purpose: a scheduler restart or leader change must not kill training; a
  new driver's first list reports what happened meanwhile (same event ids,
  so JetStream de-duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from libs.drivers.base import EventSink, LaunchRefused, NodeWorkers
from libs.drivers.k8s_manifests import (
    KILLED_EXIT_CODE,
    WATCH_SELECTOR,
    KubernetesDriverConfig,
    Needed,
    WorkerPod,
    credential_secret,
    credential_secret_name,
    gang_manifests,
    job_selector,
    missing,
    pod_name,
    prerequisites,
    read_worker_pod,
    selector_unmet,
    service_name,
)
from libs.drivers.k8s_watch import Expired, version_of, watch_events
from libs.events import (
    Event,
    JobSpec,
    WorkerExited,
    WorkerExitedData,
    WorkerSlot,
    WorkerStarted,
    WorkerStartedData,
)
from libs.job_credentials import credential
from libs.logs import get_logger
from libs.tasks import cancel_and_wait

__all__ = ["KubernetesDriver", "KubernetesDriverConfig", "load_api_client"]

_API_CONCURRENCY = 16  # parallel create/delete calls for a large gang
_Message = tuple[str, Any]  # ("LIST", [pod, ...]) or (ADDED|MODIFIED|DELETED, pod)


def load_api_client() -> client.ApiClient:
    """In-cluster service account credentials, else the kubeconfig (KUBECONFIG)."""
    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        kube_config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


async def _in_threads(call: Callable[..., None], args: list[tuple[Any, ...]]) -> None:
    """``call(*a)`` for every ``a``, at most _API_CONCURRENCY at a time, each in a
    thread. Every call has finished before the first error is raised: a
    create still in flight when a sibling failed would otherwise land after
    the caller's clean-up had listed what to delete (a pod left behind)."""
    gate = asyncio.Semaphore(_API_CONCURRENCY)

    async def one(a: tuple[Any, ...]) -> None:
        async with gate:
            await asyncio.to_thread(call, *a)

    results = await asyncio.gather(*(one(a) for a in args), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


class KubernetesDriver:
    def __init__(self, config: KubernetesDriverConfig, sink: EventSink, *, nats_url: str,
                 api_client: client.ApiClient | None = None,
                 source: str = "scheduler/k8s-driver", watch_timeout_s: int = 300,
                 stop_wait_s: float = 10.0, job_credential_key: bytes | None = None) -> None:
        if config.job_credentials and not job_credential_key:
            raise ValueError("job_credentials needs the job credential key "
                             "(PRIMUS_JOB_CREDENTIAL_KEY)")
        self.config = config
        self.job_credential_key = job_credential_key
        self.sink = sink
        self.nats_url = nats_url
        self.source = source
        self.watch_timeout_s = watch_timeout_s
        self.stop_wait_s = stop_wait_s  # beyond grace_s, for pods to be gone after stop
        self._owns_client = api_client is None
        self._api_client = api_client or load_api_client()
        self._core = client.CoreV1Api(self._api_client)
        self._known: dict[str, WorkerPod] = {}  # pod name -> last view
        self._emitted: set[str] = set()
        self._consumer: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None  # the open watch response, to unblock it on close
        self._log = get_logger(component="k8s-driver")

    # ------------------------------------------------------------------ ClusterDriver

    async def start(self) -> None:
        """Start the pod watch (idempotent; launch calls it). Call it at startup
        to hear about pods started before this process."""
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Message] = asyncio.Queue()
        self._consumer = asyncio.create_task(self._consume(queue))
        self._thread = threading.Thread(target=self._watch_forever, args=(loop, queue),
                                        name="k8s-pod-watch", daemon=True)
        self._thread.start()

    async def launch(self, job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot]) -> None:
        """Check that every Secret, claim and node label the pods need is
        there (``LaunchRefused`` when not: nothing is created), then create
        the service, the job's NATS credential Secret and the pods; any
        failure removes what was created and raises. A service that exists
        already means this attempt was launched before (a new leader
        launches it again): its pods are not created again, and one that is
        gone (deleted while no driver watched) is reported ``lost``, so the
        gang runs again as a new attempt instead of a rank starting twice
        under ids that de-duplication swallows."""
        await self.start()
        service, pods = gang_manifests(job, attempt, spec, slots, config=self.config,
                                       nats_url=self.nats_url)
        if await asyncio.to_thread(self._read, "service", service_name(job, attempt)):
            await self._report_lost(job, attempt, slots)
            return
        # Everything the pods name must exist before anything is created:
        # a missing Secret or claim keeps the job pending, nothing half made.
        problems = await self._unmet(spec, slots)
        if problems:
            raise LaunchRefused("; ".join(problems))
        try:
            if not await asyncio.to_thread(self._create, "service", service):
                await self._report_lost(job, attempt, slots)
                return
            if self.config.job_credentials:
                assert self.job_credential_key is not None
                cred = credential(self.job_credential_key, job)
                # Kept across attempts (409 is fine: the same credential).
                await asyncio.to_thread(self._create, "secret", credential_secret(
                    job, cred.user, cred.password, self.config))
            await _in_threads(self._create, [("pod", p) for p in pods])
        except Exception as exc:
            # The caller gets the exception (and logs its traceback); say what we do.
            self._log.warning("launch failed; removing the gang", job=job, attempt=attempt,
                              error=repr(exc))
            with contextlib.suppress(Exception):
                await self.stop(job, grace_s=0)
            raise
        self._log.info("gang created", job=job, attempt=attempt,
                       service=service["metadata"]["name"],
                       pods=[p["metadata"]["name"] for p in pods])

    def ignored(self, spec: JobSpec) -> list[str]:
        return []  # pods honour every workload field

    async def stop(self, job: str, *, grace_s: float = 10.0) -> None:
        """Delete every pod of the job (all attempts) with ``grace_s`` as the grace
        period, then its services; wait until the pods are gone (their GPUs are
        free for the next placement) or ``grace_s + stop_wait_s`` passed."""
        selector = job_selector(job)
        grace = max(0, math.ceil(grace_s))
        pods = await asyncio.to_thread(self._list, "pod", selector)
        await _in_threads(self._delete, [("pod", p["metadata"]["name"], grace)
                                         for p in pods["items"]])
        services = await asyncio.to_thread(self._list, "service", selector)
        await _in_threads(self._delete, [("service", s["metadata"]["name"], None)
                                         for s in services["items"]])
        if self.config.job_credentials:
            # By its name, so the scheduler never lists (reads) other Secrets;
            # the next attempt's launch creates it again.
            await asyncio.to_thread(self._delete, "secret", credential_secret_name(job), None)
        deadline = time.monotonic() + grace + self.stop_wait_s
        while True:
            pods = await asyncio.to_thread(self._list, "pod", selector)
            if not pods["items"] or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(1.0, max(0.05, grace / 10)))
        if pods["items"]:
            self._log.warning("pods still terminating after stop", job=job,
                              pods=[p["metadata"]["name"] for p in pods["items"]])

    async def _unmet(self, spec: JobSpec, slots: list[WorkerSlot]) -> list[str]:
        """What keeps the gang from starting: Secrets and claims the pods
        name that are missing (or lack a key, or a checkpoint claim that
        several nodes cannot share), and nodes without the labels of the
        job's node_selector (the kubelet would reject those pods)."""
        needs = prerequisites(spec, slots, self.config)
        kinds = {"secret": "secret", "pvc": "persistentvolumeclaim"}

        async def check(need: Needed) -> str | None:
            obj = await asyncio.to_thread(self._read, kinds[need.kind], need.name)
            return missing(need, obj, self.config.namespace)

        problems = [p for p in await asyncio.gather(*(check(n) for n in needs)) if p]
        if spec.node_selector:
            for node in sorted({s.node for s in slots}):
                obj = await asyncio.to_thread(self._read, "node", node)
                wrong = selector_unmet(obj, spec.node_selector)
                if wrong:
                    problems.append(f"node {node} lacks the node_selector label(s) "
                                    f"{', '.join(wrong)}")
        return problems

    async def _report_lost(self, job: str, attempt: int, slots: list[WorkerSlot]) -> None:
        listing = await asyncio.to_thread(self._list, "pod", job_selector(job))
        present = {p["metadata"]["name"] for p in listing["items"]}
        for slot in slots:
            if pod_name(job, attempt, slot.rank) in present:
                continue
            self._log.warning("worker pod lost: gone with no exit seen", job=job,
                              attempt=attempt, rank=slot.rank, node=slot.node)
            await self._emit_until_out(WorkerExited(
                id=f"{job}-a{attempt}-r{slot.rank}-exited", source=self.source, job=job,
                node=slot.node, data=WorkerExitedData(
                    attempt=attempt, rank=slot.rank, exit_code=KILLED_EXIT_CODE, lost=True,
                    reason="pod deleted while no driver watched")))

    async def node_workers(self, node: str) -> NodeWorkers:
        """Alive when the Node is Ready and worker pods run there (the pod
        watch's view; the Node is read now)."""
        running = [v for v in self._known.values()
                   if v.node == node and v.started and v.exit_code is None]
        try:
            ready = await asyncio.to_thread(self._node_ready, node)
        except Exception as exc:
            return NodeWorkers(node=node, workers=len(running), alive=False,
                               detail=f"cannot read node {node}: {exc}")
        return NodeWorkers(node=node, workers=len(running), alive=ready and bool(running),
                           detail=f"node Ready={ready}; {len(running)} worker pod(s) running")

    def _node_ready(self, node: str) -> bool:
        obj = json.loads(self._core.read_node(node, _preload_content=False).data)
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in obj.get("status", {}).get("conditions", []))

    async def adopt(self) -> int:
        """After a restart: the watch's first list finds the pods an earlier
        instance started and reports how each is doing, so nothing is
        counted here (returns 0)."""
        await self.start()
        return 0

    async def detach(self) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the watch. Pods keep running (see the module docstring)."""
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.shutdown()  # unblocks the watch thread's read
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        await cancel_and_wait([self._consumer])
        if self._owns_client:
            self._api_client.close()

    # ------------------------------------------------------------------ API calls (threads)

    def _create(self, kind: str, body: dict[str, Any]) -> bool:
        """Create the object; False when it exists already."""
        ns, name = self.config.namespace, body["metadata"]["name"]
        try:
            create = {"service": self._core.create_namespaced_service,
                      "secret": self._core.create_namespaced_secret,
                      "pod": self._core.create_namespaced_pod}[kind]
            create(ns, body, _preload_content=False).data  # noqa: B018 (read: frees the connection)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._log.info("already exists", kind=kind, name=name)
            return False
        return True

    def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object as the API returns it; None when it does not exist."""
        ns = self.config.namespace
        readers: dict[str, Callable[..., Any]] = {
            "service": lambda: self._core.read_namespaced_service(
                name, ns, _preload_content=False),
            "secret": lambda: self._core.read_namespaced_secret(
                name, ns, _preload_content=False),
            "persistentvolumeclaim": lambda: self._core.read_namespaced_persistent_volume_claim(
                name, ns, _preload_content=False),
            "node": lambda: self._core.read_node(name, _preload_content=False),
        }
        try:
            return json.loads(readers[kind]().data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, kind: str, name: str, grace: int | None) -> None:
        ns = self.config.namespace
        options = client.V1DeleteOptions(grace_period_seconds=grace)
        try:
            delete = {"service": self._core.delete_namespaced_service,
                      "secret": self._core.delete_namespaced_secret,
                      "pod": self._core.delete_namespaced_pod}[kind]
            delete(name, ns, body=options, _preload_content=False).data  # noqa: B018
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _list(self, kind: str, selector: str) -> dict[str, Any]:
        ns = self.config.namespace
        lister = {"service": self._core.list_namespaced_service,
                  "pod": self._core.list_namespaced_pod}[kind]
        resp = lister(ns, label_selector=selector, _preload_content=False)
        return json.loads(resp.data)

    # ------------------------------------------------------------------ watch (thread)

    def _watch_forever(self, loop: asyncio.AbstractEventLoop,
                       queue: asyncio.Queue[_Message]) -> None:
        """List, then watch from the list's resourceVersion; on 410 Gone list
        again; on errors back off and resume from the last version seen."""
        version: str | None = None
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                if version is None:
                    listing = self._list("pod", WATCH_SELECTOR)
                    version = listing["metadata"]["resourceVersion"]
                    self._post(loop, queue, ("LIST", listing["items"]))
                version = self._watch_once(loop, queue, version)
                backoff = 0.5
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                if self._stopping.is_set():
                    break
                self._log.warning("pod watch failed", status=exc.status, reason=exc.reason)
                self._stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
            except Exception as exc:
                if self._stopping.is_set():
                    break
                self._log.warning("pod watch failed", error=repr(exc))
                self._stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def _post(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Message],
              message: _Message) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, message)
        except RuntimeError:  # the event loop is closed: nobody is listening
            self._stopping.set()

    def _watch_once(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Message],
                    version: str) -> str | None:
        """One watch request; returns the version to resume from, None to re-list."""
        resp = self._core.list_namespaced_pod(
            self.config.namespace, label_selector=WATCH_SELECTOR, watch=True,
            resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s, _preload_content=False,
            _request_timeout=self.watch_timeout_s + 30)
        with self._lock:
            self._stream = resp
        try:
            if self._stopping.is_set():
                return version
            for kind, obj in watch_events(resp, "pod"):
                version = version_of(obj, version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(loop, queue, (kind, obj))
            return version
        except Expired:
            return None  # our version is too old: list again
        finally:
            with self._lock:
                self._stream = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    # ------------------------------------------------------------------ events (loop)

    async def _consume(self, queue: asyncio.Queue[_Message]) -> None:
        while True:
            kind, payload = await queue.get()
            try:
                if kind == "LIST":
                    await self._on_list(payload)
                else:
                    view = read_worker_pod(payload, deleted=kind == "DELETED")
                    if view is not None:
                        await self._observe(view, deleted=kind == "DELETED")
            except Exception:
                self._log.exception("pod event not handled", kind=kind)

    async def _on_list(self, pods: list[dict[str, Any]]) -> None:
        seen: set[str] = set()
        for pod in pods:
            view = read_worker_pod(pod)
            if view is not None:
                seen.add(view.name)
                await self._observe(view, deleted=False)
        # Pods deleted while no watch was open (after a 410 or an error).
        for name in set(self._known) - seen:
            await self._observe(self._known[name].gone(), deleted=True)

    async def _observe(self, view: WorkerPod, *, deleted: bool) -> None:
        base = f"{view.job}-a{view.attempt}-r{view.rank}"
        if view.started:
            await self._emit_once(WorkerStarted(
                id=f"{base}-started", source=self.source, job=view.job, node=view.node,
                data=WorkerStartedData(attempt=view.attempt, rank=view.rank, pid=0)))
        if view.exit_code is not None:
            # A disruption (drain, node shutdown or pressure) spends no
            # retry; a rejection says the node could not take the pod, so
            # the scheduler holds it out of placement for a while.
            await self._emit_once(WorkerExited(
                id=f"{base}-exited", source=self.source, job=view.job, node=view.node,
                data=WorkerExitedData(attempt=view.attempt, rank=view.rank,
                                      exit_code=view.exit_code,
                                      reason=view.disrupted or view.rejected,
                                      lost=view.disrupted is not None,
                                      node_down=view.rejected is not None)))
        if deleted:
            # The pod will not be seen again: forget it, keep memory bounded.
            self._known.pop(view.name, None)
            self._emitted.difference_update({f"{base}-started", f"{base}-exited"})
        else:
            self._known[view.name] = view

    async def _emit_until_out(self, event: Event) -> None:
        """For an event no pod status will bring again (a lost pod's exit):
        publish until it is out; the id makes a repeat that got through a no-op."""
        delay = 0.25
        while event.id not in self._emitted:
            await self._emit_once(event)
            if event.id not in self._emitted:
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    async def _emit_once(self, event: Event) -> None:
        if event.id in self._emitted:
            return
        try:
            await self.sink(event)
        except Exception:
            # Not marked: the next status of this pod (or the next list) retries.
            self._log.exception("sink failed", event_id=event.id)
            return
        self._emitted.add(event.id)
        self._log.info(event.type, job=event.job, node=event.node, event_id=event.id)
