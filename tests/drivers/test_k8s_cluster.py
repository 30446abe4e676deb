"""Primus-SaFE on a real Kubernetes cluster (runs only with KUBECONFIG set).

1. The KubernetesDriver alone: a two-worker gang on one node, rank 1
   resolves rank 0 through the headless service (MASTER_ADDR), the exit
   codes come back as worker.exited events, and stop leaves nothing behind.
2. The golden job's shape through the platform: a local nats-server, the
   real scheduler and failover services (``PRIMUS_DRIVER=kubernetes``,
   talking to the cluster with your kubeconfig), the cluster's nodes
   registered with the platform, and a job submitted with ``primus-safe
   submit``: Guaranteed resources (GPUs and the RDMA resource only where
   the nodes have them), a shared ReadWriteMany checkpoint claim, a
   workspace's network settings. Rank 0 checkpoints every step and, in
   attempt 1, dies with exit code 135 (a bus error: an infrastructure
   fault) -> failover cordons and taints its node in Kubernetes -> the
   scheduler places attempt 2 on other nodes -> it resumes from the step in
   the shared claim and completes; closing the fault removes the taint and
   the cordon. Needs at least two ready, untainted nodes.

Environment:
- PRIMUS_K8S_TEST_NAMESPACE (default ``default``): where the pods run.
- PRIMUS_K8S_TEST_IMAGE (default ``busybox:1.36``): the workers' image.
- PRIMUS_K8S_TEST_CHECKPOINT_PVC: an existing ReadWriteMany claim in that
  namespace; or PRIMUS_K8S_TEST_RWX_CLASS: a StorageClass offering
  ReadWriteMany, for a claim the test creates (and deletes). Without
  either, test 2 is skipped.

Run: ``KUBECONFIG=~/.kube/config PRIMUS_K8S_TEST_RWX_CLASS=nfs-csi
.venv/bin/python -m pytest -q tests/drivers/test_k8s_cluster.py``."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from libs.bus import Bus
from libs.drivers.k8s_manifests import checkpoint_subpath, job_selector
from libs.drivers.k8s_nodes import CORDONED, taint_key
from libs.drivers.kubernetes import KubernetesDriver, KubernetesDriverConfig, load_api_client
from libs.events import (
    Event,
    HeartbeatData,
    JobSpec,
    NodeHeartbeat,
    NodeRegistered,
    NodeRegisteredData,
    NodeStateChanged,
    NodeStateData,
    WorkerExited,
    WorkerSlot,
    WorkerStarted,
)
from tests.helpers import run_cli, start_service, stop_process, until

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
    usable = usable_nodes(core)
    if not usable:
        pytest.skip("no ready, untainted node in the cluster")
    return usable[0]["name"]


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


# --------------------------------------------------------------------------- the platform


RWX_PVC = os.environ.get("PRIMUS_K8S_TEST_CHECKPOINT_PVC")
RWX_CLASS = os.environ.get("PRIMUS_K8S_TEST_RWX_CLASS")
# Rank 0 checkpoints a step a second into the shared claim; in attempt 1 it
# dies with a bus error (135: an infrastructure exit) at step 8. Every
# attempt logs where it resumed. The other ranks run until rank 0's last step.
TRAIN = """
dir="$PRIMUS_CHECKPOINT_DIR"; step=$(cat "$dir/step" 2>/dev/null || echo 0)
echo "attempt $PRIMUS_ATTEMPT rank $RANK node $PRIMUS_NODE_NAME resumed at $step" >> "$dir/resumes"
while [ "$step" -lt 12 ]; do
  step=$((step + 1))
  if [ "$RANK" = 0 ]; then echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"; fi
  if [ "$RANK" = 0 ] && [ "$PRIMUS_ATTEMPT" = 1 ] && [ "$step" = 8 ]; then exit 135; fi
  sleep 1
