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

from libs.events import KEY_PATTERN
from libs.store import Migration

# The telemetry messages' JSON as ClickHouse types, for the ingest tables
# (migration 5). Required fields are Nullable here so that a missing one
# fails the CHECK (and the message goes to pydantic for its reason) instead
# of silently becoming 0.
_GPU_TYPES = (
    ("util_pct", "Float32"), ("vram_used_bytes", "UInt64"), ("vram_total_bytes", "UInt64"),
    ("temp_c", "Float32"), ("power_w", "Float32"), ("temp_junction_c", "Float32"),
    ("temp_hbm_c", "Float32"), ("power_cap_w", "Float32"), ("sclk_mhz", "Float32"),
    ("mclk_mhz", "Float32"), ("ecc_correctable", "UInt64"), ("ecc_uncorrectable", "UInt64"),
    ("pcie_rx_bytes_s", "Float64"), ("pcie_tx_bytes_s", "Float64"),
    ("xgmi_rx_bytes_s", "Float64"), ("xgmi_tx_bytes_s", "Float64"),
)
_KEY = KEY_PATTERN.replace("{", "{{").replace("}", "}}")  # str.format escapes


def _map(items: str, key: str, value: str, keep: str = "") -> str:
    """A Map from an Array(Tuple) column: ``key`` -> ``value`` of each item kept."""
    src = f"arrayFilter(x -> {keep}, {items})" if keep else items
    return (f"mapFromArrays(arrayMap(x -> tupleElement(x, '{key}'), {src}), "
            f"arrayMap(x -> tupleElement(x, '{value}'), {src}))")


