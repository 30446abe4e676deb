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

from pathlib import Path

import pytest
from kubernetes import client

from libs.bus import Bus
from libs.drivers.k8s_manifests import checkpoint_subpath
from tests.drivers.k8s_fake_api import FakeKubeApi, condition_node
from tests.drivers.k8s_kubelet import FakeKubelet
from tests.drivers.test_k8s_cluster import NS, golden_flow

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
