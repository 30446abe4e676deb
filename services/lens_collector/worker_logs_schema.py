"""DDL of migration 8: workers' output lines in ``logs``, and job telemetry
read from them in ``job_metrics``.

A ``log.worker`` message is a batch of one worker's lines as columns
(``libs.events.WorkerLogData``). It goes into the Null-engine
``ingest_worker_log`` table as the raw JSON (like the other telemetry, see
``ingest``); a materialized view spreads it into one ``logs`` row per line
with the job, attempt, rank, node, stream and the line's own number
(``seq``), so lines read back in the order printed. Service log lines keep
their columns' defaults (rank -1, stream '').

``job_metrics.origin`` says where a row came from: ``sdk`` (the job reports
through ``libs.sdk.Run``) or ``log`` (parsed from its output). A job that
does both is counted once: queries read the SDK's rows when there are any.
"""

from __future__ import annotations

from libs.events import KEY_PATTERN

_KEY = KEY_PATTERN.replace("{", "{{").replace("}", "}}")

WORKER_LOGS_MIGRATION: tuple[str, ...] = (
    """ALTER TABLE {db}.logs
        ADD COLUMN IF NOT EXISTS attempt UInt16 DEFAULT 0,
        ADD COLUMN IF NOT EXISTS rank Int32 DEFAULT -1,
        ADD COLUMN IF NOT EXISTS stream LowCardinality(String) DEFAULT '',
        ADD COLUMN IF NOT EXISTS seq UInt64 DEFAULT 0 CODEC(DoubleDelta, ZSTD),
        ADD COLUMN IF NOT EXISTS batch String DEFAULT '' CODEC(ZSTD(3)),
        ADD COLUMN IF NOT EXISTS dropped UInt64 DEFAULT 0""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_worker_log (
        id String, type String, time DateTime64(6, 'UTC'), source String,
        node Nullable(String), job String,
        data Tuple(attempt Nullable(UInt16), rank Nullable(UInt32), seq Nullable(UInt64),
                   text Array(String), stream Array(String), t_ms Array(UInt32),
                   dropped_lines Nullable(UInt64), dropped_bytes Nullable(UInt64)),
        CONSTRAINT is_worker_log CHECK type = 'log.worker',
        CONSTRAINT keys CHECK match(job, '{_KEY}')
            AND (isNull(node) OR match(assumeNotNull(node), '{_KEY}')),
        CONSTRAINT required CHECK isNotNull(data.attempt) AND data.attempt >= 1
            AND isNotNull(data.rank) AND isNotNull(data.seq) AND notEmpty(data.text)
            AND length(data.stream) = length(data.text)
            AND length(data.t_ms) = length(data.text)
            AND arrayAll(s -> s IN ('stdout', 'stderr', 'meta'), data.stream)
    ) ENGINE = Null""",
    # The inner select renames the batch's columns: an alias of the outer
    # one (time, id) would otherwise shadow the column of the same name.
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_worker_log_rows TO {db}.logs AS
    SELECT b_time + toIntervalMillisecond(b_data.t_ms[i]) AS time,
           concat(b_id, '.', toString(i - 1)) AS id, 'worker' AS service,
           if(b_data.stream[i] = 'meta', 'warning', '') AS level, b_node AS node,
           b_job AS job, b_data.text[i] AS message, '{{}}' AS fields,
           assumeNotNull(b_data.attempt) AS attempt,
           toInt32(assumeNotNull(b_data.rank)) AS rank, b_data.stream[i] AS stream,
           assumeNotNull(b_data.seq) + i - 1 AS seq, b_id AS batch,
           if(b_data.stream[i] = 'meta', ifNull(b_data.dropped_lines, 0), 0) AS dropped
    FROM (SELECT id AS b_id, toDateTime64(time, 3) AS b_time, ifNull(node, '') AS b_node,
                 job AS b_job, data AS b_data FROM {db}.ingest_worker_log)
    ARRAY JOIN arrayEnumerate(b_data.text) AS i""",
    """ALTER TABLE {db}.job_metrics
        ADD COLUMN IF NOT EXISTS origin LowCardinality(String) DEFAULT 'sdk',
        ADD COLUMN IF NOT EXISTS learning_rate Nullable(Float64) CODEC(Gorilla, ZSTD),
        ADD COLUMN IF NOT EXISTS samples_per_s Nullable(Float64) CODEC(Gorilla, ZSTD),
        ADD COLUMN IF NOT EXISTS tflops Nullable(Float64) CODEC(Gorilla, ZSTD),
        ADD COLUMN IF NOT EXISTS skipped_iterations Nullable(UInt64),
        ADD COLUMN IF NOT EXISTS nan_iterations Nullable(UInt64)""",
)

def counted_once(where: str) -> str:
    """The condition that keeps, of each job's ``job_metrics`` rows that
    ``where`` selects, those of one origin: the SDK's when it sent any, else
    the ones parsed from the job's output (the rule "the SDK wins")."""
    return (f"(job, origin) IN (SELECT job, if(countIf(origin = 'sdk') > 0, 'sdk', 'log') "
            f"FROM {{db}}.job_metrics WHERE {where} GROUP BY job)")


# One job's rows, counted once (``{job:String}``: the query's job parameter).
PREFERRED_ORIGIN = counted_once("job = {job:String}")


def logs_ttl(days: int) -> str:
    """The statement that keeps log lines ``days`` days (Settings.lens_logs_ttl_days)."""
    return f"ALTER TABLE {{db}}.logs MODIFY TTL toDateTime(time) + INTERVAL {int(days)} DAY"
