"""The hosts file: which machines exist, what they hold, and (when the platform
is to build the cluster itself) how Kubernetes should be laid out on them.

Bootstrap owns it; the embedded stack writes one for its local nodes. Every
problem in a file is reported at once, each at its own path, so an operator
fixes a 1,000-line file in one pass instead of one error per run. Checks that
only matter for building a cluster (a control plane, an odd etcd quorum,
non-overlapping CIDRs) apply when ``provision: true`` or a ``kubernetes``
section is present: the embedded stack's worker-only files stay valid.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import defaultdict
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from libs.events import Frozen, NodeDescription, check_key
from libs.kubespray import (
    HOSTNAME,
    KubesprayRelease,
    hostname_fix,
    is_dns_subdomain,
    normal_kube_version,
)

# GPU models the platform knows how to judge; "cpu" is a local node with no GPU.
KNOWN_GPU_MODELS = ("MI300X", "MI325X", "MI250X", "MI210", "H100", "H200", "A100", "cpu")

Role = Literal["control-plane", "etcd", "worker"]


def normal_ip(value: str) -> str:
    """An address a node can be reached at, in normal form (pure): IPv6
    compressed and lower-case, IPv4-mapped IPv6 as plain IPv4, so two
    spellings of one address compare equal. Raises ValueError with the fix."""
    try:
        ip = ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"{value[:80]!r} is not an IP address (write e.g. 10.0.0.7)") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    why = ("the unspecified address" if ip.is_unspecified else "a multicast address"
           if ip.is_multicast else "a broadcast or reserved address"
           if isinstance(ip, ipaddress.IPv4Address) and ip.is_reserved else "")
    if why:
        raise ValueError(f"{ip} is {why}: no node can be reached there; "
                         "write the node's own address (e.g. 10.0.0.7)")
    return str(ip)


_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*-----|PRIVATE KEY")
# A key reference is a path on the bootstrap host, or secret:NAME for a
# Kubernetes Secret (a DNS subdomain); either is one line, no spaces.
_SECRET_REF = re.compile(r"^secret:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_KEY_PATH = re.compile(r"^[^\s:]+$")


def looks_like_a_key(text: str) -> bool:
    """Whether ``text`` holds key material itself (a PEM block) (pure)."""
    return bool(_PEM.search(text))


def check_key_reference(value: str) -> str:
    """A reference to an SSH private key, never the key (pure)."""
    fix = ("give a path on the bootstrap host (e.g. /etc/primus/ssh/id_ed25519) or a "
           "Kubernetes Secret as secret:NAME")
    if looks_like_a_key(value) or "\n" in value:
        raise ValueError(f"holds a private key itself; keys are never written in the hosts "
                         f"file (it is copied into the inventory): {fix}")
    if not (_SECRET_REF.match(value) or _KEY_PATH.match(value)) or len(value) > 4096:
        raise ValueError(f"{value[:80]!r} is neither a file path nor secret:NAME; {fix}")
    return value


# Validation context for records and events another release may have written:
# a GPU model this release does not know is kept, not refused. Only a hosts
# file an operator hands over is held to KNOWN_GPU_MODELS.
STORED = {"stored": True}


class HostSpec(NodeDescription):
    """A hosts file entry: a node's name, its description and how to reach
    it over SSH. The ``nodes`` bucket keeps it per node."""

    name: str
    roles: list[Role] = Field(default_factory=lambda: ["worker"])
    labels: dict[str, str] = Field(default_factory=dict, description="e.g. rack, switch")
    gpu_count: int = Field(ge=0, le=64)
    ssh_user: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
    ssh_key: str | None = Field(
        default=None, description="reference to the SSH private key: a path on the "
        "bootstrap host or a secret name; never the key itself")

    @classmethod
    def of(cls, name: str, description: NodeDescription) -> HostSpec:
        """The entry of a node known by its description (a ``node.registered``)."""
        return cls.model_validate({"name": name, **description.model_dump()}, context=STORED)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_key(value, "node name")

    @field_validator("ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        return normal_ip(value)

    @field_validator("ssh_key")
    @classmethod
    def _ssh_key(cls, value: str | None) -> str | None:
        return None if value is None else check_key_reference(value)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        # They become Kubernetes node labels (primus-safe/KEY=VALUE), so they
        # follow Kubernetes' rule, which also bounds what a node event carries.
        if len(value) > 64:
            raise ValueError(f"{len(value)} labels; at most 64 per node")
        for key, text in value.items():
            if looks_like_a_key(text):
                raise ValueError(f"label {key[:63]!r} holds a private key; labels are "
                                 "published on every node, never put a secret there")
            if not _LABEL.match(key):
                raise ValueError(f"label name {key[:80]!r} is not a Kubernetes label name: "
                                 "letters, digits, '-', '_' and '.', at most 63 characters")
            if text and not _LABEL.match(text):
                raise ValueError(f"label {key}: value {text[:80]!r} is not a Kubernetes label "
                                 "value: letters, digits, '-', '_' and '.', at most 63 "
                                 "characters, starting and ending with a letter or digit")
        return value

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, value: str, info: ValidationInfo) -> str:
        if value not in KNOWN_GPU_MODELS and not (info.context or {}).get("stored"):
            known = ", ".join(KNOWN_GPU_MODELS)
            raise ValueError(f"unknown GPU model {value!r}; use one of {known}")
        return value


class KubernetesSettings(Frozen):
    """What Kubespray needs to lay the cluster out; defaults are Kubespray's."""

    version: str | None = Field(
        default=None, description="Kubernetes version (1.34.3; a leading v is accepted); "
        "default: the newest the Kubespray release builds. Checked against that release's "
        "supported versions at plan time")
    pod_cidr: str = "10.233.64.0/18"
    service_cidr: str = "10.233.0.0/18"
    node_cidr_prefix: int | None = Field(
        default=None, ge=8, le=128, description="each node's share of pod_cidr (Kubespray's "
        "kube_network_node_prefix); default Kubespray's: 24 for IPv4, 120 for IPv6")
    dns_domain: str = Field(
        default="cluster.local", description="the cluster's DNS domain (Kubespray's "
        "dns_domain); the Kubernetes driver's PRIMUS_K8S_CLUSTER_DOMAIN must match it")
    container_runtime: Literal["containerd", "crio", "docker"] = "containerd"
    network_plugin: Literal["calico", "cilium", "flannel", "kube-ovn"] = "calico"

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        return None if value is None else normal_kube_version(value)

    @field_validator("dns_domain")
    @classmethod
    def _dns_domain(cls, value: str) -> str:
        if not is_dns_subdomain(value):
            raise ValueError(f"{value[:80]!r} is not a DNS domain: lower-case labels of letters, "
                             "digits and '-' joined by '.', e.g. cluster.local")
        return value

    @field_validator("pod_cidr", "service_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            net = ipaddress.ip_network(value.strip())
        except ValueError as exc:
            hint = ("the address has bits set past the prefix: write the network's first "
                    "address" if "host bits" in str(exc) else "write e.g. 10.233.64.0/18")
            raise ValueError(f"{value[:80]!r} is not a network ({hint})") from None
        return str(net)

    @model_validator(mode="after")
    def _one_family(self) -> KubernetesSettings:
        pods, services = (ipaddress.ip_network(self.pod_cidr),
                          ipaddress.ip_network(self.service_cidr))
        if pods.version != services.version:
            raise ValidationError.from_exception_data("KubernetesSettings", [InitErrorDetails(
                type=PydanticCustomError("hosts", "{message}", {"message": (
                    f"service_cidr {services} is IPv{services.version} but pod_cidr {pods} is "
                    f"IPv{pods.version}; give both ranges in one address family")}),
                loc=("service_cidr",), input=None)])
        return self


class HostsFile(Frozen):
    cluster: str = "local"
    provision: bool = Field(
        default=False, description="build Kubernetes on these nodes with Kubespray")
    kubernetes: KubernetesSettings | None = None
    nodes: list[HostSpec] = Field(min_length=1)

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        return check_key(value, "cluster name")

    @property
    def provisioned(self) -> bool:
        """Whether this file describes a cluster the platform builds itself."""
        return self.provision or self.kubernetes is not None

    @property
    def k8s(self) -> KubernetesSettings:
        return self.kubernetes or KubernetesSettings()

    @model_validator(mode="wrap")
    @classmethod
    def _every_name(cls, data: Any, handler: Any) -> HostsFile:
        """Host names are judged on the raw file too, so a bad name is
        listed (with its fix) even when another field's error stops the
        whole-file checks below: every bad name at once."""
        try:
            return handler(data)  # type: ignore[no-any-return]
        except ValidationError as exc:
            names = _raw_name_problems(data)
            if not names:
                raise
            errors = [InitErrorDetails(type=PydanticCustomError(e["type"], "{message}", {
                "message": e["msg"].removeprefix("Value error, ")}), loc=e["loc"], input=None)
                for e in exc.errors() if tuple(e["loc"]) not in names]
            errors += [InitErrorDetails(type=PydanticCustomError("hosts", "{message}", {
                "message": message}), loc=loc, input=None) for loc, message in names.items()]
            raise ValidationError.from_exception_data(cls.__name__, errors) from None

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> HostsFile:
        # A Kubespray release in the context (``bootstrap plan|apply``) adds
        # its own rules: supported Kubernetes versions, address space.
        found = problems(self, (info.context or {}).get("kubespray"))
        if found:
            raise ValidationError.from_exception_data("HostsFile", [
                InitErrorDetails(type=PydanticCustomError("hosts", message),
                                 loc=loc, input=None)
                for loc, message in found])
        return self


Problem = tuple[tuple[str | int, ...], str]


def _hostname_problem(name: str) -> str:
    return (f"{name[:80]!r} is not a host name Kubespray and Kubernetes accept (lower-case "
            "letters, digits and '-', at most 63 characters, starting and ending with a letter "
            f"or digit); write {hostname_fix(name)!r}")


def _raw_name_problems(data: Any) -> dict[tuple[str | int, ...], str]:
    """Bad host names in a raw hosts file that asks for provisioning."""
    if not isinstance(data, dict) or not (data.get("provision") is True or data.get("kubernetes")):
        return {}
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        return {}
    return {("nodes", i, "name"): _hostname_problem(node["name"])
            for i, node in enumerate(nodes) if isinstance(node, dict)
            and isinstance(node.get("name"), str) and not HOSTNAME.match(node["name"])}


def problems(hosts: HostsFile, release: KubesprayRelease | None = None) -> list[Problem]:
    """Every cross-field problem, each at its path (pure; the order is the
    file's); with ``release``, also what that Kubespray release refuses."""
    out: list[Problem] = []
    for attr in ("name", "ip"):
        seen: dict[str, list[int]] = defaultdict(list)
        for i, node in enumerate(hosts.nodes):
            seen[getattr(node, attr)].append(i)
        for value, where in seen.items():
            for i in where[1:]:
                out.append((("nodes", i, attr),
                            f"duplicate node {attr} {value!r} (also nodes.{where[0]}); "
                            "each must be unique"))
    if not hosts.provisioned:
        return out
    why = "required because the file asks for provisioning (provision: true or kubernetes:)"
    control = [n for n in hosts.nodes if "control-plane" in n.roles]
    etcd = [n for n in hosts.nodes if "etcd" in n.roles]
    if not control:
        out.append((("nodes",), f"no node has the role control-plane; {why}"))
    if not etcd or len(etcd) % 2 == 0:
        out.append((("nodes",), f"{len(etcd)} etcd member(s): etcd needs an odd number "
                    f"(1, 3 or 5) to keep quorum; {why}"))
    k8s = hosts.k8s
    pods, services = ipaddress.ip_network(k8s.pod_cidr), ipaddress.ip_network(k8s.service_cidr)
    if pods.version == services.version and pods.overlaps(services):  # type: ignore[arg-type]
        out.append((("kubernetes", "service_cidr"),
                    f"{k8s.service_cidr} overlaps pod_cidr {k8s.pod_cidr}; pick disjoint ranges"))
    for i, node in enumerate(hosts.nodes):
        if not HOSTNAME.match(node.name):
            out.append((("nodes", i, "name"), _hostname_problem(node.name)))
        ip = ipaddress.ip_address(node.ip)
        for label, net in (("pod_cidr", pods), ("service_cidr", services)):
            if ip.version == net.version and ip in net:
                out.append((("nodes", i, "ip"),
                            f"{node.ip} lies inside {label} {net}; move the range or the node"))
    if release is not None:
        out.extend(_release_problems(hosts, release, pods))
    return out


def _release_problems(hosts: HostsFile, release: KubesprayRelease,
                      pods: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[Problem]:
    """What Kubespray ``release`` itself would refuse (its validate_inventory
    role), said here with the hosts file's own fields."""
    k8s = hosts.k8s
    out: list[Problem] = []
    if why := release.kube_version_problem(k8s.version):
        out.append((("kubernetes", "version"), why))
    prefix = k8s.node_cidr_prefix or (release.kube_network_node_prefix if pods.version == 4
                                      else release.kube_network_node_prefix_ipv6)
    if prefix < pods.prefixlen or prefix > pods.max_prefixlen:
        out.append((("kubernetes", "node_cidr_prefix"),
                    f"/{prefix} does not fit inside pod_cidr {pods}; give a prefix between "
                    f"{pods.prefixlen} and {pods.max_prefixlen}"))
        return out
    cluster = sum(1 for n in hosts.nodes if {"control-plane", "worker"} & set(n.roles))
    # Calico hands out blocks on demand; the others give each node one
    # fixed /prefix of pod_cidr, so pod_cidr bounds the node count.
    if k8s.network_plugin != "calico" and 2 ** (prefix - pods.prefixlen) < cluster:
        need = prefix - (cluster - 1).bit_length()
        out.append((("kubernetes", "pod_cidr"),
                    f"{pods} split into /{prefix} per node holds {2 ** (prefix - pods.prefixlen)}"
                    f" node(s), but {cluster} join the cluster ({k8s.network_plugin}); widen "
                    f"it to /{need} or larger, or raise node_cidr_prefix"))
    if pods.version == 4 and k8s.network_plugin != "calico" and (
            release.kubelet_max_pods > 2 ** (32 - prefix) - 2):
        out.append((("kubernetes", "node_cidr_prefix"),
                    f"/{prefix} per node leaves {2 ** (32 - prefix) - 2} pod addresses, fewer "
                    f"than the {release.kubelet_max_pods} pods a node may run; use /"
                    f"{32 - (release.kubelet_max_pods + 2 - 1).bit_length()} or a shorter prefix"))
    return out


def hosts_json_schema() -> dict[str, Any]:
    """The hosts file's JSON Schema, for editors and other tools."""
    schema = HostsFile.model_json_schema()
    schema["$id"] = "https://primus-safe.dev/proto/hosts.schema.json"
    schema["title"] = "Primus-SaFE hosts file"
    return schema


def render_hosts_schema() -> str:
    return json.dumps(hosts_json_schema(), indent=2, sort_keys=True) + "\n"


def local_hosts(count: int, *, gpus_per_node: int = 1) -> HostsFile:
    """Hosts for the embedded stack: ``count`` nodes on this machine, each
    offering its CPU as ``gpus_per_node`` device slot(s), two per rack."""
    return HostsFile(
        cluster="embedded",
        nodes=[
            HostSpec(
                name=f"node-{i}",
                ip=f"127.0.0.{i + 1}",
                labels={"rack": f"r{(i - 1) // 2 + 1}", "switch": "s1"},
                gpu_model="cpu",
                gpu_count=gpus_per_node,
            )
            for i in range(1, count + 1)
        ],
    )
