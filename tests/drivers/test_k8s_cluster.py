"""The KubernetesDriver on a real cluster (runs only with KUBECONFIG set): a
two-worker gang is created on one node, rank 1 resolves rank 0 through the
headless service (MASTER_ADDR), the exit codes come back as worker.exited
events, and stop leaves nothing behind.

PRIMUS_K8S_TEST_NAMESPACE (default ``default``) and PRIMUS_K8S_TEST_IMAGE
(default ``busybox:1.36``) choose where and with what."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from kubernetes import client

from libs.drivers.k8s_manifests import job_selector
from libs.drivers.kubernetes import KubernetesDriver, KubernetesDriverConfig, load_api_client
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot, WorkerStarted

pytestmark = [
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"),
                       reason="needs a real cluster: set KUBECONFIG"),
    pytest.mark.timeout(400),
]

NS = os.environ.get("PRIMUS_K8S_TEST_NAMESPACE", "default")
IMAGE = os.environ.get("PRIMUS_K8S_TEST_IMAGE", "busybox:1.36")
# Rank 0 stays up a while; rank 1 exits 3 once MASTER_ADDR resolves, 1 if it never does.
SCRIPT = """
if [ "$RANK" = 0 ]; then sleep 30; exit 0; fi
for i in $(seq 60); do nslookup "$MASTER_ADDR" >/dev/null 2>&1 && exit 3; sleep 1; done
exit 1
"""


def pick_node(core: client.CoreV1Api) -> str:
    usable = []
    for node in core.list_node().items:
        ready = any(c.type == "Ready" and c.status == "True"
                    for c in node.status.conditions or [])
        blocked = node.spec.unschedulable or any(
            t.effect in ("NoSchedule", "NoExecute") for t in node.spec.taints or [])
        if ready and not blocked:
            usable.append(node.metadata.name)
    if not usable:
        pytest.skip("no ready, untainted node in the cluster")
    return sorted(usable)[0]


async def test_gang_runs_on_a_real_cluster() -> None:
    api_client = load_api_client()
    core = client.CoreV1Api(api_client)
    node = await asyncio.to_thread(pick_node, core)
    job = f"K8s_smoke-{uuid.uuid4().hex[:6]}"  # exercises the DNS-name conversion
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    config = KubernetesDriverConfig(namespace=NS, image=IMAGE, priority_class_prefix=None)
    driver = KubernetesDriver(config, sink, nats_url="nats://127.0.0.1:4222",
                              api_client=api_client)
    spec = JobSpec(name="smoke", workers=2, command=["sh", "-c", SCRIPT])
    slots = [WorkerSlot(rank=r, node=node, gpus=0) for r in range(2)]
    try:
        await driver.launch(job, 1, spec, slots)
        deadline = time.monotonic() + 300
        while sum(isinstance(e, WorkerExited) for e in events) < 2:
            assert time.monotonic() < deadline, f"no exits in time: {events}"
            await asyncio.sleep(1)
        exits = {e.data.rank: e.data.exit_code for e in events if isinstance(e, WorkerExited)}
        assert exits == {0: 0, 1: 3}, exits
        assert {e.data.rank for e in events if isinstance(e, WorkerStarted)} == {0, 1}
        assert all(e.job == job and e.node == node for e in events)
    finally:
        await driver.stop(job, grace_s=0)
        await driver.close()
    left = await asyncio.to_thread(core.list_namespaced_pod, NS,
                                   label_selector=job_selector(job))
    assert left.items == []
    services = await asyncio.to_thread(core.list_namespaced_service, NS,
                                       label_selector=job_selector(job))
    assert services.items == []
    api_client.close()
