"""The pure half of the Kubernetes driver: what a placed gang looks like as
Kubernetes objects, and what a worker pod's status means for the platform.

No I/O, no clock, no client: plain dicts in and out, so every manifest can be
checked against the Kubernetes schemas and every status mapping can be tested
as data. ``libs.drivers.kubernetes`` does the API calls.

A gang is one headless Service (the rendezvous name) and one Pod per rank,
each bound to the node the platform's scheduler chose (``spec.nodeName``:
kube-scheduler never decides placement). Rank 0 is reachable at a stable DNS
name through the service (pod ``hostname`` + ``subdomain``), which becomes
MASTER_ADDR. Object names carry the attempt, so a re-placed gang never
collides with the previous attempt's terminating pods.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from libs.events import JobSpec, WorkerSlot
from libs.worker_env import WORKER_ENV_PASSWORD, WORKER_ENV_USER, WorkerEnv

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "primus-safe"
LABEL_JOB = "primus-safe/job"
LABEL_ATTEMPT = "primus-safe/attempt"
LABEL_RANK = "primus-safe/rank"
# Job ids may hold '_' and upper case, which label values and DNS names may
# not; the exact id travels in an annotation so events carry it unchanged.
ANNOTATION_JOB_ID = "primus-safe/job-id"
CONTAINER = "worker"
# Every worker pod of every job, and nothing else (the platform's own pods
# are managed by Helm and have no job label).
WATCH_SELECTOR = f"{MANAGED_BY}={MANAGER},{LABEL_JOB}"
NATS_TOKEN_KEY = "nats-token"  # the key in the chart's Secret
# A pod that ended without its container reporting a termination (deleted,
# evicted, its node lost, refused by the kubelet) was ended from outside: the
# platform reports it as killed by SIGKILL, like the LocalDriver reports a
# process killed with its node. Negative codes mean "killed by that signal".
KILLED_EXIT_CODE = -9

_DNS_LABEL_MAX = 63


class KubernetesDriverConfig(BaseModel):
    """Where and how worker pods run; built by the caller from the settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    image: str = Field(min_length=1, description="the training image when neither the job "
                       "nor its workspace names one")
    gpu_resource: str = Field(default="amd.com/gpu", description="the device resource of a "
                              "node whose GPU model says nothing (e.g. nvidia.com/gpu)")
    checkpoint_pvc: str | None = Field(
        default=None, description="ReadWriteMany claim for checkpoints when neither the job "
        "nor its workspace names one; without any, checkpoints live in the pod and do not "
        "survive re-placement")
    termination_grace_s: int = Field(
        default=30, ge=0, description="terminationGracePeriodSeconds: how long a worker the "
        "cluster evicts or drains has to checkpoint after SIGTERM (the SDK saves on SIGTERM)")
    checkpoint_mount_path: str = "/checkpoints"
    service_account: str | None = None
    master_port: int = Field(default=29500, ge=1, le=65535)
    priority_class_prefix: str | None = Field(
        default="primus-safe", description="the chart's priorityClasses.prefix; None: "
        "no priorityClassName")
    nats_token_secret: str | None = Field(
        default=None, description=f"Secret whose '{NATS_TOKEN_KEY}' key is the bus token")
    cluster_domain: str = Field(
        default="cluster.local", description="the cluster's DNS domain (Kubespray's "
        "dns_domain): rank 0's address is <pod>.<service>.<namespace>.svc.<this>")
    job_credentials: bool = Field(
        default=False, description="workers log in to NATS with their job's own credential, "
        "from a per-job Secret the driver creates (never the platform's token)")


# --------------------------------------------------------------------------- names


