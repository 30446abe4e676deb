"""The alert loop: asks the store what happened, feeds the rules, publishes.

Collector replicas share the telemetry consumer, so no replica sees every
sample; ClickHouse does. One replica at a time (the leader of the
``lens-alerts`` role, elected by ``libs.leader``) queries each window of
``interval_s`` (ending ``lag_s`` ago, so late rows are in) for what the
rules need: only the GPUs above an alert level or in a breach the rules
watch, each job's progress, losses, throughput and newest checkpoint, and
each node's newest sample. The transitions go out as ``lens.alert`` events
with ids derived from the alert, so a second evaluator's copies are dropped
by the bus; the collector stores them from the CONTROL stream like any
event. A replica that takes over starts by reading what is open.

Which jobs are watched comes from the store too (each job's latest
placement, completion, failure or preemption in the ``events`` table, in
stream order), not only from the events this replica consumed: with several
replicas another one may have stored a job's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from libs.events import LensAlert, LensAlertData
from libs.logs import get_logger
from services.lens_collector.alerts import AlertEngine, GpuReading, JobReading, Transition
from services.lens_collector.log_alerts import LogAlerts, LogLine
from services.lens_collector.worker_logs_schema import counted_once

Query = Callable[[str, dict[str, Any]], Awaitable[list[tuple[Any, ...]]]]
Publish = Callable[[LensAlert], Awaitable[Any]]

_WINDOW = ("time >= fromUnixTimestamp64Milli({frm:Int64}, 'UTC') "
           "AND time < fromUnixTimestamp64Milli({to:Int64}, 'UTC')")
GPU_SQL = f"""SELECT node, gpu, max({{sensor}}) AS temp,
       max(if(vram_total_bytes > 0, vram_used_bytes / vram_total_bytes, NULL)) AS vram,
       max(if(power_cap_w > 0, power_w / power_cap_w, NULL)) AS power
FROM {{db}}.gpu_metrics WHERE {_WINDOW}
GROUP BY node, gpu
HAVING temp > {{t:Float64}} OR vram > {{v:Float64}} OR power > {{p:Float64}}
    OR concat(node, '/gpu', toString(gpu)) IN {{open:Array(String)}}"""
# A job that reports through the SDK and prints a framework's log is read
# once: from the SDK's rows (origin 'sdk') when the window has any.
JOB_SQL = f"""SELECT job, max(iteration), countIf(isNaN(loss) OR isInfinite(loss)),
       countIf(isFinite(loss)), avgIf(throughput, checkpoint_path IS NULL),
       toUnixTimestamp64Milli(maxIf(time, checkpoint_path IS NOT NULL)),
       toUnixTimestamp64Milli(max(time))
FROM {{db}}.job_metrics WHERE {_WINDOW} AND {counted_once(_WINDOW)}
GROUP BY job"""
# Workers' lines stored since the last window that any log rule's pattern
# matches (the engine filters; the rules' state machine counts). By insert
# time: a line is seen once however late it was printed.
LOG_SQL = """SELECT toUnixTimestamp64Milli(time), job, node, rank, message FROM {db}.logs
WHERE received > fromUnixTimestamp64Milli({frm:Int64}, 'UTC')
  AND received <= fromUnixTimestamp64Milli({to:Int64}, 'UTC')
  AND time >= fromUnixTimestamp64Milli({frm:Int64}, 'UTC') - INTERVAL 1 DAY
  AND service = 'worker' AND stream != 'meta' AND match(message, {pattern:String})
ORDER BY time, seq LIMIT 100000"""
NODE_SQL = f"""SELECT node, toUnixTimestamp64Milli(max(time)) FROM {{db}}.node_metrics
WHERE {_WINDOW} GROUP BY node"""
# Each job's latest lifecycle event stored since {frm}, by stream order.
LIFECYCLE_SQL = """SELECT job, argMax(type, stream_seq),
       toUnixTimestamp64Milli(argMax(time, stream_seq))
FROM {db}.events
WHERE type IN ('job.placed', 'job.completed', 'job.failed', 'job.preempted') AND job != ''
  AND received >= fromUnixTimestamp64Milli({frm:Int64}, 'UTC')
GROUP BY job"""
LIFECYCLE_MARGIN_S = 60.0  # events stored a little before the window are read again
RESUME_LOOKBACK_S = 86_400.0  # after a (re)start: the jobs of the last day
OPEN_SQL = """SELECT rule, subject_key, nullIf(node, ''), nullIf(job, ''), gpu, value, threshold,
       severity, message, toUnixTimestamp64Milli(opened_at)
