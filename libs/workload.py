"""What a worker runs in and with, beyond its command: the image, the
resources of its pod, its volumes, secrets, node constraints and network
settings. ``JobSpec`` (job.yaml) carries these; a workspace in the
scheduler's configuration carries defaults and limits for them
(``services/scheduler/workload.py`` merges and checks them).

Kubernetes honours all of it; the local driver runs processes on this
machine and honours only ``env`` (it says once, in ``explain``, what it
ignored: ``kubernetes_only``).

Pure models and functions. Quantities are Kubernetes quantities ("96",
"500m", "256Gi") parsed by the ``kubernetes`` client's own parser, imported
when a quantity is first checked (the client takes half a second to import
and most processes never see a quantity).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# DNS-1123 subdomain (Secret, PVC names), label (volume names), and label keys/values.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An extended resource: a domain-qualified name (rdma/hca, example.com/foo).
_EXTENDED = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
GPU_RESOURCES = ("amd.com/gpu", "nvidia.com/gpu")
QUANTITY_HELP = "write a Kubernetes quantity such as 96, 500m, 256Gi or 1.5Ti"
# Paths the platform mounts itself in every worker pod.
RESERVED_MOUNTS = ("/dev/shm",)
RESERVED_VOLUMES = ("checkpoints", "dshm", "nats-credential")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity as a number (bytes, cores); ValueError naming
    the form when it is not one."""
    from kubernetes.utils.quantity import parse_quantity  # see the module docstring

    try:
        value = parse_quantity(text)
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"{str(text)[:40]!r} is not a quantity: {QUANTITY_HELP}") from None
    if value <= 0:
        raise ValueError(f"{text!r} must be more than 0")
    return value


def _subdomain(value: str, what: str) -> str:
    if not (_SUBDOMAIN.match(value) and len(value) <= 253):
        raise ValueError(f"{what} {value[:80]!r} is not a Kubernetes object name: use "
                         "lower-case a-z, 0-9, '-' and '.', starting and ending with a letter "
                         "or digit")
    return value


def _absolute(value: str, what: str) -> str:
    if not value.startswith("/") or "\0" in value:
        raise ValueError(f"{what} {value[:80]!r} must be an absolute path (starting with /)")
    return value.rstrip("/") or "/"


def _label_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (prefix and not (_SUBDOMAIN.match(prefix) and len(prefix) <= 253)) \
            or not _NAME_PART.match(name):
        raise ValueError(f"label key {key[:80]!r} is not valid: [prefix/]name, the name up to "
                         "63 characters of letters, digits, '-', '_' and '.'")


class Resources(_Frozen):
    """What one worker's pod asks for, besides its GPUs (``gpus_per_worker``).
    Requests equal limits, so a pod that names cpu and memory gets the
    Guaranteed QoS class."""

    cpu: str | None = Field(default=None, description="CPU cores, e.g. 96 or 500m")
    memory: str | None = Field(default=None, description="memory, e.g. 1536Gi")
    shared_memory: str | None = Field(
        default=None, description="size of the memory-backed /dev/shm (it counts against "
        "memory); RCCL/NCCL and DataLoader workers need more than the 64 MiB default")
    ephemeral_storage: str | None = Field(default=None, description="local scratch, e.g. 200Gi")
    extra: dict[str, int] = Field(
        default_factory=dict, description="extended resources per worker, e.g. rdma/hca: 1")

    @field_validator("cpu", "memory", "shared_memory", "ephemeral_storage")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None:
            quantity(value)
        return value

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: dict[str, int]) -> dict[str, int]:
        for name, amount in value.items():
            if name in GPU_RESOURCES:
                raise ValueError(f"{name}: GPUs are asked for with gpus_per_worker, not here")
            if not _EXTENDED.match(name) or name.split("/")[0].endswith("kubernetes.io"):
                raise ValueError(f"unknown resource name {name[:80]!r}: an extended resource is "
                                 "domain-qualified, like rdma/hca or example.com/fpga (cpu, "
                                 "memory and ephemeral storage have their own fields)")
            if amount < 1:
                raise ValueError(f"{name}: ask for at least 1")
        return value

    @model_validator(mode="after")
    def _shm_fits(self) -> Resources:
        if self.shared_memory and self.memory and \
                quantity(self.shared_memory) > quantity(self.memory):
            raise ValueError(f"shared_memory {self.shared_memory} is more than memory "
                             f"{self.memory}: /dev/shm is counted against the pod's memory")
        return self

    def over(self, defaults: Resources) -> Resources:
        """These, with every field left unset taken from ``defaults``."""
        return Resources(
            cpu=self.cpu or defaults.cpu, memory=self.memory or defaults.memory,
            shared_memory=self.shared_memory or defaults.shared_memory,
            ephemeral_storage=self.ephemeral_storage or defaults.ephemeral_storage,
            extra={**defaults.extra, **self.extra})

    @property
    def guaranteed(self) -> bool:
        return bool(self.cpu and self.memory)


