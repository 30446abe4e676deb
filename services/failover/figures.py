"""Failover's figures on /metrics (``libs.metrics``).

Counted as decisions go out: faults opened by kind, recoveries by kind and
each recovery's phase times (detection, mitigation, re-placement, first
step: seconds from the last healthy sign, as ``fault.recovered`` carries
them). Read at scrape time from the fault book and the heartbeat monitor:
faults open now by kind and status, nodes watched and nodes down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from libs.metrics import ServiceMetrics, gauge_family, settled
from services.failover.faults import Fault

# From a missed heartbeat (seconds) to a resumed job's first step (minutes).
PHASE_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class FailoverFigures:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.opened = metrics.counter("failover_faults_opened", "faults opened", ("kind",))
        self.recoveries = metrics.counter(
            "failover_recoveries", "faults whose jobs ran again (fault.recovered)", ("kind",))
        self.closed = metrics.counter("failover_faults_closed", "faults closed", ("kind",))
        self.phase_seconds = metrics.histogram(
            "failover_recovery_phase_seconds", "a recovered fault's phases, in seconds from "
            "the last healthy sign", ("phase",), buckets=PHASE_BUCKETS)

    def sent(self, action: str, fault: Fault) -> None:
        if action == "open":
            self.opened.labels(fault.kind).inc()
        elif action == "close":
            self.closed.labels(fault.kind).inc()
        elif action == "recovered":
            self.recoveries.labels(fault.kind).inc()
            for phase, seconds in fault.timings().items():
                if seconds is not None:
                    self.phase_seconds.labels(phase.removesuffix("_s")).observe(seconds)


def failover_families(faults: dict[str, Fault], monitor: Any) -> Iterator[Metric]:
    """Reads only: called on the metrics server's thread."""
    book = settled(lambda: list(faults.values()))
    open_now = Counter((f.kind, f.status) for f in book if f.status != "closed")
    yield gauge_family("failover_faults_open", "faults not closed, by kind and status",
                       ("kind", "status"), open_now.items())
    yield gauge_family("failover_nodes_watched", "nodes whose heartbeats failover watches", (),
                       [((), len(monitor.last_seen))])
    yield gauge_family("failover_nodes_down", "watched nodes past their heartbeat deadline",
                       (), [((), len(monitor.down))])
