"""What applying a hosts file would change (pure).

Re-applying an edited file must touch only what differs: new nodes are
registered, changed nodes re-registered (and re-proven), removed nodes
drained then removed, and only the rendered files whose text changed are
rewritten. ``plan`` prints this; ``apply`` and the service act on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from libs.inventory import HostsFile, HostSpec
from libs.records import JobRecord

NodeAction = Literal["add", "update", "remove"]
FileAction = Literal["create", "update", "delete"]


@dataclass(frozen=True)
class NodeChange:
    node: str
    action: NodeAction
    fields: tuple[str, ...] = ()  # for updates: which fields differ


@dataclass(frozen=True)
class FileChange:
    path: str
    action: FileAction


@dataclass(frozen=True)
class Hazard:
    """A change Kubespray cannot carry out safely on a running cluster;
    ``apply`` (and ``plan``) refuse it unless the operator passes ``flag``."""

    message: str
    flag: str


@dataclass(frozen=True)
class Plan:
    nodes: tuple[NodeChange, ...] = ()
    files: tuple[FileChange, ...] = ()
    cluster: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # setting: (old, new)
    hazards: tuple[Hazard, ...] = ()

    def refused(self, allowed: Iterable[str]) -> list[Hazard]:
        """The hazards the operator did not allow with their flag."""
        given = set(allowed)
        return [h for h in self.hazards if h.flag not in given]

    @property
    def empty(self) -> bool:
        return not (self.nodes or self.files or self.cluster)

    def removed(self) -> list[str]:
        return [c.node for c in self.nodes if c.action == "remove"]


def diff_nodes(old: dict[str, HostSpec], new: HostsFile) -> list[NodeChange]:
    """Node changes from the recorded hosts to the new file, in file order,
    removals last (they wait for a drain)."""
    out: list[NodeChange] = []
    wanted = {h.name: h for h in new.nodes}
    for host in new.nodes:
        before = old.get(host.name)
        if before is None:
            out.append(NodeChange(host.name, "add"))
        elif before != host:
            a, b = before.model_dump(), host.model_dump()
            out.append(NodeChange(host.name, "update", tuple(k for k in b if a.get(k) != b[k])))
    out.extend(NodeChange(name, "remove") for name in sorted(old) if name not in wanted)
    return out


def diff_files(old: dict[str, str], new: dict[str, str]) -> list[FileChange]:
    out = [FileChange(p, "create" if p not in old else "update")
           for p, text in new.items() if old.get(p) != text]
    out.extend(FileChange(p, "delete") for p in sorted(old) if p not in new)
    return out


def diff_cluster(old: HostsFile | None, new: HostsFile) -> dict[str, tuple[Any, Any]]:
    before = old.k8s.model_dump() if old is not None and old.provisioned else {}
    after = new.k8s.model_dump() if new.provisioned else {}
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)}


FIRST_CONTROL_PLANE_FLAG = "--allow-first-control-plane-change"
DNS_DOMAIN_FLAG = "--allow-dns-domain-change"


def _first_control_plane(hosts: HostsFile) -> str | None:
    return next((n.name for n in hosts.nodes if "control-plane" in n.roles), None)


def _built_domain(old_files: dict[str, str]) -> str | None:
    """The DNS domain the cluster was built with, from the k8s-cluster.yml
    last written: ``dns_domain``, or ``cluster_name`` (Kubespray's default
    for it, which renderers before ``dns_domain`` existed set)."""
    for path, text in old_files.items():
        if path.endswith("group_vars/k8s_cluster/k8s-cluster.yml"):
            doc = yaml.safe_load(text) or {}
            return str(doc.get("dns_domain") or doc.get("cluster_name") or "cluster.local")
    return None


def hazards(old: HostsFile | None, new: HostsFile, old_files: dict[str, str]) -> list[Hazard]:
    """Changes to a built cluster that Kubespray documents as unsupported
    in place: a different ``kube_control_plane[0]`` (the node that
    initialised the cluster; see Kubespray's docs/operations/nodes.md) and a
    different DNS domain (every Service name and certificate SAN changes)."""
    if old is None or not old.provisioned or not new.provisioned:
        return []
    out = []
    before, after = _first_control_plane(old), _first_control_plane(new)
    if before is not None and before != after:
        where = ("is no longer in the file" if before not in {n.name for n in new.nodes}
                 else "is no longer the first control-plane node in the file")
        out.append(Hazard(
            f"kube_control_plane[0] would change from {before} to {after}: {before} {where}. "
            "Kubespray does not support changing the first control-plane node in place; keep "
            f"{before} first (add new control-plane nodes after it), or follow Kubespray's "
            f"'Replacing a first control plane node' procedure and pass "
            f"{FIRST_CONTROL_PLANE_FLAG}", FIRST_CONTROL_PLANE_FLAG))
    built = _built_domain(old_files)
    if built is not None and built != new.k8s.dns_domain:
        out.append(Hazard(
            f"the cluster's DNS domain would change from {built} to {new.k8s.dns_domain}: "
            f"every Service address changes; set kubernetes.dns_domain: {built} to keep it, or "
            f"pass {DNS_DOMAIN_FLAG} if the cluster is to be rebuilt", DNS_DOMAIN_FLAG))
    return out


def make_plan(old: HostsFile | None, new: HostsFile, *, old_files: dict[str, str],
              new_files: dict[str, str], live: dict[str, HostSpec] | None = None) -> Plan:
    """``live`` (the nodes bootstrap knows, from its ``nodes`` bucket) wins
    over the last applied file for nodes: it is what the platform acts on.
    Cluster settings are not in the bucket, so they come from ``old``."""
    recorded = live if live is not None else (
        {h.name: h for h in old.nodes} if old is not None else {})
    return Plan(nodes=tuple(diff_nodes(recorded, new)),
                files=tuple(diff_files(old_files, new_files)),
                cluster=diff_cluster(old, new),
                hazards=tuple(hazards(old, new, old_files)))


_MARK = {"add": "+", "create": "+", "update": "~", "remove": "-", "delete": "-"}


def describe(plan: Plan) -> str:
    """The plan as lines an operator reads before ``apply``."""
    if plan.empty:
        return "no changes: the cluster matches the hosts file"
    lines = []
    for c in plan.nodes:
        extra = f" ({', '.join(c.fields)})" if c.fields else ""
        note = " after its jobs are moved away" if c.action == "remove" else ""
        lines.append(f"{_MARK[c.action]} node {c.node}{extra}{note}")
    for key, (a, b) in plan.cluster.items():
        lines.append(f"~ kubernetes.{key}: {a} -> {b}")
    lines.extend(f"{_MARK[f.action]} file {f.path}" for f in plan.files)
    lines.extend(f"! {h.message}" for h in plan.hazards)
    counts = {a: sum(1 for c in plan.nodes if c.action == a) for a in ("add", "update", "remove")}
    lines.append(f"{counts['add']} to add, {counts['update']} to change, "
                 f"{counts['remove']} to remove, {len(plan.files)} file(s) to write")
    return "\n".join(lines)


def as_json(plan: Plan) -> dict[str, Any]:
    return {
        "nodes": [{"node": c.node, "action": c.action, "fields": list(c.fields)}
                  for c in plan.nodes],
        "cluster": {k: {"old": a, "new": b} for k, (a, b) in plan.cluster.items()},
        "files": [{"path": f.path, "action": f.action} for f in plan.files],
        "hazards": [{"message": h.message, "flag": h.flag} for h in plan.hazards],
    }


def busy_jobs(job_records: Iterable[JobRecord], node: str) -> list[str]:
    """Jobs the ``jobs`` bucket still shows on ``node`` (running or stopping):
    a node is removed only when this is empty."""
    return sorted(r.id for r in job_records if r.holds_gpus and node in r.nodes)