def dns_label(raw: str, *, max_len: int = _DNS_LABEL_MAX) -> str:
    """``raw`` as a DNS-1123 label of at most ``max_len`` characters. Pure.

    A name that is already valid is kept. Otherwise it is lower-cased, every
    other character becomes '-', it is cut to fit and an 8-hex digest of the
    original is appended, so distinct ids ("a_b", "a-b", "A-b") stay distinct
    and the same id always gives the same name.
    """
    if max_len < 8:
        raise ValueError(f"max_len {max_len} leaves no room for a name")
    clean = re.sub(r"[^a-z0-9-]", "-", raw.lower()).strip("-")
    if clean == raw and 0 < len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    head = clean[: max_len - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


def job_label(job: str) -> str:
    return dns_label(job)


def pod_name(job: str, attempt: int, rank: int) -> str:
    """Pod name and hostname (a DNS-1123 label) of one rank of one attempt."""
    suffix = f"-a{attempt}-r{rank}"
    return dns_label(job, max_len=_DNS_LABEL_MAX - len(suffix)) + suffix


def service_name(job: str, attempt: int) -> str:
    """Headless service of one attempt: a DNS-1035 label, so it starts with a letter."""
    prefix, suffix = "ps-", f"-a{attempt}"
    return prefix + dns_label(job, max_len=_DNS_LABEL_MAX - len(prefix) - len(suffix)) + suffix


def gpu_resource(model: str, default: str) -> str | None:
    """The device plugin resource of a GPU model: ``amd.com/gpu`` for AMD
    Instinct/Radeon, ``nvidia.com/gpu`` for NVIDIA; ``default`` when the
    model says neither; None for ``cpu`` (a node registered with CPU device
    slots, as local nodes and CPU-only test clusters are: nothing to ask
    a device plugin for). Pure."""
    name = model.strip().lower()
    if name == "cpu":
        return None
    if name.startswith(("mi", "amd", "instinct", "radeon")):
        return "amd.com/gpu"
    if name.startswith(("nvidia", "tesla", "geforce", "rtx", "quadro")) or re.match(
            r"^(gb|gh|[abhlvt])\d", name):
        return "nvidia.com/gpu"
    return default


def rendezvous_port(job: str, attempt: int, spec: JobSpec,
                    config: KubernetesDriverConfig) -> int:
    """Rank 0's port. Pods with their own network all use ``master_port``;
    on the node's network (``host_network``) two jobs' rank 0 may share a
    node, so the port is spread over the 1000 above it by the job's id. Pure."""
    if not spec.host_network:
        return config.master_port
    digest = int(hashlib.sha256(f"{job}/{attempt}".encode()).hexdigest()[:8], 16)
    return min(65535, config.master_port + 1 + digest % 999)


def checkpoint_claim(spec: JobSpec, config: KubernetesDriverConfig) -> str | None:
    """The shared checkpoint volume of the job: its own, else its workspace's
    (resolved into the spec), else the driver's."""
    return spec.checkpoint_pvc or config.checkpoint_pvc


def worker_checkpoint_dir(job: str, spec: JobSpec, config: KubernetesDriverConfig) -> str:
    """The job's checkpoint directory as its workers see it: the claim's
    job directory mounted at the mount path, or the job's directory in the
    pod's own volume."""
    if checkpoint_claim(spec, config):
        return config.checkpoint_mount_path
    return f"{config.checkpoint_mount_path.rstrip('/')}/{job}"


def checkpoint_subpath(job: str) -> str:
    """Every attempt of a job mounts this directory of the claim (and sees
    no other job's): re-placed after a failure, it resumes from it."""
    return f"jobs/{job}"


def master_addr(job: str, attempt: int, config: KubernetesDriverConfig) -> str:
    """Rank 0's stable DNS name through the headless service."""
    return (f"{pod_name(job, attempt, 0)}.{service_name(job, attempt)}."
            f"{config.namespace}.svc.{config.cluster_domain}")


def priority_class(spec: JobSpec, config: KubernetesDriverConfig) -> str | None:
    """The chart's PriorityClass for the job (``<prefix>-<priority>``)."""
    if config.priority_class_prefix is None:
        return None
    return f"{config.priority_class_prefix}-{spec.priority}"


def job_labels(job: str, attempt: int) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, LABEL_JOB: job_label(job), LABEL_ATTEMPT: str(attempt)}


