"""Failover on Kubernetes, end to end through the real client: Node
conditions from the (recording) API server open faults, each fault cordons
and taints the node, closing a fault removes its taint, and the last one
uncordons the node. Failover runs in-process on a real nats-server; the
close is the operator's real event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from libs.bus import Bus
from libs.drivers.k8s_nodes import CORDONED, KubernetesNodes
from libs.events import (
    FaultCloseData,
    FaultCloseRequested,
    FaultOpened,
    NodeRegistered,
    NodeRegisteredData,
)
from libs.settings import Settings
from services.failover.app import Failover
from tests.drivers.k8s_fake_api import FakeKubeApi, condition_node

pytestmark = pytest.mark.timeout(60)


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    server = FakeKubeApi().start()
    try:
        yield server
    finally:
        server.stop()


def taints(api: FakeKubeApi, node: str) -> list[str]:
    return [t["key"] for t in (api.nodes[node].get("spec") or {}).get("taints") or []]


def cordoned(api: FakeKubeApi, node: str) -> bool:
    return bool((api.nodes[node].get("spec") or {}).get("unschedulable"))


@pytest.fixture
async def failover(nats_url: str, tmp_path: Path, api: FakeKubeApi) -> AsyncIterator[Failover]:
    """Failover on the Kubernetes driver against ``api``; the test starts it
    (after subscribing to what it wants to hear)."""
    api_client = client.ApiClient(client.Configuration(host=api.url))
    service = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "state",
                                driver="kubernetes", heartbeat_first_grace_s=600),
                       nodes=KubernetesNodes(api_client=api_client, watch_timeout_s=30))
    try:
        yield service
    finally:
        await service.stop()
        api_client.close()


async def register(bus: Bus, failover: Failover, node: str) -> None:
    """Bootstrap registers ``node``: from now on its conditions are judged."""
    await bus.publish(NodeRegistered(source="test", node=node, data=NodeRegisteredData(
        ip="10.0.0.1", gpu_model="MI300X", gpu_count=8)))
    await until(lambda: node in failover.monitor.last_seen)


async def close_fault(bus: Bus, fault_id: str, reason: str) -> None:
    """The operator's ``primus-safe fault close``."""
    await bus.publish(FaultCloseRequested(source="cli", node="gpu-1", data=FaultCloseData(
        fault_id=fault_id, by="ops", reason=reason)))


def open_faults(failover: Failover) -> dict[str, Any]:
    return {f.kind: f for f in failover.book.faults.values()
            if f.key == "gpu-1" and f.status != "closed"}


