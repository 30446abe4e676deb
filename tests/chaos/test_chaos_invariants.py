"""The chaos invariants catch what they claim to: each check gets a clean
history (no violation) and a broken one (the violation, named)."""

from __future__ import annotations

from libs.events import (
    JobPlaced,
    JobPlacedData,
    NodeCommandData,
    NodeDrainRequested,
    WorkerExited,
    WorkerExitedData,
    WorkerSlot,
    WorkerStarted,
    WorkerStartedData,
)
from tests.chaos.invariants import (
    AttemptStart,
    agent_violations,
    drain_violations,
    history_violations,
    placement_violations,
    process_violations,
    quarantine_violations,
    resume_violations,
    retry_violations,
)
from tests.chaos.schedule import KINDS, plan_kills


def placed(attempt: int, *nodes: str) -> JobPlaced:
    return JobPlaced(source="t", job="j", data=JobPlacedData(attempt=attempt, workers=[
        WorkerSlot(rank=r, node=n, gpus=1) for r, n in enumerate(nodes)]))


def started(attempt: int, rank: int, node: str) -> WorkerStarted:
    return WorkerStarted(source="t", job="j", node=node,
                         data=WorkerStartedData(attempt=attempt, rank=rank, pid=100 + rank))


def exited(attempt: int, rank: int, node: str, code: int = 0) -> WorkerExited:
    return WorkerExited(source="t", job="j", node=node,
                        data=WorkerExitedData(attempt=attempt, rank=rank, exit_code=code))


def test_history_every_event_once() -> None:
    assert history_violations(["a", "b", "c"], {"a": 1, "b": 1}, settled=2) == []
    found = history_violations(["a", "b", "b", "c"], {"a": 2, "x": 1})
    assert "event b is in the CONTROL stream 2 times" in found
    assert any("lost from the history table" in f and "'b'" in f for f in found)
    assert "event a stored 2 times in the history table" in found
    assert any("never held" in f and "'x'" in f for f in found)


def test_placements_clean_run_with_a_retry() -> None:
    events = [placed(1, "n1", "n2"), started(1, 0, "n1"), started(1, 1, "n2"),
              exited(1, 1, "n2", -9), exited(1, 0, "n1", 1), placed(1, "n1", "n2"),
              placed(2, "n1", "n3"), started(2, 0, "n1"), started(2, 1, "n3"),
              exited(2, 0, "n1"), exited(2, 1, "n3")]
    assert placement_violations(events) == []


def test_placements_caught_twice() -> None:
    found = placement_violations([
        placed(1, "n1", "n2"), placed(1, "n1", "n3"),  # re-placed without a new attempt
        started(1, 0, "n1"), started(1, 1, "n3"),  # not where the first placement said
        placed(2, "n3", "n4"), started(2, 0, "n3"),  # while attempt 1 still runs
        started(3, 0, "n4"),  # no placement
    ])
    assert any("attempt 1 placed twice" in f for f in found)
    assert any("rank 1 started on n3, placed on n2" in f for f in found)
    assert any("attempt 2 rank 0 started on n3 while" in f for f in found)
    assert any("attempt 3 rank 0 started without a placement" in f for f in found)
    assert any("never reported its exit" in f for f in found)


def test_processes_one_per_rank_and_attempt() -> None:
    assert process_violations([("j", 1, 0, "n1", 10), ("j", 1, 1, "n2", 11),
                               ("j", 2, 0, "n1", 12)]) == []
    assert process_violations([("j", 1, 0, "n1", 10), ("j", 1, 0, "n3", 13)]) == [
        "j attempt 1 rank 0 ran 2 times as (node, pid) [('n1', 10), ('n3', 13)]"]


def test_quarantined_only_with_an_open_fault() -> None:
    nodes = {"n1": {"state": "ready"}, "n2": {"state": "quarantined"},
             "n3": {"state": "quarantined"}, "n4": {"state": "ready"}}
    faults = [{"key": "n2", "scope": "node", "status": "mitigated"},
              {"key": "n3", "scope": "node", "status": "closed"},
              {"key": "j", "scope": "job", "status": "opened"}]
    assert quarantine_violations({**nodes, "n3": {"state": "ready"}}, faults, killed=["n2"]) == []
    found = quarantine_violations(nodes, faults, killed=["n2", "n4"])
    assert found == ["n3 is quarantined without an open fault",
                     "n4 was killed but is ready with no open fault"]


