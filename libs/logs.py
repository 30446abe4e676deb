"""structlog set up once per process: JSON lines on stderr, with the service
and, where known, node and job ids bound so logs join metrics and events."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure(service: str, level: str = "info", **bound: str | None) -> structlog.BoundLogger:
    static = {"service": service, **{k: v for k, v in bound.items() if v is not None}}

    def add_static(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
        # Also for lines logged from worker threads, which do not inherit
        # the context variables bound in the main thread.
        for key, value in static.items():
            event.setdefault(key, value)
        return event

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_static,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
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
