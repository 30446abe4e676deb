"""Failover's fault rules and fault lifecycle, as scenarios."""

from __future__ import annotations

from services.failover.faults import FailoverRules, FaultBook, FaultRule, classify_exit, infra_rule


def book(*rules: FaultRule) -> FaultBook:
    return FaultBook(FailoverRules(rules=list(rules)) if rules else FailoverRules())


def test_a_node_fault_opens_is_mitigated_recovers_and_closes() -> None:
    b = book()
    [opened] = b.observe("heartbeat_missed", "n2", bad=True, now=13.0, last_good=10.0,
                         jobs=["j1"], reason="no heartbeat")
    assert opened.action == "open" and opened.fault.jobs == ["j1"]
    assert b.observe("heartbeat_missed", "n2", bad=True, now=14.0) == []  # one per outage
    [mitigated] = b.node_state("n2", "quarantined", now=13.2)
    assert mitigated.action == "mitigate"
    b.job_placed("j1", attempt=2, now=13.5)
    assert b.job_stepped("j1", attempt=1, now=13.6) == []  # a late step of the old attempt
    [recovered] = b.job_stepped("j1", attempt=2, now=20.0)
    assert recovered.action == "recovered"
    assert recovered.fault.timings() == {"detection_s": 3.0, "mitigation_s": 3.2,
                                         "replacement_s": 3.5, "first_step_s": 10.0}
    [closed] = b.node_state("n2", "ready", now=60.0)  # it passed bench again
    assert closed.action == "close" and closed.fault.status == "closed"
    assert b.observe("heartbeat_missed", "n2", bad=True, now=70.0)[0].action == "open"


def test_consecutive_count_and_a_good_observation_resets_the_streak() -> None:
    b = book(FaultRule(kind="probe_failed", consecutive=3))
    assert b.observe("probe_failed", "n1", bad=True, now=1) == []
    assert b.observe("probe_failed", "n1", bad=True, now=2) == []
    assert b.observe("probe_failed", "n1", bad=False, now=3) == []
    assert b.observe("probe_failed", "n1", bad=True, now=4) == []
    assert b.observe("probe_failed", "n1", bad=True, now=5) == []
    assert [d.action for d in b.observe("probe_failed", "n1", bad=True, now=6)] == ["open"]


def test_a_job_fault_restarts_the_job_without_touching_nodes() -> None:
    b = book()
    decisions = b.observe("alert:loss_nonfinite", "j9", bad=True, now=5.0, last_good=4.0)
    assert [d.action for d in decisions] == ["open", "restart_job"]
    fault = decisions[0].fault
    assert fault.scope == "job" and fault.jobs == ["j9"] and fault.status == "mitigated"
    assert b.node_state("j9", "quarantined", now=6) == []
    b.job_placed("j9", attempt=3, now=7.0)
    [done] = b.job_stepped("j9", attempt=3, now=9.0)
    assert done.fault.status == "closed" and done.fault.timings()["first_step_s"] == 5.0


def test_unknown_kinds_and_record_only_rules() -> None:
    b = book()
    assert b.observe("cosmic_rays", "n1", bad=True, now=1) == []
    [opened] = b.observe("alert:gpu_temp_high", "n1", bad=True, now=1)
    assert opened.fault.failover is False  # recorded; nothing moves


def test_exit_codes_are_classified() -> None:
    infra = FailoverRules().infra_exit_codes
    assert classify_exit(0, infra) == "ok"
    assert classify_exit(-7, infra) == "infra" and classify_exit(134, infra) == "infra"
    assert classify_exit(1, infra) == "user" and classify_exit(-15, infra) == "user"
    assert classify_exit(-9, infra) == "user"  # a hard stop of the platform's own


# ------------------------------------------------------------ time and strangers


