"""Renders a hosts file into the files Kubespray and Helm read (pure).

Kept apart from provisioning so ``plan`` can show exactly what ``apply``
would write, and tests can check the inventory with ``ansible-inventory``
without touching a machine. Output is a mapping of relative path → text, in
a stable order, so re-rendering an unchanged hosts file changes no file.
"""

from __future__ import annotations

from typing import Any

import yaml

from libs.inventory import HostsFile, HostSpec, looks_like_a_key
from libs.yaml_files import paused_gc

# Kubespray's group names for our roles.
_GROUPS = {"control-plane": "kube_control_plane", "etcd": "etcd", "worker": "kube_node"}

# The add-ons the platform expects on a cluster it builds; each gets its own
# values file so an operator can review or override one without the others.
ADDONS = ("juicefs", "harbor", "higress", "amd-gpu-operator", "nats", "clickhouse")


def _vendor(gpu_model: str) -> str:
    if gpu_model.startswith("MI"):
        return "amd"
    return "none" if gpu_model == "cpu" else "nvidia"


def _host_vars(host: HostSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"ansible_host": host.ip, "ip": host.ip, "access_ip": host.ip}
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
    out["node_labels"] = labels
    return out


def kubespray_inventory(hosts: HostsFile) -> dict[str, Any]:
    """Kubespray's YAML inventory: every host once under ``all.hosts``, then
    the role groups and ``k8s_cluster`` (control plane + workers)."""
    children: dict[str, Any] = {g: {"hosts": {}} for g in _GROUPS.values()}
    for host in hosts.nodes:
        for role in host.roles:
            children[_GROUPS[role]]["hosts"][host.name] = None
    children["k8s_cluster"] = {"children": {"kube_control_plane": None, "kube_node": None}}
    children["calico_rr"] = {"hosts": {}}
    return {"all": {"hosts": {h.name: _host_vars(h) for h in hosts.nodes},
                    "children": children}}


def group_vars(hosts: HostsFile) -> dict[str, dict[str, Any]]:
    k8s = hosts.k8s
    return {
        "all/all.yml": {"cluster_name": f"{hosts.cluster}.local"},
        "k8s_cluster/k8s-cluster.yml": {
            "kube_version": k8s.version,
            "kube_pods_subnet": k8s.pod_cidr,
            "kube_service_addresses": k8s.service_cidr,
            "container_manager": k8s.container_runtime,
            "kube_network_plugin": k8s.network_plugin,
            "cluster_name": f"{hosts.cluster}.local",
            "helm_enabled": True,
        },
    }


def addon_values(hosts: HostsFile) -> dict[str, dict[str, Any]]:
    """Helm values per add-on: JuiceFS (with its metadata engine and object
    store), Harbor, Higress, the AMD GPU operator, NATS and ClickHouse."""
    gpu_nodes = sorted(h.name for h in hosts.nodes if h.gpu_model != "cpu" and h.gpu_count)
    return {
        "juicefs": {
            "storageClasses": [{
                "name": "juicefs", "enabled": True, "reclaimPolicy": "Retain",
                "backend": {
                    "name": hosts.cluster,
                    "metaurl": "redis://juicefs-meta-redis-master.storage:6379/1",
                    "storage": "minio",
                    "bucket": "http://juicefs-minio.storage:9000/juicefs",
                },
            }],
            "metadataEngine": {"kind": "redis", "release": "juicefs-meta-redis"},
            "objectStore": {"kind": "minio", "release": "juicefs-minio", "bucket": "juicefs"},
        },
        "harbor": {"expose": {"type": "ingress", "ingress": {
            "className": "higress", "hosts": {"core": f"harbor.{hosts.cluster}.local"}}},
            "externalURL": f"https://harbor.{hosts.cluster}.local",
            "persistence": {"persistentVolumeClaim": {"registry": {"storageClass": "juicefs"}}}},
        "higress": {"global": {"ingressClass": "higress"},
                    "higress-core": {"gateway": {"replicas": 2}}},
        "amd-gpu-operator": {
            "deviceConfig": {"spec": {"driver": {"enable": False},
                                      "devicePlugin": {"enableNodeLabeller": True},
                                      "metricsExporter": {"enable": True}}},
            "nodeSelector": {"primus-safe/gpu-vendor": "amd"},
            "expectedNodes": gpu_nodes,
        },
        "nats": {"config": {"jetstream": {"enabled": True, "fileStore": {
            "pvc": {"size": "20Gi", "storageClassName": "juicefs"}}},
            "cluster": {"enabled": True, "replicas": 3}}},
        "clickhouse": {"shards": 1, "replicaCount": 2,
                       "persistence": {"size": "200Gi"}, "keeper": {"enabled": True}},
    }


# libyaml's C emitter when present: the pure-Python one took most of a
# 10,000-node ``bootstrap plan``; both write the same text for these documents.
_Dumper: type[Any] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=True, default_flow_style=False)


def render(hosts: HostsFile) -> dict[str, str]:
    """Every file ``apply`` writes, as relative path → text (stable order)."""
    with paused_gc():  # many short-lived nodes, no garbage: see libs/yaml_files.py
        return _render(hosts)


def _render(hosts: HostsFile) -> dict[str, str]:
    base = f"inventory/{hosts.cluster}"
    files = {f"{base}/hosts.yaml": _yaml(kubespray_inventory(hosts))}
    for rel, doc in group_vars(hosts).items():
        files[f"{base}/group_vars/{rel}"] = _yaml(doc)
    for addon, doc in addon_values(hosts).items():
        files[f"{base}/addons/{addon}.values.yaml"] = _yaml(doc)
    for path, text in files.items():
        # HostsFile refuses inline keys; this holds even for a model built
        # without validation, since these files are copied and committed.
        if looks_like_a_key(text):
            raise ValueError(f"{path} would contain a private key; refusing to render it")
    return dict(sorted(files.items()))
