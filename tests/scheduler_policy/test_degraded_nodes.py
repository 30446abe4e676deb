"""Degraded nodes (bench passed, but below their fleet) are used last: a
gang goes there only when healthy nodes cannot hold it; with
``degraded_nodes: never`` they are not used at all."""

from __future__ import annotations

from libs.inventory import HostSpec
from libs.records import NodeRecord
from services.scheduler.config import SchedulerFile
from services.scheduler.policy import Job, Node, Snapshot, Workspace, schedule
from services.scheduler.view import SchedulerState, policy_nodes

WS = [Workspace("default")]


def nodes(*degraded: str) -> list[Node]:
    # The degraded node sorts first by IP: a healthy-blind placement would take it.
    return [Node(name=n, gpus=8, gpu_model="MI300X", rack="r1", ip=f"10.0.0.{i}",
                 degraded=n in degraded) for i, n in enumerate(["a", "b", "c"], 1)]


def test_a_gang_that_fits_on_healthy_nodes_never_lands_on_a_degraded_one() -> None:
    for job in (Job("one", "default", workers=1, gpus_per_worker=8),
                Job("small", "default", workers=1, gpus_per_worker=2),
                Job("two", "default", workers=2, gpus_per_worker=8)):
        result = schedule(Snapshot(nodes(*"a"), WS, pending=[job]), SchedulerFile().policy(), 0)
        assert "a" not in {n for n, _ in result.placements[job.id]}, job


def test_degraded_nodes_are_used_when_healthy_ones_cannot_hold_the_gang() -> None:
    job = Job("three", "default", workers=3, gpus_per_worker=8)
    result = schedule(Snapshot(nodes("a"), WS, pending=[job]), SchedulerFile().policy(), 0)
    assert sorted(n for n, _ in result.placements["three"]) == ["a", "b", "c"]


def test_never_takes_degraded_nodes_out_of_placement() -> None:
    spec = HostSpec(name="a", ip="10.0.0.1", gpu_model="MI300X", gpu_count=8)
    state = SchedulerState(nodes={"a": NodeRecord(spec=spec, state="ready", degraded=True)})
    assert [n.state for n in policy_nodes(state, "last")] == ["ready"]
    assert [n.degraded for n in policy_nodes(state, "last")] == [True]
    assert [n.state for n in policy_nodes(state, "never")] == ["unready"]
