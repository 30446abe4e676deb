"""Causes found by replaying the Alibaba GPU traces (``bench/scheduler_trace.py``)
against FIFO first-fit and best-fit, each as a scenario: nodes, jobs -> binds
and holds. Each failed before its fix."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_kit import Scenario, job, rack, run, running

from services.scheduler.policy import SchedulerConfig, Workspace

BALANCE = [Workspace("ws", queue_policy="balance")]
S: list[Scenario] = []

_one_full = [running(job("busy", 1, 8, prio="high", preemptible=False), ["r1-n0"])]
S.append(Scenario(
    # Decided by priority alone, the 1-GPU job took the only wholly free
    # node (stranding 7 GPUs) and the gang waited for another to drain; on
    # the trace replays 8-GPU tasks waited up to twice as long as under FIFO
    # first-fit, and more free GPUs sat on partly used nodes. The 1-GPU job
    # takes the next GPU that frees up anywhere instead.
    "a gang that needs whole nodes takes a wholly free node before smaller jobs",
    rack("r1", 2), [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)],
    workspaces=BALANCE, running=_one_full,
    placed={"big": ["r1-n1"]}, pending_codes={"h": "capacity"}))
S.append(Scenario(
    "a smaller job still tops up a partly used node next to it", rack("r1", 3),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)], workspaces=BALANCE,
    running=[*_one_full, running(job("part", 1, 4, prio="high"), ["r1-n2"])],
    placed={"big": ["r1-n1"], "h": ["r1-n2"]}))
S.append(Scenario(
    "a FIFO queue keeps its order", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)], running=_one_full,
    placed={"h": ["r1-n1"]}, pending_codes={"big": "capacity"}))
S.append(Scenario(
    "a gang that must share free nodes with a smaller job does not jump it", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 4, at=1)], workspaces=BALANCE,
    running=_one_full, placed={"h": ["r1-n1"], "big": ["r1-n1"]}))


@pytest.mark.parametrize("s", S, ids=[s.name for s in S])
def test_scenario(s: Scenario) -> None:
    result = run(s)
    for job_id, want in s.placed.items():
        assert job_id in result.placements, f"{job_id} not placed: {result.pending.get(job_id)}"
        assert [n for n, _ in result.placements[job_id]] == want
    for job_id, code in s.pending_codes.items():
        assert job_id in result.pending, f"{job_id} was placed"
        assert result.pending[job_id].code == code, result.pending[job_id]
    if s.reserved is not None:
        assert {k: set(v) for k, v in result.reservations.items()} == s.reserved


def test_a_victim_search_out_of_budget_evicts_only_what_the_placement_needs() -> None:
    # Replaying the multigpu50 trace, one 4-GPU job evicted 44 one-GPU jobs:
    # the search ran out of fit checks while releasing victims, went on
    # releasing every candidate, and had no checks left to spare the ones not
    # needed.
    nodes = rack("r1", 6)
    small = [running(job(f"s{k}-{slot}", 1, 1, prio="low"), [(f"r1-n{k}", 1)],
                     started=float(slot * 6 + k))  # most recent first: across the nodes
             for k in range(6) for slot in range(8)]
    s = Scenario("out of budget", nodes, [job("big", 1, 4, prio="high", at=1)],
                 running=small, config=replace(SchedulerConfig(), max_victim_checks=4))
    result = run(s)
    node_of = {a.job.id: a.slots[0][0] for a in small}
    victims = [p.victim for p in result.preemptions if p.preemptor == "big"]
    assert len(victims) == 4
    assert len({node_of[v] for v in victims}) == 1  # all on the node it will take
    (node, gpus), = result.nominations["big"]
    assert gpus == 4 and {node_of[v] for v in victims} == {node}