async def test_node_conditions_open_faults_that_cordon_and_closing_them_uncordons(
        bus: Bus, api: FakeKubeApi, failover: Failover) -> None:
    api.put_node(condition_node("gpu-1"))
    api.put_node(condition_node("gpu-9"))  # never registered with the platform
    # A mark left by a fault that closed while failover was away.
    stale = condition_node("gpu-2")
    stale["spec"] = {"unschedulable": True, "taints": [
        {"key": "primus-safe/fault-bench_failed", "value": "", "effect": "NoSchedule"}]}
    stale["metadata"]["annotations"] = {CORDONED: "true"}
    api.put_node(stale)
    opened: list[FaultOpened] = []

    async def seen(msg: Any) -> None:
        opened.append(FaultOpened.model_validate_json(msg.data))

    sub = await bus.nc.subscribe("safe.fault.*.opened", cb=seen)
    await failover.start(bus)
    try:
        await until(lambda: not cordoned(api, "gpu-2"))  # put right at the first listing
        assert taints(api, "gpu-2") == [] and CORDONED not in api.nodes["gpu-2"]["metadata"][
            "annotations"]
        await register(bus, failover, "gpu-1")

        api.set_condition("gpu-9", "Ready", "False")  # not the platform's: not judged
        api.set_condition("gpu-1", "Ready", "False")
        await until(lambda: cordoned(api, "gpu-1"))
        assert taints(api, "gpu-1") == ["primus-safe/fault-condition-NotReady"]
        await until(lambda: len(opened) == 1)
        assert (opened[0].node, opened[0].data.kind, opened[0].data.quarantine) == (
            "gpu-1", "condition:NotReady", True)
        assert opened[0].data.reason == "Kubernetes node NotReady: kubelet says Ready is False"

        api.set_condition("gpu-1", "MemoryPressure", "True")
        await until(lambda: len(taints(api, "gpu-1")) == 2)
        assert set(open_faults(failover)) == {"condition:NotReady", "condition:MemoryPressure"}

        # The pressure clears: its fault closes (rule close_on_clear), its taint
        # goes; the node stays cordoned for the fault still open.
        api.set_condition("gpu-1", "MemoryPressure", "False")
        await until(lambda: taints(api, "gpu-1") == ["primus-safe/fault-condition-NotReady"])
        assert cordoned(api, "gpu-1") and set(open_faults(failover)) == {"condition:NotReady"}

        # Ready again does not close NotReady (the node returns through bench);
        # the operator closes it, and the last fault's close uncordons the node.
        api.set_condition("gpu-1", "Ready", "True")
        await asyncio.sleep(0.5)
        assert cordoned(api, "gpu-1") and set(open_faults(failover)) == {"condition:NotReady"}
        await close_fault(bus, open_faults(failover)["condition:NotReady"].fault_id,
                          "kubelet fixed")
        await until(lambda: not cordoned(api, "gpu-1"))
        assert taints(api, "gpu-1") == [] and open_faults(failover) == {}
        assert not cordoned(api, "gpu-9") and [f.node for f in opened] == ["gpu-1"] * 2
        # The patch is visible in the API a moment before failover notes it done.
        await until(lambda: failover.health()["cordons_pending"] == 0)
    finally:
        await sub.unsubscribe()


async def test_a_fault_closed_while_its_condition_holds_opens_again_and_the_node_stays_cordoned(
        bus: Bus, api: FakeKubeApi, failover: Failover) -> None:
    """The watch reports changes only, so a NotReady node whose fault an
    operator closes would otherwise be back in service with nothing saying
    why it is NotReady. Failover judges the condition again at once: a new
    fault, and the cordon is never lifted in between."""
    api.put_node(condition_node("gpu-1"))
    await failover.start(bus)
    await register(bus, failover, "gpu-1")
    api.set_condition("gpu-1", "Ready", "False")
    await until(lambda: "condition:NotReady" in open_faults(failover))
    await until(lambda: failover.health()["cordons_pending"] == 0 and cordoned(api, "gpu-1"))
    first = open_faults(failover)["condition:NotReady"]
    patches = len(api.requests(method="PATCH"))

    await close_fault(bus, first.fault_id, "looks fine to me")
    await until(lambda: failover.book.faults[first.fault_id].status == "closed")
    again = open_faults(failover)["condition:NotReady"]
    assert again.fault_id != first.fault_id
    assert again.reason == ("Kubernetes node NotReady: kubelet says Ready is False (still "
                            "so after ops closed the last fault: fix the node, or set this "
                            "rule's failover to false)")
    await until(lambda: failover.health()["cordons_pending"] == 0)
    assert cordoned(api, "gpu-1")
    assert taints(api, "gpu-1") == ["primus-safe/fault-condition-NotReady"]
    # Nothing was uncordoned in between: no patch since lifted the cordon
    # or took the taint off.
    for call in api.requests(method="PATCH")[patches:]:
        spec = (call.body or {}).get("spec") or {}
        lifted = "unschedulable" in spec and not spec["unschedulable"]
        untainted = "taints" in spec and not spec["taints"]
        assert not lifted and not untainted, call.body

    # The kubelet says Ready again; closing the new fault now puts the node back.
    api.set_condition("gpu-1", "Ready", "True")
    await asyncio.sleep(0.5)
    await close_fault(bus, again.fault_id, "kubelet fixed")
    await until(lambda: not cordoned(api, "gpu-1"))
    assert open_faults(failover) == {}
