"""The scheduler's job lifecycle (``services/scheduler/lifecycle.py``):
transitions one by one, then random event sequences against its invariants."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.events import JobSpec, WorkerSlot
from libs.records import JobRecord
from services.scheduler import lifecycle as lc
from services.scheduler.lifecycle import (
    FINAL,
    Announce,
    Command,
    Exited,
    Forget,
    Launch,
    Limits,
    NodeLost,
    Placed,
    Save,
    StopWorkers,
)

LIMITS = Limits(stop_grace_s=30.0, preemption_grace_s=20.0)


def job(workers: int = 2, max_retry: int = 1, **spec: object) -> JobRecord:
    return JobRecord(id="j", submitted_at=0.0, spec=JobSpec(
        name="j", workers=workers, gpus_per_worker=1, command=["x"], max_retry=max_retry,
        **spec))  # type: ignore[arg-type]


def slots(*nodes: str) -> tuple[WorkerSlot, ...]:
    return tuple(WorkerSlot(rank=i, node=n, gpus=1) for i, n in enumerate(nodes))


def running(**kw: object) -> JobRecord:
    step = lc.apply(job(**kw), Placed(slots("a", "b")), 10.0, LIMITS)  # type: ignore[arg-type]
    assert step.record is not None
    return step.record


def kinds(step: lc.Step) -> list[str]:
    return [type(e).__name__ + (f":{e.what}" if isinstance(e, Announce) else "")
            for e in step.effects]


def test_a_placement_is_saved_then_announced_then_launched() -> None:
    step = lc.apply(job(), Placed(slots("a", "b")), 10.0, LIMITS)
    assert kinds(step) == ["Save", "Announce:placed", "Launch"]
    assert step.record is not None and step.record.attempt == 1
    assert step.record.status == "running" and step.record.started_at == 10.0


def test_apply_never_changes_its_input() -> None:
    before = running()
    copy = before.model_copy(deep=True)
    lc.apply(before, Exited(1, 0, 0, "a"), 20.0, LIMITS)
    lc.apply(before, Command("stop"), 20.0, LIMITS)
    assert before == copy


def test_every_rank_exiting_zero_completes_the_job() -> None:
    one = lc.apply(running(), Exited(1, 0, 0, "a"), 20.0, LIMITS)
    assert one.record is not None and one.record.status == "running" and kinds(one) == ["Save"]
    two = lc.apply(one.record, Exited(1, 1, 0, "b"), 21.0, LIMITS)
    assert two.record is not None and two.record.status == "completed"
    assert kinds(two) == ["Save", "Announce:completed", "StopWorkers"]
    assert two.record.run_s == 11.0 and two.record.finished_at == 21.0
    again = lc.apply(two.record, Exited(1, 1, 0, "b"), 22.0, LIMITS)
    assert kinds(again) == ["Reannounce"]  # its end may not have gone out


def test_a_launch_refused_before_anything_was_created_waits_without_a_retry() -> None:
    step = lc.apply(running(max_retry=0), lc.LaunchBlocked("Secret hf not found"), 20.0,
                    LIMITS)
    r = step.record
    assert r is not None and r.status == "pending" and r.retries == 0
    assert r.blocked == "Secret hf not found" and "cannot launch" in r.reason
    assert r.not_before == 20.0 + LIMITS.launch_retry_s and not r.slots
    assert kinds(step)[0] == "StopWorkers" and "Save" in kinds(step)
    placed = lc.apply(r, Placed(slots("a", "b")), 60.0, LIMITS).record
    assert placed is not None and placed.blocked == "" and placed.attempt == 2
    # Only a running attempt can be refused at launch.
    assert lc.apply(job(), lc.LaunchBlocked("x"), 20.0, LIMITS).effects == ()


def test_a_failed_rank_spends_a_retry_and_requeues_after_a_backoff() -> None:
    step = lc.apply(running(max_retry=1), Exited(1, 0, 1, "a"), 20.0, LIMITS)
    job1 = step.record
    assert job1 is not None and job1.status == "stopping" and job1.after_stop == "requeue"
    assert job1.retries == 1 and job1.not_before == 25.0
    assert step.effects[-1] == StopWorkers(LIMITS.broken_gang_grace_s)
    done = lc.apply(job1, Exited(1, 1, -15, "b"), 21.0, LIMITS)
    assert done.record is not None and done.record.status == "pending"
    assert done.record.slots == [] and done.record.last_nodes == ["a", "b"]
    # the next failure is one too many: the job fails once its gang is down
    again = lc.apply(done.record, Placed(slots("c", "d")), 30.0, LIMITS).record
    assert again is not None
    fail = lc.apply(again, Exited(2, 1, 2, "d"), 31.0, LIMITS).record
    assert fail is not None and fail.after_stop == "fail" and fail.retries == 2
    assert "gave up after 2 failed attempt(s)" in fail.reason
    end = lc.apply(fail, Exited(2, 0, -15, "c"), 32.0, LIMITS)
    assert end.record is not None and end.record.status == "failed"
    assert "Announce:failed" in kinds(end)


def test_a_lost_gang_runs_again_at_once_without_spending_a_retry() -> None:
    # The stack stopped while the job ran: the next driver reports each rank lost.
    lost = lc.apply(running(max_retry=1), Exited(1, 0, -9, "a", "stack stopped", lost=True),
                    20.0, LIMITS)
    job1 = lost.record
    assert job1 is not None and job1.status == "stopping" and job1.after_stop == "requeue"
    assert job1.retries == 0 and job1.not_before == 0.0 and job1.recovering
    assert "rank 0 on a was lost (stack stopped)" in job1.reason
    assert "no retry spent" in job1.reason
    done = lc.apply(job1, Exited(1, 1, -9, "b", "stack stopped", lost=True), 21.0, LIMITS)
    assert done.record is not None and done.record.status == "pending"
    assert done.record.retries == 0
    again = lc.apply(done.record, Placed(slots("a", "b")), 22.0, LIMITS).record
    assert again is not None and again.attempt == 2 and again.retries == 0
    # a rank whose end is known is not lost when its worker is gone afterwards
    one_done = lc.apply(again, Exited(2, 0, 0, "a"), 22.5, LIMITS).record
    assert one_done is not None
    gone = lc.apply(one_done, Exited(2, 0, -9, "a", "pod deleted", lost=True), 22.6, LIMITS)
    assert gone.record == one_done and gone.effects == ()
    # a real failure after it still spends the retry it has
    failed = lc.apply(again, Exited(2, 0, 1, "a"), 23.0, LIMITS).record
    assert failed is not None and failed.retries == 1 and failed.after_stop == "requeue"


def test_a_rank_whose_node_was_down_spends_no_retry_and_runs_again_at_once() -> None:
    """A resumed or queued gang can be placed on a node that died inside
    failover's heartbeat deadline. The rank never started: like a lost
    gang, it runs again at once, first in the queue, with no retry spent
    (the scheduler keeps it off that node: node_holds)."""
    down = lc.apply(running(max_retry=1),
                    Exited(1, 1, -9, "b", "node b is down", node_down=True), 20.0, LIMITS)
    job1 = down.record
    assert job1 is not None and job1.status == "stopping" and job1.after_stop == "requeue"
    assert job1.retries == 0 and job1.recovering and job1.not_before == 0.0
    assert "rank 1 could not start: b is down" in job1.reason and "no retry spent" in job1.reason
    pending = lc.apply(job1, Exited(1, 0, -15, "a"), 20.1, LIMITS).record
    assert pending is not None and pending.status == "pending" and pending.retries == 0
    assert pending.not_before == 0.0
    judged = lc.apply(pending, NodeLost("b", "heartbeat_missed"), 21.0, LIMITS).record
    assert judged is not None and judged.exclude_nodes == ["b"] and judged.prefer_nodes == ["a"]


def test_an_operator_stop_checkpoints_and_can_be_resumed() -> None:
    step = lc.apply(running(), Command("stop", by="ops@h", reason="upgrade"), 20.0, LIMITS)
    stopping = step.record
    assert stopping is not None and stopping.status == "stopping"
    assert stopping.after_stop == "stop" and stopping.grace_s == 30.0
    assert step.effects[-1] == StopWorkers(30.0)
    assert "ops@h" in stopping.reason and "upgrade" in stopping.reason
    half = lc.apply(stopping, Exited(1, 0, 0, "a"), 25.0, LIMITS).record
    assert half is not None
    done = lc.apply(half, Exited(1, 1, 0, "b"), 26.0, LIMITS)
    assert done.record is not None and done.record.status == "stopped"
    assert done.record.retries == 0 and done.record.run_s == 16.0
    assert kinds(done) == ["Save", "Announce:stopped"]
    resumed = lc.apply(done.record, Command("resume"), 30.0, LIMITS).record
    assert resumed is not None and resumed.status == "pending" and resumed.not_before == 0.0


@pytest.mark.parametrize(("status", "action", "verdict", "says"), [
    ("completed", "stop", "refused", "it is completed, a final state"),
    ("failed", "resume", "refused", "it is failed, a final state"),
    ("cancelled", "cancel", "noop", "already cancelled"),
    ("cancelled", "delete", "ok", ""),
    ("stopped", "stop", "noop", "already stopped"),
    ("running", "resume", "noop", "nothing to resume"),
    ("pending", "stop", "ok", ""),
    ("stopped", "resume", "ok", ""),
])
def test_check_answers_each_act_in_each_state(status: str, action: lc.Action, verdict: str,
                                              says: str) -> None:
    record = job()
    record.status = status  # type: ignore[assignment]
    got, line = lc.check(record, action)
    assert got == verdict and says in line


def test_an_unknown_job_is_refused_by_name() -> None:
    assert lc.check(None, "stop", "nope") == ("refused", "job nope not found")


def test_a_pending_job_stops_cancels_and_deletes_at_once() -> None:
    stop = lc.apply(job(), Command("stop"), 1.0, LIMITS)
    assert stop.record is not None and stop.record.status == "stopped"
    cancel = lc.apply(job(), Command("cancel"), 1.0, LIMITS)
    assert cancel.record is not None and cancel.record.status == "cancelled"
    delete = lc.apply(job(), Command("delete"), 1.0, LIMITS)
    assert delete.record is None and kinds(delete) == ["Forget", "Announce:deleted"]


def test_deleting_a_running_job_stops_it_first() -> None:
    step = lc.apply(running(), Command("delete"), 20.0, LIMITS)
    assert step.record is not None and step.record.after_stop == "delete"
    gone = lc.apply(step.record, Exited(1, 0, 0, "a"), 21.0, LIMITS).record
    assert gone is not None
    final = lc.apply(gone, Exited(1, 1, 0, "b"), 22.0, LIMITS)
    assert final.record is None and isinstance(final.effects[0], Forget)


def test_a_redelivered_request_is_done_once() -> None:
    stopped = lc.apply(job(), Command("stop", id="req-1"), 1.0, LIMITS).record
    assert stopped is not None
    resumed = lc.apply(stopped, Command("resume", id="req-2"), 2.0, LIMITS).record
    assert resumed is not None and resumed.status == "pending"
    replay = lc.apply(resumed, Command("resume", id="req-2"), 3.0, LIMITS)
    assert replay.effects == () and "done already" in replay.answer


def test_the_clock_times_out_stops_deadlines_and_ttls() -> None:
    stopping = lc.apply(running(), Command("stop"), 20.0, LIMITS).record
    assert stopping is not None
    assert lc.due(stopping, 20.0 + 30 + 60 - 1, LIMITS) is None
    fact = lc.due(stopping, 20.0 + 30 + 60 + 1, LIMITS)
    assert isinstance(fact, lc.StopTimedOut)
    out = lc.apply(stopping, fact, 111.0, LIMITS)
    assert out.effects[0] == StopWorkers(0.0, wait=True)
    assert out.record is not None and out.record.status == "stopped"

    bounded = running(max_runtime_s=100)
    assert lc.due(bounded, 109.0, LIMITS) is None
    deadline = lc.due(bounded, 111.0, LIMITS)
    assert isinstance(deadline, lc.Deadline)
    past = lc.apply(bounded, deadline, 111.0, LIMITS).record
    assert past is not None and past.after_stop == "fail" and past.code == "deadline"
    assert past.retries == 0

    finished = running(ttl_after_finished_s=60)
    for rank, node in enumerate(("a", "b")):
        step = lc.apply(finished, Exited(1, rank, 0, node), 20.0, LIMITS)
        assert step.record is not None
        finished = step.record
    assert lc.due(finished, 79.0, LIMITS) is None
    expired = lc.due(finished, 80.0, LIMITS)
    assert isinstance(expired, lc.Expired)
    assert lc.apply(finished, expired, 80.0, LIMITS).record is None


def test_a_drain_moves_the_gang_without_spending_a_retry() -> None:
    step = lc.apply(running(max_retry=0), lc.Drain("a", "drained by ops"), 20.0, LIMITS)
    moving = step.record
    assert moving is not None and moving.after_stop == "preempted"
    assert moving.prefer_nodes == ["b"] and moving.exclude_nodes == []
    assert step.effects[-1] == StopWorkers(LIMITS.stop_grace_s)
    for rank, node in enumerate(("a", "b")):
        out = lc.apply(moving, Exited(1, rank, 0, node), 21.0, LIMITS).record
        assert out is not None
        moving = out
    assert moving.status == "pending" and moving.retries == 0 and moving.preempted
    assert lc.apply(job(), lc.Drain("a", "x"), 1.0, LIMITS).effects == ()  # nothing there


def test_a_new_leader_finishes_what_the_last_one_started() -> None:
    assert lc.on_restart(running(), LIMITS) == (Announce("placed"), Launch())
    stopping = lc.apply(running(), Command("stop"), 20.0, LIMITS).record
    assert stopping is not None
    assert lc.on_restart(stopping, LIMITS) == (StopWorkers(30.0),)
    assert lc.on_restart(job(), LIMITS) == ()


# ------------------------------------------------------------ random sequences

NODES = {"a": 2, "b": 2, "c": 1}


@dataclass
class World:
    """Jobs, the nodes' GPUs, and what the test remembers to check against."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    final: dict[str, str] = field(default_factory=dict)
    now: float = 0.0

    def free(self) -> dict[str, int]:
        free = dict(NODES)
        for record in self.jobs.values():
            if record.holds_gpus:
                for slot in record.slots:
                    free[slot.node] -= slot.gpus
        return free