_RDMA = "tupleElement(x, 'rdma')"
_INGEST: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_node (
        id String, type String, time DateTime64(6, 'UTC'), source String, node String,
        data Tuple(
            cpu_pct Nullable(Float64), mem_used_bytes Nullable(UInt64),
            mem_total_bytes Nullable(UInt64), load1 Nullable(Float64),
            gpu_tool Nullable(String),
            gpus Array(Tuple(index Nullable(UInt8),
                             {", ".join(f"{n} Nullable({t})" for n, t in _GPU_TYPES)})),
            nics Array(Tuple(name String, rx_bytes_s Float64, tx_bytes_s Float64, rdma Bool)),
            disks Array(Tuple(name String, read_bytes_s Float64, write_bytes_s Float64)),
            filesystems Array(Tuple(mount String, free_bytes UInt64, total_bytes UInt64))),
        CONSTRAINT is_node_telemetry CHECK type = 'telemetry.node',
        CONSTRAINT node_is_a_key CHECK match(node, '{_KEY}'),
        CONSTRAINT required CHECK isNotNull(data.cpu_pct) AND isNotNull(data.mem_used_bytes)
            AND isNotNull(data.mem_total_bytes) AND isNotNull(data.load1)
            AND data.cpu_pct >= 0 AND data.load1 >= 0
            AND arrayAll(g -> isNotNull(tupleElement(g, 'index')), data.gpus)
    ) ENGINE = Null""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.ingest_node_gpus TO {{db}}.gpu_metrics AS
    SELECT time, node, assumeNotNull(tupleElement(g, 'index')) AS gpu, id AS event_id,
           {", ".join(f"tupleElement(g, '{n}') AS {n}" for n, _ in _GPU_TYPES)}
    FROM {{db}}.ingest_node ARRAY JOIN data.gpus AS g""",
    f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.ingest_node_host TO {{db}}.node_metrics AS
    SELECT time, node, id AS event_id, assumeNotNull(data.cpu_pct) AS cpu_pct,
           assumeNotNull(data.mem_used_bytes) AS mem_used_bytes,
           assumeNotNull(data.mem_total_bytes) AS mem_total_bytes,
           assumeNotNull(data.load1) AS load1, length(data.gpus) AS gpu_count,
           ifNull(data.gpu_tool, '') AS gpu_tool,
           {_map("data.nics", "name", "rx_bytes_s", f"NOT {_RDMA}")} AS net_rx_bytes_s,
           {_map("data.nics", "name", "tx_bytes_s", f"NOT {_RDMA}")} AS net_tx_bytes_s,
           {_map("data.nics", "name", "rx_bytes_s", _RDMA)} AS rdma_rx_bytes_s,
           {_map("data.nics", "name", "tx_bytes_s", _RDMA)} AS rdma_tx_bytes_s,
           {_map("data.disks", "name", "read_bytes_s")} AS disk_read_bytes_s,
           {_map("data.disks", "name", "write_bytes_s")} AS disk_write_bytes_s,
           {_map("data.filesystems", "mount", "free_bytes")} AS fs_free_bytes,
           {_map("data.filesystems", "mount", "total_bytes")} AS fs_total_bytes
    FROM {{db}}.ingest_node""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_job (
        id String, type String, time DateTime64(6, 'UTC'), source String,
        node Nullable(String), job String,
        data Tuple(rank Nullable(UInt16), attempt Nullable(UInt16), iteration Nullable(UInt64),
                   loss Nullable(Float64), throughput Nullable(Float64),
                   step_time_s Nullable(Float64), checkpoint_path Nullable(String),
                   loss_nonfinite Nullable(String), grad_norm Nullable(Float64),
                   tokens_per_s Nullable(Float64), checkpoint_bytes Nullable(UInt64),
                   checkpoint_duration_s Nullable(Float64), dropped Nullable(UInt64)),
        CONSTRAINT is_job_telemetry CHECK type = 'telemetry.job',
        CONSTRAINT keys CHECK match(job, '{_KEY}')
            AND (isNull(node) OR match(assumeNotNull(node), '{_KEY}')),
        CONSTRAINT required CHECK isNotNull(data.rank) AND isNotNull(data.iteration)
    ) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_job_rows TO {db}.job_metrics AS
    SELECT time, job, assumeNotNull(data.rank) AS rank, ifNull(data.attempt, 1) AS attempt,
           ifNull(node, '') AS node, id AS event_id, assumeNotNull(data.iteration) AS iteration,
           if(isNull(data.loss_nonfinite), data.loss, toFloat64OrNull(data.loss_nonfinite))
               AS loss,
           data.throughput AS throughput, data.step_time_s AS step_time_s,
           data.checkpoint_path AS checkpoint_path, data.grad_norm AS grad_norm,
           data.tokens_per_s AS tokens_per_s, data.checkpoint_bytes AS checkpoint_bytes,
           data.checkpoint_duration_s AS checkpoint_duration_s, data.dropped AS dropped
    FROM {db}.ingest_job""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_log (
        id String, type String, time DateTime64(6, 'UTC'), source String,
        node Nullable(String), job Nullable(String),
        data Tuple(level String, message Nullable(String), service String, fields String),
        CONSTRAINT is_log_record CHECK type = 'log.record',
        CONSTRAINT keys CHECK (isNull(node) OR match(assumeNotNull(node), '{_KEY}'))
            AND (isNull(job) OR match(assumeNotNull(job), '{_KEY}')),
        CONSTRAINT required CHECK isNotNull(data.message)
    ) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_log_rows TO {db}.logs AS
    SELECT time, id, if(data.service = '', source, data.service) AS service,
           data.level AS level, ifNull(node, '') AS node, ifNull(job, '') AS job,
           assumeNotNull(data.message) AS message,
           if(data.fields = '', '{{}}', data.fields) AS fields
    FROM {db}.ingest_log""",
)

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
    Migration(4, "1-minute roll-ups", (
        """CREATE TABLE IF NOT EXISTS {db}.gpu_metrics_1m (
            minute DateTime('UTC') CODEC(DoubleDelta, ZSTD),
            node LowCardinality(String),
            gpu UInt8,
            samples SimpleAggregateFunction(sum, UInt64),
            util_avg AggregateFunction(avg, Nullable(Float32)),
            util_max SimpleAggregateFunction(max, Nullable(Float32)),
            vram_used_max SimpleAggregateFunction(max, Nullable(UInt64)),
            vram_total SimpleAggregateFunction(max, Nullable(UInt64)),
            temp_max SimpleAggregateFunction(max, Nullable(Float32)),
            temp_junction_max SimpleAggregateFunction(max, Nullable(Float32)),
            temp_hbm_max SimpleAggregateFunction(max, Nullable(Float32)),
            power_avg AggregateFunction(avg, Nullable(Float32)),
            power_max SimpleAggregateFunction(max, Nullable(Float32)),
            ecc_uncorrectable_max SimpleAggregateFunction(max, Nullable(UInt64))
        ) ENGINE = AggregatingMergeTree
        PARTITION BY toYYYYMM(minute)
        ORDER BY (node, gpu, minute)
        TTL minute + INTERVAL 365 DAY""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_metrics_1m_mv TO {db}.gpu_metrics_1m AS
        SELECT toStartOfMinute(time) AS minute, node, gpu, count() AS samples,
               avgState(util_pct) AS util_avg, max(util_pct) AS util_max,
               max(vram_used_bytes) AS vram_used_max, max(vram_total_bytes) AS vram_total,
               max(temp_c) AS temp_max, max(temp_junction_c) AS temp_junction_max,
               max(temp_hbm_c) AS temp_hbm_max, avgState(power_w) AS power_avg,
               max(power_w) AS power_max, max(ecc_uncorrectable) AS ecc_uncorrectable_max
        FROM {db}.gpu_metrics GROUP BY minute, node, gpu""",
        """CREATE TABLE IF NOT EXISTS {db}.node_metrics_1m (
            minute DateTime('UTC') CODEC(DoubleDelta, ZSTD),
            node LowCardinality(String),
            samples SimpleAggregateFunction(sum, UInt64),
            cpu_avg AggregateFunction(avg, Float32),
            cpu_max SimpleAggregateFunction(max, Float32),
            mem_used_max SimpleAggregateFunction(max, UInt64),
            mem_total SimpleAggregateFunction(max, UInt64),
            load1_max SimpleAggregateFunction(max, Float32)
        ) ENGINE = AggregatingMergeTree
        PARTITION BY toYYYYMM(minute)
        ORDER BY (node, minute)
        TTL minute + INTERVAL 365 DAY""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.node_metrics_1m_mv TO {db}.node_metrics_1m AS
        SELECT toStartOfMinute(time) AS minute, node, count() AS samples,
               avgState(cpu_pct) AS cpu_avg, max(cpu_pct) AS cpu_max,
               max(mem_used_bytes) AS mem_used_max, max(mem_total_bytes) AS mem_total,
               max(load1) AS load1_max
        FROM {db}.node_metrics GROUP BY minute, node""",
        """CREATE TABLE IF NOT EXISTS {db}.job_metrics_1m (
            minute DateTime('UTC') CODEC(DoubleDelta, ZSTD),
            job String,
            samples SimpleAggregateFunction(sum, UInt64),
            ranks AggregateFunction(uniq, UInt16),
            iteration_max SimpleAggregateFunction(max, UInt64),
            loss_avg AggregateFunction(avg, Nullable(Float64)),
            throughput_avg AggregateFunction(avg, Nullable(Float64)),
            tokens_per_s_avg AggregateFunction(avg, Nullable(Float64)),
            step_time_avg AggregateFunction(avg, Nullable(Float64)),
            checkpoints SimpleAggregateFunction(sum, UInt64)
        ) ENGINE = AggregatingMergeTree
        PARTITION BY toYYYYMM(minute)
        ORDER BY (job, minute)
        TTL minute + INTERVAL 365 DAY""",
        """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.job_metrics_1m_mv TO {db}.job_metrics_1m AS
        SELECT toStartOfMinute(time) AS minute, job, count() AS samples,
               uniqState(rank) AS ranks, max(iteration) AS iteration_max,
               avgState(loss) AS loss_avg, avgState(throughput) AS throughput_avg,
               avgState(tokens_per_s) AS tokens_per_s_avg,
               avgState(step_time_s) AS step_time_avg,
               countIf(checkpoint_path IS NOT NULL) AS checkpoints
        FROM {db}.job_metrics GROUP BY minute, job""",
    )),
    Migration(5, "ingest: telemetry parsed by the engine", _INGEST),
)
