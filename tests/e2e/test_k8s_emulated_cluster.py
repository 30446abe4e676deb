"""The real-cluster flow of ``tests/drivers/test_k8s_cluster.py`` without a
cluster: the fake API server (``tests/drivers/k8s_fake_api.py``) with a
kubelet that runs every pod as a local process
(``tests/drivers/k8s_kubelet.py``). The scheduler and failover are the real
services with ``PRIMUS_DRIVER=kubernetes`` and a kubeconfig pointing at the
fake API; the job is the golden shape (Guaranteed resources, a workspace's
network settings, a ReadWriteMany checkpoint claim) submitted with the real
CLI. Rank 0 dies with a bus error in attempt 1; failover cordons and taints
its node through the API; attempt 2 runs on other nodes, resumes from the
step in the shared claim and completes; closing the fault removes the marks.

What only a real cluster shows (image pulls, the device plugins, DNS, the
kubelet's own behaviour) is left to the real-cluster test."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from libs.bus import Bus
from libs.drivers.k8s_manifests import checkpoint_subpath
from libs.events import JobSpec
from services.scheduler.protocol import ADMISSION
from tests.drivers.k8s_fake_api import FakeKubeApi, condition_node
from tests.drivers.k8s_kubelet import FakeKubelet
from tests.drivers.test_k8s_cluster import NS, golden_flow, register
from tests.helpers import run_cli, start_service, stop_process, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: fake, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {ns}}}}}]
current-context: fake
"""


async def test_failover_cordons_and_the_job_resumes_from_the_shared_claim_on_other_nodes(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    api = FakeKubeApi().start()
    kubelet = FakeKubelet(api, tmp_path / "cluster").start()
    claim = "ckpt"
    api.pvcs[claim] = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": claim, "namespace": NS},
                       "spec": {"accessModes": ["ReadWriteMany"]}}
    names = ["node-a", "node-b", "node-c"]
    for name in names:
        api.put_node(condition_node(name))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(url=api.url, ns=NS))
    api_client = client.ApiClient(client.Configuration(host=api.url))
    core = client.CoreV1Api(api_client)
    nodes = [{"name": n, "ip": f"10.0.0.{i}", "amd": 0, "rdma": 0}
             for i, n in enumerate(names, 1)]

    def read(job: str) -> str:
        directory = tmp_path / "cluster/claims" / claim / checkpoint_subpath(job)
        return (directory / "resumes").read_text() + (directory / "step").read_text()

    try:
        await golden_flow(core, nodes, nats_url=nats_url, bus=bus, tmp_path=tmp_path,
                          claim=claim, kubeconfig=str(kubeconfig), read=read)
        # The pods were the golden shape: Guaranteed resources, the claim's
        # job directory, the workspace's network settings, no device request.
        pods = [c.body for c in api.requests(method="POST") if c.body.get("kind") == "Pod"]
        assert {p["metadata"]["labels"]["primus-safe/attempt"] for p in pods} == {"1", "2"}
        for pod in pods:
            c = pod["spec"]["containers"][0]
            assert c["resources"]["requests"] == c["resources"]["limits"] == {
                "cpu": "100m", "memory": "64Mi"}
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["NCCL_SOCKET_IFNAME"] == "eth0"
            assert any(m.get("subPath", "").startswith("jobs/") for m in c["volumeMounts"])
    finally:
        kubelet.stop()
        api_client.close()
        api.stop()


async def test_a_job_whose_secret_is_missing_waits_pending_and_runs_once_it_exists(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """Nothing is created while the Secret is missing; explain says why; no
    retry is spent; the job runs once an operator creates the Secret."""
    api = FakeKubeApi().start()
    kubelet = FakeKubelet(api, tmp_path / "cluster").start()
    api.put_node(condition_node("node-a"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(url=api.url, ns=NS))
    await register(bus, [{"name": "node-a", "ip": "10.0.0.1", "amd": 0, "rdma": 0}])
    config = tmp_path / "scheduler.yaml"
    config.write_text("launch_retry_s: 2\n")  # the default is 30 s
    scheduler = start_service("scheduler", [], nats_url, tmp_path, PRIMUS_DRIVER="kubernetes",
                              PRIMUS_SCHEDULER_CONFIG=str(config),
                              PRIMUS_K8S_NAMESPACE=NS, PRIMUS_K8S_IMAGE="busybox:1.36",
                              KUBECONFIG=str(kubeconfig))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    out_file = tmp_path / "token.txt"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps({
        "name": "needs-secret", "workers": 1, "gpus_per_worker": 1, "max_retry": 0,
        "command": ["sh", "-c", f'echo "$HF_TOKEN" > {out_file}'],
        "secrets": [{"name": "hf", "env": {"HF_TOKEN": "token"}}]}))
    jobs = await bus.kv("jobs")
    try:
        await until(lambda: bus.request(ADMISSION.subject, {"spec": JobSpec(
            name="probe", workers=1, gpus_per_worker=1, command=["x"]).model_dump(
            mode="json")}, timeout_s=1), "the scheduler leader to answer admission")
        out = await asyncio.to_thread(run_cli, "submit", str(job_file), env=env)
        assert out.returncode == 0, out.stderr
        assert "names no shared checkpoint volume" in out.stderr  # Kubernetes, no claim
        job = out.stdout.strip()

        async def record() -> dict[str, Any]:
            return json.loads((await jobs.get(job)).value)

        async def blocked() -> dict[str, Any] | None:
            r = await record()
            return r if r["status"] == "pending" and r["blocked"] else None

        r = await until(blocked, "the launch to be refused", timeout=60)
        assert r["blocked"] == (f"Secret hf not found in namespace {NS} (secrets[0] of the "
                                "job)")
        assert r["retries"] == 0

        async def explained() -> str | None:
            text = (await asyncio.to_thread(run_cli, "explain", job, env=env)).stdout
            return text if "tried again at" in text else None

        text = await until(explained, "explain to say why the job waits", timeout=30)
        assert "waits: position 1 in workspace default: cannot launch: Secret hf not found " \
               f"in namespace {NS} (secrets[0] of the job); tried again at" in text
        assert not [c for c in api.requests(method="POST")
                    if c.body["metadata"]["name"].startswith("needs-secret")
                    or c.body["metadata"]["name"].startswith("ps-needs-secret")]
        api.secrets["hf"] = {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": "hf", "namespace": NS},
                             "data": {"token": base64.b64encode(b"hf_abc").decode()}}

        async def completed() -> dict[str, Any] | None:
            r = await record()
            return r if r["status"] == "completed" else None

        r = await until(completed, "the job to run once the Secret exists", timeout=90)
        assert r["retries"] == 0 and out_file.read_text().strip() == "hf_abc"
    finally:
        await asyncio.to_thread(stop_process, scheduler, tmp_path / "scheduler.log")
        kubelet.stop()
        api.stop()
