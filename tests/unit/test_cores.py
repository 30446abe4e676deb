"""The pure cores of the skeleton, as scenarios: onboarding transitions,
heartbeat fault detection, bench verdicts and gang placement."""

from __future__ import annotations

import math

import pytest

from libs.events import JobSpec
from services.bench.verdict import judge_quick
from services.bootstrap.onboarding import step
from services.failover.rules import HeartbeatMonitor
from services.scheduler.core import JobRecord, NodeView, SchedulerState, plan, retry_backoff_s


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
    mon.watch("a", 0.0)
    mon.watch("b", 0.0)
    mon.beat("a", 2.0)
    assert [m.node for m in mon.check(3.5)] == ["b"]  # b never beat
    assert mon.check(3.6) == []  # reported once
    assert [m.node for m in mon.check(5.1)] == ["a"]
    assert mon.beat("a", 6.0) is True  # back
    assert mon.check(7.0) == []
    assert [m.node for m in mon.check(9.5)] == ["a"]  # a new outage


def test_heartbeat_out_of_order_beats_do_not_move_time_back() -> None:
    mon = HeartbeatMonitor(interval_s=1.0, missed=2)
    mon.beat("a", 10.0)
    mon.beat("a", 5.0)
    assert mon.check(11.5) == []


def test_bench_verdicts() -> None:
    assert judge_quick(device_count=8, expected_devices=8, gemm_tflops=100, gemm_error=1e-4).passed
    missing = judge_quick(device_count=7, expected_devices=8, gemm_tflops=100, gemm_error=1e-4)
    assert not missing.passed and "sees 7 device(s), inventory says 8" in missing.reason
    nan = judge_quick(device_count=1, expected_devices=1, gemm_tflops=1, gemm_error=math.nan)
    assert not nan.passed and "GEMM result wrong" in nan.reason


def nodes(*specs: tuple[str, int, str]) -> dict[str, NodeView]:
    return {name: NodeView(name, gpus, "cpu", f"10.0.0.{i}", rack, state="ready")
            for i, (name, gpus, rack) in enumerate(specs, 1)}


def job(jid: str, workers: int, gpus: int = 1, priority: str = "medium", t: float = 0) -> JobRecord:
    spec = JobSpec(name=jid, workers=workers, gpus_per_worker=gpus, command=["x"],
                   priority=priority)  # type: ignore[arg-type]
    return JobRecord(id=jid, spec=spec, submitted_at=t)


def test_gang_is_all_or_nothing_and_prefers_one_rack() -> None:
    state = SchedulerState(nodes=nodes(("a", 1, "r1"), ("b", 1, "r2"), ("c", 1, "r2")),
                           jobs={"j": job("j", 2)})
    decided = plan(state, now=0)
    assert [(s.rank, s.node) for s in decided.placements[0].slots] == [(0, "b"), (1, "c")]
    state.jobs["big"] = job("big", 4, t=1)
    decided = plan(state, now=0)
    assert [p.job for p in decided.placements] == ["j"]
    assert decided.pending[0].job == "big" and "needs 4 node(s)" in decided.pending[0].reason


def test_fifo_blocks_behind_the_head_and_priority_goes_first() -> None:
    state = SchedulerState(nodes=nodes(("a", 1, "r1"), ("b", 1, "r1")), jobs={
        "big": job("big", 3, t=0), "small": job("small", 1, t=1),
        "urgent": job("urgent", 1, priority="high", t=2)})
    decided = plan(state, now=0)
    assert [p.job for p in decided.placements] == ["urgent"]
    reasons = {p.job: (p.position, p.reason) for p in decided.pending}
    assert reasons["big"][0] == 1 and reasons["small"] == (2, "waiting behind big (FIFO)")


def test_unready_nodes_are_never_used_and_backoff_delays_retries() -> None:
    state = SchedulerState(nodes=nodes(("a", 1, "r1"), ("b", 1, "r1")), jobs={"j": job("j", 2)})
    state.nodes["b"].state = "quarantined"
    assert plan(state, now=0).placements == []
    state.nodes["b"].state = "ready"
    state.jobs["j"].not_before = 10.0
    assert plan(state, now=5).pending[0].reason.startswith("retry 1 in 5 s")
    assert plan(state, now=10).placements
    assert retry_backoff_s(1) == 5.0 and retry_backoff_s(3) == 20.0 and retry_backoff_s(30) == 300
