"""The Kubespray releases bootstrap renders for, and the rules each enforces
on an inventory (pure).

Kubespray changes what it accepts from one release to the next: v2.28
dropped the ``v`` of ``kube_version`` (``1.34.3``, not ``v1.34.3``), every
release supports only the Kubernetes versions whose checksums it carries
(``roles/kubespray_defaults/vars/main/checksums.yml``), and each needs its
own ansible-core (``playbooks/ansible_version.yml``). So the renderer is
pinned to a range of releases, and a hosts file is checked against the one
it will run with before anything is written.

The figures below come from the release tags of
https://github.com/kubernetes-sigs/kubespray (v2.30.0 and v2.31.0):
``kubelet_checksums['amd64']`` keys (newest first; ``kube_version``
defaults to the first, ``kube_version_min_required`` is the last),
``playbooks/ansible_version.yml`` (minimal/maximal ansible version),
``roles/validate_inventory/tasks/main.yml`` (network plugins, container
managers, removed variables) and ``roles/kubespray_defaults/defaults/main/
main.yml`` (``kube_network_node_prefix``, ``kubelet_max_pods`` default).
A checkout of a later patch release (v2.31.1) carries more patch versions:
``with_kube_versions`` takes the list from the checkout itself.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

# Kubespray's hostname rule (roles/kubernetes/preinstall/tasks/0040-verify-
# settings.yml, "Stop if bad hostname") is RFC 1123 subdomains; the hosts
# file holds each name to one label, the node name Kubernetes shows.
HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KUBE_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.lstrip("v").split("."))


@dataclass(frozen=True)
class KubesprayRelease:
    """What one Kubespray release accepts."""

    series: str  # "2.31"
    kube_versions: tuple[str, ...]  # newest first, without the "v"
    ansible_core: tuple[str, str]  # [minimal, maximal) ansible-core version
    version: str = ""  # the exact release read from a checkout, e.g. "2.31.0"
    kube_version_v_prefix: bool = False  # kube_version written "v1.x.y" (before v2.28)
    network_plugins: tuple[str, ...] = (
        "calico", "flannel", "cloud", "cilium", "cni", "kube-ovn", "kube-router", "macvlan",
        "custom_cni", "none")
    container_managers: tuple[str, ...] = ("docker", "crio", "containerd")
    removed_vars: tuple[str, ...] = ()
    kube_network_node_prefix: int = 24
    kube_network_node_prefix_ipv6: int = 120
    kubelet_max_pods: int = 110

    @property
    def name(self) -> str:
        return f"Kubespray v{self.version or self.series}"

    @property
    def default_kube_version(self) -> str:
        return self.kube_versions[0]

    @property
    def kube_range(self) -> str:
        return f"{self.kube_versions[-1]} to {self.kube_versions[0]}"

    def kube_version_value(self, version: str | None) -> str:
        """``kube_version`` as this release wants it written."""
        plain = normal_kube_version(version) if version else self.default_kube_version
        return f"v{plain}" if self.kube_version_v_prefix else plain

    def with_kube_versions(self, versions: Sequence[str], version: str) -> KubesprayRelease:
        """This release's rules with the versions a checkout itself lists."""
        plain = tuple(sorted({normal_kube_version(v) for v in versions}, key=_v, reverse=True))
        return replace(self, kube_versions=plain or self.kube_versions, version=version)

    def kube_version_problem(self, version: str | None) -> str | None:
        """Why ``version`` cannot be built by this release, or None."""
        if version is None:
            return None
        plain = normal_kube_version(version)
        if plain in self.kube_versions:
            return None
        minor = ".".join(plain.split(".")[:2])
        same_minor = [v for v in self.kube_versions if v.startswith(minor + ".")]
        if same_minor:
            hint = f"{minor} patches it has: {', '.join(same_minor)}"
        elif _v(plain) < _v(self.kube_versions[-1]):
            hint = (f"{plain} is older than {self.kube_versions[-1]}, the oldest it supports; "
                    "use an older Kubespray release to build it, or upgrade")
        else:
            hint = f"{plain} is newer than it knows"
        return (f"Kubernetes {plain} is not supported by {self.name}, which builds "
                f"{self.kube_range} ({hint}); leave version out for "
                f"{self.default_kube_version}")


