"""structlog set up once per process: JSON lines on stderr, with the service
and, where known, node and job ids bound so logs join metrics and events.

Opt-in (``PRIMUS_LOG_SHIP=1``, ``Settings.log_ship``): every line also goes
over the bus as a ``log.record`` event (to ``safe.telemetry.log``, on the
service's bus), which lens-collector stores in its ``logs`` table.
Shipping uses the training SDK's publisher: a bounded queue and a
background thread, so logging never waits for the bus and a full queue
drops lines (counted) rather than blocking.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_ENVELOPE = ("event", "level", "timestamp", "service", "node", "job")
_shipper: Any = None  # the TelemetryPublisher while shipping


def configure(service: str, level: str = "info", *,
              ship_to: tuple[str, str | None] | None = None,
              ship_auth: dict[str, Any] | None = None,
              **bound: str | None) -> structlog.BoundLogger:
    """Log JSON lines on stderr as ``service`` (with ``bound`` ids on every
    line); with ``ship_to`` (the bus URL and token, ``Settings.log_ship``)
    also ship every line to Lens, logged in with ``ship_auth`` (the
    service's NATS ``user``, ``password`` and ``tls`` context) where given."""
    static = {"service": service, **{k: v for k, v in bound.items() if v is not None}}

    def add_static(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
        # Also for lines logged from worker threads, which do not inherit
        # the context variables bound in the main thread.
        for key, value in static.items():
            event.setdefault(key, value)
        return event

    if ship_to is not None and _shipper is None:
        start_shipping(*ship_to, source=service, **(ship_auth or {}))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_static,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            ship,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    return structlog.get_logger()


def get_logger(**bound: str | None) -> structlog.BoundLogger:
    return structlog.get_logger().bind(**{k: v for k, v in bound.items() if v is not None})


def start_shipping(url: str, token: str | None, *, source: str,
                   max_pending: int = 10_000, user: str | None = None,
                   password: str | None = None, tls: Any = None) -> Any:
    """Ship every log line from now on; returns the publisher (stats, close)."""
    global _shipper
    from libs.sdk import TelemetryPublisher  # the SDK's publisher; imported only when used

    _shipper = TelemetryPublisher(url, token, max_pending, name="primus-log-shipper",
                                  user=user, password=password, tls=tls)
    _shipper.source = source
    _shipper.start()
    return _shipper


def stop_shipping(timeout_s: float = 5.0) -> None:
    global _shipper
    shipper, _shipper = _shipper, None
    if shipper is not None:
        shipper.close(timeout_s)


def ship(_: object, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: offer the line to the shipper, if there is one."""
    shipper = _shipper
    if shipper is None:
        return event
    from libs.events import LogRecord, LogRecordData

    fields = {k: v if isinstance(v, str | int | float | bool | type(None)) else str(v)
              for k, v in event.items() if k not in _ENVELOPE}
    try:
        record = LogRecord(
            source=str(event.get("service") or shipper.source),
            node=_key(event.get("node")), job=_key(event.get("job")),
            data=LogRecordData(level=str(event.get("level", "info")),
                               message=str(event.get("event", "")),
                               service=str(event.get("service") or shipper.source),
                               fields=fields))
    except ValueError:
        return event
    shipper.offer(record)
    return event


def _key(value: object) -> str | None:
    return value if isinstance(value, str) and _KEY.match(value) else None
