"""Renders a hosts file into the inventory Kubespray reads (pure).

Kept apart from provisioning so ``plan`` can show exactly what ``apply``
would write, and tests can check the inventory with ``ansible-inventory``
without touching a machine. Output is a mapping of relative path → text, in
a stable order, so re-rendering an unchanged hosts file changes no file.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import yaml

from libs.gc_pause import paused_gc
from libs.inventory import HostsFile, HostSpec, looks_like_a_key
from libs.kubespray import KubesprayRelease, inventory_problems, newest

# Kubespray's group names for our roles.
_GROUPS = {"control-plane": "kube_control_plane", "etcd": "etcd", "worker": "kube_node"}


def _vendor(gpu_model: str) -> str:
    if gpu_model.startswith("MI"):
        return "amd"
    return "none" if gpu_model == "cpu" else "nvidia"


def _host_vars(host: HostSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"access_ip": host.ip, "ansible_host": host.ip}
    if host.ssh_user:
        out["ansible_user"] = host.ssh_user
    if host.ssh_key and host.ssh_key.startswith("secret:"):
        # the name only: whoever runs the playbooks mounts that Secret
        out["primus_ssh_key_secret"] = host.ssh_key.removeprefix("secret:")
    elif host.ssh_key:
        out["ansible_ssh_private_key_file"] = host.ssh_key
    labels = {f"primus-safe/{k}": v for k, v in sorted(host.labels.items())}
    labels["primus-safe/gpu-model"] = host.gpu_model
    labels["primus-safe/gpu-vendor"] = _vendor(host.gpu_model)
    labels["primus-safe/gpu-count"] = str(host.gpu_count)
    out["node_labels"] = dict(sorted(labels.items()))
    out["ip"] = host.ip
    return dict(sorted(out.items()))  # stable text: the dump keeps this order


def kubespray_inventory(hosts: HostsFile) -> dict[str, Any]:
    """Kubespray's YAML inventory: every host once under ``all.hosts``, then
    the role groups and ``k8s_cluster`` (control plane + workers). Hosts keep
    the hosts file's order: ``kube_control_plane[0]`` is the node that
    initialises the cluster, and Kubespray does not support changing it."""
    children: dict[str, Any] = {g: {"hosts": {}} for g in _GROUPS.values()}
    for host in hosts.nodes:
        for role in host.roles:
            children[_GROUPS[role]]["hosts"][host.name] = None
    children["k8s_cluster"] = {"children": {"kube_control_plane": None, "kube_node": None}}
    children["calico_rr"] = {"hosts": {}}
    return {"all": {"hosts": {h.name: _host_vars(h) for h in hosts.nodes},
                    "children": children}}


def group_vars(hosts: HostsFile, release: KubesprayRelease | None = None
               ) -> dict[str, dict[str, Any]]:
    """``k8s_cluster/k8s-cluster.yml`` for ``release`` (default: the newest
    supported): ``kube_version`` in its form, the pod and service ranges in
    the variables of their address family, and the DNS domain apart from the
    cluster's name (Kubespray's ``dns_domain`` defaults to ``cluster_name``)."""
    release = release or newest()
    k8s = hosts.k8s
    pods = ipaddress.ip_network(k8s.pod_cidr)
    out: dict[str, Any] = {
        "kube_version": release.kube_version_value(k8s.version),
        "container_manager": k8s.container_runtime,
        "kube_network_plugin": k8s.network_plugin,
        "cluster_name": hosts.cluster,
        "dns_domain": k8s.dns_domain,
        "helm_enabled": True,
    }
    if pods.version == 4:
        out |= {"kube_pods_subnet": k8s.pod_cidr, "kube_service_addresses": k8s.service_cidr,
                "kube_network_node_prefix": k8s.node_cidr_prefix
                or release.kube_network_node_prefix}
    else:
        out |= {"ipv4_stack": False, "ipv6_stack": True,
                "kube_pods_subnet_ipv6": k8s.pod_cidr,
                "kube_service_addresses_ipv6": k8s.service_cidr,
                "kube_network_node_prefix_ipv6": k8s.node_cidr_prefix
                or release.kube_network_node_prefix_ipv6}
    return {"k8s_cluster/k8s-cluster.yml": out}


# libyaml's C emitter when present: the pure-Python one took most of a
# 10,000-node ``bootstrap plan``; both write the same text for these documents.
_Dumper: type[Any] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml(doc: Any, *, sort_keys: bool = True) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=sort_keys, default_flow_style=False)


def render(hosts: HostsFile, release: KubesprayRelease | None = None) -> dict[str, str]:
    """Every file ``apply`` writes for Kubespray ``release`` (default: the
    newest supported), as relative path → text (stable order)."""
    with paused_gc():  # many short-lived nodes, no garbage: see libs/gc_pause.py
        return _render(hosts, release)


def _render(hosts: HostsFile, release: KubesprayRelease | None) -> dict[str, str]:
    base = f"inventory/{hosts.cluster}"
    # Not sorted: group members keep the file's order (host variables are
    # built in sorted order, so the text is still stable).
    files = {f"{base}/hosts.yaml": _yaml(kubespray_inventory(hosts), sort_keys=False)}
    for rel, doc in group_vars(hosts, release).items():
        files[f"{base}/group_vars/{rel}"] = _yaml(doc)
    for path, text in files.items():
        # HostsFile refuses inline keys; this holds even for a model built
        # without validation, since these files are copied and committed.
        if looks_like_a_key(text):
            raise ValueError(f"{path} would contain a private key; refusing to render it")
    return dict(sorted(files.items()))


def kubespray_refusals(files: dict[str, str], cluster: str,
                       release: KubesprayRelease | None = None) -> list[str]:
    """What Kubespray ``release`` would refuse in rendered ``files`` (its
    validate_inventory rules): empty for every valid hosts file. Checked
    before anything is written, so a renderer change Kubespray would reject
    fails at plan time, not in the middle of a playbook."""
    base = f"inventory/{cluster}"
    inventory = yaml.load(files[f"{base}/hosts.yaml"], Loader=_Loader)
    variables: dict[str, Any] = {}
    for path, text in files.items():
        if path.startswith(f"{base}/group_vars/"):
            variables |= yaml.load(text, Loader=_Loader) or {}
    return inventory_problems(release or newest(), inventory, variables)