def credential_secret_name(job: str) -> str:
    """The per-job Secret holding the job's NATS credential (all attempts)."""
    suffix = "-nats"
    return "ps-" + dns_label(job, max_len=_DNS_LABEL_MAX - 3 - len(suffix)) + suffix


def credential_secret(job: str, user: str, password: str,
                      config: KubernetesDriverConfig) -> dict[str, Any]:
    """The job's NATS credential as a Secret its pods read. Pure. Labelled
    like the job's pods (no attempt: every attempt uses it), so stopping
    the job deletes it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": credential_secret_name(job),
            "namespace": config.namespace,
            "labels": {MANAGED_BY: MANAGER, LABEL_JOB: job_label(job)},
            "annotations": {ANNOTATION_JOB_ID: job},
        },
        "stringData": {"user": user, "password": password},
    }


def job_selector(job: str) -> str:
    """Label selector for every object of the job, all attempts."""
    return f"{MANAGED_BY}={MANAGER},{LABEL_JOB}={job_label(job)}"


# --------------------------------------------------------------------------- manifests


def service_manifest(job: str, attempt: int, config: KubernetesDriverConfig,
                     port: int | None = None) -> dict[str, Any]:
    """Headless service giving every pod of the attempt a DNS name. Pure."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job, attempt),
            "namespace": config.namespace,
            "labels": job_labels(job, attempt),
            "annotations": {ANNOTATION_JOB_ID: job},
        },
        "spec": {
            "clusterIP": "None",
            "selector": job_labels(job, attempt),
            # Rendezvous happens before any worker is "ready".
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": port or config.master_port,
                       "targetPort": port or config.master_port, "protocol": "TCP"}],
        },
    }


def worker_env(job: str, attempt: int, spec: JobSpec, slot: WorkerSlot, *, world: int,
               config: KubernetesDriverConfig, nats_url: str) -> list[dict[str, Any]]:
    """torchrun variables plus the PRIMUS_* ones the SDK reads. Pure.

    One worker (pod) per node: RANK/WORLD_SIZE count workers (as the
    LocalDriver does); NODE_RANK/NNODES/LOCAL_WORLD_SIZE say the same for a
    torchrun started inside the pod over its GPUs, and torchrun reads its
    own arguments from the PET_* variables, so an unmodified
    ``torchrun train.py`` joins the gang. The job's own env (with its
    workspace's network settings) comes first; the platform's wins; secrets
    come last, from their Secrets.
    """
    port = rendezvous_port(job, attempt, spec, config)
    addr = master_addr(job, attempt, config)
    checkpoint_dir = worker_checkpoint_dir(job, spec, config)
    local = max(1, slot.gpus)
    values = dict(spec.env)
    values.update(WorkerEnv(
        master_addr=addr, master_port=port, world_size=world, rank=slot.rank, local_rank=0,
        nnodes=world, node_rank=slot.rank, job=job, attempt=attempt, node=slot.node,
        nats_url=nats_url, checkpoint_dir=checkpoint_dir,  # type: ignore[arg-type]
        checkpoint_interval=spec.checkpoint_interval, device_slots=slot.gpus,
    ).public_env())
    values.update({
        "LOCAL_WORLD_SIZE": str(local),
        "PET_NNODES": str(world), "PET_NODE_RANK": str(slot.rank),
        "PET_NPROC_PER_NODE": str(local), "PET_MASTER_ADDR": addr,
        "PET_MASTER_PORT": str(port),
    })
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    if config.job_credentials:
        secret = credential_secret_name(job)
        env += [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                for name, key in ((WORKER_ENV_USER, "user"), (WORKER_ENV_PASSWORD, "password"))]
    elif config.nats_token_secret:
        env.append({"name": "PRIMUS_NATS_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": config.nats_token_secret, "key": NATS_TOKEN_KEY}}})
    for ref in spec.secrets:
        env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": key}}}
                for var, key in ref.env.items()]
    return env


