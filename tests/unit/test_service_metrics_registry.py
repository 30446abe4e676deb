"""libs/metrics.py: one registry per process, served over HTTP, with
instruments made once and scrape-time sources that cannot break the page."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
import structlog
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from libs.metrics import ServiceMetrics, gauge_family, settled, subject_label
from libs.service import _serve_metrics
from libs.settings import Settings


def families(metrics: ServiceMetrics) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_subjects_become_their_event_pattern_never_a_node_or_job_name() -> None:
    assert subject_label("safe.node.gpu-17.state") == "safe.node.*.state"
    assert subject_label("safe.job.train-42.placed") == "safe.job.*.placed"
    assert subject_label("safe.telemetry.node.gpu-3") == subject_label("safe.telemetry.node.x")
    assert subject_label("something.else.entirely.here") == "something.else.>"


def test_instruments_are_made_once_by_name() -> None:
    metrics = ServiceMetrics("scheduler")
    first = metrics.counter("decisions", "made", ("kind",))
    assert metrics.counter("decisions", "made", ("kind",)) is first  # a fresh service instance
    first.labels("placed").inc(3)
    assert families(metrics)["primus_decisions"].samples[0].value == 3
    with pytest.raises(ValueError, match="exists as a Counter"):
        metrics.gauge("decisions", "made")


def test_a_failing_source_leaves_the_rest_of_the_page() -> None:
    metrics = ServiceMetrics("failover", node=None)

    def broken() -> Iterator[Metric]:
        raise KeyError("state moved")
        yield  # pragma: no cover

    def fine() -> Iterator[Metric]:
        yield gauge_family("faults_open", "open", ("kind",), [(("node_down",), 2)])

    remove = metrics.add_source(broken)
    metrics.add_source(fine)
    page = families(metrics)
    assert page["primus_faults_open"].samples[0].labels == {"kind": "node_down"}
    assert page["primus_service_info"].samples[0].labels == {"service": "failover", "node": ""}
    remove()
    assert "primus_faults_open" in families(metrics)


def test_settled_retries_a_copy_the_loop_resized() -> None:
    calls = []

    def read() -> list[int]:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("dictionary changed size during iteration")
        return [1, 2]

    assert settled(read) == [1, 2] and len(calls) == 3


def test_served_on_a_free_port_and_closed() -> None:
    metrics = ServiceMetrics("bench-agent", node="gpu-1")
    port = metrics.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'primus_service_info{node="gpu-1",service="bench-agent"} 1.0' in text
    finally:
        metrics.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_switched_off_nothing_is_served_and_a_taken_port_is_not_fatal() -> None:
    log = structlog.get_logger()
    assert _serve_metrics("scheduler", Settings(metrics=False), None, log) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with structlog.testing.capture_logs() as logs:
            metrics = _serve_metrics("scheduler", Settings(metrics_host="127.0.0.1",
                                                           metrics_port=port), None, log)
        assert metrics is not None  # the figures are kept; the service starts anyway
        metrics.close()
    [warning] = [e for e in logs if e["event"] == "metrics not served"]
    assert warning["port"] == port and "PRIMUS_METRICS_PORT" in warning["fix"]


@pytest.mark.parametrize("values", [[("ready", 2)], [(("ready", "extra"), 2)]])
def test_a_gauge_refuses_label_values_that_do_not_match_its_labels(values: list) -> None:
    """A bare string would be split into letters: the state "ready" shown as "r"."""
    with pytest.raises(ValueError, match="give a tuple of 1"):
        gauge_family("nodes", "nodes by state", ("state",), values)
