"""1-minute roll-ups of GPU, node and job telemetry (schema migration 4),
kept for a year while raw rows expire after weeks.

They are refreshable materialized views: once a minute the engine
aggregates the last few complete minutes and appends them; the targets are
ReplacingMergeTree tables versioned by ``computed_at``, so a minute that got
late rows is simply computed again and the newest version wins (read them
with FINAL). A view that runs on every insert would aggregate each insert
block separately - as many roll-up rows as GPU rows, which halved ingest
throughput in ``bench/lens_ingest.py`` - while this costs one scan of a few
minutes per minute.

``backfill`` runs the same SELECTs over any window: after a collector was
down longer than the refresh window, or over history that predates the
roll-ups.

``gpu_jobs_1m`` (migration 9) rolls up the GPUs that were placed with a
job, per job, attempt and GPU: the GPU-hours of jobs and workspaces over a
year are read from it (``gpu_jobs``).
"""

from __future__ import annotations

from datetime import datetime

from clickhouse_connect.driver.client import Client

REFRESH_WINDOW_MIN = 3  # complete minutes recomputed by each refresh

_RECENT = (f"time >= toStartOfMinute(now()) - INTERVAL {REFRESH_WINDOW_MIN} MINUTE "
           "AND time < toStartOfMinute(now())")
_WINDOW = ("time >= toStartOfMinute({since:DateTime64(3, 'UTC')}) "
           "AND time < toStartOfMinute({until:DateTime64(3, 'UTC')})")

