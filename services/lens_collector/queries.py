"""The named, parameterised queries Lens answers over the bus. Only these
run: a caller picks a name and passes typed parameters, never SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.lens_collector.gpu_jobs import (
    GPU_HOURS_DEFAULTS,
    GPU_HOURS_PARAMS,
    GPU_HOURS_SQL,
    JOB_GPUS_SQL,
    WORKSPACE_GPU_HOURS_SQL,
)
from services.lens_collector.worker_logs_schema import PREFERRED_ORIGIN

_ONE = f"job = {{job:String}} AND {PREFERRED_ORIGIN}"  # a job's rows, counted once


@dataclass(frozen=True)
class NamedQuery:
    sql: str
    params: dict[str, str]  # name -> ClickHouse type
    defaults: dict[str, Any]
    help: str


def _lag(where: str) -> str:
    """How long after their sample the GPU rows ``where`` picks were stored."""
    return ("""SELECT count() AS rows, quantile(0.5)(lag) AS p50_s, quantile(0.99)(lag) AS p99_s,
                  max(lag) AS max_s, min(time) AS first_time, max(time) AS last_time
           FROM (SELECT dateDiff('millisecond', time, received) / 1000 AS lag, time
                 FROM {db}.gpu_metrics
                 WHERE """ + where + ")")


QUERIES: dict[str, NamedQuery] = {
    "job_summary": NamedQuery(
        """SELECT count() AS samples, uniqExact(rank) AS ranks, max(iteration) AS last_iteration,
                  argMin(loss, iteration) AS first_loss, argMax(loss, iteration) AS last_loss,
                  avg(throughput) AS mean_throughput, countIf(checkpoint_path IS NOT NULL)
                  AS checkpoints, min(time) AS first_time, max(time) AS last_time
           FROM {db}.job_metrics FINAL WHERE """ + _ONE,
        {"job": "String"}, {}, "one row: iterations, loss, throughput, checkpoints of a job"),
    "job_series": NamedQuery(
        """SELECT iteration, avg(loss) AS loss, sum(throughput) AS throughput,
                  max(step_time_s) AS step_time_s, avg(grad_norm) AS grad_norm,
                  sum(tokens_per_s) AS tokens_per_s
           FROM {db}.job_metrics FINAL
           WHERE """ + _ONE + """ AND checkpoint_path IS NULL
           GROUP BY iteration ORDER BY iteration LIMIT {limit:UInt32}""",
        {"job": "String", "limit": "UInt32"}, {"limit": 10000},
        "loss and throughput per iteration"),
    "job_attempts": NamedQuery(
        """SELECT attempt, min(iteration) AS first_iteration, max(iteration) AS last_iteration,
                  min(time) AS started, max(time) AS last_report
           FROM {db}.job_metrics FINAL WHERE """ + _ONE + """ AND checkpoint_path IS NULL
           GROUP BY attempt ORDER BY attempt""",
        {"job": "String"}, {}, "iterations each attempt ran (a resume starts after a checkpoint)"),
    "job_checkpoints": NamedQuery(
        """SELECT iteration, rank, checkpoint_path, checkpoint_bytes, checkpoint_duration_s,
                  time FROM {db}.job_metrics FINAL
           WHERE """ + _ONE + """ AND checkpoint_path IS NOT NULL ORDER BY iteration, rank""",
        {"job": "String"}, {}, "checkpoints the job reported"),
    "node_summary": NamedQuery(
        """SELECT count() AS samples, avg(cpu_pct) AS mean_cpu_pct, max(cpu_pct) AS max_cpu_pct,
                  argMax(mem_used_bytes, time) AS mem_used_bytes,
                  argMax(mem_total_bytes, time) AS mem_total_bytes,
                  argMax(gpu_count, time) AS gpus, argMax(gpu_tool, time) AS gpu_tool,
                  max(time) AS last_time
           FROM {db}.node_metrics FINAL WHERE node = {node:String}""",
        {"node": "String"}, {}, "one row: telemetry of a node"),
    "node_gpus": NamedQuery(
        """SELECT gpu, argMax(util_pct, time) AS util_pct, argMax(temp_c, time) AS temp_c,
                  argMax(temp_junction_c, time) AS temp_junction_c,
                  argMax(temp_hbm_c, time) AS temp_hbm_c, argMax(power_w, time) AS power_w,
                  argMax(power_cap_w, time) AS power_cap_w,
                  argMax(vram_used_bytes, time) AS vram_used_bytes,
                  argMax(vram_total_bytes, time) AS vram_total_bytes,
                  max(ecc_uncorrectable) AS ecc_uncorrectable, max(time) AS last_time
           FROM {db}.gpu_metrics
           WHERE node = {node:String} AND time >= now64() - INTERVAL {minutes:UInt32} MINUTE
           GROUP BY gpu ORDER BY gpu""",
        {"node": "String", "minutes": "UInt32"}, {"minutes": 60},
        "each GPU of a node: its newest readings"),
    "node_series": NamedQuery(
        """SELECT toStartOfInterval(time, INTERVAL {step:UInt32} SECOND) AS t,
                  avg(cpu_pct) AS cpu_pct, max(mem_used_bytes) AS mem_used_bytes,
                  sum(arraySum(mapValues(net_rx_bytes_s))) / count() AS net_rx_bytes_s,
                  sum(arraySum(mapValues(net_tx_bytes_s))) / count() AS net_tx_bytes_s,
                  sum(arraySum(mapValues(rdma_rx_bytes_s))) / count() AS rdma_rx_bytes_s,
                  sum(arraySum(mapValues(rdma_tx_bytes_s))) / count() AS rdma_tx_bytes_s
           FROM {db}.node_metrics
           WHERE node = {node:String} AND time >= now64() - INTERVAL {minutes:UInt32} MINUTE
           GROUP BY t ORDER BY t""",
        {"node": "String", "minutes": "UInt32", "step": "UInt32"},
        {"minutes": 60, "step": 10}, "a node's CPU, memory and network over time"),
    "gpu_series": NamedQuery(
        """SELECT toStartOfInterval(time, INTERVAL {step:UInt32} SECOND) AS t, gpu,
                  avg(util_pct) AS util_pct, max(temp_c) AS temp_c, avg(power_w) AS power_w,
                  max(vram_used_bytes) AS vram_used_bytes
           FROM {db}.gpu_metrics
           WHERE node = {node:String} AND time >= now64() - INTERVAL {minutes:UInt32} MINUTE
           GROUP BY t, gpu ORDER BY t, gpu""",
        {"node": "String", "minutes": "UInt32", "step": "UInt32"},
        {"minutes": 60, "step": 10}, "each GPU of a node over time"),
    "job_throughput": NamedQuery(
        """SELECT toStartOfInterval(time, INTERVAL {step:UInt32} SECOND) AS t,
                  max(iteration) AS iteration, avg(throughput) * uniqExact(rank) AS samples_per_s,
                  avg(throughput) AS throughput_per_rank,
                  avg(tokens_per_s) AS tokens_per_s_per_rank, avg(step_time_s) AS step_time_s
           FROM {db}.job_metrics FINAL
           WHERE """ + _ONE + """ AND checkpoint_path IS NULL
           GROUP BY t ORDER BY t""",
        {"job": "String", "step": "UInt32"}, {"step": 10}, "a job's throughput over time"),
    "alerts": NamedQuery(
        """SELECT alert_id, argMax(a_state, a_time) AS state, any(a_rule) AS rule,
                  any(a_severity) AS severity, any(a_subject) AS subject, any(a_node) AS node,
                  any(a_job) AS job, min(a_opened) AS opened_at,
                  if(countIf(a_state = 'closed') > 0, maxIf(a_time, a_state = 'closed'), NULL)
                  AS closed_at,
                  argMin(a_message, a_time) AS message
           FROM (SELECT alert_id, state AS a_state, time AS a_time, rule AS a_rule,
                        severity AS a_severity, subject_key AS a_subject, node AS a_node,
                        job AS a_job, opened_at AS a_opened, message AS a_message
                 FROM {db}.alerts FINAL
                 WHERE ({job:String} = '' OR job = {job:String})
                   AND ({node:String} = '' OR node = {node:String}))
           GROUP BY alert_id HAVING {open_only:UInt8} = 0 OR state = 'open'
           ORDER BY opened_at DESC LIMIT {limit:UInt32}""",
        {"job": "String", "node": "String", "open_only": "UInt8", "limit": "UInt32"},
        {"job": "", "node": "", "open_only": 0, "limit": 1000}, "alerts, newest first"),
    "logs": NamedQuery(
        """SELECT time, service, level, node, job, message, fields FROM {db}.logs FINAL
           WHERE ({job:String} = '' OR job = {job:String}) AND service != 'worker'
             AND ({node:String} = '' OR node = {node:String})
           ORDER BY time, id LIMIT {limit:UInt32}""",
        {"job": "String", "node": "String", "limit": "UInt32"},
        {"job": "", "node": "", "limit": 1000},
        "the services' log lines, oldest first (workers' output: worker_logs)"),
    "worker_logs": NamedQuery(
        """SELECT time, attempt, rank, node, stream, message, seq,
                  toUnixTimestamp64Milli(received) AS received_ms
           FROM {db}.logs FINAL
           WHERE job = {job:String} AND service = 'worker'
             AND ({attempt:UInt16} = 0 OR attempt = {attempt:UInt16})
             AND ({rank:Int32} < 0 OR rank = {rank:Int32})
             AND time >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
             AND received > fromUnixTimestamp64Milli({after_ms:Int64}, 'UTC')
             AND ({grep:String} = '' OR match(message, {grep:String}))
           ORDER BY if({newest_first:UInt8} = 1, -1, 1)
                    * toUnixTimestamp64Milli(if({after_ms:Int64} > 0, received, time)),
                    if({newest_first:UInt8} = 1, -1, 1) * toUnixTimestamp64Milli(time),
                    if({newest_first:UInt8} = 1, -1, 1) * attempt,
                    if({newest_first:UInt8} = 1, -1, 1) * rank,
                    if({newest_first:UInt8} = 1, -1, 1) * seq
           LIMIT {limit:UInt32}""",
        {"job": "String", "attempt": "UInt16", "rank": "Int32", "since_ms": "Int64",
         "after_ms": "Int64", "grep": "String", "newest_first": "UInt8", "limit": "UInt32"},
        {"attempt": 0, "rank": -1, "since_ms": 0, "after_ms": 0, "grep": "",
         "newest_first": 0, "limit": 1000},
        "a job's output lines (all ranks, or one), oldest first; newest_first for a tail, "
        "after_ms (stored after) to follow"),
    "job_output": NamedQuery(
        """SELECT attempt, rank, any(node) AS node, countIf(stream != 'meta') AS lines,
                  sum(dropped) AS dropped_lines, max(time) AS last_line
           FROM {db}.logs FINAL WHERE job = {job:String} AND service = 'worker'
           GROUP BY attempt, rank ORDER BY attempt, rank""",
        {"job": "String"}, {}, "lines each rank of a job printed, and how many the rate "
        "limit dropped"),
    "timeline": NamedQuery(
        """SELECT time, kind, name, node, job, detail FROM (
             SELECT time, 'event' AS kind, toString(type) AS name, toString(node) AS node, job,
                    data AS detail
             FROM {db}.events FINAL
             WHERE ({job:String} = '' OR job = {job:String})
               AND ({node:String} = '' OR node = {node:String}) AND type != 'node.heartbeat'
             UNION ALL
             SELECT time, 'log', toString(level), toString(node), job,
                    concat(toString(service), ': ', message)
             FROM {db}.logs FINAL
             WHERE ({job:String} = '' OR job = {job:String}) AND service != 'worker'
               AND ({node:String} = '' OR node = {node:String})
             UNION ALL
             SELECT time, 'alert', concat(toString(rule), ' ', toString(state)), toString(node),
                    job, message
             FROM {db}.alerts FINAL
             WHERE ({job:String} = '' OR job = {job:String})
               AND ({node:String} = '' OR node = {node:String})
             UNION ALL
             SELECT toDateTime64(toStartOfInterval(time, INTERVAL {step:UInt32} SECOND), 3)
                    AS t, 'metric', 'training', toString(any(node)), job,
                    format('iteration {}, loss {}, {} samples/s per rank', toString(max(iteration)),
                           toString(round(avg(loss), 5)), toString(round(avg(throughput), 2)))
             FROM {db}.job_metrics FINAL
             WHERE {job:String} != '' AND """ + _ONE + """ AND checkpoint_path IS NULL
               AND ({node:String} = '' OR node = {node:String})
             GROUP BY t, job
             UNION ALL
             SELECT toDateTime64(toStartOfInterval(time, INTERVAL {step:UInt32} SECOND), 3)
                    AS t, 'metric', 'node', toString(node), '',
                    format('cpu {}%, memory {} GiB, {} GPUs', toString(round(avg(cpu_pct), 1)),
                           toString(round(max(mem_used_bytes) / 1073741824, 1)),
                           toString(max(gpu_count)))
             FROM {db}.node_metrics
             WHERE {job:String} = '' AND {node:String} != '' AND node = {node:String}
             GROUP BY t, node
           ) ORDER BY time, kind LIMIT {limit:UInt32}""",
        {"job": "String", "node": "String", "step": "UInt32", "limit": "UInt32"},
        {"job": "", "node": "", "step": 10, "limit": 5000},
        "metrics, events, alerts and logs of a job or node on one timeline"),
    "ingest_lag": NamedQuery(
        _lag("received >= now64() - INTERVAL {seconds:UInt32} SECOND"),
        {"seconds": "UInt32"}, {"seconds": 60},
        "GPU rows stored lately and how long after their sample they were stored"),
    "log_lag_between": NamedQuery(
        """SELECT count() AS lines, uniqExact(job, attempt, rank, seq) AS distinct_lines,
                  quantile(0.5)(lag) AS p50_s, quantile(0.99)(lag) AS p99_s, max(lag) AS max_s
           FROM (SELECT dateDiff('millisecond', time, received) / 1000 AS lag, job, attempt,
                        rank, seq
                 FROM {db}.logs
                 WHERE service = 'worker' AND stream != 'meta'
                   AND time >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')
                   AND time < fromUnixTimestamp64Milli({until_ms:Int64}, 'UTC'))""",
        {"since_ms": "Int64", "until_ms": "Int64"}, {},
        "how long after they were printed the workers' lines of a window were stored"),
    "ingest_lag_between": NamedQuery(
        _lag("time >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC') "
             "AND time < fromUnixTimestamp64Milli({until_ms:Int64}, 'UTC')"),
        {"since_ms": "Int64", "until_ms": "Int64"}, {},
        "how long after their sample the GPU rows sampled in a window were stored"),
    "job_gpus": NamedQuery(
        JOB_GPUS_SQL, {"job": "String", "minutes": "UInt32"}, {"minutes": 0},
        "each GPU a job ran on: its rank, mean and newest utilisation, VRAM, power and "
        "GPU-hours, over the job's life (minutes 0) or its last minutes"),
    "gpu_hours": NamedQuery(
        GPU_HOURS_SQL, {**GPU_HOURS_PARAMS, "limit": "UInt32"},
        {**GPU_HOURS_DEFAULTS, "limit": 1000},
        "GPU-hours per job (and its workspace) between since_ms and until_ms (0: no bound), "
        "from the 1-minute roll-up"),
    "workspace_gpu_hours": NamedQuery(
        WORKSPACE_GPU_HOURS_SQL, GPU_HOURS_PARAMS, GPU_HOURS_DEFAULTS,
        "GPU-hours per workspace between since_ms and until_ms, from the 1-minute roll-up"),
    "table_counts": NamedQuery(
        """SELECT 'events' AS table, count() AS rows, uniqExact(id) AS distinct_ids
           FROM {db}.events
           UNION ALL SELECT 'node_metrics', count(), uniqExact(event_id) FROM {db}.node_metrics
           UNION ALL SELECT 'gpu_metrics', count(), uniqExact(event_id, gpu)
           FROM {db}.gpu_metrics
           UNION ALL SELECT 'job_metrics', count(), uniqExact(event_id) FROM {db}.job_metrics
           UNION ALL SELECT 'logs', count(), uniqExact(id) FROM {db}.logs
           UNION ALL SELECT 'alerts', count(), uniqExact(alert_id, state) FROM {db}.alerts""",
        {}, {}, "rows and distinct rows per table (equal when nothing is duplicated)"),
    "events": NamedQuery(
        """SELECT time, type, node, job, source, data FROM {db}.events FINAL
           WHERE ({job:String} = '' OR job = {job:String})
             AND ({node:String} = '' OR node = {node:String})
             AND type != 'node.heartbeat'
           ORDER BY time, id LIMIT {limit:UInt32}""",
        {"job": "String", "node": "String", "limit": "UInt32"},
        {"job": "", "node": "", "limit": 1000}, "event history, newest last"),
    "event_ids": NamedQuery(
        """SELECT id, count() AS copies FROM {db}.events FINAL GROUP BY id
           ORDER BY id LIMIT {limit:UInt32}""",
        {"limit": "UInt32"}, {"limit": 1_000_000}, "every stored event id with its copies"),
    "table_rows": NamedQuery(
        """SELECT table, sum(rows) AS rows, sum(bytes_on_disk) AS bytes_on_disk,
                  sum(data_uncompressed_bytes) AS uncompressed_bytes FROM system.parts
           WHERE database = {database:String} AND active GROUP BY table ORDER BY table""",
        {"database": "String"}, {},
        "rows, bytes on disk and uncompressed bytes per table (active parts, before merges)"),
}


class QueryError(ValueError):
    pass


def resolve(name: str, params: dict[str, Any], database: str) -> tuple[str, dict[str, Any]]:
    """SQL and parameters for a named query; raises QueryError on bad input."""
    query = QUERIES.get(name)
    if query is None:
        raise QueryError(f"unknown query {name!r}; known: {', '.join(sorted(QUERIES))}")
    values = {**query.defaults, **({"database": database} if "database" in query.params else {})}
    values.update({k: v for k, v in params.items() if v is not None})
    unknown = set(values) - set(query.params)
    missing = set(query.params) - set(values)
    if unknown:
        raise QueryError(f"query {name!r} takes no parameter(s) {', '.join(sorted(unknown))}")
    if missing:
        raise QueryError(f"query {name!r} needs parameter(s) {', '.join(sorted(missing))}")
    return query.sql.replace("{db}", database), values