op = st.one_of(
    st.tuples(st.just("place"), st.integers(0, 2)),
    st.tuples(st.just("exit"), st.integers(0, 2), st.integers(0, 1),
              st.sampled_from([0, 0, 1, -9, -15]), st.booleans(),
              st.sampled_from([False, False, False, True])),
    st.tuples(st.just("node_lost"), st.sampled_from(sorted(NODES))),
    st.tuples(st.just("drain"), st.sampled_from(sorted(NODES))),
    st.tuples(st.just("recover"), st.integers(0, 2)),
    st.tuples(st.just("preempt"), st.integers(0, 2)),
    st.tuples(st.just("command"), st.integers(0, 2),
              st.sampled_from(["stop", "resume", "cancel", "delete"])),
    st.tuples(st.just("launch_failed"), st.integers(0, 2)),
    st.tuples(st.just("launch_blocked"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.floats(0.5, 200.0)),
    st.tuples(st.just("restart")),
)


def place(world: World, record: JobRecord) -> tuple[WorkerSlot, ...] | None:
    free = world.free()
    chosen = []
    for rank in range(record.spec.workers):
        node = next((n for n in sorted(free) if free[n] >= 1
                     and n not in record.exclude_nodes), None)
        if node is None:
            return None
        free[node] -= 1
        chosen.append(WorkerSlot(rank=rank, node=node, gpus=1))
    return tuple(chosen)


def step_world(world: World, name: str, fact: lc.Fact) -> None:
    before = world.jobs[name]
    held_before = before.holds_gpus
    verdict = lc.check(before, fact.action)[0] if isinstance(fact, Command) else ""
    result = lc.apply(before, fact, world.now, LIMITS)
    if verdict == "ok" and result.record is not None and not result.record.holds_gpus:
        assert isinstance(fact, Command)
        assert result.record.status == {"stop": "stopped", "cancel": "cancelled",
                                        "resume": "pending"}[fact.action], (fact, result.record)
    for effect in result.effects:
        if isinstance(effect, Launch):
            assert result.record is not None and result.record.status == "running"
        if isinstance(effect, StopWorkers) and not effect.wait:
            assert held_before, f"{fact}: stopped workers of a job that had none"
    if result.record is None:
        assert any(isinstance(e, Forget) for e in result.effects)
        del world.jobs[name]
        world.gone.add(name)
        return
    if any(isinstance(e, Save | Forget) for e in result.effects) is False:
        assert result.record == before, f"{fact} changed the job without saving it"
    world.jobs[name] = result.record


def check_invariants(world: World, retry_placements: dict[str, int]) -> None:
    free = world.free()
    assert all(g >= 0 for g in free.values()), f"GPUs counted twice: {free}"
    for name, record in world.jobs.items():
        assert name not in world.gone
        # one state, and the fields that go with it (a completed job keeps
        # its slots to say where it ran; nothing else that holds no GPUs has any)
        assert record.holds_gpus == bool(record.slots) or record.status == "completed", record
        if record.status in ("pending", "stopped", "failed", "cancelled"):
            assert record.exits == {} and record.started_at is None
        assert (record.after_stop is not None) == (record.status == "stopping"), record
        if name in world.final:
            assert record.status == world.final[name], "a final state is final"
        if record.status in FINAL:
            world.final[name] = record.status
        assert retry_placements[name] <= record.spec.max_retry, "retries past max_retry"
        assert record.retries <= record.spec.max_retry + 1


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 2),
                                st.sampled_from([None, 50.0]), st.sampled_from([None, 30.0])),
                      min_size=3, max_size=3),
       ops=st.lists(op, min_size=5, max_size=80))