# target table -> (its columns, the SELECT with a {where} for the window)
ROLLUPS: dict[str, tuple[str, str]] = {
    "gpu_metrics_1m": (
        """minute DateTime('UTC') CODEC(DoubleDelta, ZSTD), node LowCardinality(String),
        gpu UInt8, samples UInt32, util_avg Nullable(Float32) CODEC(Gorilla, ZSTD),
        util_min Nullable(Float32) CODEC(Gorilla, ZSTD),
        vram_used_max Nullable(UInt64) CODEC(T64, ZSTD), vram_total Nullable(UInt64),
        temp_max Nullable(Float32) CODEC(Gorilla, ZSTD),
        temp_junction_max Nullable(Float32) CODEC(Gorilla, ZSTD),
        temp_hbm_max Nullable(Float32) CODEC(Gorilla, ZSTD),
        power_avg Nullable(Float32) CODEC(Gorilla, ZSTD),
        power_max Nullable(Float32) CODEC(Gorilla, ZSTD),
        ecc_uncorrectable_max Nullable(UInt64), computed_at DateTime('UTC')""",
        """SELECT toStartOfMinute(time) AS minute, node, gpu, count() AS samples,
               avg(util_pct) AS util_avg, min(util_pct) AS util_min,
               max(vram_used_bytes) AS vram_used_max, max(vram_total_bytes) AS vram_total,
               max(temp_c) AS temp_max, max(temp_junction_c) AS temp_junction_max,
               max(temp_hbm_c) AS temp_hbm_max, avg(power_w) AS power_avg,
               max(power_w) AS power_max, max(ecc_uncorrectable) AS ecc_uncorrectable_max,
               now() AS computed_at
        FROM {db}.gpu_metrics WHERE {where} GROUP BY minute, node, gpu"""),
    "node_metrics_1m": (
        """minute DateTime('UTC') CODEC(DoubleDelta, ZSTD), node LowCardinality(String),
        samples UInt32, cpu_avg Float32 CODEC(Gorilla, ZSTD), cpu_max Float32,
        mem_used_max UInt64 CODEC(T64, ZSTD), mem_total UInt64, load1_max Float32,
        net_rx_avg Float64 CODEC(Gorilla, ZSTD), net_tx_avg Float64 CODEC(Gorilla, ZSTD),
        rdma_rx_avg Float64 CODEC(Gorilla, ZSTD), rdma_tx_avg Float64 CODEC(Gorilla, ZSTD),
        computed_at DateTime('UTC')""",
        """SELECT toStartOfMinute(time) AS minute, node, count() AS samples,
               avg(cpu_pct) AS cpu_avg, max(cpu_pct) AS cpu_max,
               max(mem_used_bytes) AS mem_used_max, max(mem_total_bytes) AS mem_total,
               max(load1) AS load1_max,
               avg(arraySum(mapValues(net_rx_bytes_s))) AS net_rx_avg,
               avg(arraySum(mapValues(net_tx_bytes_s))) AS net_tx_avg,
               avg(arraySum(mapValues(rdma_rx_bytes_s))) AS rdma_rx_avg,
               avg(arraySum(mapValues(rdma_tx_bytes_s))) AS rdma_tx_avg,
               now() AS computed_at
        FROM {db}.node_metrics WHERE {where} GROUP BY minute, node"""),
    "job_metrics_1m": (
        """minute DateTime('UTC') CODEC(DoubleDelta, ZSTD), job String, samples UInt32,
        ranks UInt16, iteration_max UInt64, loss_avg Nullable(Float64) CODEC(Gorilla, ZSTD),
        throughput_avg Nullable(Float64) CODEC(Gorilla, ZSTD),
        tokens_per_s_avg Nullable(Float64), step_time_avg Nullable(Float64),
        grad_norm_avg Nullable(Float64), checkpoints UInt32, computed_at DateTime('UTC')""",
        """SELECT toStartOfMinute(time) AS minute, job, count() AS samples,
               uniqExact(rank) AS ranks, max(iteration) AS iteration_max,
               avgIf(loss, checkpoint_path IS NULL) AS loss_avg,
               avgIf(throughput, checkpoint_path IS NULL) AS throughput_avg,
               avgIf(tokens_per_s, checkpoint_path IS NULL) AS tokens_per_s_avg,
               avgIf(step_time_s, checkpoint_path IS NULL) AS step_time_avg,
               avgIf(grad_norm, checkpoint_path IS NULL) AS grad_norm_avg,
               countIf(checkpoint_path IS NOT NULL) AS checkpoints, now() AS computed_at
        FROM {db}.job_metrics WHERE {where} GROUP BY minute, job"""),
}
# Added by migration 9, apart from ROLLUPS: migration 4 stays as it shipped.
GPU_JOBS_ROLLUPS: dict[str, tuple[str, str]] = {
    # A minute's samples of one GPU with one job's attempt: how many distinct
    # sample times, the first and the last (GPU-hours are spans, see gpu_jobs).
    "gpu_jobs_1m": (
        """minute DateTime('UTC') CODEC(DoubleDelta, ZSTD), job String, attempt UInt16,
        node LowCardinality(String), gpu UInt8, rank Nullable(UInt16), samples UInt32,
        first_time DateTime64(3, 'UTC'), last_time DateTime64(3, 'UTC'),
        util_avg Nullable(Float32) CODEC(Gorilla, ZSTD),
        power_avg Nullable(Float32) CODEC(Gorilla, ZSTD),
        vram_used_max Nullable(UInt64) CODEC(T64, ZSTD), computed_at DateTime('UTC')""",
        """SELECT toStartOfMinute(time) AS minute, job, attempt, node, gpu, any(rank) AS rank,
               uniqExact(time) AS samples, min(time) AS first_time, max(time) AS last_time,
               avg(util_pct) AS util_avg, avg(power_w) AS power_avg,
               max(vram_used_bytes) AS vram_used_max, now() AS computed_at
        FROM {db}.gpu_metrics WHERE job != '' AND {where}
        GROUP BY minute, job, attempt, node, gpu"""),
}
_KEYS = {"gpu_metrics_1m": "node, gpu, minute", "node_metrics_1m": "node, minute",
         "job_metrics_1m": "job, minute", "gpu_jobs_1m": "job, attempt, node, gpu, minute"}


def _migration(rollups: dict[str, tuple[str, str]]) -> tuple[str, ...]:
    statements = []
    for table, (columns, select) in rollups.items():
        statements.append(f"""CREATE TABLE IF NOT EXISTS {{db}}.{table} ({columns})
        ENGINE = ReplacingMergeTree(computed_at)
        PARTITION BY toYYYYMM(minute) ORDER BY ({_KEYS[table]})
        TTL minute + INTERVAL 365 DAY""")
        body = select.replace("{where}", _RECENT)
        statements.append(f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.{table}_mv
        REFRESH EVERY 1 MINUTE APPEND TO {{db}}.{table} AS {body}""")
    return tuple(statements)


ROLLUP_MIGRATION: tuple[str, ...] = _migration(ROLLUPS)
GPU_JOBS_ROLLUP_MIGRATION: tuple[str, ...] = _migration(GPU_JOBS_ROLLUPS)


def backfill(client: Client, database: str, since: datetime, until: datetime) -> None:
    """Compute every roll-up's complete minutes in [since, until) now."""
    for table, (_, select) in {**ROLLUPS, **GPU_JOBS_ROLLUPS}.items():
        sql = select.replace("{where}", _WINDOW).replace("{db}", database)
        client.command(f"INSERT INTO {database}.{table} {sql}",
                       parameters={"since": since, "until": until})
