"""The named, parameterised queries Lens answers over the bus. Only these
run: a caller picks a name and passes typed parameters, never SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NamedQuery:
    sql: str
    params: dict[str, str]  # name -> ClickHouse type
    defaults: dict[str, Any]
    help: str


QUERIES: dict[str, NamedQuery] = {
    "job_summary": NamedQuery(
        """SELECT count() AS samples, uniqExact(rank) AS ranks, max(iteration) AS last_iteration,
                  argMin(loss, iteration) AS first_loss, argMax(loss, iteration) AS last_loss,
                  avg(throughput) AS mean_throughput, countIf(checkpoint_path IS NOT NULL)
                  AS checkpoints, min(time) AS first_time, max(time) AS last_time
           FROM {db}.job_metrics FINAL WHERE job = {job:String}""",
        {"job": "String"}, {}, "one row: iterations, loss, throughput, checkpoints of a job"),
    "job_series": NamedQuery(
        """SELECT iteration, avg(loss) AS loss, sum(throughput) AS throughput,
                  max(step_time_s) AS step_time_s
           FROM {db}.job_metrics FINAL
           WHERE job = {job:String} AND checkpoint_path IS NULL
           GROUP BY iteration ORDER BY iteration LIMIT {limit:UInt32}""",
        {"job": "String", "limit": "UInt32"}, {"limit": 10000},
        "loss and throughput per iteration"),
    "job_attempts": NamedQuery(
        """SELECT attempt, min(iteration) AS first_iteration, max(iteration) AS last_iteration,
                  min(time) AS started, max(time) AS last_report
           FROM {db}.job_metrics FINAL WHERE job = {job:String} AND checkpoint_path IS NULL
           GROUP BY attempt ORDER BY attempt""",
        {"job": "String"}, {}, "iterations each attempt ran (a resume starts after a checkpoint)"),
    "job_checkpoints": NamedQuery(
        """SELECT iteration, rank, checkpoint_path, time FROM {db}.job_metrics FINAL
           WHERE job = {job:String} AND checkpoint_path IS NOT NULL ORDER BY iteration, rank""",
        {"job": "String"}, {}, "checkpoints the job reported"),
    "node_summary": NamedQuery(
        """SELECT count() AS samples, avg(cpu_pct) AS mean_cpu_pct, max(cpu_pct) AS max_cpu_pct,
                  argMax(mem_used_bytes, time) AS mem_used_bytes,
                  argMax(mem_total_bytes, time) AS mem_total_bytes, max(time) AS last_time
           FROM {db}.node_metrics FINAL WHERE node = {node:String}""",
        {"node": "String"}, {}, "one row: telemetry of a node"),
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
        """SELECT table, sum(rows) AS rows FROM system.parts
           WHERE database = {database:String} AND active GROUP BY table ORDER BY table""",
        {"database": "String"}, {}, "rows per table (before merges)"),
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