def _resources(spec: JobSpec, slot: WorkerSlot,
               config: KubernetesDriverConfig) -> dict[str, dict[str, str]]:
    """Requests equal limits (extended resources require it; with cpu and
    memory set the pod is Guaranteed)."""
    res = spec.resources
    amount: dict[str, str] = {}
    for field, name in (("cpu", "cpu"), ("memory", "memory"),
                        ("ephemeral_storage", "ephemeral-storage")):
        if getattr(res, field):
            amount[name] = getattr(res, field)
    device = gpu_resource(slot.gpu_model, config.gpu_resource)
    if slot.gpus and device:
        amount[device] = str(slot.gpus)
    amount.update({name: str(n) for name, n in sorted(res.extra.items())})
    return {"requests": dict(amount), "limits": dict(amount)} if amount else {}


def _volumes(job: str, spec: JobSpec,
             config: KubernetesDriverConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: checkpoints, /dev/shm,
    the job's volumes, its secrets as files."""
    claim = checkpoint_claim(spec, config)
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.resources.shared_memory:
        shm["sizeLimit"] = spec.resources.shared_memory
    volumes: list[dict[str, Any]] = [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}} if claim
        else {"name": "checkpoints", "emptyDir": {}},
        # Collective libraries (RCCL/NCCL, DataLoader workers) need more
        # shared memory than the runtime's 64 MiB default.
        {"name": "dshm", "emptyDir": shm},
    ]
    checkpoint_mount: dict[str, Any] = {"name": "checkpoints",
                                        "mountPath": config.checkpoint_mount_path}
    if claim:
        checkpoint_mount["subPath"] = checkpoint_subpath(job)
    mounts: list[dict[str, Any]] = [checkpoint_mount, {"name": "dshm", "mountPath": "/dev/shm"}]
    for v in spec.volumes:
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": v.pvc, "readOnly": v.read_only}} if v.pvc
            else {"hostPath": {"path": v.host_path, "type": "Directory"}})
        volumes.append({"name": v.name, **source})
        mounts.append({"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only})
    for i, ref in enumerate(spec.secrets):
        if ref.mount_path:
            name = f"ps-secret-{i}"
            volumes.append({"name": name, "secret": {"secretName": ref.name,
                                                     "defaultMode": 0o400}})
            mounts.append({"name": name, "mountPath": ref.mount_path, "readOnly": True})
    return volumes, mounts


def pod_manifest(job: str, attempt: int, spec: JobSpec, slot: WorkerSlot, *, world: int,
                 config: KubernetesDriverConfig, nats_url: str) -> dict[str, Any]:
    """One worker pod, bound to ``slot.node``. Pure."""
    name = pod_name(job, attempt, slot.rank)
    port = rendezvous_port(job, attempt, spec, config)
    volumes, mounts = _volumes(job, spec, config)
    container_port: dict[str, Any] = {"name": "rendezvous", "containerPort": port,
                                      "protocol": "TCP"}
    if spec.host_network:
        container_port["hostPort"] = port
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or config.image,
        # {checkpoint_dir} in an argument (``--load {checkpoint_dir}``); the
        # scheduler refuses {resume_step} here: the driver cannot read the claim.
        "command": [a.replace("{checkpoint_dir}", worker_checkpoint_dir(job, spec, config))
                    for a in spec.command],
        "env": worker_env(job, attempt, spec, slot, world=world, config=config,
                          nats_url=nats_url),
        "ports": [container_port],
        "volumeMounts": mounts,
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    resources = _resources(spec, slot, config)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "nodeName": slot.node,
        "hostname": name,
        "subdomain": service_name(job, attempt),
        # The platform re-places a failed gang as a new attempt; the kubelet
        # restarting one rank in place would rejoin nothing.
        "restartPolicy": "Never",
        # SIGTERM, then this long to checkpoint (the SDK saves on SIGTERM)
        # when the cluster evicts or drains the pod; the platform's own stops
        # pass their grace with the delete.
        "terminationGracePeriodSeconds": config.termination_grace_s,
        # Thousands of services would otherwise become env variables.
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
    }
    if spec.host_network:
        # The node's network (RDMA/RoCE devices, no overlay); cluster DNS
        # still resolves MASTER_ADDR.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.manifest() for t in spec.tolerations]
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    priority = priority_class(spec, config)
    if priority:
        pod_spec["priorityClassName"] = priority
    if config.service_account:
        pod_spec["serviceAccountName"] = config.service_account
    else:
        pod_spec["automountServiceAccountToken"] = False  # workers never call the API
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": config.namespace,
            "labels": {**job_labels(job, attempt), LABEL_RANK: str(slot.rank)},
            "annotations": {ANNOTATION_JOB_ID: job},
        },
        "spec": pod_spec,
    }


