"""Where things live on the bus: the JetStream streams and the KV buckets
every service declares at start (``Bus.ensure_topology``), the roots of the
core-NATS subjects outside every stream (health, queries), and which stream
keeps a subject. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import api

from libs.events import SUBJECT_ROOT
from libs.records import BUCKETS

DAY = 24 * 3600.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    duplicate_window_s: float = 120.0

    def config(self, replicas: int = 1) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            max_age=self.max_age_s,
            duplicate_window=self.duplicate_window_s,
            num_replicas=replicas,
        )


CONTROL = StreamSpec(
    "CONTROL",
    tuple(f"{SUBJECT_ROOT}.{d}.>" for d in ("node", "job", "worker", "bench", "fault"))
    # Lens alerts; Lens's queries are request/reply under safe.query.
    + (f"{SUBJECT_ROOT}.lens.alert.>",),
    max_age_s=30 * DAY,
)
# ClickHouse keeps the telemetry history; the stream only buffers it.
TELEMETRY = StreamSpec("TELEMETRY", (f"{SUBJECT_ROOT}.telemetry.>",), 1 * DAY, 30.0)
DEADLETTER = StreamSpec("DEADLETTER", (f"{SUBJECT_ROOT}.dlq.>",), 30 * DAY)
STREAMS: tuple[StreamSpec, ...] = (CONTROL, TELEMETRY, DEADLETTER)

# Current state, each bucket written by its owner only (libs.records).
KV_BUCKETS: dict[str, str] = {b.name: b.description for b in BUCKETS}

# Liveness: heartbeats on core NATS, kept by no stream (libs/beats.py).
LIVE_ROOT = f"{SUBJECT_ROOT}.live"

HEALTH_SUBJECT = SUBJECT_ROOT + ".health.{service}"
# Request-reply queries live outside every stream's subjects.
QUERY_SUBJECT = SUBJECT_ROOT + ".query.{name}"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching: ``*`` is one token, ``>`` the rest. A ``*`` in
    ``subject`` (itself a pattern) needs ``*`` or ``>`` in ``pattern``."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def stream_of(subject: str) -> StreamSpec | None:
    """The stream that keeps ``subject`` (None: core NATS only)."""
    return next((s for s in STREAMS if any(subject_matches(p, subject) for p in s.subjects)),
                None)

