"""Which Kubespray playbooks an apply runs, as scenarios (pure), and the
plan against the nodes bootstrap knows rather than the last applied file."""

from __future__ import annotations

from typing import Any

import pytest

from libs.inventory import HostsFile, HostSpec
from libs.records import NodeRecord
from services.bootstrap.plan import make_plan
from services.bootstrap.protocol import drained
from services.bootstrap.steps import kubespray_steps, removal_vars

CP = {"name": "cp-1", "ip": "10.0.0.1", "roles": ["control-plane", "etcd"],
      "gpu_model": "cpu", "gpu_count": 0}


def worker(name: str, ip: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ip": ip, "gpu_model": "MI300X", "gpu_count": 8, **extra}


def lab(*nodes: dict[str, Any], **changes: Any) -> HostsFile:
    return HostsFile.model_validate({"cluster": "lab", "provision": True,
                                     "nodes": [CP, *nodes], **changes})


BASE = lab(worker("gpu-1", "10.0.0.11"), worker("gpu-2", "10.0.0.12"))


def steps_for(new: HostsFile, *, exists: bool = True, down: tuple[str, ...] = (),
              facts: str | None = "facts.yml") -> list[tuple[str, str, str | None, tuple]]:
    plan = make_plan(BASE if exists else None, new, old_files={}, new_files={})
    return [(s.kind, s.playbook, s.limit, s.nodes)
            for s in kubespray_steps(plan, new, cluster_exists=exists, unreachable=down,
                                     facts_playbook=facts)]


@pytest.mark.parametrize(("name", "new", "kwargs", "expected"), [
    ("a new cluster runs the full playbook", BASE, {"exists": False},
     [("full", "cluster.yml", None, ("cp-1", "gpu-1", "gpu-2"))]),
    ("nothing changed runs nothing", BASE, {}, []),
    ("a new worker joins through scale.yml limited to it, facts first",
     lab(worker("gpu-1", "10.0.0.11"), worker("gpu-2", "10.0.0.12"), worker("gpu-3", "10.0.0.13")),
     {}, [("facts", "facts.yml", None, ()), ("scale", "scale.yml", "gpu-3", ("gpu-3",))]),
    ("a changed worker is re-joined the same way, no facts playbook in the checkout",
     lab(worker("gpu-1", "10.0.0.11", gpu_count=4), worker("gpu-2", "10.0.0.12")),
     {"facts": None}, [("scale", "scale.yml", "gpu-1", ("gpu-1",))]),
    ("a removed node goes through remove-node.yml only",
     lab(worker("gpu-1", "10.0.0.11")), {},
     [("remove", "remove-node.yml", None, ("gpu-2",))]),
    ("reachable and unreachable nodes are removed in separate runs",
     lab(), {"down": ("gpu-2",)},
     [("remove", "remove-node.yml", None, ("gpu-1",)),
      ("remove", "remove-node.yml", None, ("gpu-2",))]),
    ("removal first, then the new worker",
     lab(worker("gpu-1", "10.0.0.11"), worker("gpu-3", "10.0.0.13")), {"facts": None},
     [("remove", "remove-node.yml", None, ("gpu-2",)),
      ("scale", "scale.yml", "gpu-3", ("gpu-3",))]),
    ("a new etcd/control-plane node cannot use scale.yml",
     lab(worker("gpu-1", "10.0.0.11"), worker("gpu-2", "10.0.0.12"),
         {**CP, "name": "cp-2", "ip": "10.0.0.2", "roles": ["control-plane"]}), {},
     [("full", "cluster.yml", None, ("cp-1", "gpu-1", "gpu-2", "cp-2"))]),
    ("a cluster setting change runs the full playbook",
     lab(worker("gpu-1", "10.0.0.11"), worker("gpu-2", "10.0.0.12"), worker("gpu-3", "10.0.0.13"),
         kubernetes={"version": "1.34.3"}), {},
     [("full", "cluster.yml", None, ("cp-1", "gpu-1", "gpu-2", "gpu-3"))]),
])
def test_playbooks_for_a_change(name: str, new: HostsFile, kwargs: dict[str, Any],
                                expected: list[tuple]) -> None:
    assert steps_for(new, **kwargs) == expected, name


def test_removal_vars_follow_kubespray() -> None:
    up = removal_vars(["gpu-2", "gpu-1"], reachable=True)
    assert up == {"node": "gpu-1,gpu-2", "skip_confirmation": True,
                  "delete_nodes_confirmation": "yes"}
    down = removal_vars(["gpu-2"], reachable=False)
    assert down["reset_nodes"] is False and down["allow_ungraceful_removal"] is True
    assert down["node"] == "gpu-2"


def test_live_nodes_win_over_the_last_applied_file_for_nodes() -> None:
    applied = lab(worker("gpu-1", "10.0.0.11"))  # gpu-2 was never applied from here...
    live = {h.name: h for h in BASE.nodes}  # ...but bootstrap knows it
    new = lab(worker("gpu-1", "10.0.0.11", labels={"rack": "r2"}),
              kubernetes={"network_plugin": "cilium"})
    plan = make_plan(applied, new, old_files={}, new_files={}, live=live)
    assert [(c.node, c.action, c.fields) for c in plan.nodes] == [
        ("gpu-1", "update", ("labels",)), ("gpu-2", "remove", ())]
    assert plan.cluster == {"network_plugin": ("calico", "cilium")}  # settings: applied file
    offline = make_plan(applied, new, old_files={}, new_files={})
    assert [c.action for c in offline.nodes] == ["update"]


def test_a_node_is_drained_once_bootstrap_says_so_or_it_is_gone() -> None:
    spec = HostSpec.model_validate(worker("gpu-1", "10.0.0.11"))

    def record(state: str, done: bool) -> NodeRecord:
        return NodeRecord(spec=spec, state=state, drained=done)  # type: ignore[arg-type]

    assert drained(None) and drained(record("draining", True))
    assert not drained(record("draining", False)) and not drained(record("ready", True))