def test_random_sequences_keep_the_lifecycle_sound(
        specs: list[tuple[int, int, float | None, float | None]],
        ops: list[tuple[object, ...]]) -> None:
    world = World()
    names = [f"j{i}" for i in range(len(specs))]
    for name, (workers, retry, runtime, ttl) in zip(names, specs, strict=True):
        world.jobs[name] = JobRecord(id=name, submitted_at=0.0, spec=JobSpec(
            name=name, workers=workers, gpus_per_worker=1, command=["x"], max_retry=retry,
            max_runtime_s=runtime, ttl_after_finished_s=ttl))
    retry_placements = dict.fromkeys(names, 0)
    for o in ops:
        kind = o[0]
        if kind == "tick":
            world.now += float(o[1])  # type: ignore[arg-type]
            for name in list(world.jobs):
                fact = lc.due(world.jobs[name], world.now, LIMITS)
                if fact is not None:
                    step_world(world, name, fact)
        elif kind == "restart":
            # A new leader reads every record back from JSON.
            world.jobs = {n: JobRecord.model_validate_json(r.model_dump_json())
                          for n, r in world.jobs.items()}
        elif kind in ("node_lost", "drain"):
            fact = (lc.NodeLost(str(o[1]), "gone") if kind == "node_lost"
                    else lc.Drain(str(o[1]), "drained"))
            for name in list(world.jobs):
                step_world(world, name, fact)
        else:
            name = names[int(o[1]) % len(names)]  # type: ignore[call-overload]
            if name not in world.jobs:
                continue
            record = world.jobs[name]
            fact: lc.Fact
            if kind == "place":
                if record.status != "pending" or record.not_before > world.now:
                    continue
                chosen = place(world, record)
                if chosen is None:
                    continue
                if record.retries > 0 and not record.preempted:
                    retry_placements[name] = record.retries
                fact = Placed(chosen)
            elif kind == "exit":
                _, _, rank, code, old, lost = o
                if not record.slots:
                    continue
                rank = int(rank) % len(record.slots)  # type: ignore[call-overload]
                attempt = record.attempt - 1 if old else record.attempt
                fact = Exited(attempt, rank, int(code), record.slots[rank].node,  # type: ignore[call-overload]
                              lost=bool(lost))
            elif kind == "recover":
                fact = lc.Recover("hang", exclude=tuple(record.nodes[:1]))
            elif kind == "preempt":
                fact = lc.Preempt("urgent")
            elif kind == "launch_failed":
                fact = lc.LaunchFailed("refused")
            elif kind == "launch_blocked":
                fact = lc.LaunchBlocked("Secret missing")
            else:
                fact = Command(o[2])  # type: ignore[arg-type]
            step_world(world, name, fact)
        check_invariants(world, retry_placements)
