"""The KubernetesDriver against a recording HTTP endpoint that speaks enough of
the Kubernetes API: the real ``kubernetes`` client sends the service first,
then the pods exactly as built; stop deletes them with the grace period;
scripted pod watch events come out as worker.started / worker.exited events
exactly once each, across a 410 Gone re-list."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from libs.drivers.base import LaunchRefused
from libs.drivers.k8s_manifests import (
    KILLED_EXIT_CODE,
    WATCH_SELECTOR,
    credential_secret_name,
    gang_manifests,
    job_selector,
    pod_name,
    service_name,
)
from libs.drivers.kubernetes import KubernetesDriver, KubernetesDriverConfig
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot, WorkerStarted
from libs.job_credentials import credential
from libs.worker_env import WORKER_ENV_PASSWORD
from tests.drivers.k8s_fake_api import FakeKubeApi, wait_until

pytestmark = pytest.mark.timeout(60)

NS = "train"
PODS = f"/api/v1/namespaces/{NS}/pods"
SERVICES = f"/api/v1/namespaces/{NS}/services"
CONFIG = KubernetesDriverConfig(namespace=NS, image="rocm/pytorch:rocm6.2",
                                checkpoint_pvc="ckpt")
NATS = "nats://nats.primus:4222"
JOB = "Tiny_DDP-1"
SPEC = JobSpec(name="tiny", workers=2, gpus_per_worker=8, command=["python", "train.py"],
               priority="high", checkpoint_interval=20)
SLOTS = [WorkerSlot(rank=1, node="node-b", gpus=8), WorkerSlot(rank=0, node="node-a", gpus=8)]
RUNNING = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}


def terminated(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "startedAt": "2025-01-01T00:00:00Z",
                           "finishedAt": "2025-01-01T00:01:00Z"}}


def with_status(pod: dict[str, Any], phase: str,
                state: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"name": "worker", "state": state}]
    return {**pod, "status": status}


def summary(events: list[Event]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, WorkerStarted):
            out.append((e.id, e.type, e.job, e.node, e.data.attempt, e.data.rank, e.data.pid))
        elif isinstance(e, WorkerExited):
            out.append((e.id, e.type, e.job, e.node, e.data.attempt, e.data.rank,
                        e.data.exit_code))
    return out


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    server = FakeKubeApi().start()
    # The checkpoint claim the driver's config names, shareable across nodes.
    server.pvcs["ckpt"] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": "ckpt", "namespace": NS},
                           "spec": {"accessModes": ["ReadWriteMany"]}}
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def events() -> list[Event]:
    return []


@pytest.fixture
async def driver(api: FakeKubeApi, events: list[Event]) -> AsyncIterator[KubernetesDriver]:
    async def sink(event: Event) -> None:
        events.append(event)

    api_client = client.ApiClient(client.Configuration(host=api.url))
    drv = KubernetesDriver(CONFIG, sink, nats_url=NATS, api_client=api_client,
                           watch_timeout_s=30, stop_wait_s=10.0)
    try:
        yield drv
    finally:
        await drv.close()
        api_client.close()


async def test_launch_sends_service_then_pods_and_reports_each_event_once(
        api: FakeKubeApi, driver: KubernetesDriver, events: list[Event]) -> None:
    await driver.start()
    await wait_until(lambda: api.watches_opened == 1)
    await driver.launch(JOB, 2, SPEC, SLOTS)

    service, pods = gang_manifests(JOB, 2, SPEC, SLOTS, config=CONFIG, nats_url=NATS)
    writes = api.requests(method="POST")
    assert [(c.path, c.status) for c in writes] == [(SERVICES, 201), (PODS, 201), (PODS, 201)]
    # What went over the wire is exactly what the builders made.
    assert writes[0].body == service
    sent = sorted((c.body for c in writes[1:]), key=lambda p: p["metadata"]["name"])
    assert sent == sorted(pods, key=lambda p: p["metadata"]["name"])
    by_rank = {int(p["metadata"]["labels"]["primus-safe/rank"]): p for p in sent}
    assert by_rank[0]["spec"]["nodeName"] == "node-a"
    assert by_rank[1]["spec"]["nodeName"] == "node-b"
    env1 = {e["name"]: e.get("value") for e in by_rank[1]["spec"]["containers"][0]["env"]}
    assert env1["MASTER_ADDR"] == (f"{pod_name(JOB, 2, 0)}.{service_name(JOB, 2)}"
                                   f".{NS}.svc.cluster.local")
    assert (env1["RANK"], env1["WORLD_SIZE"], env1["PRIMUS_JOB_ID"]) == ("1", "2", JOB)
    assert by_rank[1]["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "8"}
    assert by_rank[1]["spec"]["priorityClassName"] == "primus-safe-high"

    p0, p1 = (api.pods[pod_name(JOB, 2, r)] for r in (0, 1))
    api.push("ADDED", with_status(p0, "Pending"))
    api.push("MODIFIED", with_status(p0, "Running", RUNNING))
    api.push("MODIFIED", with_status(p0, "Running", RUNNING))  # no second start
    api.push("MODIFIED", with_status(p1, "Running", RUNNING))
    api.push("MODIFIED", with_status(p0, "Succeeded", terminated(0)))
    api.push("MODIFIED", with_status(p1, "Failed", terminated(137)))
    api.pods.pop(p0["metadata"]["name"])
    api.push("DELETED", with_status(p0, "Succeeded", terminated(0)))  # no second exit
    await wait_until(lambda: len(events) >= 4)

    # 410 Gone: the driver lists again and watches from the new list's version.
    api.push("ERROR", {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                       "reason": "Expired", "message": "too old resource version"})
    await wait_until(lambda: api.watches_opened == 2)
    # Last, a pod deleted without a termination record: started, then killed.
    other = gang_manifests("other", 1, SPEC, [WorkerSlot(rank=0, node="node-c", gpus=8)],
                           config=CONFIG, nats_url=NATS)[1][0]
    api.push("ADDED", with_status(other, "Running", RUNNING))
    api.push("DELETED", with_status(other, "Running", RUNNING))
    await wait_until(lambda: len(events) >= 6)
    await asyncio.sleep(0.2)  # nothing else may follow

    started, exited = "worker.started", "worker.exited"
    assert summary(events) == [
        (f"{JOB}-a2-r0-started", started, JOB, "node-a", 2, 0, 0),
        (f"{JOB}-a2-r1-started", started, JOB, "node-b", 2, 1, 0),
        (f"{JOB}-a2-r0-exited", exited, JOB, "node-a", 2, 0, 0),
        (f"{JOB}-a2-r1-exited", exited, JOB, "node-b", 2, 1, 137),
        ("other-a1-r0-started", started, "other", "node-c", 1, 0, 0),
        ("other-a1-r0-exited", exited, "other", "node-c", 1, 0, KILLED_EXIT_CODE),
    ]
    assert all(e.source == "scheduler/k8s-driver" for e in events)

    lists = [c for c in api.requests(method="GET", watch=False) if c.path == PODS]
    watches = api.requests(watch=True)
    assert [c.query["labelSelector"] for c in lists + watches] == [WATCH_SELECTOR] * 4
    assert [w.query["resourceVersion"] for w in watches] == [c.version for c in lists]
    assert lists[0].version != lists[1].version
    assert all(w.query["allowWatchBookmarks"] == "true" for w in watches)


async def test_stop_deletes_pods_with_grace_then_service(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    await driver.launch(JOB, 2, SPEC, SLOTS)
    await driver.launch("other", 1, SPEC, [WorkerSlot(rank=0, node="node-c", gpus=8)])
    before = len(api.requests())
    await driver.stop(JOB, grace_s=7)

    calls = [c for c in api.requests()[before:] if c.query.get("watch") != "true"
             and c.query.get("labelSelector") != WATCH_SELECTOR]
    selector = job_selector(JOB)
    seen = [(c.method, c.path, c.query.get("labelSelector")) for c in calls]
    seen[1:3] = sorted(seen[1:3])  # pods are deleted in parallel
    assert seen == [
        ("GET", PODS, selector),
        ("DELETE", f"{PODS}/{pod_name(JOB, 2, 0)}", None),
        ("DELETE", f"{PODS}/{pod_name(JOB, 2, 1)}", None),
        ("GET", SERVICES, selector),
        ("DELETE", f"{SERVICES}/{service_name(JOB, 2)}", None),
        ("GET", PODS, selector),  # waits until the pods are gone: here at once
    ]
    assert [c.body["gracePeriodSeconds"] for c in calls if c.path.startswith(f"{PODS}/")] \
        == [7, 7]
    assert set(api.pods) == {pod_name("other", 1, 0)}  # another job is untouched
    assert set(api.services) == {service_name("other", 1)}


async def test_launch_is_idempotent_for_the_same_attempt(
        api: FakeKubeApi, driver: KubernetesDriver, events: list[Event]) -> None:
    await driver.launch(JOB, 2, SPEC, SLOTS)
    await driver.launch(JOB, 2, SPEC, SLOTS)  # a new leader: the service is there
    assert sorted(c.status for c in api.requests(method="POST")) == [201] * 3  # none again
    assert len(api.pods) == 2 and len(api.services) == 1
    assert not [e for e in events if isinstance(e, WorkerExited)]


async def test_a_pod_deleted_while_no_driver_watched_is_lost_not_started_again(
        api: FakeKubeApi, driver: KubernetesDriver, events: list[Event]) -> None:
    await driver.launch(JOB, 2, SPEC, SLOTS)
    api.pods.pop(pod_name(JOB, 2, 1))  # drained away while the scheduler restarted
    await driver.launch(JOB, 2, SPEC, SLOTS)
    assert pod_name(JOB, 2, 1) not in api.pods  # never a second start under the same ids
    lost = [e for e in events if isinstance(e, WorkerExited)]
    assert [(e.id, e.node, e.data.rank, e.data.exit_code, e.data.lost) for e in lost] == [
        (f"{JOB}-a2-r1-exited", "node-b", 1, KILLED_EXIT_CODE, True)]
    assert lost[0].data.reason == "pod deleted while no driver watched"


async def test_what_kubernetes_did_to_a_pod_reaches_the_scheduler(
        api: FakeKubeApi, driver: KubernetesDriver, events: list[Event]) -> None:
    """A rank whose pod Kubernetes disrupted (node shutdown: it checkpointed
    and exited 0 on the kubelet's SIGTERM) is ``lost``, not done; a rank
    the kubelet rejected before its container started is ``node_down``.
    Both say why, and neither spends a retry (the scheduler's rule)."""
    await driver.start()
    await wait_until(lambda: api.watches_opened == 1)
    await driver.launch(JOB, 2, SPEC, SLOTS)
    p0, p1 = (api.pods[pod_name(JOB, 2, r)] for r in (0, 1))
    shutdown = with_status(p0, "Succeeded", terminated(0))
    shutdown["status"]["conditions"] = [{
        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
        "message": "Pod was terminated in response to imminent node shutdown."}]
    rejected = with_status(p1, "Failed")
    # The kubelet's device manager, as `kubectl get events` shows it when a
    # GPU dropped off the node between placement and start (the message of
    # a public issue report, with AMD's resource name).
    rejected["status"] |= {"reason": "UnexpectedAdmissionError",
                           "message": "Allocate failed due to requested number of devices "
                                      "unavailable for amd.com/gpu. Requested: 8, Available: 7, "
                                      "which is unexpected"}
    api.push("MODIFIED", with_status(p0, "Running", RUNNING))
    api.push("MODIFIED", shutdown)
    api.push("MODIFIED", rejected)
    await wait_until(lambda: sum(isinstance(e, WorkerExited) for e in events) == 2)
    said = {e.data.rank: (e.data.exit_code, e.data.lost, e.data.node_down, e.data.reason)
            for e in events if isinstance(e, WorkerExited)}
    assert said == {
        0: (0, True, False,
            "TerminationByKubelet: Pod was terminated in response to imminent node shutdown."),
        1: (KILLED_EXIT_CODE, False, True,
            "UnexpectedAdmissionError: Allocate failed due to requested number of devices "
            "unavailable for amd.com/gpu. Requested: 8, Available: 7, which is unexpected")}


async def test_failed_launch_removes_the_gang_and_raises(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    api.fail_create[pod_name(JOB, 2, 1)] = 403
    # Rank 0's create goes out after rank 1's refusal came back (a loaded
    # machine): the clean-up must not list the pods before it landed (it
    # once left that pod behind).
    create = driver._create

    def late(kind: str, obj: dict[str, Any]) -> Any:
        if obj["metadata"]["name"] == pod_name(JOB, 2, 0):
            time.sleep(0.5)
        return create(kind, obj)

    driver._create = late  # type: ignore[method-assign]
    with pytest.raises(ApiException) as info:
        await driver.launch(JOB, 2, SPEC, SLOTS)
    assert info.value.status == 403
    await asyncio.sleep(1.0)  # nothing lands later either
    assert api.pods == {} and api.services == {}
    assert any(c.method == "DELETE" and c.path == f"{SERVICES}/{service_name(JOB, 2)}"
               for c in api.requests())


async def test_relist_reports_pods_that_vanished_between_watches(
        api: FakeKubeApi, driver: KubernetesDriver, events: list[Event]) -> None:
    _, pods = gang_manifests(JOB, 3, SPEC, SLOTS, config=CONFIG, nats_url=NATS)
    for pod in pods:  # running before this driver started (a scheduler restart)
        api.pods[pod["metadata"]["name"]] = with_status(pod, "Running", RUNNING)
    await driver.start()
    await wait_until(lambda: len(events) == 2)
    assert {e.id for e in events} == {f"{JOB}-a3-r0-started", f"{JOB}-a3-r1-started"}

    api.pods.pop(pod_name(JOB, 3, 1))  # gone while no watch was open
    api.push("ERROR", {"kind": "Status", "code": 410, "message": "gone"})
    await wait_until(lambda: len(events) == 3)
    await asyncio.sleep(0.2)
    assert summary(events[2:]) == [(f"{JOB}-a3-r1-exited", "worker.exited", JOB, "node-b", 3, 1,
                                    KILLED_EXIT_CODE)]


async def test_a_failed_sink_call_is_retried_on_the_next_status(
        api: FakeKubeApi, events: list[Event]) -> None:
    calls = 0

    async def flaky(event: Event) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("bus down")
        events.append(event)

    api_client = client.ApiClient(client.Configuration(host=api.url))
    drv = KubernetesDriver(CONFIG, flaky, nats_url=NATS, api_client=api_client)
    try:
        await drv.launch(JOB, 1, SPEC, SLOTS[1:])
        pod = api.pods[pod_name(JOB, 1, 0)]
        api.push("MODIFIED", with_status(pod, "Running", RUNNING))
        await wait_until(lambda: calls == 1)
        api.push("MODIFIED", with_status(pod, "Running", RUNNING))
        await wait_until(lambda: len(events) == 1)
        assert events[0].id == f"{JOB}-a1-r0-started"
    finally:
        await drv.close()
        api_client.close()


async def test_close_stops_a_blocked_watch_promptly(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    await driver.start()
    await wait_until(lambda: api.watches_opened == 1)
    t0 = time.monotonic()
    await driver.close()
    assert driver._thread is not None and not driver._thread.is_alive()
    assert time.monotonic() - t0 < 3.0


def node(name: str, ready: bool) -> dict[str, Any]:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False"}]}}


async def test_node_workers_is_the_node_ready_condition_and_its_running_pods(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    """What failover is told about a node whose agent fell silent."""
    await driver.start()
    await wait_until(lambda: api.watches_opened == 1)
    await driver.launch(JOB, 2, SPEC, SLOTS)
    p0 = api.pods[pod_name(JOB, 2, 0)]  # rank 0 is on node-a
    api.push("MODIFIED", with_status(p0, "Running", RUNNING))
    await wait_until(lambda: any(v.started for v in driver._known.values()))
    api.nodes["node-a"] = node("node-a", ready=True)
    seen = await driver.node_workers("node-a")
    assert seen.alive and seen.workers == 1 and "Ready=True" in seen.detail
    api.nodes["node-a"] = node("node-a", ready=False)  # the kubelet stopped reporting
    assert not (await driver.node_workers("node-a")).alive
    gone = await driver.node_workers("node-x")  # no such Node: no evidence of life
    assert not gone.alive and "cannot read node node-x" in gone.detail


async def test_a_lost_pod_is_reported_even_when_the_bus_refuses_it_at_first(
        api: FakeKubeApi) -> None:
    """No pod status will bring a lost pod's exit again: it is sent until out."""
    events: list[Event] = []
    refusals = [2]

    async def sink(event: Event) -> None:
        if isinstance(event, WorkerExited) and refusals[0] > 0:
            refusals[0] -= 1
            raise ConnectionError("bus away")
        events.append(event)

    api_client = client.ApiClient(client.Configuration(host=api.url))
    drv = KubernetesDriver(CONFIG, sink, nats_url=NATS, api_client=api_client,
                           watch_timeout_s=30, stop_wait_s=10.0)
    try:
        await drv.launch(JOB, 4, SPEC, SLOTS)
        api.pods.pop(pod_name(JOB, 4, 0))
        await drv.launch(JOB, 4, SPEC, SLOTS)
        lost = [e for e in events if isinstance(e, WorkerExited)]
        assert [(e.data.rank, e.data.lost) for e in lost] == [(0, True)] and refusals == [0]
    finally:
        await drv.close()
        api_client.close()


# --------------------------------------------------------------------------- workload


WORKLOAD = JobSpec.model_validate({  # validated like a job file
    **SPEC.model_dump(), "secrets": [{"name": "hf", "env": {"HF_TOKEN": "token"}}],
    "volumes": [{"name": "data", "pvc": "pretrain-data", "mount_path": "/data"}],
    "image_pull_secrets": ["registry-cred"]})


def secret(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": data}


def claim(name: str, *modes: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": {"accessModes": list(modes)}}


@pytest.mark.parametrize(("setup", "says"), [
    (lambda api: api.secrets.pop("hf"), "Secret hf not found in namespace train (secrets[0]"),
    (lambda api: api.secrets.update(hf=secret("hf", other="eA==")), "Secret hf has no key token"),
    (lambda api: api.secrets.pop("registry-cred"),
     "Secret registry-cred not found in namespace train (image_pull_secrets[0]"),
    (lambda api: api.pvcs.pop("pretrain-data"),
     "PersistentVolumeClaim pretrain-data not found in namespace train (volumes[0] (data)"),
    (lambda api: api.pvcs.update(ckpt=claim("ckpt", "ReadWriteOnce")),
     "checkpoint claim ckpt is ReadWriteOnce"),
])
async def test_a_launch_missing_what_its_pods_name_creates_nothing(
        api: FakeKubeApi, driver: KubernetesDriver, setup: Callable[[FakeKubeApi], Any],
        says: str) -> None:
    api.secrets.update({"hf": secret("hf", token="eA=="), "registry-cred": secret("registry-cred")})
    api.pvcs["pretrain-data"] = claim("pretrain-data", "ReadOnlyMany")
    await driver.launch("ready", 1, WORKLOAD, SLOTS)  # everything there: it launches
    assert len(api.pods) == 2
    setup(api)
    with pytest.raises(LaunchRefused) as refused:
        await driver.launch(JOB, 1, WORKLOAD, SLOTS)
    assert says in str(refused.value)
    # Nothing of the refused job was created: only reads went out for it.
    assert {c.body["metadata"]["name"] for c in api.requests(method="POST")} == {
        service_name("ready", 1), pod_name("ready", 1, 0), pod_name("ready", 1, 1)}


async def test_a_node_without_the_selectors_labels_refuses_the_launch(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    api.nodes["node-a"] = {"metadata": {"name": "node-a", "labels": {"pool": "llm"}}}
    api.nodes["node-b"] = {"metadata": {"name": "node-b", "labels": {"pool": "batch"}}}
    spec = SPEC.model_copy(update={"node_selector": {"pool": "llm"}})
    with pytest.raises(LaunchRefused, match="node node-b lacks the node_selector label"):
        await driver.launch(JOB, 1, spec, SLOTS)
    assert not api.requests(method="POST")


async def test_attempt_two_mounts_the_checkpoints_of_attempt_one(
        api: FakeKubeApi, driver: KubernetesDriver) -> None:
    """Failover re-places the gang on other nodes: the new pods mount the
    same directory of the same ReadWriteMany claim."""
    await driver.launch(JOB, 1, SPEC, SLOTS)
    await driver.stop(JOB, grace_s=0)  # node-b failed; the attempt ended
    moved = [WorkerSlot(rank=0, node="node-c", gpus=8), WorkerSlot(rank=1, node="node-d", gpus=8)]
    await driver.launch(JOB, 2, SPEC, moved)
    mounts: dict[int, set[tuple[str, str, str]]] = {}
    for call in api.requests(method="POST", path=PODS):
        pod = call.body
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
        mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"]
                     if m["name"] == "checkpoints")
        attempt = int(pod["metadata"]["labels"]["primus-safe/attempt"])
        mounts.setdefault(attempt, set()).add((
            volume["persistentVolumeClaim"]["claimName"], mount["subPath"], mount["mountPath"]))
    assert mounts[1] == mounts[2] == {("ckpt", f"jobs/{JOB}", "/checkpoints")}
    nodes = {c.body["spec"]["nodeName"] for c in api.requests(method="POST", path=PODS)}
    assert nodes == {"node-a", "node-b", "node-c", "node-d"}


# --------------------------------------------------------------------------- job credentials


async def test_each_job_gets_its_own_nats_credential_in_a_secret_removed_when_it_stops(
        api: FakeKubeApi, events: list[Event]) -> None:
    key = b"k" * 32
    config = CONFIG.model_copy(update={"job_credentials": True,
                                       "nats_token_secret": "primus-safe"})
    api_client = client.ApiClient(client.Configuration(host=api.url))

    async def sink(event: Event) -> None:
        events.append(event)

    drv = KubernetesDriver(config, sink, nats_url=NATS, api_client=api_client,
                           watch_timeout_s=30, stop_wait_s=10.0, job_credential_key=key)
    try:
        await drv.launch(JOB, 1, SPEC, SLOTS)
        await drv.launch("other", 1, SPEC, [WorkerSlot(rank=0, node="node-c", gpus=8)])
        cred = credential(key, JOB)
        secret = api.secrets[credential_secret_name(JOB)]
        assert secret["stringData"] == {"user": cred.user, "password": cred.password}
        assert credential_secret_name("other") in api.secrets
        for rank in (0, 1):
            env = {e["name"]: e for e in api.pods[pod_name(JOB, 1, rank)]["spec"]
                   ["containers"][0]["env"]}
            # The job's own login, never the platform's token.
            assert "PRIMUS_NATS_TOKEN" not in env
            assert env[WORKER_ENV_PASSWORD]["valueFrom"] == {"secretKeyRef": {
                "name": credential_secret_name(JOB), "key": "password"}}
            assert cred.password not in str(env)
        # A re-placed attempt reuses it; stopping the job removes it and only it.
        await drv.stop(JOB, grace_s=0)
        assert credential_secret_name(JOB) not in api.secrets
        assert credential_secret_name("other") in api.secrets
        # A launch that fails half way leaves nothing behind, the Secret included.
        api.fail_create[pod_name(JOB, 2, 1)] = 403
        with pytest.raises(ApiException):
            await drv.launch(JOB, 2, SPEC, SLOTS)
        assert credential_secret_name(JOB) not in api.secrets
        assert not [p for p in api.pods if p.startswith(pod_name(JOB, 2, 0)[:-6])]
    finally:
        await drv.close()
        api_client.close()


def test_job_credentials_need_the_key() -> None:
    with pytest.raises(ValueError, match="job credential key"):
        KubernetesDriver(CONFIG.model_copy(update={"job_credentials": True}),
                         lambda e: None,  # type: ignore[arg-type,return-value]
                         nats_url=NATS, api_client=client.ApiClient())
