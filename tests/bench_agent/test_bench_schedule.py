"""Periodic health probes: when a check is due, skip-if-running, timeouts and
the consecutive-failure count, with the clock passed in."""

from __future__ import annotations

from services.bench.config import CheckConfig
from services.bench.schedule import ProbeSchedule, Report, Skip, Start, start_offset


def check(name: str = "temp", **kw: object) -> CheckConfig:
    base: dict[str, object] = {"name": name, "kind": "gpu_temperature", "interval_s": 10,
                               "timeout_s": 5, "failures_before_report": 3}
    return CheckConfig.model_validate(base | kw)


def starts(actions: list[Start | Skip | Report]) -> list[str]:
    return [a.name for a in actions if isinstance(a, Start)]


def test_first_run_after_jitter_then_every_interval() -> None:
    spec = check(jitter_s=4.0)
    offset = start_offset("node-1", "temp", 4.0)
    assert 0 <= offset < 4.0
    assert start_offset("node-1", "temp", 4.0) == offset  # the same on every restart
    assert start_offset("node-2", "temp", 4.0) != offset  # nodes spread out
    sched = ProbeSchedule([spec], now=100.0, seed="node-1")
    assert sched.due(100.0 + offset - 0.01) == []
    [first] = sched.due(100.0 + offset)
    assert isinstance(first, Start)
    sched.finished("temp", first.run, "ok")
    assert sched.due(100.0 + offset + 9.9) == []
    assert starts(sched.due(100.0 + offset + 10.0)) == ["temp"]
    # While the run is going the next thing that can happen is its timeout.
    assert sched.next_wake(100.0 + offset + 10.0) == 100.0 + offset + 15.0


def test_a_late_wake_does_not_burst() -> None:
    sched = ProbeSchedule([check()], now=0.0)
    run = sched.due(0.0)[0]
    assert isinstance(run, Start)
    sched.finished("temp", run.run, "ok")
    assert starts(sched.due(95.0)) == ["temp"]  # nine intervals late: one run
    assert sched.due(96.0) == []
    assert sched.states["temp"].next_due == 105.0


def test_skip_if_running_and_start_again_otherwise() -> None:
    sched = ProbeSchedule([check("a"), check("b", skip_if_running=False)], now=0.0)
    assert starts(sched.due(0.0)) == ["a", "b"]
    later = sched.due(10.0)
    assert starts(later) == ["b"]  # b overlaps itself, a waits
    assert [s.name for s in later if isinstance(s, Skip)] == ["a"]
    assert sched.states["a"].skipped == 1 and len(sched.states["b"].running) == 2


def test_failure_reported_after_n_in_a_row_once_per_streak_then_recovery() -> None:
    sched = ProbeSchedule([check()], now=0.0)
    reports: list[Report | None] = []
    for i, status in enumerate(["failed", "failed", "ok", "failed", "failed", "failed",
                                "failed", "ok"]):
        run = sched.due(i * 10.0)[0]
        assert isinstance(run, Start)
        reports.append(sched.finished("temp", run.run, status, f"reading {i}"))  # type: ignore[arg-type]
    assert reports[:5] == [None] * 5  # an ok in between restarts the count
    assert reports[5] == Report("temp", True, 3, "reading 5")
    assert reports[6] is None  # reported once per streak
    assert reports[7] == Report("temp", False, 4, "reading 7")


def test_unavailable_is_not_a_failure() -> None:
    sched = ProbeSchedule([check(failures_before_report=2)], now=0.0)
    statuses = ["failed", "unavailable", "failed", "unavailable"]
    for i, status in enumerate(statuses):
        run = sched.due(i * 10.0)[0]
        assert isinstance(run, Start)
        assert sched.finished("temp", run.run, status) is None  # type: ignore[arg-type]


def test_timeout_fails_the_run_and_a_hung_probe_keeps_failing() -> None:
    sched = ProbeSchedule([check(failures_before_report=2)], now=0.0)
    run = sched.due(0.0)[0]
    assert isinstance(run, Start)
    assert sched.next_wake(0.0) == 5.0  # the timeout comes before the next interval
    assert sched.expire(4.9) == []
    assert sched.expire(5.0) == []  # one failure; the threshold is two
    actions = sched.due(10.0)  # still running: skipped, and that counts as a failure
    assert [type(a) for a in actions] == [Skip, Report]
    assert isinstance(actions[1], Report) and actions[1].failed and "hung" in actions[1].detail
    # When the hung run finally ends it only frees its slot.
    assert sched.finished("temp", run.run, "ok") is None
    assert sched.states["temp"].running == {}
    assert starts(sched.due(20.0)) == ["temp"]


def test_reconfigure_keeps_state_of_unchanged_checks() -> None:
    sched = ProbeSchedule([check("a"), check("b")], now=0.0)
    for action in sched.due(0.0):
        assert isinstance(action, Start)
        sched.finished(action.name, action.run, "failed")
    sched.reconfigure([check("a"), check("b", interval_s=30), check("c", jitter_s=0)], now=5.0)
    assert sched.states["a"].consecutive_failures == 1 and sched.states["a"].next_due == 10.0
    assert sched.states["b"].consecutive_failures == 1 and sched.states["b"].next_due == 30.0
    assert sched.states["c"].next_due == 5.0
    sched.reconfigure([check("c")], now=6.0)
    assert list(sched.states) == ["c"]
    assert sched.finished("a", 1, "ok") is None  # a removed check's late finish is ignored



def test_a_report_that_did_not_go_out_is_made_at_the_next_failure() -> None:
    sched = ProbeSchedule([check()], now=0.0)

    def fail(i: int) -> Report | None:
        run = sched.due(i * 10.0)[0]
        assert isinstance(run, Start)
        return sched.finished("temp", run.run, "failed", f"reading {i}")

    assert [fail(i) for i in range(4)] == [None, None, Report("temp", True, 3, "reading 2"),
                                            None]
    sched.unreport("temp")  # the bus refused that report
    assert fail(4) == Report("temp", True, 5, "reading 4")
    assert fail(5) is None  # said now: once per streak again
