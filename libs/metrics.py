"""Prometheus metrics of one service process, served on ``/metrics``.

Every service process gets one ``ServiceMetrics`` from the shell
(``libs.service``): the bus's figures (messages handled and dead-lettered
by subject, handler latency, how late messages are handled, each durable's
pending count) and the service's own. A service adds its figures two ways:

- instruments it updates as things happen (``counter``, ``histogram``,
  ``gauge``: get-or-create by name, so a service instance built afresh
  after a lost connection keeps counting into the same series), and
- a *source*: a function called at scrape time that reads the service's
  state and yields metric families (queue lengths, open faults, nodes per
  state), the way ``health()`` reads it for the health request.

The page is rendered by prometheus-client's HTTP server on a thread of its
own: a scrape never waits on the event loop, and a source only reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from libs.events import EVENT_TYPES
from libs.logs import get_logger
from libs.routes import event_subject

PREFIX = "primus"
Source = Callable[[], Iterable[Metric]]
# Handler latency: from a millisecond (a KV update) to a minute (a bench
# level, an insert of a large batch under load).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)
# How long after the server stored a message it was handled.
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_M = TypeVar("_M", Counter, Gauge, Histogram)
_T = TypeVar("_T")


class ServiceMetrics:
    """One process's registry, its instruments, its sources and its server."""

    def __init__(self, service: str, node: str | None = None) -> None:
        self.service, self.node = service, node
        self.registry = CollectorRegistry(auto_describe=False)
        self._made: dict[str, Any] = {}
        self._sources: dict[int, Source] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self.server: Any = None
        self.port: int | None = None
        self.registry.register(_Sources(self))
        info = self.gauge("service_info", "this process: which service, on which node",
                          ("service", "node"))
        info.labels(service, node or "").set(1)
        self.handled = self.counter(
            "messages_handled", "messages a consumer handled (acked after their effect)",
            ("consumer", "subject"))
        self.dead_lettered = self.counter(
            "messages_dead_lettered", "messages refused with a reason, kept in the DLQ stream",
            ("subject",))
        self.handler_seconds = self.histogram(
            "handler_seconds", "time a handler took for one event or one batch",
            ("consumer", "subject"), buckets=LATENCY_BUCKETS)
        self.lag_seconds = self.histogram(
            "consumer_lag_seconds", "how long after the server stored a message it was handled",
            ("consumer",), buckets=LAG_BUCKETS)
        self.pending = self.gauge(
            "consumer_pending", "messages of a durable not yet delivered to it (num_pending)",
            ("consumer",))
        self.ack_pending = self.gauge(
            "consumer_ack_pending", "messages of a durable delivered and not yet acked",
            ("consumer",))

    # ------------------------------------------------------------------ instruments

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return self._get(Counter, name, documentation, labels)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return self._get(Gauge, name, documentation, labels)

    def histogram(self, name: str, documentation: str, labels: Sequence[str] = (), *,
                  buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        return self._get(Histogram, name, documentation, labels, buckets=tuple(buckets))

    def _get(self, kind: type[_M], name: str, documentation: str, labels: Sequence[str],
             **extra: Any) -> _M:
        with self._lock:
            made = self._made.get(name)
            if made is None:
                made = kind(name, documentation, tuple(labels), namespace=PREFIX,
                            registry=self.registry, **extra)
                self._made[name] = made
            elif not isinstance(made, kind):
                raise ValueError(f"metric {name} exists as a {type(made).__name__}")
            return made

    # ------------------------------------------------------------------ sources

    def add_source(self, source: Source) -> Callable[[], None]:
        """Call ``source`` at every scrape; the returned function stops that."""
        with self._lock:
            key = self._next
            self._next += 1
            self._sources[key] = source

        def remove() -> None:
            with self._lock:
                self._sources.pop(key, None)

        return remove

    def _collect_sources(self) -> Iterator[Metric]:
        with self._lock:
            sources = list(self._sources.values())
        for source in sources:
            name = getattr(source, "__qualname__", repr(source))
            try:
                families = list(source())
            except Exception as exc:  # one broken source must not empty the page
                if name not in self._failing:
                    self._failing.add(name)
                    get_logger(component="metrics").warning(
                        "metrics source failed", source=name, error=repr(exc))
                continue
            self._failing.discard(name)
            yield from families

    # ------------------------------------------------------------------ serving

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0: any free one); the port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.server, self.port = server, int(server.server_port)
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def render(self) -> bytes:
        """The page a scrape gets (text exposition format)."""
        return generate_latest(self.registry)


class _Sources:
    """The registry's view of a ServiceMetrics' sources."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics._collect_sources()


def gauge_family(name: str, documentation: str, labels: Sequence[str],
                 values: Iterable[tuple[Sequence[str], float]]) -> GaugeMetricFamily:
    """A gauge family read at scrape time: ``values`` are (label values, value)."""
    family = GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=list(labels))
    for label_values, value in values:
        # A bare string would be taken letter by letter ("ready" as "r").
        if isinstance(label_values, str) or len(label_values) != len(labels):
            raise ValueError(f"{name}: label values {label_values!r} do not match the labels "
                             f"{tuple(labels)}; give a tuple of {len(labels)}")
        family.add_metric([str(v) for v in label_values], float(value))
    return family


def settled(read: Callable[[], _T], tries: int = 5) -> _T:
    """``read()`` retried while the loop changes what it iterates: a source
    runs on the server's thread, and copying a dict the event loop resizes
    meanwhile raises RuntimeError. A copy under the GIL is otherwise whole."""
    for _ in range(tries - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


# Every node's and job's subjects (12,500 nodes have as many telemetry subjects).
@lru_cache(maxsize=1 << 16)
def subject_label(subject: str) -> str:
    """A bounded label for a subject: its event's subject pattern
    (``safe.node.*.state``), the first two tokens and ``>`` otherwise. Node
    and job names never become label values."""
    tokens = subject.split(".")
    for pattern in _PATTERNS.get(len(tokens), ()):
        if all(p == "*" or p == t for p, t in zip(pattern, tokens, strict=True)):
            return ".".join(pattern)
    return ".".join([*tokens[:2], ">"])


def _by_length(patterns: Iterable[str]) -> dict[int, tuple[tuple[str, ...], ...]]:
    out: dict[int, list[tuple[str, ...]]] = {}
    for pattern in sorted(set(patterns)):
        assert ">" not in pattern, pattern  # event subjects are fixed-length
        tokens = tuple(pattern.split("."))
        out.setdefault(len(tokens), []).append(tokens)
    return {n: tuple(p) for n, p in out.items()}


_PATTERNS = _by_length(event_subject(cls) for cls in EVENT_TYPES)
