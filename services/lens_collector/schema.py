"""Lens's ClickHouse schema as versioned migrations.

``events`` keeps every control-plane event once: ReplacingMergeTree on the
event id, so a redelivered event collapses into the same row. Telemetry
tables are ordered for the questions asked of them (a node's or a job's
series over time) and expire by TTL; ClickHouse is the history, the bus only
buffers. Inserts carry a de-duplication token (the hash of the batch's event
ids), so a redelivered batch adds no rows even before a merge.
"""

from __future__ import annotations

from libs.store import Migration

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "events, node and job telemetry", (
        """CREATE TABLE IF NOT EXISTS {db}.events (
            id String,
            type LowCardinality(String),
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            source LowCardinality(String),
            node LowCardinality(String),
            job String,
            subject String,
            stream_seq UInt64,
            data String CODEC(ZSTD(3)),
            received DateTime64(3, 'UTC') DEFAULT now64(3)
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toYYYYMM(time)
        ORDER BY id
        SETTINGS non_replicated_deduplication_window = 10000""",
        """CREATE TABLE IF NOT EXISTS {db}.node_metrics (
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            node LowCardinality(String),
            event_id String,
            cpu_pct Float32 CODEC(Gorilla, ZSTD),
            mem_used_bytes UInt64 CODEC(T64, ZSTD),
            mem_total_bytes UInt64 CODEC(T64, ZSTD),
            load1 Float32 CODEC(Gorilla, ZSTD)
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toDate(time)
        ORDER BY (node, time, event_id)
        TTL toDateTime(time) + INTERVAL 30 DAY
        SETTINGS non_replicated_deduplication_window = 10000""",
        """CREATE TABLE IF NOT EXISTS {db}.gpu_metrics (
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            node LowCardinality(String),
            gpu UInt8,
            event_id String,
            util_pct Nullable(Float32),
            vram_used_bytes Nullable(UInt64),
            vram_total_bytes Nullable(UInt64),
            temp_c Nullable(Float32),
            power_w Nullable(Float32)
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toDate(time)
        ORDER BY (node, gpu, time, event_id)
        TTL toDateTime(time) + INTERVAL 30 DAY
        SETTINGS non_replicated_deduplication_window = 10000""",
        """CREATE TABLE IF NOT EXISTS {db}.job_metrics (
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            job String,
            rank UInt16,
            attempt UInt16,
            node LowCardinality(String),
            event_id String,
            iteration UInt64 CODEC(DoubleDelta, ZSTD),
            loss Nullable(Float64) CODEC(Gorilla, ZSTD),
            throughput Nullable(Float64) CODEC(Gorilla, ZSTD),
            step_time_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            checkpoint_path Nullable(String)
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toYYYYMM(time)
        ORDER BY (job, rank, iteration, event_id)
        TTL toDateTime(time) + INTERVAL 180 DAY
        SETTINGS non_replicated_deduplication_window = 10000""",
    )),
)