# Common to both supported releases: Kubernetes versions of each tag's
# checksums.yml (kubeadm, kubelet and kubectl list the same ones).
RELEASES: dict[str, KubesprayRelease] = {
    "2.30": KubesprayRelease(
        series="2.30", ansible_core=("2.17.3", "2.18.0"),
        kube_versions=(
            "1.34.3", "1.34.2", "1.34.1", "1.34.0", "1.33.7", "1.33.6", "1.33.5", "1.33.4",
            "1.33.3", "1.33.2", "1.33.1", "1.33.0", "1.32.11", "1.32.10", "1.32.9", "1.32.8",
            "1.32.7", "1.32.6", "1.32.5", "1.32.4", "1.32.3", "1.32.2", "1.32.1", "1.32.0")),
    "2.31": KubesprayRelease(
        series="2.31", ansible_core=("2.18.0", "2.19.0"),
        removed_vars=("kubelet_static_pod_path",),
        kube_versions=(
            "1.35.4", "1.35.3", "1.35.2", "1.35.1", "1.35.0", "1.34.7", "1.34.6", "1.34.5",
            "1.34.4", "1.34.3", "1.34.2", "1.34.1", "1.34.0", "1.33.11", "1.33.10", "1.33.9",
            "1.33.8", "1.33.7", "1.33.6", "1.33.5", "1.33.4", "1.33.3", "1.33.2", "1.33.1",
            "1.33.0")),
}


class UnsupportedRelease(ValueError):
    """A Kubespray release the renderer was not built for."""


def supported_list() -> str:
    return ", ".join(f"v{s}.x" for s in RELEASES)


def newest() -> KubesprayRelease:
    return RELEASES[max(RELEASES, key=_v)]


def release_for(version: str) -> KubesprayRelease:
    """The rules of Kubespray ``version`` ("v2.31.0", "2.31.1"); raises
    UnsupportedRelease naming the supported ones."""
    m = _RELEASE.match(version.strip())
    if m is None:
        raise UnsupportedRelease(f"{version[:40]!r} is not a Kubespray release (like v2.31.0); "
                                 f"supported: {supported_list()}")
    series = f"{m[1]}.{m[2]}"
    if series not in RELEASES:
        raise UnsupportedRelease(f"Kubespray v{version.strip().lstrip('v')} is not supported; "
                                 f"check out one of {supported_list()} (e.g. git checkout "
                                 f"v{newest().series}.0)")
    exact = version.strip().lstrip("v")
    return replace(RELEASES[series], version=exact if m[3] is not None else "")


def normal_kube_version(text: str) -> str:
    """``1.34.3`` from ``v1.34.3`` or ``1.34.3``; ValueError otherwise."""
    m = _KUBE_VERSION.match(str(text).strip())
    if m is None:
        raise ValueError(f"{str(text)[:40]!r} is not a Kubernetes version; write e.g. 1.34.3")
    return f"{int(m[1])}.{int(m[2])}.{int(m[3])}"


def hostname_fix(name: str) -> str:
    """A name Kubespray and Kubernetes accept, close to ``name``."""
    clean = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return clean or "node"


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and bool(_DNS_SUBDOMAIN.match(text))


# ------------------------------------------------------------------ inventory rules


def _network(text: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(text))
    except ValueError:
        return None


def inventory_problems(release: KubesprayRelease, inventory: Mapping[str, Any],
                       variables: Mapping[str, Any]) -> list[str]:
    """The asserts of Kubespray's ``validate_inventory`` role and its
    hostname check, over a rendered inventory (``hosts.yaml`` as parsed)
    and the variables its group_vars set. Each message names the rule as
    Kubespray's task does. Kubespray's defaults fill what is not set."""
    groups = _groups(inventory)
    var = {"kube_network_plugin": "calico", "container_manager": "containerd",
           "etcd_deployment_type": "host", "kube_proxy_mode": "ipvs", "dns_mode": "coredns",
           "kube_network_node_prefix": release.kube_network_node_prefix,
           "kube_network_node_prefix_ipv6": release.kube_network_node_prefix_ipv6,
           "ipv4_stack": True, "ipv6_stack": False, "helm_enabled": False,
           "kubelet_max_pods": release.kubelet_max_pods,
           "kube_version": release.default_kube_version, **variables}
    out: list[str] = []
    if removed := sorted(set(var) & set(release.removed_vars)):
        out.append(f"Fail if removed variables are used: {', '.join(removed)}")
    if not groups.get("kube_control_plane"):
        out.append("Stop if kube_control_plane group is empty")
    if not groups.get("etcd") and var["etcd_deployment_type"] != "kubeadm":
        out.append("Stop if etcd group is empty in external etcd mode")
    etcd = groups.get("etcd") or groups.get("kube_control_plane") or []
    if len(etcd) % 2 == 0:
        out.append(f"Stop if even number of etcd hosts ({len(etcd)})")
    out.extend(_version_problems(release, var))
    for key in ("helm_enabled", "download_run_once", "download_always_pull",
                "openstack_lbaas_enabled"):
        if key in var and not isinstance(var[key], bool):
            out.append(f"Stop if known booleans are set as strings: {key}={var[key]!r}")
    out.extend(_network_problems(var, len(_k8s_cluster(groups))))
    plugin, runtime = var["kube_network_plugin"], var["container_manager"]
    if plugin not in release.network_plugins:
        out.append(f"Stop if unsupported options selected: kube_network_plugin {plugin!r}")
    if runtime not in release.container_managers:
        out.append(f"Stop if unsupported options selected: container_manager {runtime!r}")
    if var["etcd_deployment_type"] == "docker" and runtime != "docker":
        out.append("Stop if unsupported options selected: etcd in docker needs docker")
    for host in inventory.get("all", {}).get("hosts") or {}:
        if not _DNS_SUBDOMAIN.match(str(host)):
            out.append(f"Stop if bad hostname: {host}")
    return out


