"""RBAC grants exactly what the code uses. The Kubernetes code paths run
against the recording fake API server (tests/drivers/k8s_fake_api.py) —
the scheduler's pod driver (watch, launch with every Secret and claim a job
can name, a repeated launch, a failed launch, node_workers, stop) and
failover's node API (watch, cordon, uncordon) — and the (resource, verb)
pairs their HTTP requests need are compared with what the chart's Roles and
ClusterRoles grant each service account: nothing missing, nothing extra.

The pairs are derived from the requests, never listed here, so a new call
in the drivers fails this test until rbac.yaml grants it (and a grant the
code stopped using fails it too)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from deploy_helpers import NAMESPACE, RELEASE, Renderer, by_kind
from kubernetes import client

from libs.drivers.k8s_manifests import KubernetesDriverConfig
from libs.drivers.k8s_nodes import KubernetesNodes
from libs.drivers.kubernetes import KubernetesDriver
from libs.events import Event, JobSpec, WorkerSlot
from tests.drivers.k8s_fake_api import FakeKubeApi, condition_node

pytestmark = pytest.mark.timeout(120)

Grant = tuple[str, str, str, str]  # (scope: namespaced | cluster, apiGroup, resource, verb)

NODES = ("gpu-a", "gpu-b")
JOB = "rbac-probe"


def _spec() -> JobSpec:
    """A job naming every kind of object the driver checks before launch."""
    return JobSpec.model_validate({
        "name": JOB, "workers": 2, "gpus_per_worker": 8, "command": ["python", "train.py"],
        "secrets": [{"name": "wandb", "env": {"WANDB_API_KEY": "key"}}],
        "image_pull_secrets": ["registry"],
        "volumes": [{"name": "data", "mount_path": "/data", "pvc": "datasets"}],
        "checkpoint_pvc": "ckpt",
        "node_selector": {"pool": "mi300x"},
    })


def _driver_kwargs(job_credentials: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config and constructor extras for per-job credentials, where the
    driver has them (they add the Secret it creates and deletes)."""
    if not job_credentials or "job_credentials" not in KubernetesDriverConfig.model_fields:
        return {}, {}
    if "job_credential_key" not in inspect.signature(KubernetesDriver).parameters:
        return {}, {}
    return {"job_credentials": True}, {"job_credential_key": b"k3y-for-the-rbac-test"}


async def _scheduler_calls(api: FakeKubeApi, *, job_credentials: bool) -> list[Grant]:
    for node in NODES:
        api.put_node(condition_node(node, labels={"pool": "mi300x"}))
    api.secrets["wandb"] = {"metadata": {"name": "wandb"}, "data": {"key": "eA=="}}
    api.secrets["registry"] = {"metadata": {"name": "registry"}, "data": {".dockerconfigjson": ""}}
    for claim in ("datasets", "ckpt"):
        api.pvcs[claim] = {"metadata": {"name": claim},
                           "spec": {"accessModes": ["ReadWriteMany"]}}
    extra_config, extra_kwargs = _driver_kwargs(job_credentials)
    config = KubernetesDriverConfig(namespace=NAMESPACE, image="rocm/pytorch:rocm6.2",
                                    **extra_config)
    slots = [WorkerSlot(rank=r, node=n, gpus=8) for r, n in enumerate(NODES)]
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    api_client = client.ApiClient(client.Configuration(host=api.url))
    driver = KubernetesDriver(config, sink, nats_url="nats://nats:4222", api_client=api_client,
                              watch_timeout_s=30, stop_wait_s=0.5, **extra_kwargs)
    before = len(api.requests())
    try:
        await driver.adopt()
        await driver.launch(JOB, 1, _spec(), slots)
        await driver.launch(JOB, 1, _spec(), slots)  # a new leader launches it again
        await driver.node_workers(NODES[0])
        await driver.stop(JOB, grace_s=0)
        api.fail_create["fails-a1-r0"] = 500  # a failed launch removes what it made
        with pytest.raises(client.ApiException):
            await driver.launch("fails", 1, _spec(), slots[:1])
    finally:
        await driver.close()
        api_client.close()
    calls = api.requests()[before:]
    assert any(c.method == "POST" and c.status == 201 for c in calls), "nothing was launched"
    return [c.rbac() for c in calls]


async def _failover_calls(api: FakeKubeApi) -> list[Grant]:
    api.put_node(condition_node("gpu-f"))
    seen: list[Any] = []

    async def sink(update: Any) -> None:
        seen.append(update)

    api_client = client.ApiClient(client.Configuration(host=api.url))
    nodes = KubernetesNodes(api_client=api_client, watch_timeout_s=30)
    before = len(api.requests())
    try:
        await nodes.watch(sink)
        for _ in range(500):  # the list, then the watch
            if api.node_watches_opened:
                break
            await asyncio.sleep(0.02)
        assert await nodes.cordon("gpu-f", "condition:NotReady", "kubelet stopped")
        assert await nodes.uncordon("gpu-f", "condition:NotReady")
    finally:
        await nodes.close()
        api_client.close()
    return [c.rbac() for c in api.requests()[before:]]


def _granted(objects: list[dict[str, Any]], account: str) -> set[Grant]:
    """What the chart's bindings give ``account``: a RoleBinding's rules are
    namespaced (its Role must live in the release namespace), a
    ClusterRoleBinding's are cluster-wide."""
    roles, cluster_roles = by_kind(objects, "Role"), by_kind(objects, "ClusterRole")
    out: set[Grant] = set()
    for kind, scope, role_kind, pool in (("RoleBinding", "namespaced", "Role", roles),
                                         ("ClusterRoleBinding", "cluster", "ClusterRole",
                                          cluster_roles)):
        for binding in by_kind(objects, kind).values():
            if not any(s["kind"] == "ServiceAccount" and s["name"] == account
                       for s in binding["subjects"]):
                continue
            assert binding["roleRef"]["kind"] == role_kind
            role = pool[binding["roleRef"]["name"]]
            if scope == "namespaced":
                assert role["metadata"]["namespace"] == NAMESPACE
            for rule in role["rules"]:
                assert "resourceNames" not in rule and "nonResourceURLs" not in rule
                out |= {(scope, group, resource, verb) for group in rule["apiGroups"]
                        for resource in rule["resources"] for verb in rule["verbs"]}
    return out


def _diff(used: set[Grant], granted: set[Grant]) -> str:
    return (f"used but not granted: {sorted(used - granted)}; "
            f"granted but not used: {sorted(granted - used)}")


@pytest.mark.parametrize("auth", ["users", "token"])
async def test_the_chart_grants_exactly_what_the_drivers_call(render: Renderer, auth: str) -> None:
    objects = render({"nats": {"auth": {"mode": auth}}})
    api = FakeKubeApi().start()
    try:
        # Per-job NATS credentials (a Secret per job) are on in users mode only:
        # the chart passes the scheduler its job credential key only then.
        scheduler_used = set(await _scheduler_calls(api, job_credentials=auth == "users"))
        failover_used = set(await _failover_calls(api))
    finally:
        api.stop()
    assert all(c.path.startswith(f"/api/v1/namespaces/{NAMESPACE}/")
               or c.path.startswith("/api/v1/nodes") for c in api.requests())

    account = f"{RELEASE}-primus-safe-"
    scheduler = _granted(objects, account + "scheduler")
    failover = _granted(objects, account + "failover")
    assert scheduler_used == scheduler, "scheduler: " + _diff(scheduler_used, scheduler)
    assert failover_used == failover, "failover: " + _diff(failover_used, failover)