done
"""


def usable_nodes(core: client.CoreV1Api) -> list[dict[str, Any]]:
    usable = []
    for node in core.list_node().items:
        ready = any(c.type == "Ready" and c.status == "True"
                    for c in node.status.conditions or [])
        blocked = node.spec.unschedulable or any(
            t.effect in ("NoSchedule", "NoExecute") for t in node.spec.taints or [])
        if ready and not blocked:
            alloc = node.status.allocatable or {}
            usable.append({"name": node.metadata.name, "ip": next(
                (a.address for a in node.status.addresses or [] if a.type == "InternalIP"),
                "10.0.0.1"), "amd": int(alloc.get("amd.com/gpu", 0) or 0),
                "rdma": int(alloc.get("rdma/hca", 0) or 0)})
    return sorted(usable, key=lambda n: n["name"])


@pytest.fixture
def checkpoint_claim() -> Iterator[str]:
    if RWX_PVC:
        yield RWX_PVC
        return
    if not RWX_CLASS:
        pytest.skip("needs a ReadWriteMany claim: set PRIMUS_K8S_TEST_CHECKPOINT_PVC or "
                    "PRIMUS_K8S_TEST_RWX_CLASS")
    api_client = load_api_client()
    core = client.CoreV1Api(api_client)
    name = f"primus-test-ckpt-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_persistent_volume_claim(NS, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": RWX_CLASS,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    try:
        yield name
    finally:
        core.delete_namespaced_persistent_volume_claim(name, NS)
        api_client.close()


async def register(bus: Bus, nodes: list[dict[str, Any]]) -> None:
    """Play bootstrap's part: the cluster's nodes registered and ready (GPU
    nodes with their AMD GPUs, CPU-only ones with one CPU slot each)."""
    gpus = all(n["amd"] for n in nodes)
    kv = await bus.kv("nodes")
    for n in nodes:
        model, count = ("MI300X", n["amd"]) if gpus else ("cpu", 1)
        spec = {"name": n["name"], "ip": n["ip"], "gpu_model": model, "gpu_count": count,
                "labels": {"rack": "r1"}, "roles": ["worker"], "ssh_user": None}
        await kv.put(n["name"], json.dumps({"spec": spec, "state": "ready", "reason": "",
                                            "registration": f"reg-{n['name']}"}).encode())
        await bus.publish(NodeRegistered(source="test", node=n["name"], data=NodeRegisteredData(
            ip=n["ip"], gpu_model=model, gpu_count=count, labels={"rack": "r1"})))
        await bus.publish(NodeStateChanged(source="test", node=n["name"],
                                           data=NodeStateData(state="ready")))


async def beat(bus: Bus, nodes: list[str], stop: asyncio.Event) -> None:
    """Play every node's bench agent: a heartbeat a second."""
    seq = 0
    while not stop.is_set():
        seq += 1
        for node in nodes:
            await bus.publish(NodeHeartbeat(source=f"bench/{node}", node=node,
                                            data=HeartbeatData(seq=seq, pid=os.getpid(),
                                                               interval_s=1.0)))
        await asyncio.sleep(1)


async def quarantine_on_fault(bus: Bus) -> Any:
    """Play bootstrap's part: a fault that quarantines takes its node out of
    service (the scheduler then places nothing there and re-places the gang)."""
    async def on(msg: Any) -> None:
        data = json.loads(msg.data)
        if data["data"].get("quarantine"):
            await bus.publish(NodeStateChanged(source="test", node=data["node"], data=(
                NodeStateData(state="quarantined", reason=data["data"]["reason"]))))

    return await bus.nc.subscribe("safe.fault.*.opened", cb=on)


def read_claim(core: client.CoreV1Api, claim: str, subpath: str) -> str:
    """The job's checkpoint directory, read by a pod that mounts the claim."""
    name = f"primus-test-read-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "read", "image": IMAGE, "command": ["sh", "-c", "cat /c/resumes /c/step"],
            "volumeMounts": [{"name": "c", "mountPath": "/c", "subPath": subpath}]}],
            "volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": claim}}]}})
    try:
        deadline = time.monotonic() + 180
        while core.read_namespaced_pod(name, NS).status.phase not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, "the reader pod did not finish"
            time.sleep(1)
        return core.read_namespaced_pod_log(name, NS)
    finally:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def node_marks(core: client.CoreV1Api, node: str) -> tuple[bool, set[str], str]:
    obj = json.loads(core.read_node(node, _preload_content=False).data)
    taints = {t["key"] for t in obj["spec"].get("taints") or []}
    return (bool(obj["spec"].get("unschedulable")), taints,
            (obj["metadata"].get("annotations") or {}).get(CORDONED, ""))


async def test_failover_cordons_the_node_and_the_job_resumes_elsewhere_from_the_shared_claim(
        nats_url: str, bus: Bus, tmp_path: Path, checkpoint_claim: str) -> None:
    api_client = load_api_client()
    core = client.CoreV1Api(api_client)
    try:
        nodes = await asyncio.to_thread(usable_nodes, core)
        if len(nodes) < 2:
            pytest.skip(f"needs 2 ready, untainted nodes; the cluster has {len(nodes)}")
        await golden_flow(core, nodes, nats_url=nats_url, bus=bus, tmp_path=tmp_path,
                          claim=checkpoint_claim, kubeconfig=os.environ["KUBECONFIG"],
                          read=lambda job: read_claim(core, checkpoint_claim,
                                                      checkpoint_subpath(job)))
    finally:
        api_client.close()