def _version_problems(release: KubesprayRelease, var: Mapping[str, Any]) -> list[str]:
    text = str(var["kube_version"])
    if text.startswith("v") != release.kube_version_v_prefix:
        # Its checksums are keyed by the version in the release's own form.
        form = "with" if release.kube_version_v_prefix else "without"
        return [f"Download_file | Check if requested Kubernetes are supported: {text!r} "
                f"({release.name} writes kube_version {form} a leading 'v')"]
    plain = text.lstrip("v")
    out = []
    if not _KUBE_VERSION.match(plain) or _v(plain) < _v(release.kube_versions[-1]):
        out.append(f"Stop if unsupported version of Kubernetes: {text} is below "
                   f"kube_version_min_required {release.kube_versions[-1]}")
    elif plain not in release.kube_versions:
        out.append(f"Download_file | Check if requested Kubernetes are supported: {text} "
                   "has no checksums")
    return out


def _network_problems(var: Mapping[str, Any], nodes: int) -> list[str]:
    out = []
    plugin = var["kube_network_plugin"]
    stacks = [(4, "", var["kube_network_node_prefix"])] if var["ipv4_stack"] else []
    if var["ipv6_stack"]:
        stacks.append((6, "_ipv6", var["kube_network_node_prefix_ipv6"]))
    for family, suffix, node_prefix in stacks:
        pods = _network(var.get(f"kube_pods_subnet{suffix}", "10.233.64.0/18"))
        services = _network(var.get(f"kube_service_addresses{suffix}", "10.233.0.0/18"))
        if services is None or services.version != family:
            out.append(f"Check that kube_service_addresses{suffix} is a network range")
        if pods is None or pods.version != family:
            out.append(f"Check that kube_pods_subnet{suffix} is a network range")
            continue
        # Stricter than Kubespray's ipaddr() test, which only catches a pod
        # range inside the service range: any overlap breaks routing.
        if services is not None and services.version == family and pods.overlaps(services):  # type: ignore[arg-type]
            out.append(f"Check that kube_pods_subnet{suffix} does not collide with "
                       f"kube_service_addresses{suffix}")
        if plugin != "calico" and 2 ** (int(node_prefix) - pods.prefixlen) < nodes:
            out.append(f"Check that ipv{family} IP range is enough for the nodes: /"
                       f"{pods.prefixlen} split in /{node_prefix} per node holds "
                       f"{2 ** max(0, int(node_prefix) - pods.prefixlen)}, not {nodes}")
        if family == 4 and plugin not in ("calico", "none") and (
                int(var["kubelet_max_pods"]) > 2 ** (32 - int(node_prefix)) - 2):
            out.append("Guarantee that enough network address space is available for all pods")
    return out


def _groups(inventory: Mapping[str, Any]) -> dict[str, list[str]]:
    """Group name -> its hosts in inventory order (children not expanded
    except k8s_cluster's, which _k8s_cluster handles)."""
    children = (inventory.get("all") or {}).get("children") or {}
    return {name: list((body or {}).get("hosts") or {}) for name, body in children.items()}


def _k8s_cluster(groups: Mapping[str, list[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for group in ("kube_control_plane", "kube_node"):
        seen.update(dict.fromkeys(groups.get(group, [])))
    return list(seen)
