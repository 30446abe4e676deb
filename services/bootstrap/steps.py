"""Which Kubespray playbooks an ``apply`` runs, in order (pure).

Kubespray has one playbook per kind of change, and using the wrong one hurts:
``cluster.yml`` touches every node (slow on 1,000 nodes, and it restarts
components), ``scale.yml`` only joins workers (a control-plane or etcd node
needs ``cluster.yml``), and ``remove-node.yml`` must run while the node is
still in the inventory, with ``reset_nodes=false`` and
``allow_ungraceful_removal=true`` when the node is unreachable (it cannot be
reset). Keeping this a pure function of the plan lets it be tested as
scenarios and printed before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from libs.inventory import HostsFile
from services.bootstrap.plan import Plan

REMOVE_PLAYBOOK = "remove-node.yml"
SCALE_PLAYBOOK = "scale.yml"
# Where Kubespray keeps its facts playbook (older checkouts: the root).
FACTS_PLAYBOOKS = ("playbooks/facts.yml", "facts.yml")

StepKind = Literal["remove", "facts", "scale", "full"]


@dataclass(frozen=True)
class Step:
    kind: StepKind
    playbook: str
    nodes: tuple[str, ...] = ()  # the nodes this step is about (for results and events)
    limit: str | None = None  # ansible --limit
    extravars: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"-e {k}={v}" for k, v in sorted(self.extravars.items()))
        limit = f" --limit {self.limit}" if self.limit else ""
        return f"{self.playbook}{limit}{' ' + extra if extra else ''}"


def removal_vars(nodes: Iterable[str], *, reachable: bool) -> dict[str, Any]:
    """Kubespray's remove-node.yml extra vars: ``node`` (comma-separated)
    picks the nodes, ``skip_confirmation`` (and, for older checkouts,
    ``delete_nodes_confirmation``) answers its prompt, and a node that cannot
    be reached is deleted from Kubernetes without being reset."""
    out: dict[str, Any] = {"node": ",".join(sorted(nodes)), "skip_confirmation": True,
                           "delete_nodes_confirmation": "yes"}
    if not reachable:
        out |= {"reset_nodes": False, "allow_ungraceful_removal": True}
    return out


def kubespray_steps(plan: Plan, hosts: HostsFile, *, cluster_exists: bool,
                    unreachable: Iterable[str] = (), full_playbook: str = "cluster.yml",
                    facts_playbook: str | None = "facts.yml") -> list[Step]:
    """The playbooks for ``plan``: removals first (the node must still be in
    the inventory), then either scale.yml limited to new or changed workers,
    or the full playbook when there is no cluster yet, a cluster setting
    changed, or a control-plane / etcd node joins."""
    steps: list[Step] = []
    removed = plan.removed()
    down = set(unreachable) & set(removed)
    for reachable, group in ((True, [n for n in removed if n not in down]),
                             (False, [n for n in removed if n in down])):
        if group:
            steps.append(Step("remove", REMOVE_PLAYBOOK, tuple(sorted(group)),
                              extravars=removal_vars(group, reachable=reachable)))
    joining = [c.node for c in plan.nodes if c.action in ("add", "update")]
    roles = {h.name: set(h.roles) for h in hosts.nodes}
    only_workers = all(roles[n] <= {"worker"} for n in joining)
    if not joining and not plan.cluster and (cluster_exists or removed):
        return steps  # removals only, or nothing changed on the machines
    if cluster_exists and joining and only_workers and not plan.cluster:
        if facts_playbook:  # every node's facts, or --limit leaves scale.yml without them
            steps.append(Step("facts", facts_playbook))
        steps.append(Step("scale", SCALE_PLAYBOOK, tuple(joining), limit=",".join(joining)))
    else:
        steps.append(Step("full", full_playbook, tuple(h.name for h in hosts.nodes)))
    return steps