async def golden_flow(core: client.CoreV1Api, nodes: list[dict[str, Any]], *, nats_url: str,
                      bus: Bus, tmp_path: Path, claim: str, kubeconfig: str,
                      read: Callable[[str], str], image: str = IMAGE) -> None:
    """submit -> running -> rank 0 dies with a bus error -> failover cordons
    and taints its node -> attempt 2 elsewhere resumes from the shared claim
    -> completes -> closing the fault removes the marks. ``read(job)``: the
    job's checkpoint directory's ``resumes`` and ``step`` files."""
    workers = min(2, len(nodes) - 1)  # attempt 2 must fit without the cordoned node
    rdma = all(n["rdma"] for n in nodes)
    # The golden shape: Guaranteed resources, the RDMA device and GPUs where
    # the nodes have them (the platform registers CPU-only nodes with CPU slots).
    workload: dict[str, Any] = {
        "resources": {"cpu": "100m", "memory": "64Mi", "shared_memory": "16Mi",
                      "extra": {"rdma/hca": 1} if rdma else {}},
        "network": {"socket_ifname": "eth0"}, "checkpoint_pvc": claim}
    config = tmp_path / "scheduler.yaml"
    config.write_text(json.dumps({"workspaces": [{"name": "default", "workload": workload}],
                                  "stop_grace_s": 5, "preemption_grace_s": 5}))
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"rules": [{"kind": "worker_infra_exit", "consecutive": 1}]}))
    kube = dict(PRIMUS_DRIVER="kubernetes", PRIMUS_K8S_NAMESPACE=NS, PRIMUS_K8S_IMAGE=image,
                KUBECONFIG=kubeconfig)
    await register(bus, nodes)
    stop_beats = asyncio.Event()
    beats = asyncio.create_task(beat(bus, [n["name"] for n in nodes], stop_beats))
    bootstrap = await quarantine_on_fault(bus)
    scheduler = start_service("scheduler", [], nats_url, tmp_path,
                              PRIMUS_SCHEDULER_CONFIG=str(config), **kube)
    failover = start_service("failover", [], nats_url, tmp_path,
                             PRIMUS_FAILOVER_RULES=str(rules), **kube)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps({
        "name": "golden-shape", "workers": workers, "gpus_per_worker": 1,
        "command": ["sh", "-c", TRAIN], "max_retry": 2, "env": {"NCCL_DEBUG": "WARN"}}))
    jobs = await bus.kv("jobs")
    job = ""
    try:
        out = await asyncio.to_thread(run_cli, "submit", str(job_file), env=env)
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip()

        async def record() -> dict[str, Any]:
            return json.loads((await jobs.get(job)).value)

        first = await until(lambda: _running(record, 1), "attempt 1 to run", timeout=300)
        bad = next(s["node"] for s in first["slots"] if s["rank"] == 0)
        # Rank 0 dies at step 8; failover cordons and taints its node.
        marks = await until(lambda: _marked(core, bad), "the failed node's cordon and taint",
                            timeout=120)
        assert marks[0] and taint_key("worker_infra_exit") in marks[1] and marks[2]
        second = await until(lambda: _running(record, 2), "attempt 2 to run", timeout=300)
        assert bad not in {s["node"] for s in second["slots"]}
        done = await until(lambda: _status(record, "completed"), "the job to complete",
                           timeout=300)
        assert done["attempt"] == 2
        text = await asyncio.to_thread(read, job)
        resumed = [line for line in text.splitlines() if line.startswith("attempt 2 rank 0")]
        assert resumed and int(resumed[0].rsplit(" ", 1)[1]) >= 8, text
        assert text.strip().splitlines()[-1] == "12"
        # Closing the fault removes the platform's taint and cordon.
        faults = json.loads((await asyncio.to_thread(
            run_cli, "faults", "--json", env=env)).stdout)
        fault = next(f for f in faults if f["key"] == bad and f["status"] != "closed")
        out = await asyncio.to_thread(run_cli, "fault", "close", fault["fault_id"], env=env)
        assert out.returncode == 0, out.stderr
        await until(lambda: _unmarked(core, bad), "the cordon and taint to go", timeout=120)
    finally:
        stop_beats.set()
        await beats
        await bootstrap.unsubscribe()
        for proc, name in ((scheduler, "scheduler"), (failover, "failover")):
            await asyncio.to_thread(stop_process, proc, tmp_path / f"{name}.log")
        if job:
            for pod in core.list_namespaced_pod(NS, label_selector=job_selector(job)).items:
                core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
        for n in nodes:  # never leave a test's mark on a real node
            unschedulable, taints, ours = node_marks(core, n["name"])
            if ours or any(t.startswith("primus-safe/fault-") for t in taints):
                body = {"spec": {"unschedulable": False if ours else unschedulable,
                                 "taints": [t for t in (core.read_node(n["name"]).spec.taints
                                                        or []) if not t.key.startswith(
                                     "primus-safe/fault-")] or None}}
                core.patch_node(n["name"], body)


async def _running(record: Any, attempt: int) -> dict[str, Any] | None:
    r = await record()
    return r if r["status"] == "running" and r["attempt"] >= attempt else None


async def _status(record: Any, status: str) -> dict[str, Any] | None:
    r = await record()
    return r if r["status"] == status else None


async def _marked(core: client.CoreV1Api, node: str) -> tuple[bool, set[str], str] | None:
    marks = await asyncio.to_thread(node_marks, core, node)
    return marks if marks[0] and marks[1] else None


async def _unmarked(core: client.CoreV1Api, node: str) -> bool:
    unschedulable, taints, ours = await asyncio.to_thread(node_marks, core, node)
    return not unschedulable and not any(t.startswith("primus-safe/fault-") for t in taints)