def gang_manifests(job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot], *,
                   config: KubernetesDriverConfig,
                   nats_url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The service and the pods (in rank order) of one attempt. Pure."""
    ordered = sorted(slots, key=lambda s: s.rank)
    pods = [pod_manifest(job, attempt, spec, slot, world=len(ordered), config=config,
                         nats_url=nats_url) for slot in ordered]
    port = rendezvous_port(job, attempt, spec, config)
    return service_manifest(job, attempt, config, port), pods


# --------------------------------------------------------------------------- prerequisites


@dataclass(frozen=True)
class Needed:
    """An object the pods name that must exist before they are created."""

    kind: str  # "secret" | "pvc"
    name: str
    field: str  # where the job (or configuration) names it
    keys: tuple[str, ...] = ()  # secret keys read as env variables
    shared: bool = False  # mounted by workers on several nodes: must be ReadWriteMany


def prerequisites(spec: JobSpec, slots: list[WorkerSlot],
                  config: KubernetesDriverConfig) -> list[Needed]:
    """Every Secret and claim the gang's pods name. Pure."""
    several = len({s.node for s in slots}) > 1
    out: list[Needed] = []
    for i, ref in enumerate(spec.secrets):
        out.append(Needed("secret", ref.name, f"secrets[{i}]", tuple(ref.env.values())))
    out += [Needed("secret", n, f"image_pull_secrets[{i}]")
            for i, n in enumerate(spec.image_pull_secrets)]
    out += [Needed("pvc", v.pvc, f"volumes[{i}] ({v.name})")
            for i, v in enumerate(spec.volumes) if v.pvc]
    claim = checkpoint_claim(spec, config)
    if claim:
        out.append(Needed("pvc", claim, "checkpoint_pvc", shared=several))
    return out