def test_a_beat_counts_when_received_and_a_stranger_is_never_judged() -> None:
    from services.failover.rules import HeartbeatMonitor

    monitor = HeartbeatMonitor(interval_s=1.0, missed=3)
    monitor.watch("gpu-1", now=100.0)
    monitor.beat("gpu-1", at=101.0)  # the sender may have stamped it 2099: not used
    monitor.beat("forged-9", at=101.0)  # bootstrap never registered it
    assert monitor.check(103.9) == []
    [missed] = monitor.check(104.1)
    assert missed.node == "gpu-1" and missed.last_seen == 101.0
    assert "forged-9" not in monitor.last_seen and monitor.unknown_beats == {"forged-9": 1}
    assert monitor.check(500.0) == []  # one fault per outage, and none for the stranger


def test_a_silence_whose_fault_an_operator_closed_is_judged_again() -> None:
    from services.failover.rules import HeartbeatMonitor

    monitor = HeartbeatMonitor(interval_s=1.0, missed=3)
    monitor.watch("gpu-1", now=100.0)
    monitor.watch("gpu-2", now=100.0)
    assert [m.node for m in monitor.check(103.1)] == ["gpu-1", "gpu-2"]
    assert monitor.check(150.0) == []  # once per outage
    monitor.judge_again("gpu-1", now=150.0)  # closed; its agent is still silent
    monitor.judge_again("gpu-9", now=150.0)  # not down: nothing to do
    assert monitor.check(152.9) == []  # a full deadline from the close
    [again] = monitor.check(153.1)
    assert again.node == "gpu-1" and again.last_seen == 100.0  # silent since its last beat
    monitor.judge_again("gpu-2", now=160.0)
    monitor.beat("gpu-2", at=161.0)  # closed because it was fixed: it beats, no fault
    assert monitor.check(163.5) == []


def test_after_a_start_every_node_gets_a_full_deadline_whatever_was_replayed() -> None:
    from services.failover.rules import HeartbeatMonitor

    monitor = HeartbeatMonitor(interval_s=1.0, missed=3)
    started = 1000.0
    monitor.blind(started)
    monitor.watch("gpu-1", now=started)
    monitor.watch("gpu-2", now=started)
    monitor.beat("gpu-1", at=started + 0.1)  # replayed beats count as received now
    assert monitor.check(started + 2.9) == []
    monitor.beat("gpu-2", at=started + 2.9)  # a slow agent, within its deadline
    assert [m.node for m in monitor.check(started + 3.2)] == ["gpu-1"]


def test_a_check_scans_only_the_silent_and_a_stalled_judge_judges_no_one() -> None:
    from services.failover.rules import HeartbeatMonitor

    monitor = HeartbeatMonitor(interval_s=1.0, missed=3)
    for i in range(1000):
        monitor.watch(f"gpu-{i:04d}", now=0.0, heard=True)
    for t in (1.0, 2.0, 3.0):  # all beat but gpu-0007, in whatever order they arrive
        for i in reversed(range(1000)):
            if i != 7:
                monitor.beat(f"gpu-{i:04d}", at=t + i / 10_000)
    assert list(monitor.last_seen)[0] == "gpu-0007"  # the silent one leads the arrival order
    assert [m.node for m in monitor.check(3.05)] == ["gpu-0007"]
    # Nobody beats for a while because the judge itself stood still (its
    # process paused 4 s): past stall_s late, the silence is its own.
    assert monitor.check(7.2, late_s=4.1) == []
    assert monitor.check(9.0) == []  # a full deadline from when it could hear again
    assert len(monitor.check(10.3)) == 999  # now they really are silent
    monitor.beat("gpu-0001", at=10.4)
    assert list(monitor.last_seen)[-1] == "gpu-0001"


def test_every_fault_of_a_job_closes_when_the_job_ends() -> None:
    book = FaultBook(FailoverRules())
    hang = book.observe("alert:job_hang", "job-1", bad=True, now=10.0)
    slow = book.observe("alert:throughput_low", "job-1", bad=True, now=11.0)
    node = book.observe("heartbeat_missed", "gpu-1", bad=True, now=12.0, jobs=["job-1"])
    closed = book.job_ended("job-1", now=20.0)
    assert {d.fault.fault_id for d in closed} == {hang[0].fault.fault_id, slow[0].fault.fault_id}
    assert all(d.action == "close" and d.fault.closed_at == 20.0 for d in closed)
    assert node[0].fault.status == "opened"  # the node's own fault waits for bench
    assert book.job_ended("job-1", now=21.0) == []  # once