class Volume(_Frozen):
    """A volume mounted into every worker: a PersistentVolumeClaim, or a
    directory of the node (``host_path``, when the workspace allows it)."""

    name: str = Field(description="a DNS label, unique in the job")
    mount_path: str = Field(description="where the workers see it (absolute)")
    read_only: bool = False
    pvc: str | None = Field(default=None, description="the PersistentVolumeClaim's name")
    host_path: str | None = Field(default=None, description="a directory on the node")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _LABEL.match(value):
            raise ValueError(f"volume name {value[:80]!r} is not a DNS label: lower-case a-z, "
                             "0-9 and '-', at most 63 characters")
        if value in RESERVED_VOLUMES:
            raise ValueError(f"volume name {value!r} is the platform's own: choose another")
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, value: str) -> str:
        value = _absolute(value, "mount_path")
        if value in RESERVED_MOUNTS:
            raise ValueError(f"{value} is mounted by the platform (resources.shared_memory "
                             "sets its size)")
        return value

    @field_validator("pvc")
    @classmethod
    def _pvc(cls, value: str | None) -> str | None:
        return None if value is None else _subdomain(value, "pvc")

    @field_validator("host_path")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else _absolute(value, "host_path")

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError(f"volume {self.name}: give exactly one of pvc (a claim name) or "
                             "host_path (a node directory)")
        return self


class SecretRef(_Frozen):
    """A Kubernetes Secret of the job's namespace, given to every worker as
    environment variables (``env``: variable -> key) and/or as files (one per
    key) under ``mount_path``. It must exist when the job launches."""

    name: str
    env: dict[str, str] = Field(default_factory=dict, description="variable name -> key")
    mount_path: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _subdomain(value, "secret name")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for var, key in value.items():
            if not _ENV_NAME.match(var):
                raise ValueError(f"environment variable name {var[:80]!r} is not valid")
            if not re.match(r"^[-._a-zA-Z0-9]+$", key):
                raise ValueError(f"secret key {key[:80]!r} is not valid: letters, digits, "
                                 "'-', '_' and '.'")
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, value: str | None) -> str | None:
        return None if value is None else _absolute(value, "mount_path")

    @model_validator(mode="after")
    def _used(self) -> SecretRef:
        if not self.env and self.mount_path is None:
            raise ValueError(f"secret {self.name}: give env (variable: key) or mount_path, "
                             "or both")
        return self


class Toleration(_Frozen):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Toleration:
        if self.key is not None:
            _label_key(self.key)
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies to effect NoExecute only")
        return self

    def manifest(self) -> dict[str, Any]:
        body: dict[str, Any] = {"operator": self.operator}
        for field, name in (("key", "key"), ("value", "value"), ("effect", "effect"),
                            ("toleration_seconds", "tolerationSeconds")):
            if getattr(self, field) is not None:
                body[name] = getattr(self, field)
        return body


def check_node_selector(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        _label_key(key)
        if label and not _NAME_PART.match(label):
            raise ValueError(f"node_selector {key}: value {label[:80]!r} is not a label value")
    return value


def check_names(value: list[str], what: str) -> list[str]:
    for name in value:
        _subdomain(name, what)
    return value


class Network(_Frozen):
    """The fabric the collective libraries use. RCCL reads NCCL's variable
    names, so one set serves ROCm and CUDA; Gloo (torch's CPU backend and
    rendezvous store) gets the socket interface too."""

    ib_hca: str | None = Field(default=None, description="RDMA devices, e.g. mlx5_0,mlx5_1 or "
                               "^mlx5_4 (NCCL_IB_HCA)")
    socket_ifname: str | None = Field(default=None, description="the bootstrap/TCP interface, "
                                      "e.g. eth0 (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)")
    ib_gid_index: int | None = Field(default=None, ge=0, description="RoCE GID index "
                                     "(NCCL_IB_GID_INDEX), e.g. 3 for RoCE v2")

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.ib_hca:
            out["NCCL_IB_HCA"] = self.ib_hca
        if self.socket_ifname:
            out["NCCL_SOCKET_IFNAME"] = out["GLOO_SOCKET_IFNAME"] = self.socket_ifname
        if self.ib_gid_index is not None:
            out["NCCL_IB_GID_INDEX"] = str(self.ib_gid_index)
        return out


# Fields of JobSpec only a Kubernetes driver can honour, with the value that means "unset".
KUBERNETES_ONLY = ("image", "resources", "host_network", "volumes", "secrets", "node_selector",
                   "tolerations", "image_pull_secrets", "checkpoint_pvc")


def kubernetes_only(spec: Any) -> list[str]:
    """The Kubernetes-only fields ``spec`` (a JobSpec) sets: what a driver
    that runs local processes ignores."""
    unset = {"resources": Resources(), "host_network": False}
    return [name for name in KUBERNETES_ONLY
            if getattr(spec, name) not in (None, [], {}, unset.get(name))]
