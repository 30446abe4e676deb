"""KubernetesNodes against the recording fake API server: cordon adds
unschedulable and the fault's taint (once), leaves an operator's cordon
alone, uncordon removes only the platform's taint (and the cordon with the
last one); the node watch lists, then watches from the list's version,
resumes from the last version it saw, re-lists after 410 Gone, and reports
a condition change once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client

from libs.drivers.k8s_nodes import CORDONED, KubernetesNodes, taint_key
from libs.drivers.nodes import NodeUpdate
from tests.drivers.k8s_fake_api import FakeKubeApi, condition_node, wait_until

pytestmark = pytest.mark.timeout(60)

NODES = "/api/v1/nodes"


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    server = FakeKubeApi().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nodes(api: FakeKubeApi) -> AsyncIterator[KubernetesNodes]:
    api_client = client.ApiClient(client.Configuration(host=api.url))
    drv = KubernetesNodes(api_client=api_client, watch_timeout_s=30)
    try:
        yield drv
    finally:
        await drv.close()
        api_client.close()


def spec(api: FakeKubeApi, name: str) -> dict[str, Any]:
    return api.nodes[name].get("spec") or {}


def taint_keys(api: FakeKubeApi, name: str) -> list[str]:
    return [t["key"] for t in spec(api, name).get("taints") or []]


async def test_cordon_taints_once_and_the_last_uncordon_lets_the_node_back(
        api: FakeKubeApi, nodes: KubernetesNodes) -> None:
    api.put_node(condition_node("gpu-1"))
    kube_taint = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    api.nodes["gpu-1"]["spec"]["taints"] = [kube_taint]  # someone else's taint stays

    assert await nodes.cordon("gpu-1", "heartbeat_missed", "no heartbeat for 3 s")
    assert spec(api, "gpu-1")["unschedulable"] is True
    assert spec(api, "gpu-1")["taints"] == [
        kube_taint, {"key": "primus-safe/fault-heartbeat_missed", "value": "",
                     "effect": "NoSchedule"}]
    notes = api.nodes["gpu-1"]["metadata"]["annotations"]
    assert notes[CORDONED] == "true"
    assert notes["primus-safe/fault-heartbeat_missed"] == "heartbeat_missed: no heartbeat for 3 s"
    [patch] = api.requests(method="PATCH")
    assert patch.path == f"{NODES}/gpu-1" and patch.content_type == "application/merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"]  # a patch from a stale read is refused

    assert not await nodes.cordon("gpu-1", "heartbeat_missed", "again")  # idempotent
    assert len(api.requests(method="PATCH")) == 1

    assert await nodes.cordon("gpu-1", "alert:gpu_temp_high", "92 C")
    assert taint_keys(api, "gpu-1") == ["node.kubernetes.io/not-ready",
                                        taint_key("heartbeat_missed"),
                                        "primus-safe/fault-alert-gpu_temp_high"]

    assert await nodes.uncordon("gpu-1", "heartbeat_missed")  # another fault is open
    assert spec(api, "gpu-1")["unschedulable"] is True
    assert taint_keys(api, "gpu-1") == ["node.kubernetes.io/not-ready",
                                        "primus-safe/fault-alert-gpu_temp_high"]
    assert await nodes.uncordon("gpu-1", "alert:gpu_temp_high")  # the last one
    assert "unschedulable" not in spec(api, "gpu-1")
    assert spec(api, "gpu-1")["taints"] == [kube_taint]
    assert CORDONED not in api.nodes["gpu-1"]["metadata"]["annotations"]
    assert not await nodes.uncordon("gpu-1", "alert:gpu_temp_high")  # nothing left to do


async def test_an_operators_cordon_is_left_alone(
        api: FakeKubeApi, nodes: KubernetesNodes) -> None:
    node = condition_node("gpu-2")
    node["spec"] = {"unschedulable": True}  # kubectl cordon, by hand
    api.put_node(node)
    assert await nodes.cordon("gpu-2", "bench_failed", "gemm 40% of fleet")
    assert taint_keys(api, "gpu-2") == [taint_key("bench_failed")]
    assert CORDONED not in api.nodes["gpu-2"]["metadata"]["annotations"]
    assert await nodes.uncordon("gpu-2", "bench_failed")
    assert spec(api, "gpu-2") == {"unschedulable": True}  # still the operator's


async def test_a_conflicting_change_is_read_again_and_a_missing_node_is_no_change(
        api: FakeKubeApi, nodes: KubernetesNodes) -> None:
    api.put_node(condition_node("gpu-3"))
    real_read = nodes._core.read_node
    reads = 0

    def read_then_change(name: str, **kw: Any) -> Any:
        nonlocal reads
        reads += 1
        resp = real_read(name, **kw)
        if reads == 1:  # the kubelet writes between our read and our patch
            api.set_condition("gpu-3", "DiskPressure", "True")
        return resp

    nodes._core.read_node = read_then_change  # type: ignore[method-assign]
    assert await nodes.cordon("gpu-3", "probe_failed", "ecc")
    assert [c.status for c in api.requests(method="PATCH")] == [409, 200]
    assert spec(api, "gpu-3")["unschedulable"] is True
    assert not await nodes.cordon("gpu-x", "probe_failed", "no such node")


async def test_the_watch_lists_then_watches_and_reports_condition_changes_once(
        api: FakeKubeApi, nodes: KubernetesNodes) -> None:
    api.put_node(condition_node("gpu-1"))
    api.put_node(condition_node("gpu-2", MemoryPressure="True"))
    updates: list[NodeUpdate] = []

    async def sink(update: NodeUpdate) -> None:
        updates.append(update)

    await nodes.watch(sink)
    await wait_until(lambda: api.node_watches_opened == 1)
    [first] = updates
    assert first.complete and {v.name: v.conditions for v in first.nodes} == {
        "gpu-1": {"NotReady": False, "MemoryPressure": False, "DiskPressure": False,
                  "PIDPressure": False, "NetworkUnavailable": False},
        "gpu-2": {"NotReady": False, "MemoryPressure": True, "DiskPressure": False,
                  "PIDPressure": False, "NetworkUnavailable": False}}

    api.set_condition("gpu-1", "Ready", "Unknown")  # the kubelet stopped reporting
    api.put_node(api.nodes["gpu-1"])  # a status rewrite that changes nothing judged
    api.bookmark()
    api.set_condition("gpu-2", "MemoryPressure", "False")
    await wait_until(lambda: len(updates) == 3)
    await asyncio.sleep(0.2)
    assert [(v.name, v.conditions["NotReady"], v.conditions["MemoryPressure"])
            for u in updates[1:] for v in u.nodes] == [("gpu-1", True, False),
                                                       ("gpu-2", False, False)]
    assert updates[1].nodes[0].messages["NotReady"] == "kubelet says Ready is Unknown"
    api.delete_node("gpu-2")
    await wait_until(lambda: len(updates) == 4)
    assert updates[3].deleted == ("gpu-2",)

    [listing] = api.requests(path=NODES, method="GET", watch=False)
    [watch] = api.requests(path=NODES, watch=True)
    assert watch.query["resourceVersion"] == listing.version
    assert watch.query["allowWatchBookmarks"] == "true"
    assert int(watch.query["timeoutSeconds"]) == 30


async def test_the_watch_resumes_from_its_version_and_relists_after_410(
        api: FakeKubeApi, nodes: KubernetesNodes) -> None:
    api.put_node(condition_node("gpu-1"))
    updates: list[NodeUpdate] = []

    async def sink(update: NodeUpdate) -> None:
        updates.append(update)

    await nodes.watch(sink)
    await wait_until(lambda: api.node_watches_opened == 1)
    api.set_condition("gpu-1", "DiskPressure", "True")
    await wait_until(lambda: len(updates) == 2)
    seen = api.version

    # The watch ends (its timeout); a change meanwhile comes from the resumed
    # watch, which asks for what followed the last version seen: no re-list.
    api.end_node_watches()
    api.set_condition("gpu-1", "PIDPressure", "True")
    await wait_until(lambda: len(updates) == 3)
    watches = api.requests(path=NODES, watch=True)
    assert len(watches) == 2 and watches[1].query["resourceVersion"] == str(seen)
    assert len(api.requests(path=NODES, method="GET", watch=False)) == 1
    assert updates[2].nodes[0].conditions["PIDPressure"] is True

    # History compacted: 410 Gone; the driver lists again (every node, complete).
    api.expire_node_history()
    await wait_until(lambda: len(updates) == 4)
    lists = api.requests(path=NODES, method="GET", watch=False)
    assert len(lists) == 2 and updates[3].complete
    await wait_until(lambda: api.node_watches_opened == 3)
    assert api.requests(path=NODES, watch=True)[-1].query["resourceVersion"] == lists[1].version
    api.set_condition("gpu-1", "DiskPressure", "False")
    await wait_until(lambda: len(updates) == 5)
    assert updates[4].nodes[0].conditions["DiskPressure"] is False
