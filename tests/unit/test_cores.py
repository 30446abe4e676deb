"""The pure cores of the skeleton, as scenarios: onboarding transitions,
heartbeat fault detection, bench verdicts and gang placement."""

from __future__ import annotations

import math

import pytest

from libs.events import JobSpec, WorkerSlot
from libs.inventory import HostSpec
from libs.records import JobRecord, NodeRecord
from libs.specs import SpecError
from services.bench.verdict import judge_quick
from services.bootstrap.onboarding import step
from services.failover.rules import HeartbeatMonitor
from services.scheduler.config import SchedulerFile
from services.scheduler.config import load as load_scheduler_file
from services.scheduler.lifecycle import Limits
from services.scheduler.policy import schedule
from services.scheduler.view import (
    SchedulerState,
    snapshot,
    used_gpus,
)


@pytest.mark.parametrize(("state", "trigger", "expected"), [
    ("registered", "bench_requested", "preflight"),
    ("preflight", "bench_passed", "ready"),
    ("preflight", "bench_failed", "quarantined"),
    ("ready", "fault_opened", "quarantined"),
    ("quarantined", "bench_passed", "ready"),
    ("ready", "bench_passed", None),
    ("quarantined", "fault_opened", None),
    ("registered", "bench_passed", None),
])
def test_onboarding(state: str, trigger: str, expected: str | None) -> None:
    moved = step(state, trigger)  # type: ignore[arg-type]
    assert (moved.state if moved else None) == expected


def test_heartbeat_monitor_reports_each_outage_once() -> None:
    mon = HeartbeatMonitor(interval_s=1.0, missed=3)
    mon.watch("a", 0.0, heard=True)
    mon.watch("b", 0.0, heard=True)
    mon.beat("a", 2.0)
    assert [m.node for m in mon.check(3.5)] == ["b"]  # b was in service and fell silent
    assert mon.check(3.6) == []  # reported once
    assert [m.node for m in mon.check(5.1)] == ["a"]
    assert mon.beat("a", 6.0) is True  # back
    assert mon.check(7.0) == []
    assert [m.node for m in mon.check(9.5)] == ["a"]  # a new outage


def test_an_agent_never_heard_gets_the_first_beat_grace_not_the_deadline() -> None:
    """Agents starting on a busy machine are slow to say their first word;
    their node runs nothing yet, so silence then is not an outage."""
    mon = HeartbeatMonitor(interval_s=1.0, missed=3, first_beat_grace_s=30.0)
    mon.watch("starting", 0.0)
    mon.watch("serving", 0.0, heard=True)  # was in service when the monitor started
    assert [m.node for m in mon.check(3.5)] == ["serving"]
    assert mon.check(29.0) == []
    mon.beat("starting", 29.5)  # first word: from now on the beat deadline holds
    assert [m.node for m in mon.check(32.6)] == ["starting"]
    mon.watch("never", 40.0)
    assert [m.node for m in mon.check(70.1)] == ["never"]  # an agent that never starts


def test_an_agent_that_announced_its_stop_is_waited_for() -> None:
    mon = HeartbeatMonitor(interval_s=1.0, missed=3)
    mon.watch("a", 0.0, heard=True)
    mon.beat("a", 10.0)
    mon.pause("a", until=10.5 + 60)  # a rolling upgrade: back within 60 s
    assert mon.check(60.0) == []
    mon.beat("a", 65.0)  # back
    assert mon.check(67.0) == []
    mon.pause("a", until=70.0)
    assert mon.check(72.9) == []
    [missed] = mon.check(73.1)  # not back in time: the beat deadline runs from then
    assert missed.node == "a" and missed.last_seen == 65.0
    mon.pause("stranger", until=100.0)  # never registered: nothing to wait for
    assert "stranger" not in mon.quiet_until


def test_heartbeat_out_of_order_beats_do_not_move_time_back() -> None:
    mon = HeartbeatMonitor(interval_s=1.0, missed=2)
    mon.watch("a", 0.0)  # registered: only those are judged
    mon.beat("a", 10.0)
    mon.beat("a", 5.0)
    assert mon.check(11.5) == []
    assert [m.node for m in mon.check(12.1)] == ["a"]

def test_a_judge_looking_ahead_faults_by_the_deadline_not_a_look_after() -> None:
    """Looking every 0.05 s with lead_s=0.1, a silence is called at the last
    look before the deadline: the fault is never later than interval x
    missed after the last beat (a node killed just after a beat is found
    within 3 s), and never more than the lead earlier."""
    mon = HeartbeatMonitor(interval_s=1.0, missed=3, lead_s=0.1)
    mon.watch("a", 0.0, heard=True)
    mon.beat("a", 10.0)
    looks = [10.0 + k * 0.05 for k in range(100)]
    [at] = [t for t in looks if mon.check(t)]
    assert 12.9 < at <= 13.0
    mon.beat("a", 20.0)  # back; a pause and a blind spell are judged alike
    mon.pause("a", until=30.0)
    assert mon.check(32.85) == []
    assert [m.node for m in mon.check(32.95)] == ["a"]
    # Without the lead, the same looks find it a look after the deadline.
    late = HeartbeatMonitor(interval_s=1.0, missed=3)
    late.watch("a", 0.0, heard=True)
    late.beat("a", 10.0)
    assert [t for t in looks if late.check(t)][0] > 13.0


