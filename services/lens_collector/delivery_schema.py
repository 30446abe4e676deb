"""The ``alert_deliveries`` table: every attempt to deliver an alert
transition to a receiver, and its outcome.

One row per attempt, after a ``queued`` row (attempt 0) written before the
event is acked: ``delivered`` (2xx), ``failed`` (another try comes at
``next_attempt_at``), ``gave_up`` (out of attempts or time, or a 4xx that no retry
fixes) or ``silenced`` (an active Alertmanager silence covers the alert:
not sent). ``cause`` says why it was sent: the alert's ``transition``
(opened, closed), the periodic ``resend`` of open alerts to Alertmanager
(recorded when its outcome changes), or a ``recovered`` retry that a
replica which died mid-way left behind. A failed row keeps the ``lens.alert``
event, so whichever replica takes the retry over can send it again.
"""

from __future__ import annotations

DELIVERIES_TABLE = "alert_deliveries"
DELIVERY_COLUMNS: list[str] = [
    "time", "delivery_id", "alert_id", "state", "rule", "severity", "node", "job", "workspace",
    "receiver", "kind", "cause", "attempt", "outcome", "status_code", "error", "latency_ms",
    "next_attempt_at", "silence_id", "event"]

DELIVERIES_MIGRATION: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS {db}.alert_deliveries (
        time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
        delivery_id String,
        alert_id String,
        state LowCardinality(String),
        rule LowCardinality(String),
        severity LowCardinality(String),
        node LowCardinality(String),
        job String,
        workspace LowCardinality(String),
        receiver LowCardinality(String),
        kind LowCardinality(String),
        cause LowCardinality(String),
        attempt UInt16,
        outcome LowCardinality(String),
        status_code Nullable(UInt16),
        error String CODEC(ZSTD(3)),
        latency_ms Nullable(Float32),
        next_attempt_at Nullable(DateTime64(3, 'UTC')),
        silence_id String,
        event String CODEC(ZSTD(3))
    ) ENGINE = ReplacingMergeTree
    PARTITION BY toYYYYMM(time)
    ORDER BY (delivery_id, time, attempt, outcome)
    TTL toDateTime(time) + INTERVAL 90 DAY
    SETTINGS non_replicated_deduplication_window = 10000""",
)

# The transitions (to a receiver) already queued: a redelivered event's.
CHAINS_SQL = """SELECT DISTINCT delivery_id FROM {db}.alert_deliveries
WHERE delivery_id IN {ids:Array(String)} AND cause != 'resend'"""
# Attempts nobody carries on: the newest row is queued or failed and its
# next attempt is long overdue (the replica that owned it stopped or died).
ORPHANS_SQL = """SELECT delivery_id, argMax(receiver, (time, attempt)), max(attempt),
       argMax(event, (time, attempt))
FROM {db}.alert_deliveries
WHERE cause != 'resend' AND time > fromUnixTimestamp64Milli({since:Int64}, 'UTC')
GROUP BY delivery_id
HAVING argMax(outcome, (time, attempt)) IN ('queued', 'failed')
   AND max(next_attempt_at) < fromUnixTimestamp64Milli({stale:Int64}, 'UTC')
LIMIT 10000"""
