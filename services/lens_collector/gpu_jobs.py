"""GPU rows that say which job uses the GPU: migration 9 and the SQL of the
queries over it (``queries.QUERIES`` names them).

The agent puts the job, attempt and rank holding each GPU into its node
telemetry (``services/bench/placements.py``); ``gpu_metrics`` gets them as
columns (``job`` '' and ``attempt`` 0 for an idle GPU), the ingest table is
remade to carry them in both wire forms, and ``gpu_jobs_1m`` rolls them up
for a year (``rollups``).

GPU-hours are measured as spans, not as counts of samples: an attempt
holds its GPUs from its placement to its end, so the GPU-time of one
attempt on one GPU is the time from its first sample to its last, plus one
sample interval for the last sample (estimated as the span over the
samples less one: exact for evenly spaced samples at any interval). A gap
in the telemetry (an agent restarting, a sample lost) is thus counted, as
the GPU stayed held, and a sample stored twice counts once (samples are
distinct times). Counting samples instead would drop every gap and be
right only at a 1 s interval.
"""

from __future__ import annotations

from services.lens_collector.ingest_schema import GPU_READINGS, GpuField, keys_check, node_ingest
from services.lens_collector.rollups import GPU_JOBS_ROLLUP_MIGRATION

# The GPU's worker, stored as: '' and 0 for an idle GPU (they are ORDER-free
# filter columns; NULL would cost a null map for nothing), the rank as sent.
GPU_OWNER: tuple[GpuField, ...] = (
    ("job", "String", "ifNull({v}, '')"),
    ("attempt", "UInt16", "ifNull({v}, 0)"),
    ("rank", "UInt16", "{v}"),
)

GPU_JOBS_MIGRATION: tuple[str, ...] = (
    """ALTER TABLE {db}.gpu_metrics
        ADD COLUMN IF NOT EXISTS job LowCardinality(String) DEFAULT '',
        ADD COLUMN IF NOT EXISTS attempt UInt16 DEFAULT 0,
        ADD COLUMN IF NOT EXISTS rank Nullable(UInt16)""",
    # Rows are ordered by node, GPU and time: a job's rows are found by
    # skipping granules (8192 rows, about 2 h of one GPU) without it.
    "ALTER TABLE {db}.gpu_metrics ADD INDEX IF NOT EXISTS job_idx job TYPE set(64) GRANULARITY 4",
    *node_ingest(GPU_READINGS + GPU_OWNER,
                 checks=f",\n        CONSTRAINT gpu_jobs CHECK {keys_check('job')}"),
    *GPU_JOBS_ROLLUP_MIGRATION,
)

# Where a job's raw rows can start: its first placement (events keeps every
# event), so that the day partitions before it are never read.
_JOB_START = """greatest(
    if({minutes:UInt32} = 0, toDateTime64(0, 3), now64(3) - INTERVAL {minutes:UInt32} MINUTE),
    (SELECT min(time) FROM {db}.events WHERE job = {job:String} AND type = 'job.placed'))"""


def _span_s(first: str, last: str, samples: str) -> str:
    """GPU-seconds of one attempt on one GPU (see the module's docstring)."""
    return (f"if({samples} > 1, dateDiff('millisecond', {first}, {last}) / 1000 * {samples} "
            f"/ ({samples} - 1), 0)")


JOB_GPUS_SQL = f"""SELECT node, gpu, argMax(r, t1) AS rank, max(attempt) AS attempt,
       round(sum(util_sum) / sum(util_n), 1) AS util_pct, argMax(util_last, t1) AS util_pct_last,
       argMax(vram_last, t1) AS vram_used_bytes, max(vram_max) AS vram_used_max,
       argMax(vram_total, t1) AS vram_total_bytes,
       round(sum(power_sum) / sum(power_n), 1) AS power_w, argMax(power_last, t1) AS power_w_last,
       sum(n) AS samples, round(sum(seconds) / 3600, 6) AS gpu_hours,
       min(t0) AS first_time, max(t1) AS last_time
FROM (SELECT node, gpu, attempt, argMax(rank, time) AS r, sum(util_pct) AS util_sum,
             count(util_pct) AS util_n, argMax(util_pct, time) AS util_last,
             argMax(vram_used_bytes, time) AS vram_last, max(vram_used_bytes) AS vram_max,
             argMax(vram_total_bytes, time) AS vram_total, sum(power_w) AS power_sum,
             count(power_w) AS power_n, argMax(power_w, time) AS power_last,
             uniqExact(time) AS n, min(time) AS t0, max(time) AS t1,
             {_span_s("t0", "t1", "n")} AS seconds
      FROM {{db}}.gpu_metrics
      WHERE job = {{job:String}} AND time >= {_JOB_START}
      GROUP BY node, gpu, attempt)
GROUP BY node, gpu ORDER BY rank, node, gpu"""

# One row per attempt on a GPU, from the roll-up, in a window of minutes.
_RUNS = f"""SELECT job, attempt, node, gpu, min(first_time) AS t0, max(last_time) AS t1,
              sum(samples) AS n, {_span_s("t0", "t1", "n")} AS seconds
       FROM {{db}}.gpu_jobs_1m FINAL
       WHERE minute >= toStartOfMinute(fromUnixTimestamp64Milli({{since_ms:Int64}}, 'UTC'))
         AND ({{until_ms:Int64}} = 0
              OR minute < fromUnixTimestamp64Milli({{until_ms:Int64}}, 'UTC'))
         AND ({{job:String}} = '' OR job = {{job:String}})
       GROUP BY job, attempt, node, gpu"""
# The workspace of each job: its job.submitted event (kept for good in
# events, where job records are forgotten ttl_after_finished_s after the end).
_WORKSPACES = """SELECT job, argMax(JSONExtractString(data, 'spec', 'workspace'), time)
              AS workspace
       FROM {db}.events WHERE type = 'job.submitted' GROUP BY job"""
_RUNS_WITH_WORKSPACE = f"""SELECT runs.*, ws.workspace AS workspace
       FROM ({_RUNS}) AS runs LEFT JOIN ({_WORKSPACES}) AS ws ON runs.job = ws.job
       WHERE {{workspace:String}} = '' OR ws.workspace = {{workspace:String}}"""

GPU_HOURS_SQL = f"""SELECT job, any(workspace) AS workspace, uniqExact(attempt) AS attempts,
       uniqExact(node, gpu) AS gpus, round(sum(seconds) / 3600, 6) AS gpu_hours,
       min(t0) AS first_time, max(t1) AS last_time
FROM ({_RUNS_WITH_WORKSPACE})
GROUP BY job ORDER BY gpu_hours DESC, job LIMIT {{limit:UInt32}}"""

WORKSPACE_GPU_HOURS_SQL = f"""SELECT workspace, uniqExact(job) AS jobs,
       round(sum(seconds) / 3600, 6) AS gpu_hours, min(t0) AS first_time, max(t1) AS last_time
FROM ({_RUNS_WITH_WORKSPACE})
GROUP BY workspace ORDER BY gpu_hours DESC, workspace"""

GPU_HOURS_PARAMS = {"since_ms": "Int64", "until_ms": "Int64", "workspace": "String",
                    "job": "String"}
GPU_HOURS_DEFAULTS = {"since_ms": 0, "until_ms": 0, "workspace": "", "job": ""}