def selector_unmet(node: Mapping[str, Any] | None, selector: Mapping[str, str]) -> list[str]:
    """The ``key=value`` labels of ``selector`` the node (as the API
    returned it; None: not found) lacks: the kubelet would reject the pod. Pure."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return [f"{k}={v}" for k, v in selector.items() if labels.get(k) != v]


def missing(need: Needed, obj: Mapping[str, Any] | None, namespace: str) -> str | None:
    """Why ``obj`` (as the API returned it; None: not found) does not do
    for ``need``; None when it does. Pure."""
    what = {"secret": "Secret", "pvc": "PersistentVolumeClaim"}[need.kind]
    if obj is None:
        return f"{what} {need.name} not found in namespace {namespace} ({need.field} of the job)"
    if need.kind == "secret":
        have = set((obj.get("data") or {}) | (obj.get("stringData") or {}))
        lacking = [k for k in need.keys if k not in have]
        if lacking:
            return (f"Secret {need.name} has no key {', '.join(lacking)} ({need.field} of the "
                    f"job); it has: {', '.join(sorted(have)) or 'none'}")
    if need.kind == "pvc" and need.shared:
        modes = (obj.get("spec") or {}).get("accessModes") or []
        if "ReadWriteMany" not in modes:
            return (f"checkpoint claim {need.name} is {'/'.join(modes) or 'without access mode'}"
                    f": workers on several nodes cannot all mount it; use a ReadWriteMany claim")
    return None


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class WorkerPod:
    """What the platform needs to know of one worker pod."""

    name: str
    job: str
    attempt: int
    rank: int
    node: str
    started: bool
    exit_code: int | None
    # Kubernetes ended it for reasons of its own (a DisruptionTarget
    # condition: node shutdown or pressure, a drain's eviction, the taint
    # manager, preemption): the platform's loss, whatever the exit code.
    disrupted: str | None = None
    # The kubelet refused it before its container started (admission: a
    # node condition, a device the node no longer has): the node's fault.
    rejected: str | None = None

    def gone(self) -> WorkerPod:
        """The same pod after it disappeared: ended, killed if it had not exited."""
        code = KILLED_EXIT_CODE if self.exit_code is None else self.exit_code
        return replace(self, exit_code=code)


def read_worker_pod(pod: Mapping[str, Any], *, deleted: bool = False) -> WorkerPod | None:
    """Map a pod object (as the API returns it) to a ``WorkerPod``. Pure.

    Returns None for a pod that is not a primus-safe worker. ``started``: the
    container ran (pod Running or Succeeded, container running, or terminated
    after a start). ``exit_code``: the container's exit code once it
    terminated; 0 for a Succeeded pod without container details; and
    ``KILLED_EXIT_CODE`` for a pod that Failed or was deleted without a
    termination record (evicted, node lost, rejected by the kubelet).
    ``disrupted``: the reason and message of a DisruptionTarget condition
    (what a Job's podFailurePolicy ignores: the disruption is the cluster's,
    not the workload's). ``rejected``: why a pod Failed before its container
    ever started with no disruption named (the kubelet's admission).
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = (meta.get("annotations") or {}).get(ANNOTATION_JOB_ID)
    if labels.get(MANAGED_BY) != MANAGER or not job:
        return None
    try:
        attempt, rank = int(labels[LABEL_ATTEMPT]), int(labels[LABEL_RANK])
    except (KeyError, ValueError):
        return None
    status = pod.get("status") or {}
    phase = status.get("phase")
    container = next((c for c in status.get("containerStatuses") or []
                      if c.get("name") == CONTAINER), {})
    state = container.get("state") or {}
    terminated = state.get("terminated")
    started = (phase in ("Running", "Succeeded") or bool(state.get("running"))
               or bool(terminated and terminated.get("startedAt")))
    exit_code: int | None = None
    if terminated is not None and terminated.get("exitCode") is not None:
        exit_code = int(terminated["exitCode"])
    elif phase == "Succeeded":
        exit_code = 0
    elif phase == "Failed":
        exit_code = KILLED_EXIT_CODE
    disrupted = next((_said(c.get("reason") or "DisruptionTarget", c.get("message"))
                      for c in status.get("conditions") or []
                      if c.get("type") == "DisruptionTarget" and c.get("status") == "True"),
                     None)
    rejected = None
    if phase == "Failed" and not started and terminated is None and not disrupted:
        rejected = _said(status.get("reason") or "Failed", status.get("message"))
    view = WorkerPod(name=str(meta.get("name", "")), job=str(job), attempt=attempt, rank=rank,
                     node=str((pod.get("spec") or {}).get("nodeName") or ""),
                     started=started, exit_code=exit_code, disrupted=disrupted,
                     rejected=rejected)
    return view.gone() if deleted else view


def _said(reason: str, message: str | None) -> str:
    """A condition's or status's reason and message as one line."""
    text = " ".join(str(message or "").split())
    return f"{reason}: {text}" if text else reason