def test_a_preempted_job_closes_its_faults_and_its_next_run_is_judged_afresh() -> None:
    book = FaultBook(FailoverRules())
    hang = book.observe("alert:job_hang", "job-2", bad=True, now=10.0)[0].fault
    assert [d.action for d in book.job_ended("job-2", now=12.0)] == ["close"]  # preempted
    book.job_placed("job-2", attempt=2, now=30.0)  # placed again: another run
    assert book.job_stepped("job-2", attempt=2, now=31.0) == []
    assert hang.replaced_at == {} and hang.first_step_at == {} and hang.closed_at == 12.0
    again = book.observe("alert:job_hang", "job-2", bad=True, now=40.0)
    assert [d.action for d in again] == ["open", "restart_job"]  # a new fault, not the old one
    assert again[0].fault.fault_id != hang.fault_id


def test_an_unconfigured_log_alert_is_a_fault_only_when_infra() -> None:
    job = infra_rule("alert:log_collective_timeout", "infra", about_job=True)
    node = infra_rule("alert:log_rdma_error", "infra", about_job=False)
    assert job is not None and (job.kind, job.scope, job.failover) == (
        "alert:log_collective_timeout", "job", True)
    assert node is not None and node.scope == "node"
    assert infra_rule("alert:log_traceback", "user", about_job=True) is None
    assert infra_rule("alert:job_hang", None, about_job=True) is None  # a metric rule


def test_a_watched_node_outlasts_a_silent_driver_until_the_bound() -> None:
    """No word (None) keeps the node watched until ``no_word_s`` have passed
    since the driver last said its workers run; the driver saying they
    stopped ends the watch at once."""
    from services.failover.rules import MissedHeartbeat, WatchedNode

    missed = MissedHeartbeat("n1", last_seen=0.0, overdue_s=3.0)
    watched = WatchedNode(missed, asked=10.0, seen_running=10.0)
    assert not watched.due(11.9, 2.0) and watched.due(12.0, 2.0)
    assert watched.answered(True, 12.0, 30.0) == "" and watched.seen_running == 12.0
    assert watched.answered(None, 14.0, 30.0) == ""  # a scheduler restarting: no word
    assert watched.answered(None, 41.9, 30.0) == "" and watched.asked == 41.9
    assert watched.answered(None, 42.0, 30.0) == "; no word on its workers for 30 s"
    stopped = WatchedNode(missed, asked=10.0, seen_running=10.0)
    assert stopped.answered(None, 12.0, 30.0) == ""
    assert stopped.answered(False, 14.0, 30.0) == "; its workers have stopped too"


def test_a_newly_silent_node_is_watched_unless_the_driver_says_its_workers_stopped() -> None:
    """The first answer: running watches from now; no word (the scheduler
    restarting with the agent) watches from the node's last beat, so the
    bound counts from there; stopped opens the fault at once."""
    from services.failover.rules import MissedHeartbeat, WatchedNode

    missed = MissedHeartbeat("n1", last_seen=1000.0, overdue_s=3.0)  # wall clock
    running = WatchedNode.first(missed, True, 50.0, 1003.0)
    assert running is not None and running.seen_running == 50.0 and running.asked == 50.0
    unheard = WatchedNode.first(missed, None, 50.0, 1003.0)
    assert unheard is not None and unheard.seen_running == 47.0
    assert unheard.answered(None, 76.9, 30.0) == ""
    assert unheard.answered(None, 77.0, 30.0) == "; no word on its workers for 30 s"
    assert WatchedNode.first(missed, False, 50.0, 1003.0) is None
    # A last beat stamped after the wall clock's now (a clock step) counts as now.
    assert WatchedNode.first(missed, None, 50.0, 999.0).seen_running == 50.0  # type: ignore[union-attr]
