"""Admission as data: workspaces, declared pools and registered nodes in,
ok / refused / unschedulable (with the reason and the field to fix) out;
and an unschedulable FIFO head that does not hold the jobs behind it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from dataclasses import field as default
from typing import Any

import pytest
from policy_kit import NOW, job, rack

from services.scheduler.config import SchedulerFile
from services.scheduler.policy import Node, SchedulerConfig, Snapshot, Workspace, schedule
from services.scheduler.policy.admission import Fleet, admit, screen

WS = {"ws": Workspace("ws")}
PRIORITIES = ("low", "medium", "high")
# Two racks of four 8-GPU MI300X nodes (64 GPUs), one node quarantined.
FLEET = rack("r1", 4) + rack("r2", 3) + rack("r2", 1, state="quarantined", prefix="q")


@dataclass
class Case:
    name: str
    job: Any
    verdict: str
    says: str  # a fragment the reason must hold
    field: str = ""
    nodes: list[Node] = default(default_factory=lambda: FLEET)
    workspaces: dict[str, Workspace] = default(default_factory=lambda: WS)
    pools: dict[str, dict[str, int]] = default(default_factory=dict)


CASES = [
    # -- never: refused ---------------------------------------------------------
    Case("no gpus_per_worker where the workspace requires GPUs", job("j", 2, 0), "refused",
         "gpus_per_worker is 0", "gpus_per_worker"),
    Case("unknown workspace", job("j", ws="research"), "refused",
         "unknown workspace 'research'; the scheduler's workspaces are: ws", "workspace"),
    Case("unknown priority class", job("j", prio="urgent"), "refused",
         "unknown priority class 'urgent'", "priority"),
    Case("unknown GPU model", job("j", gpu_models={"H100"}), "refused",
         "unknown gpu_model H100; the cluster has MI300X", "gpu_model"),
    Case("a model the workspace may not use", job("j", gpu_models={"MI300X"}), "refused",
         "not allowed in workspace ws; its quota_by_model allows MI250X", "gpu_model",
         workspaces={"ws": Workspace("ws", quota_by_model={"MI250X": 64})}),
    Case("unit_workers that do not divide workers", job("j", 6, unit_workers=4), "refused",
         "workers (6) is not a multiple of unit_workers (4)", "unit_workers"),
    Case("a node-scoped unit larger than any node of its model",
         job("j", 4, 4, unit_workers=4, unit_scope="node"), "refused",
         "a unit of 4 workers x 4 GPUs needs 16 GPUs on one node; MI300X nodes have 8",
         "unit_workers"),
    Case("a worker larger than any node of its model", job("j", 1, 16), "refused",
         "a worker of 16 GPUs needs 16 GPUs on one node; MI300X nodes have 8", "gpus_per_worker"),
    Case("more GPUs than the workspace's whole quota", job("j", 9),
         "refused", "needs 72 GPUs; workspace ws's whole quota is 64", "workers",
         workspaces={"ws": Workspace("ws", quota_gpus=64)}),
    Case("more GPUs of a model than its per-model quota", job("j", 5), "refused",
         "workspace ws's quota for MI300X is 32", "workers",
         workspaces={"ws": Workspace("ws", quota_by_model={"MI300X": 32})}),
    Case("more GPUs of a model than the declared pools can ever hold", job("j", 12), "refused",
         "needs 96 MI300X GPUs; pool(s) default are configured to hold at most 80", "workers",
         pools={"default": {"MI300X": 80}}),
    # -- not now: unschedulable -------------------------------------------------
    Case("more GPUs than the registered nodes have (no declared capacity)", job("j", 9),
         "unschedulable", "needs 72 MI300X GPUs; the registered MI300X nodes can give at most 64"),
    Case("more than registered, within the declared capacity", job("j", 9), "unschedulable",
         "can give at most 64", pools={"default": {"MI300X": 128}}),
    Case("a rack-scoped unit larger than every rack", job("j", 5, unit_workers=5,
         unit_scope="rack"), "unschedulable",
         "a unit of 5 workers x 8 GPUs must sit in one rack; the largest MI300X rack holds 4"),
    Case("no node of the workspace's pool registered yet", job("j"), "unschedulable",
         "no MI300X node is registered in pool gpu-b yet",
         workspaces={"ws": Workspace("ws", node_pools=frozenset({"gpu-b"}))}),
    Case("a model the quota names but no node has yet", job("j", gpu_models={"MI355X"}),
         "unschedulable", "no MI355X node is registered yet",
         workspaces={"ws": Workspace("ws", quota_by_model={"MI355X": 64})}),
    Case("no node registered at all: a model cannot be judged unknown",
         job("j", gpu_models={"H100"}), "unschedulable", "no node is registered yet", nodes=[]),
    # -- ok ---------------------------------------------------------------------
    Case("fits the registered nodes, the quarantined one included", job("j", 8), "ok", ""),
    Case("any model, one of which holds it", job("j", 2),
         "ok", "", nodes=rack("r1", 1, model="MI250X") + rack("r2", 2)),
    Case("a unit that fits one node", job("j", 4, 2, unit_workers=4), "ok", ""),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_admission(case: Case) -> None:
    got = admit(case.job, case.workspaces, Fleet.of(case.nodes, case.pools), PRIORITIES)
    assert got.verdict == case.verdict, got
    assert case.says in got.reason, got.reason
    assert got.field == case.field


def test_an_unschedulable_fifo_head_does_not_block_the_jobs_behind_it() -> None:
    nodes = rack("r1", 2)  # 16 GPUs
    head = job("head", 4, at=0)  # 32 GPUs: more than the cluster has today
    behind = [job("a", 1, at=1), job("b", 1, at=2)]
    snap = Snapshot(nodes=nodes, workspaces=[Workspace("ws", queue_policy="fifo")],
                    pending=[head, *behind])
    config = SchedulerConfig()

    # Without admission the head blocks its FIFO queue: nothing behind it runs.
    blocked = schedule(snap, config, NOW)
    assert not blocked.placements and blocked.pending["a"].code == "fifo"

    screened, verdicts = screen(snap, Fleet.of(nodes), config.priorities)
    assert verdicts["head"].verdict == "unschedulable"
    assert "needs 32 MI300X GPUs; the registered MI300X nodes can give at most 16" in \
        verdicts["head"].reason
    result = schedule(screened, config, NOW)
    assert set(result.placements) == {"a", "b"}

    # Once nodes register, the same job is admitted and heads the queue again.
    grown = replace(snap, nodes=nodes + rack("r2", 2))
    again, verdicts = screen(grown, Fleet.of(grown.nodes), config.priorities)
    assert verdicts == {} and [j.id for j in again.pending] == ["head", "a", "b"]
    assert set(schedule(again, config, NOW).placements) == {"head"}


def test_answers_are_cached_per_shape_and_workspace() -> None:
    fleet = Fleet.of(FLEET)
    small, big = Workspace("small", quota_by_model={"MI300X": 8}), Workspace("big")
    spaces = {"small": small, "big": big}
    assert admit(job("x", 2, ws="small"), spaces, fleet).verdict == "refused"
    assert admit(job("y", 2, ws="big"), spaces, fleet).ok  # same shape, other workspace


def test_declared_pools_load_from_the_scheduler_file() -> None:
    cfg = SchedulerFile.model_validate({"pools": [{"name": "gpu-a",
                                                   "gpus_by_model": {"MI300X": 1024}}]})
    assert cfg.pool_capacity() == {"gpu-a": {"MI300X": 1024}}
    with pytest.raises(ValueError, match="pool names must be unique"):
        SchedulerFile.model_validate({"pools": [{"name": "p"}, {"name": "p"}]})