FROM {db}.alerts FINAL WHERE state = 'open'
  AND alert_id NOT IN (SELECT alert_id FROM {db}.alerts WHERE state = 'closed')"""


class AlertLoop:
    def __init__(self, engine: AlertEngine, *, query: Query, publish: Publish, source: str,
                 interval_s: float = 5.0, lag_s: float = 2.0,
                 clock: Callable[[], float] = time.time,
                 log_alerts: LogAlerts | None = None) -> None:
        self.engine, self.query, self.publish, self.source = engine, query, publish, source
        self.log_alerts = log_alerts
        self.interval_s, self.lag_s, self.clock = interval_s, lag_s, clock
        self.watermark: float | None = None
        self.published = 0
        self._log = get_logger(component="alerts")

    async def run(self, leads: Callable[[], bool] | None = None) -> None:
        """Evaluate every ``interval_s`` while ``leads()`` (None: always)."""
        while True:
            try:
                if leads is None or leads():
                    await self.evaluate()
                else:
                    self.watermark = None  # another replica evaluates; start over if we take over
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store or the bus is away: try next time
                self._log.warning("alert evaluation failed", error=repr(exc))
            await asyncio.sleep(self.interval_s)

    async def evaluate(self) -> list[Transition]:
        """One window: query, feed the rules, publish what opened or closed."""
        to = int((self.clock() - self.lag_s) * 1000)
        out: list[Transition] = []
        if self.watermark is None:
            out += await self._resume(to)
        frm = int(self.watermark * 1000) if self.watermark is not None else to - 1000 * int(
            self.interval_s)
        at = to / 1000
        window = {"frm": frm, "to": to}
        c = self.engine.config
        t, v, p = c.open_levels()  # hot GPUs only, plus those the rules watch
        gpu_rows = await self.query(GPU_SQL.replace("{sensor}", c.gpu_temp_sensor), {
            **window, "t": t, "v": v, "p": p, "open": self.engine.watched_gpu_keys()})
        out += self.engine.gpu_window(at, {(r[0], int(r[1])): GpuReading(r[2], r[3], r[4])
                                          for r in gpu_rows})
        out += await self._lifecycle(at, frm - int(LIFECYCLE_MARGIN_S * 1000))
        jobs = await self.query(JOB_SQL, window)
        out += self.engine.job_window(at, {r[0]: _job_reading(r) for r in jobs})
        nodes = await self.query(NODE_SQL, window)
        out += self.engine.node_window(at, {r[0]: r[1] / 1000 for r in nodes})
        out += self.engine.tick(at)
        if self.log_alerts is not None:
            out += await self._log_window(window, at)
        self.watermark = at
        for transition in out:
            await self.publish(alert_event(transition, self.source))
            self.published += 1
        return out

    async def _log_window(self, window: dict[str, int], at: float) -> list[Transition]:
        assert self.log_alerts is not None
        out: list[Transition] = []
        rows = await self.query(LOG_SQL, {**window, "pattern": self.log_alerts.any_pattern})
        for millis, job, node, rank, text in rows:
            out += self.log_alerts.observe(LogLine(millis / 1000, text, job or None,
                                                   node or None, rank if rank >= 0 else None))
        return out + self.log_alerts.tick(at)

    async def _lifecycle(self, at: float, frm: int) -> list[Transition]:
        rows = await self.query(LIFECYCLE_SQL, {"frm": frm})
        return self.engine.job_states(at, {r[0]: (r[1], r[2] / 1000) for r in rows})

    async def job_ended(self, job: str, at: float) -> None:
        for transition in self.engine.job_ended(job, at):
            with contextlib.suppress(Exception):
                await self.publish(alert_event(transition, self.source))

    async def _resume(self, to: int) -> list[Transition]:
        """After a (re)start: keep open what the store says is open (closing
        duplicates), learn which jobs run and which ended, and what the last
        hour's nodes and jobs did, so silence since then is noticed. Learning
        opens and closes nothing by itself: that is what made every restart
        add one more copy of an open alert."""
        at = to / 1000
        hour = {"frm": to - 3_600_000, "to": to}
        out = self.engine.restore([_open_alert(r) for r in await self.query(OPEN_SQL, {})], at)
        out += await self._lifecycle(at, to - int(RESUME_LOOKBACK_S * 1000))
        for row in await self.query(JOB_SQL, hour):
            self.engine.learn_job(row[0], _job_reading(row), row[6] / 1000)
        self.engine.node_window(at, {r[0]: r[1] / 1000 for r in await self.query(NODE_SQL, hour)})
        self.watermark = (to - 1000 * int(self.interval_s)) / 1000
        return out


def alert_event(t: Transition, source: str) -> LensAlert:
    def utc(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    return LensAlert(
        id=f"{t.alert_id}-{t.state}", source=source, time=utc(t.at), node=t.node, job=t.job,
        data=LensAlertData(alert_id=t.alert_id, rule=t.rule, state=t.state,
                           severity=t.severity, subject_key=t.key, gpu=t.gpu, value=t.value,
                           threshold=t.threshold, message=t.message,
                           opened_at=utc(t.opened_at), fault_class=t.fault_class))


def _job_reading(row: tuple[Any, ...]) -> JobReading:
    checkpoint = row[5] / 1000 if row[5] else None  # maxIf of nothing is the epoch
    return JobReading(iteration=row[1], nonfinite_losses=row[2], finite_losses=row[3],
                      throughput=row[4] if row[4] == row[4] else None,  # avg of none is NaN
                      last_checkpoint=checkpoint)


def _open_alert(row: tuple[Any, ...]) -> Transition:
    rule, key, node, job, gpu, value, threshold, severity, message, opened = row
    return Transition(rule=rule, state="open", key=key, opened_at=opened / 1000,
                      at=opened / 1000, node=node, job=job, gpu=gpu, value=value,
                      threshold=threshold, severity=severity, message=message)