@pytest.mark.parametrize("lead", [-0.1, 1.0, 2.0])
def test_a_lead_of_a_whole_interval_or_negative_is_refused(lead: float) -> None:
    with pytest.raises(ValueError, match="lead_s"):
        HeartbeatMonitor(interval_s=1.0, missed=3, lead_s=lead)



def test_bench_verdicts() -> None:
    assert judge_quick(device_count=8, expected_devices=8, gemm_tflops=100, gemm_error=1e-4).passed
    missing = judge_quick(device_count=7, expected_devices=8, gemm_tflops=100, gemm_error=1e-4)
    assert not missing.passed and "sees 7 device(s), inventory says 8" in missing.reason
    nan = judge_quick(device_count=1, expected_devices=1, gemm_tflops=1, gemm_error=math.nan)
    assert not nan.passed and "GEMM result wrong" in nan.reason


def view_nodes(*specs: tuple[str, int, str, str]) -> dict[str, NodeRecord]:
    return {name: NodeRecord(spec=HostSpec(name=name, ip=f"10.0.0.{i}", gpu_model="cpu",
                                           gpu_count=gpus, labels={"rack": rack}),
                             state=state)  # type: ignore[arg-type]
            for i, (name, gpus, rack, state) in enumerate(specs, 1)}


def record(jid: str, workers: int, gpus: int = 1, **kw: object) -> JobRecord:
    spec = JobSpec(name=jid, workers=workers, gpus_per_worker=gpus, command=["x"],
                   **kw)  # type: ignore[arg-type]
    return JobRecord(id=jid, spec=spec, submitted_at=0.0)


WORKSPACES = SchedulerFile().workspace_policies()


def test_snapshot_translates_node_states_and_running_gangs() -> None:
    state = SchedulerState(nodes=view_nodes(("a", 2, "r1", "ready"), ("b", 2, "r1", "quarantined"),
                                            ("c", 2, "r2", "preflight")))
    running = record("run", 2)
    running.status, running.started_at = "stopping", 5.0
    running.slots = [WorkerSlot(rank=0, node="a", gpus=1), WorkerSlot(rank=1, node="a", gpus=1)]
    state.jobs = {"run": running, "new": record("new", 1, priority="high")}
    snap, held = snapshot(state, WORKSPACES, now=10.0)
    assert {n.name: n.state for n in snap.nodes} == {
        "a": "ready", "b": "quarantined", "c": "unready"}
    [alloc] = snap.running
    assert alloc.terminating and alloc.slots == (("a", 1), ("a", 1))
    assert [j.id for j in snap.pending] == ["new"] and snap.pending[0].priority == "high"
    assert held == {}
    assert used_gpus(state) == {"a": 2, "b": 0, "c": 0}


def test_backoff_and_unknown_workspaces_are_answered_before_the_policy() -> None:
    state = SchedulerState(nodes=view_nodes(("a", 1, "r1", "ready")))
    waiting = record("w", 1)
    waiting.not_before, waiting.retries = 20.0, 1
    state.jobs = {"w": waiting, "x": record("x", 1, workspace="research")}
    snap, held = snapshot(state, WORKSPACES, now=15.0)
    assert snap.pending == []
    # retry 1 of the default 3; the reason stays the same all through the wait
    assert held["w"].reason == "retry 1 of 3 after a back-off, at 00:00:20 UTC"
    assert held["w"].code == "backoff"
    assert snapshot(state, WORKSPACES, now=19.0)[1]["w"].reason == held["w"].reason
    assert "workspace 'research' is not configured; known: default" in held["x"].reason
    assert [j.id for j in snapshot(state, WORKSPACES, now=20.0)[0].pending] == ["w"]


def test_the_policy_places_a_gang_from_the_snapshot() -> None:
    state = SchedulerState(nodes=view_nodes(("a", 1, "r1", "ready"), ("b", 1, "r2", "ready"),
                                            ("c", 1, "r2", "ready")))
    big = record("big", 4)
    big.submitted_at = 1.0  # after j: FIFO places j, then big waits at the head
    state.jobs = {"j": record("j", 2), "big": big}
    snap, _ = snapshot(state, WORKSPACES, now=0.0)
    result = schedule(snap, SchedulerFile().policy(), 0.0)
    assert sorted(result.placements["j"]) == [("b", 1), ("c", 1)]  # one rack
    assert "big" in result.pending and result.pending["big"].position == 1


def test_records_round_trip_through_json() -> None:
    job = record("j", 2, max_retry=5)
    job.status, job.attempt, job.exits = "running", 2, {0: 0}
    job.slots = [WorkerSlot(rank=0, node="a", gpus=1)]
    job.exclude_nodes = ["b"]
    back = JobRecord.model_validate_json(job.model_dump_json())
    assert back == job and back.exits == {0: 0}


def test_retry_backoff_grows_and_is_capped() -> None:
    limits = Limits()
    assert [limits.backoff_s(n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    assert limits.backoff_s(30) == 300.0


def test_scheduler_file_rejects_duplicate_workspaces(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sched.yaml"
    path.write_text("workspaces:\n  - {name: a}\n  - {name: a}\n")
    with pytest.raises(SpecError, match="workspace names must be unique"):
        load_scheduler_file(path)
