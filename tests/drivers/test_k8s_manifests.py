"""The Kubernetes driver's pure half: every manifest passes the Kubernetes
schemas (kubernetes-validate, strict), names are valid DNS labels, the worker
environment is what torchrun and the SDK read, priority classes match the Helm
chart, and pod statuses map to the right lifecycle (scenarios as data)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from libs.drivers.k8s_manifests import (
    KILLED_EXIT_CODE,
    KubernetesDriverConfig,
    WorkerPod,
    dns_label,
    gang_manifests,
    job_selector,
    master_addr,
    pod_name,
    read_worker_pod,
    service_name,
)
from libs.events import JobSpec, WorkerSlot

REPO = Path(__file__).resolve().parents[2]
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
K8S_VERSIONS = ["1.30", "1.33"]

BASE = KubernetesDriverConfig(namespace="train", image="rocm/pytorch:rocm6.2")
FULL = KubernetesDriverConfig(
    namespace="train", image="registry.local/train:1", gpu_resource="nvidia.com/gpu",
    checkpoint_pvc="ckpt", checkpoint_mount_path="/mnt/ckpt", service_account="trainer",
    master_port=23456, nats_token_secret="primus-safe", priority_class_prefix=None)


def spec(**over: Any) -> JobSpec:
    fields: dict[str, Any] = dict(name="tiny", workers=2, gpus_per_worker=8,
                                  command=["python", "train.py", "--steps", "10"],
                                  priority="high", checkpoint_interval=25)
    fields.update(over)
    return JobSpec(**fields)


SLOTS = [WorkerSlot(rank=1, node="gpu-02", gpus=8), WorkerSlot(rank=0, node="gpu-01", gpus=8)]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in pod["spec"]["containers"][0]["env"]}


# --------------------------------------------------------------------------- schemas


def test_schema_versions_are_installed() -> None:
    versions = {kubernetes_validate.utils.major_minor(v)
                for v in kubernetes_validate.utils.all_versions()}
    assert set(K8S_VERSIONS) <= versions


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("config", [BASE, FULL], ids=["base", "full"])
@pytest.mark.parametrize("gpus", [0, 8])
def test_manifests_validate_strict(version: str, config: KubernetesDriverConfig,
                                   gpus: int) -> None:
    slots = [WorkerSlot(rank=r, node=f"gpu-{r}", gpus=gpus) for r in range(3)]
    service, pods = gang_manifests("Tiny_Job-7", 4, spec(workers=3, gpus_per_worker=gpus,
                                                         workdir="/workspace",
                                                         env={"NCCL_DEBUG": "INFO"}),
                                   slots, config=config, nats_url="nats://nats:4222")
    for obj in [service, *pods]:
        # Returns the schema version it used: the exact one asked for.
        assert kubernetes_validate.validate(obj, version, strict=True) == version


def test_strict_validation_is_not_vacuous() -> None:
    _, pods = gang_manifests("j", 1, spec(), SLOTS, config=BASE, nats_url="nats://n:4222")
    pods[0]["spec"]["nodename"] = "gpu-01"  # a typo strict mode must catch
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pods[0], "1.33", strict=True)


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("job", ["tiny", "Tiny_DDP", "a_b", "a-b", "A-b", "9lives", "x-",
                                 "J" * 63, "a" + "_" * 62, "0" * 63])
def test_names_are_dns_labels(job: str) -> None:
    for attempt, rank in [(1, 0), (51, 4095), (123456, 4095)]:
        pod = pod_name(job, attempt, rank)
        assert DNS_1123_LABEL.match(pod) and len(pod) <= 63, pod
        assert pod.endswith(f"-a{attempt}-r{rank}")
        svc = service_name(job, attempt)
        assert DNS_1035_LABEL.match(svc) and len(svc) <= 63, svc
    label = dns_label(job)
    assert DNS_1123_LABEL.match(label) and LABEL_VALUE.match(label) and len(label) <= 63
    assert dns_label(job) == label  # deterministic


def test_valid_names_are_kept_and_converted_ones_stay_distinct() -> None:
    assert dns_label("tiny-ddp-ea8d3a") == "tiny-ddp-ea8d3a"
    assert pod_name("tiny", 2, 1) == "tiny-a2-r1"
    assert service_name("tiny", 2) == "ps-tiny-a2"
    converted = {dns_label(j) for j in ["a-b", "a_b", "A-b", "A_B"]}
    assert len(converted) == 4
    assert dns_label("Tiny_DDP").startswith("tiny-ddp-")
    long = ["x" * 63, "x" * 62 + "y"]
    assert pod_name(long[0], 1, 0) != pod_name(long[1], 1, 0)


# --------------------------------------------------------------------------- content


def test_pods_bind_to_chosen_nodes_in_rank_order_with_labels() -> None:
    service, pods = gang_manifests("Tiny_DDP", 3, spec(), SLOTS, config=BASE,
                                   nats_url="nats://nats:4222")
    assert [p["spec"]["nodeName"] for p in pods] == ["gpu-01", "gpu-02"]
    for rank, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels == {"app.kubernetes.io/managed-by": "primus-safe",
                          "primus-safe/job": dns_label("Tiny_DDP"),
                          "primus-safe/attempt": "3", "primus-safe/rank": str(rank)}
        assert pod["metadata"]["annotations"]["primus-safe/job-id"] == "Tiny_DDP"
        assert pod["metadata"]["namespace"] == "train"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["hostname"] == pod["metadata"]["name"] == pod_name("Tiny_DDP", 3, rank)
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
        # The service selects every pod of the attempt, ready or not.
        assert service["spec"]["selector"].items() <= labels.items()
        container = pod["spec"]["containers"][0]
        assert container["image"] == "rocm/pytorch:rocm6.2"
        assert container["command"] == ["python", "train.py", "--steps", "10"]
        assert container["resources"] == {"requests": {"amd.com/gpu": "8"},
                                          "limits": {"amd.com/gpu": "8"}}
        assert pod["spec"]["automountServiceAccountToken"] is False
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert job_selector("Tiny_DDP") == ("app.kubernetes.io/managed-by=primus-safe,"
                                        f"primus-safe/job={dns_label('Tiny_DDP')}")


def test_worker_env_is_torchrun_plus_sdk() -> None:
    _, pods = gang_manifests("Tiny_DDP", 3, spec(env={"NCCL_DEBUG": "INFO", "RANK": "99"}),
                             SLOTS, config=BASE, nats_url="nats://nats:4222")
    job = dns_label("Tiny_DDP")
    addr = f"{job}-a3-r0.ps-{job}-a3.train.svc.cluster.local"
    assert master_addr("Tiny_DDP", 3, BASE) == addr
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert env == {
            "NCCL_DEBUG": "INFO", "RANK": str(rank),  # the platform's RANK wins
            "MASTER_ADDR": addr, "MASTER_PORT": "29500", "WORLD_SIZE": "2",
            "LOCAL_RANK": "0", "NNODES": "2", "NODE_RANK": str(rank),
            "PRIMUS_JOB_ID": "Tiny_DDP", "PRIMUS_ATTEMPT": "3",
            "PRIMUS_NODE_NAME": f"gpu-0{rank + 1}", "PRIMUS_NATS_URL": "nats://nats:4222",
            "PRIMUS_CHECKPOINT_DIR": "/checkpoints/Tiny_DDP",
            "PRIMUS_CHECKPOINT_INTERVAL": "25", "PRIMUS_DEVICE_SLOTS": "8",
            # torchrun inside the pod: one process per GPU, its args from PET_*
            "LOCAL_WORLD_SIZE": "8", "PET_NNODES": "2", "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": addr, "PET_MASTER_PORT": "29500",
        }
        names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names))


def test_full_config_options() -> None:
    _, pods = gang_manifests("j", 1, spec(workdir="/ws"), SLOTS, config=FULL,
                             nats_url="nats://n:4222")
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["workingDir"] == "/ws"
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert "automountServiceAccountToken" not in pod["spec"]
    assert "priorityClassName" not in pod["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} \
        in pod["spec"]["volumes"]
    # The claim's directory of this job, whatever the attempt.
    assert {"name": "checkpoints", "mountPath": "/mnt/ckpt", "subPath": "jobs/j"} \
        in container["volumeMounts"]
    env = env_of(pod)
    assert env["PRIMUS_CHECKPOINT_DIR"] == "/mnt/ckpt"
    assert env["MASTER_PORT"] == "23456"
    assert env["PRIMUS_NATS_TOKEN"] == {"secretKeyRef": {"name": "primus-safe",
                                                          "key": "nats-token"}}


def test_no_gpu_request_without_gpus() -> None:
    _, pods = gang_manifests("j", 1, spec(gpus_per_worker=0),
                             [WorkerSlot(rank=0, node="n", gpus=0)], config=BASE, nats_url="x")
    assert "resources" not in pods[0]["spec"]["containers"][0]
    assert {"name": "checkpoints", "emptyDir": {}} in pods[0]["spec"]["volumes"]


def test_priority_classes_are_the_charts() -> None:
    values = yaml.safe_load((REPO / "deploy/helm/primus-safe/values.yaml").read_text())
    pcs = values["priorityClasses"]
    chart_names = {f"{pcs['prefix']}-{c['name']}" for c in pcs["classes"]}
    for priority in ["low", "medium", "high"]:
        _, pods = gang_manifests("j", 1, spec(priority=priority), SLOTS, config=BASE,
                                 nats_url="x")
        assert pods[0]["spec"]["priorityClassName"] == f"primus-safe-{priority}"
        assert pods[0]["spec"]["priorityClassName"] in chart_names


# --------------------------------------------------------------------------- status

_META = {"name": "j-a2-r1", "labels": {"app.kubernetes.io/managed-by": "primus-safe",
                                       "primus-safe/job": "j", "primus-safe/attempt": "2",
                                       "primus-safe/rank": "1"},
         "annotations": {"primus-safe/job-id": "J_1"}}


def _pod(phase: str | None, state: dict[str, Any] | None = None,
         meta: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {} if phase is None else {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"name": "worker", "state": state}]
    return {"metadata": meta or _META, "spec": {"nodeName": "gpu-03"}, "status": status}


_RUN = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
_TERM = {"terminated": {"exitCode": 137, "startedAt": "2025-01-01T00:00:00Z"}}
_TERM_NOSTART = {"terminated": {"exitCode": 128, "reason": "StartError"}}
_WAIT = {"waiting": {"reason": "ContainerCreating"}}
STATUS_CASES = [
    # (pod, deleted) -> (started, exit_code)
    ("pending", _pod("Pending", _WAIT), False, (False, None)),
    ("no status yet", _pod(None), False, (False, None)),
    ("running", _pod("Running", _RUN), False, (True, None)),
    ("running, no container details", _pod("Running"), False, (True, None)),
    ("succeeded", _pod("Succeeded", {"terminated": {"exitCode": 0}}), False, (True, 0)),
    ("succeeded, no details", _pod("Succeeded"), False, (True, 0)),
    ("failed 137", _pod("Failed", _TERM), False, (True, 137)),
    ("terminated before phase update", _pod("Running", _TERM), False, (True, 137)),
    ("never started", _pod("Failed", _TERM_NOSTART), False, (False, 128)),
    ("evicted, no termination", _pod("Failed"), False, (False, KILLED_EXIT_CODE)),
    ("deleted while running", _pod("Running", _RUN), True, (True, KILLED_EXIT_CODE)),
    ("deleted while pending", _pod("Pending", _WAIT), True, (False, KILLED_EXIT_CODE)),
    ("deleted after exit", _pod("Failed", _TERM), True, (True, 137)),
    ("unknown (node lost)", _pod("Unknown", _RUN), False, (True, None)),
]


@pytest.mark.parametrize(("pod", "deleted", "expected"), [c[1:] for c in STATUS_CASES],
                         ids=[c[0] for c in STATUS_CASES])
def test_read_worker_pod(pod: dict[str, Any], deleted: bool,
                         expected: tuple[bool, int | None]) -> None:
    view = read_worker_pod(pod, deleted=deleted)
    assert view is not None
    assert (view.name, view.job, view.attempt, view.rank, view.node) == \
        ("j-a2-r1", "J_1", 2, 1, "gpu-03")
    assert (view.started, view.exit_code) == expected


# Pods Kubernetes itself ended or refused. The status shapes follow real
# `kubectl get pod -o yaml` output shared in public ops write-ups: a pod on a
# node that was rebooted under graceful node shutdown (phase Failed, reason
# Terminated, a DisruptionTarget condition "TerminationByKubelet"); a pod
# whose process exited 0 on that SIGTERM (phase Succeeded, same condition, an
# ephemeral-storage eviction message); a kubelet eviction for memory pressure
# (reason Evicted, no container record); a pod the kubelet refused at
# admission ("Pod was rejected: The node had condition: [DiskPressure].", no
# container ever created); and a drain's eviction (reason
# EvictionByEvictionAPI, message "Eviction API: evicting"), as the
# Kubernetes docs on pod disruption conditions list them.
_SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
_STORAGE = ("The node was low on resource: ephemeral-storage. Threshold quantity:\n"
            "      67007895757, available: 59739228Ki. ")


def _disrupted(phase: str, reason: str, message: str, state: dict[str, Any] | None,
               *, status_reason: str | None = None) -> dict[str, Any]:
    pod = _pod(phase, state)
    pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
         "lastTransitionTime": "2025-12-31T09:05:29Z"},
        {"type": "Ready", "status": "False", "reason": "PodFailed"}]
    if status_reason:
        pod["status"] |= {"reason": status_reason, "message": message}
    return pod


_REJECTED = _pod("Failed")
_REJECTED["status"] |= {"reason": "Evicted",
                        "message": "Pod was rejected: The node had condition: [DiskPressure]."}
_NOT_YET = _pod("Running", _RUN)
_NOT_YET["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "False"}]
DISRUPTION_CASES = [
    # (pod, deleted) -> (started, exit_code, disrupted, rejected)
    ("node shutdown", _disrupted("Failed", "TerminationByKubelet", _SHUTDOWN, {
        "terminated": {"exitCode": 2, "reason": "Error", "startedAt": "2025-12-31T07:43:57Z"}},
        status_reason="Terminated"), False,
     (True, 2, f"TerminationByKubelet: {_SHUTDOWN}", None)),
    ("checkpointed and exited 0 on the kubelet's SIGTERM",
     _disrupted("Succeeded", "TerminationByKubelet", _STORAGE, {
         "terminated": {"exitCode": 0, "reason": "Completed",
                        "startedAt": "2025-08-26T08:29:13Z"}}), False,
     (True, 0, "TerminationByKubelet: The node was low on resource: ephemeral-storage. "
               "Threshold quantity: 67007895757, available: 59739228Ki.", None)),
    ("memory-pressure eviction, no container record",
     _disrupted("Failed", "TerminationByKubelet", "The node was low on resource: memory.",
                None, status_reason="Evicted"), False,
     (False, KILLED_EXIT_CODE, "TerminationByKubelet: The node was low on resource: memory.",
      None)),
    ("a drain's eviction, then deleted", _disrupted(
        "Running", "EvictionByEvictionAPI", "Eviction API: evicting", {
            "terminated": {"exitCode": 143, "startedAt": "2025-01-01T00:00:00Z"}}), True,
     (True, 143, "EvictionByEvictionAPI: Eviction API: evicting", None)),
    ("taint manager deleted it while it ran", _disrupted(
        "Running", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint",
        _RUN), True,
     (True, KILLED_EXIT_CODE,
      "DeletionByTaintManager: Taint manager: deleting due to NoExecute taint", None)),
    ("rejected at admission", _REJECTED, False,
     (False, KILLED_EXIT_CODE, None,
      "Evicted: Pod was rejected: The node had condition: [DiskPressure].")),
    ("a failed start is the job's own", _pod("Failed", _TERM_NOSTART), False,
     (False, 128, None, None)),
    ("a condition that is False is no disruption", _NOT_YET, False, (True, None, None, None)),
]


@pytest.mark.parametrize(("pod", "deleted", "expected"), [c[1:] for c in DISRUPTION_CASES],
                         ids=[c[0] for c in DISRUPTION_CASES])
def test_read_worker_pod_names_what_kubernetes_did(
        pod: dict[str, Any], deleted: bool,
        expected: tuple[bool, int | None, str | None, str | None]) -> None:
    view = read_worker_pod(pod, deleted=deleted)
    assert view is not None
    assert (view.started, view.exit_code, view.disrupted, view.rejected) == expected


@pytest.mark.parametrize("meta", [
    {"name": "p", "labels": {"app": "x"}},
    {**_META, "annotations": {}},
    {**_META, "labels": {**_META["labels"], "app.kubernetes.io/managed-by": "Helm"}},
    {**_META, "labels": {**_META["labels"], "primus-safe/rank": "zero"}},
])
def test_foreign_pods_are_ignored(meta: dict[str, Any]) -> None:
    assert read_worker_pod(_pod("Running", _RUN, meta)) is None


def test_gone_keeps_a_real_exit_code() -> None:
    view = WorkerPod(name="p", job="j", attempt=1, rank=0, node="n", started=True,
                     exit_code=None)
    assert view.gone().exit_code == KILLED_EXIT_CODE
    assert WorkerPod(**{**view.__dict__, "exit_code": 3}).gone().exit_code == 3
