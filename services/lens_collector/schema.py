"""Lens's ClickHouse schema as versioned migrations.

``events`` keeps every control-plane event once: ReplacingMergeTree on the
event id, so a redelivered event collapses into the same row. Telemetry
tables are ordered for the questions asked of them (a node's or a job's
series over time) and expire by TTL; ClickHouse is the history, the bus only
buffers. Inserts carry a de-duplication token (the hash of the batch's event
ids), so a redelivered batch adds no rows even before a merge.

Later migrations only add: columns (richer GPU, host and job figures, and
``received``, the insert time, for ingest lag), the logs and alerts tables,
and 1-minute roll-ups kept by materialized views for a year, so dashboards
over weeks read thousands of rows instead of billions. Migration 1 stays as
it shipped: existing databases upgrade in place.
"""

from __future__ import annotations

from libs.store import Migration
from services.lens_collector.delivery_schema import DELIVERIES_MIGRATION
from services.lens_collector.gpu_jobs import GPU_JOBS_MIGRATION
from services.lens_collector.ingest_schema import INGEST_COLUMNS_MIGRATION, INGEST_MIGRATION
from services.lens_collector.rollups import ROLLUP_MIGRATION
from services.lens_collector.worker_logs_schema import WORKER_LOGS_MIGRATION

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
    Migration(2, "richer GPU, host and job figures; insert time", (
        """ALTER TABLE {db}.gpu_metrics
            ADD COLUMN IF NOT EXISTS temp_junction_c Nullable(Float32) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS temp_hbm_c Nullable(Float32) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS power_cap_w Nullable(Float32) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS sclk_mhz Nullable(Float32) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS mclk_mhz Nullable(Float32) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS ecc_correctable Nullable(UInt64) CODEC(T64, ZSTD),
            ADD COLUMN IF NOT EXISTS ecc_uncorrectable Nullable(UInt64) CODEC(T64, ZSTD),
            ADD COLUMN IF NOT EXISTS pcie_rx_bytes_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS pcie_tx_bytes_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS xgmi_rx_bytes_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS xgmi_tx_bytes_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS received DateTime64(3, 'UTC') DEFAULT now64(3)
                CODEC(DoubleDelta, ZSTD)""",
        """ALTER TABLE {db}.node_metrics
            ADD COLUMN IF NOT EXISTS gpu_count UInt8 DEFAULT 0,
            ADD COLUMN IF NOT EXISTS gpu_tool LowCardinality(String) DEFAULT '',
            ADD COLUMN IF NOT EXISTS net_rx_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS net_tx_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS rdma_rx_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS rdma_tx_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS disk_read_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS disk_write_bytes_s Map(LowCardinality(String), Float64),
            ADD COLUMN IF NOT EXISTS fs_free_bytes Map(LowCardinality(String), UInt64),
            ADD COLUMN IF NOT EXISTS fs_total_bytes Map(LowCardinality(String), UInt64),
            ADD COLUMN IF NOT EXISTS received DateTime64(3, 'UTC') DEFAULT now64(3)
                CODEC(DoubleDelta, ZSTD)""",
        """ALTER TABLE {db}.job_metrics
            ADD COLUMN IF NOT EXISTS grad_norm Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS tokens_per_s Nullable(Float64) CODEC(Gorilla, ZSTD),
            ADD COLUMN IF NOT EXISTS checkpoint_bytes Nullable(UInt64),
            ADD COLUMN IF NOT EXISTS checkpoint_duration_s Nullable(Float64),
            ADD COLUMN IF NOT EXISTS dropped Nullable(UInt64),
            ADD COLUMN IF NOT EXISTS received DateTime64(3, 'UTC') DEFAULT now64(3)
                CODEC(DoubleDelta, ZSTD)""",
    )),
    Migration(3, "logs and alerts", (
        """CREATE TABLE IF NOT EXISTS {db}.logs (
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            id String,
            service LowCardinality(String),
            level LowCardinality(String),
            node LowCardinality(String),
            job String,
            message String CODEC(ZSTD(3)),
            fields String CODEC(ZSTD(3)),
            received DateTime64(3, 'UTC') DEFAULT now64(3) CODEC(DoubleDelta, ZSTD),
            INDEX node_idx node TYPE set(1024) GRANULARITY 4
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toDate(time)
        ORDER BY (job, time, id)
        TTL toDateTime(time) + INTERVAL 14 DAY
        SETTINGS non_replicated_deduplication_window = 10000""",
        """CREATE TABLE IF NOT EXISTS {db}.alerts (
            time DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD),
            alert_id String,
            state LowCardinality(String),
            rule LowCardinality(String),
            severity LowCardinality(String),
            subject_key String,
            node LowCardinality(String),
            job String,
            gpu Nullable(UInt8),
            value Nullable(Float64),
            threshold Nullable(Float64),
            message String CODEC(ZSTD(3)),
            opened_at DateTime64(3, 'UTC'),
            event_id String
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toYYYYMM(opened_at)
        ORDER BY (alert_id, state)
        TTL toDateTime(time) + INTERVAL 365 DAY
        SETTINGS non_replicated_deduplication_window = 10000""",
    )),
    Migration(4, "1-minute roll-ups", ROLLUP_MIGRATION),
    Migration(5, "ingest: telemetry parsed by the engine", INGEST_MIGRATION),
    Migration(6, "ingest: node GPUs and NICs as columns (telemetry.node version 2)",
              INGEST_COLUMNS_MIGRATION),
    # Merging Map(LowCardinality(String), ...) re-maps every key through the
    # parts' dictionaries: node_metrics cost 3.5x more CPU per merge than with
    # plain String keys, which compress as well (a node repeats its names).
    Migration(7, "node_metrics map keys as String: cheaper merges", (
        "ALTER TABLE {db}.node_metrics "
        + ", ".join(f"MODIFY COLUMN IF EXISTS {c} Map(String, {t})" for c, t in (
            ("net_rx_bytes_s", "Float64"), ("net_tx_bytes_s", "Float64"),
            ("rdma_rx_bytes_s", "Float64"), ("rdma_tx_bytes_s", "Float64"),
            ("disk_read_bytes_s", "Float64"), ("disk_write_bytes_s", "Float64"),
            ("fs_free_bytes", "UInt64"), ("fs_total_bytes", "UInt64"))),
    )),
    Migration(8, "workers' output lines; job telemetry parsed from them",
              WORKER_LOGS_MIGRATION),
    Migration(9, "GPU rows carry the job, attempt and rank using the GPU", GPU_JOBS_MIGRATION),
    Migration(10, "alert deliveries: every attempt to send an alert, and its outcome",
              DELIVERIES_MIGRATION),
)

# Where each table's rows go on a sharded cluster (PRIMUS_CLICKHOUSE_CLUSTER,
# libs/clickhouse_cluster.py). Telemetry by node, so a node's series is on
# one shard; job telemetry by job, so a job's roll-up is whole on its shard;
# a roll-up on the same key as its source (each shard refreshes its own).
SHARDING: dict[str, str] = {
    "events": "cityHash64(id)",
    "node_metrics": "cityHash64(node)",
    "gpu_metrics": "cityHash64(node)",
    "job_metrics": "cityHash64(job)",
    "logs": "cityHash64(job, node)",
    "alerts": "cityHash64(alert_id)",
    "alert_deliveries": "cityHash64(delivery_id)",
    "gpu_metrics_1m": "cityHash64(node)",
    "node_metrics_1m": "cityHash64(node)",
    "job_metrics_1m": "cityHash64(job)",
    "gpu_jobs_1m": "cityHash64(node)",
}
