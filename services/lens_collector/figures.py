"""lens-collector's figures on /metrics (``libs.metrics``).

Rows stored per table (``rate()`` of it is rows per second), the store
thread's time per piece of work by kind (a telemetry insert, a history
insert, an alert query), telemetry batch sizes, and what was refused or
delivered twice. Counters the collector keeps anyway are read at scrape
time; the histograms are observed as work finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from libs.metrics import PREFIX, ServiceMetrics, settled

# An alert query takes milliseconds; a full telemetry batch about half a second.
STORE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 10, 100, 500, 1000, 2500, 5000, 10000, 20000, 50000)


class CollectorFigures:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.store_seconds = metrics.histogram(
            "lens_store_seconds", "time one piece of work held the store (insert latency for "
            "kind=telemetry and kind=events)", ("kind",), buckets=STORE_BUCKETS)
        self.batch_messages = metrics.histogram(
            "lens_telemetry_batch_messages", "messages in one telemetry batch",
            buckets=BATCH_BUCKETS)


def collector_families(collector: Any) -> Callable[[], Iterator[Metric]]:
    """A source reading the collector's own counters."""

    def families() -> Iterator[Metric]:
        # Telemetry lands in ingest_node / ingest_job / ..., which fill gpu_metrics and the rest.
        rows = CounterMetricFamily(f"{PREFIX}_lens_rows_stored", "rows stored, by table",
                                   labels=["table"])
        for table, count in sorted(settled(lambda: list(collector.rows_written.items()))):
            rows.add_metric([table], count)
        yield rows
        yield CounterMetricFamily(f"{PREFIX}_lens_refused", "telemetry messages refused "
                                  "(dead-lettered with the reason)", value=collector.refused)
        yield CounterMetricFamily(f"{PREFIX}_lens_redelivered", "telemetry messages delivered "
                                  "more than once (a replica died or was slow)",
                                  value=collector.redelivered)
        yield CounterMetricFamily(f"{PREFIX}_lens_inserts", "telemetry inserts",
                                  value=collector.inserts)
        deliverer = getattr(collector, "deliverer", None)
        if deliverer is not None:
            outcomes = CounterMetricFamily(
                f"{PREFIX}_lens_alert_deliveries", "alert delivery attempts this replica "
                "recorded, by outcome (alert_deliveries has each one)", labels=["outcome"])
            for outcome, count in sorted(settled(lambda: list(deliverer.counts.items()))):
                outcomes.add_metric([outcome], count)
            yield outcomes

    return families