def test_resume_from_the_newest_complete_checkpoint() -> None:
    complete = {10: 100.0, 20: 105.0, 30: 120.0}
    good = [AttemptStart(1, 90.0, {0: 0, 1: 0}, 1),
            AttemptStart(2, 110.0, {0: 20, 1: 20}, 21),
            AttemptStart(3, 130.0, {0: 30, 1: 30}, None)]
    assert resume_violations(good, complete) == []
    found = resume_violations([AttemptStart(2, 110.0, {0: 10, 1: 10}, 11),  # 20 was newer
                               AttemptStart(3, 110.0, {0: 30, 1: 30}, 31),  # 30 came later
                               AttemptStart(4, 130.0, {0: 30, 1: 20}, 31),
                               AttemptStart(5, 130.0, {0: 30, 1: 30}, 25)], complete)
    assert found == [
        "attempt 2 resumed from step 10, but step 20 was complete before its launch",
        "attempt 3 resumed from step 30, which was not complete at its launch",
        "attempt 4: ranks resumed from different steps {0: 30, 1: 20}",
        "attempt 5: first step 25 after resuming from 30 (expected 31)"]


def test_kill_plans_are_seeded_and_bounded() -> None:
    assert plan_kills(7, 4, spare_nodes=1) == plan_kills(7, 4, spare_nodes=1)
    every = len(KINDS)
    for seed in range(50):
        kills = plan_kills(seed, every + 4, spare_nodes=2)
        kinds = [k.kind for k in kills]
        assert len(kills) == every + 4 and set(kinds[:every]) == set(KINDS)
        assert kinds.count("node") + kinds.count("drain") == 2  # the gang must still fit
        assert all(0 <= k.delay_s <= 3.0 and 0.3 <= k.down_s <= 6.0 for k in kills)
        assert not kills[0].hurry  # the first kill finds the job running
        one = [k.kind for k in plan_kills(seed, every + 4, spare_nodes=1)]
        assert one.count("node") + one.count("drain") == 1
        assert len(set(one[:every - 1])) == every - 1
    assert not {"node", "drain"} & {k.kind for k in plan_kills(3, 12, spare_nodes=0)}


def test_an_agent_restart_must_not_evacuate_its_node() -> None:
    faults = [{"key": "n1", "kind": "heartbeat_missed", "jobs": ["j"], "scope": "node"},
              {"key": "n2", "kind": "heartbeat_missed", "jobs": [], "scope": "node"},
              {"key": "n3", "kind": "heartbeat_missed", "jobs": ["j"], "scope": "node"}]
    assert agent_violations(faults, restarted=["n1", "n2", "n3"], killed=["n3"]) == [
        "n1's agent was restarted while its workers ran, yet failover evacuated it "
        "(heartbeat_missed, jobs ['j'])"]


def drain(node: str) -> NodeDrainRequested:
    return NodeDrainRequested(source="t", node=node, data=NodeCommandData(by="op"))


def test_a_drained_node_takes_no_new_worker_and_stays_cordoned() -> None:
    events = [placed(1, "n1", "n2"), drain("n2"), placed(2, "n1", "n3")]
    assert drain_violations(events, {"n2": {"cordoned": True}}, ["n2"]) == []
    found = drain_violations([*events, placed(3, "n2", "n3"), drain("n4")],
                             {"n2": {"cordoned": False}, "n4": {"cordoned": True}},
                             ["n2", "n4", "n5"])
    assert found == ["j attempt 3 rank 0 placed on n2 after it was drained",
                     "n2 was drained, but is not cordoned at the end",
                     "n5 was drained, but no drain request is in the stream"]


def test_only_a_strike_that_kills_workers_spends_a_retry() -> None:
    assert retry_violations("j", 2, failing_strikes=2) == []
    assert retry_violations("j", 3, failing_strikes=2) == [
        "j spent 3 retries, but only 2 strike(s) killed its workers"]
