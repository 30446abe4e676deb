"""The services' own /metrics figures, read from plain state: the
scheduler's queue (zeros for an empty class), failover's open faults and
recovery phases."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from libs.events import JobSpec
from libs.metrics import ServiceMetrics
from libs.records import FaultRecord, JobRecord
from services.failover.figures import FailoverFigures, failover_families
from services.scheduler.figures import scheduler_families
from services.scheduler.view import SchedulerState


def samples(metrics: ServiceMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples}


def job(name: str, status: str, priority: str = "medium", workspace: str = "research"
        ) -> JobRecord:
    spec = JobSpec(name=name, workers=1, gpus_per_worker=1, command=["true"],
                   priority=priority, workspace=workspace)  # type: ignore[arg-type]
    return JobRecord(id=name, spec=spec, submitted_at=0.0, status=status)  # type: ignore[arg-type]


def test_the_queue_counts_pending_jobs_and_shows_empty_classes_as_zero() -> None:
    state = SchedulerState(jobs={j.id: j for j in (
        job("a", "pending", "high"), job("b", "pending", "high"), job("c", "running"),
        job("d", "pending", "low", workspace="prod"))})
    metrics = ServiceMetrics("scheduler")
    metrics.add_source(lambda: scheduler_families(state, leading=True,
                                                  workspaces=["research", "prod"]))
    got = samples(metrics)

    def queue(workspace: str, priority: str) -> float:
        return got[("primus_scheduler_queue_length",
                    frozenset({"workspace": workspace, "priority": priority}.items()))]

    assert queue("research", "high") == 2 and queue("prod", "low") == 1
    assert queue("research", "low") == 0 and queue("prod", "medium") == 0
    assert got[("primus_scheduler_jobs",
                frozenset({"workspace": "research", "status": "running"}.items()))] == 1
    assert got[("primus_scheduler_leader", frozenset())] == 1


def fault(fault_id: str, status: str, **times: float) -> FaultRecord:
    return FaultRecord(fault_id=fault_id, kind="heartbeat_missed", scope="node", key="gpu-1",
                       reason="no heartbeat", jobs=["train"], last_good=100.0,
                       opened_at=103.0, status=status, **times)  # type: ignore[arg-type]


def test_failover_counts_faults_and_a_recovery_phases_from_the_last_good_sign() -> None:
    metrics = ServiceMetrics("failover")
    figures = FailoverFigures(metrics)
    recovered = fault("f1", "mitigated", mitigated_at=104.0,
                      replaced_at={"train": 110.0}, first_step_at={"train": 130.0})
    figures.sent("open", recovered)
    figures.sent("recovered", recovered)
    book = {"f1": recovered, "f2": fault("f2", "opened"), "f3": fault("f3", "closed")}
    monitor = SimpleNamespace(last_seen={"gpu-1": 0.0, "gpu-2": 0.0}, down={"gpu-1"})
    metrics.add_source(lambda: failover_families(book, monitor))
    got = samples(metrics)
    kind = frozenset({"kind": "heartbeat_missed"}.items())
    assert got[("primus_failover_faults_opened_total", kind)] == 1
    assert got[("primus_failover_recoveries_total", kind)] == 1
    for phase, seconds in (("detection", 3.0), ("mitigation", 4.0), ("replacement", 10.0),
                           ("first_step", 30.0)):
        assert got[("primus_failover_recovery_phase_seconds_sum",
                    frozenset({"phase": phase}.items()))] == seconds
    open_now = {dict(k[1])["status"]: v for k, v in got.items()
                if k[0] == "primus_failover_faults_open"}
    assert open_now == {"mitigated": 1, "opened": 1}  # the closed one is not open
    assert got[("primus_failover_nodes_down", frozenset())] == 1
    assert got[("primus_failover_nodes_watched", frozenset())] == 2
