"""lens-collector shell: batch pull consumers on the control and telemetry
streams write into ClickHouse (acked only after the insert returned), a
request-reply endpoint answers the named queries, and one replica at a time
evaluates the alert rules.

Replicas share the durable consumers ("lens-events", "lens-telemetry"), so
N of them split the load like a queue group. Telemetry is handed to the
engine as raw JSON (``ingest``); control events are few and go through
pydantic and ``rows``. The clickhouse-connect client is synchronous and the
in-process engine is not meant for concurrent use, so every store call runs
on one worker thread, while the event loop fetches the next batch.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client
from nats.aio.msg import Msg

from libs.bus import Bus, event_or_reason
from libs.clickhouse_cluster import Layout, data_table
from libs.events import (
    Event,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobProgress,
    JobProgressData,
    JobStopped,
    JobSubmitted,
    LensAlert,
)
from libs.leader import LeaderElection
from libs.logs import get_logger
from libs.metrics import ServiceMetrics
from libs.settings import Settings
from libs.specs import load_model
from libs.store import cluster_statements, migrate, open_store
from libs.tasks import cancel_and_wait
from libs.wiring import wire
from services.lens_collector.alerting import AlertLoop
from services.lens_collector.alerts import AlertConfig, AlertEngine
from services.lens_collector.deliverer import Deliverer
from services.lens_collector.delivery_config import load_delivery
from services.lens_collector.delivery_schema import DELIVERIES_TABLE, DELIVERY_COLUMNS
from services.lens_collector.figures import CollectorFigures, collector_families
from services.lens_collector.ingest import (
    Item,
    Route,
    envelope_refusal,
    event_id_of,
    route_of,
    store,
)
from services.lens_collector.log_alerts import LogAlerts, load_rules
from services.lens_collector.log_telemetry import COLUMNS as PARSED_COLUMNS
from services.lens_collector.log_telemetry import JobFormat, LogTelemetry
from services.lens_collector.protocol import LensQuery, LensRows
from services.lens_collector.queries import QueryError, resolve
from services.lens_collector.routes import (
    ALERTS_ROLE,
    DELIVERY_DURABLE,
    REPLICA_HANDOVER_S,
    ROUTES,
)
from services.lens_collector.rows import COLUMNS, EVENT_ID_COLUMN, rows_for
from services.lens_collector.schema import MIGRATIONS, SHARDING
from services.lens_collector.store_thread import StoreThread
from services.lens_collector.worker_logs_schema import logs_ttl

# A job's run is over: its hang and throughput rules stop watching it.
RUN_ENDED = (JobCompleted, JobFailed, JobPreempted, JobStopped, JobCancelled)
# The job is done for good: its output's format need not be kept in memory.
JOB_DONE = (JobCompleted, JobFailed, JobCancelled)
# A job's log format, from its job.submitted (when this replica missed it).
SUBMITTED_SQL = """SELECT data FROM {db}.events
WHERE type = 'job.submitted' AND job = {job:String} ORDER BY time DESC LIMIT 1"""


def load_alerts(path: Path | None) -> AlertConfig:
    """The alert rules file (PRIMUS_LENS_ALERTS_FILE); the defaults without one."""
    return AlertConfig() if path is None else load_model(path, AlertConfig)


class LensCollector:
    name = "lens-collector"
    routes = ROUTES

    def __init__(self, settings: Settings, *, alerts: AlertConfig | None = None,
                 evaluate_alerts: bool = True, alert_interval_s: float = 5.0,
                 batch: int = 20000, fill_s: float = 0.8,
                 ack_wait_s: float = REPLICA_HANDOVER_S,
                 alert_receivers: Path | None = None) -> None:
        self.settings = settings
        self.db = settings.clickhouse_database
        # A cluster's layout: every statement of the schema in its cluster form.
        self.layout = (Layout(settings.clickhouse_cluster, SHARDING)
                       if settings.clickhouse_cluster else None)
        self.batch, self.fill_s, self.ack_wait_s = batch, fill_s, ack_wait_s
        self._store_thread = StoreThread()
        self.client: Client | None = None
        self.bus: Bus | None = None
        self.rows_written: Counter[str] = Counter()
        # Workers' output as job telemetry; used on the store thread only.
        self.log_telemetry = LogTelemetry(self._format_of)
        self._job_formats: dict[str, JobFormat] = {}
        self.refused = 0
        self.redelivered = 0  # messages delivered more than once (the collector died, or slow)
        self.store_s: Counter[str] = Counter()  # the store thread's busy seconds, by kind
        self.inserts = 0
        self._figures: CollectorFigures | None = None
        self._log = get_logger()
        self._alert_task: asyncio.Task[None] | None = None
        self.alerts: AlertLoop | None = None
        self.election: LeaderElection | None = None
        if evaluate_alerts:
            path = settings.lens_alerts_file
            config = alerts or load_alerts(path)
            self._alert_config = config
        self._evaluate = evaluate_alerts
        self._alert_interval_s = alert_interval_s
        # Where alerts are delivered: a bad file stops the start here, with
        # the file, the field and the fix (libs.specs.SpecError).
        receivers = alert_receivers or settings.lens_alert_receivers
        self._delivery = load_delivery(receivers) if receivers is not None else None
        self.deliverer: Deliverer | None = None
        self._resend_task: asyncio.Task[None] | None = None

    async def _store(self, fn: Any, *args: Any, kind: str = "other") -> Any:
        """``fn`` on the store's one thread (one engine per process), before
        queued telemetry unless it is telemetry (``store_thread``); its time
        there is counted by ``kind``: what holds the engine shows in the
        health reply."""
        def timed() -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                took = time.perf_counter() - started
                self.store_s[kind] += took
                if self._figures is not None:
                    self._figures.store_seconds.labels(kind).observe(took)

        return await self._store_thread.submit(timed, urgent=kind != "telemetry")

    async def start(self, bus: Bus) -> None:
        # Thousands of short-lived message objects a second: collect young
        # garbage less often, and never rescan what start-up built.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        self.bus = bus
        self.client = await self._store(open_store, self.settings.store_dsn)
        applied = await self._store(migrate, self.client, self.db, MIGRATIONS, self.layout)
        await self._store(self._logs_retention)
        self._log.info("store ready", dsn=self.settings.store_dsn.split("@")[-1], applied=applied)
        if self._delivery is not None:
            config, secrets = self._delivery
            self.deliverer = Deliverer(config, secrets, query=self._sql,
                                       insert=self._insert_deliveries)
            await self.deliverer.start()
        # The delivery consumer only where there is somewhere to deliver to.
        routes = ROUTES if self.deliverer is not None else replace(ROUTES, consumes=tuple(
            c for c in ROUTES.consumes if c.durable != DELIVERY_DURABLE))
        await wire(bus, routes, self, tune={"lens-telemetry": {
            "batch": self.batch, "fill_s": self.fill_s, "ack_wait_s": self.ack_wait_s}})
        if self._evaluate:
            self.alerts = AlertLoop(AlertEngine(self._alert_config), query=self._sql,
                                    publish=bus.publish, source=self.name,
                                    interval_s=self._alert_interval_s,
                                    log_alerts=LogAlerts(load_rules(
                                        *filter(None, [self.settings.lens_log_alerts_file]))))
            self.election = LeaderElection.for_service(bus, ALERTS_ROLE, self.settings)
            await self.election.start()
            election = self.election
            self._alert_task = asyncio.create_task(
                self.alerts.run(lambda: election.is_leader))
        if self.deliverer is not None:  # re-sends: the alert role's leader (any, without one)
            leads = (lambda: self.election is not None and self.election.is_leader
                     ) if self.election is not None else None
            self._resend_task = asyncio.create_task(self.deliverer.run(leads))

    # ------------------------------------------------------------------ writing

    async def on_events(self, batch: list[tuple[Event, int]]) -> None:
        """Every control event, into the history table (one insert per batch)."""
        await self._store(self._insert_rows, rows_for(batch), kind="events")
        for event, _ in batch:
            if isinstance(event, JobSubmitted) and event.job:
                spec = event.data.spec
                self._job_formats[event.job] = JobFormat(spec.log_format, {
                    k: v.model_dump() for k, v in spec.log_formats.items()})
            elif isinstance(event, JOB_DONE) and event.job:
                self._job_formats.pop(event.job, None)
                await self._store(self.log_telemetry.forget, event.job)
        if self.alerts is not None:
            for event, _ in batch:
                if isinstance(event, RUN_ENDED) and event.job:
                    await self.alerts.job_ended(event.job, min(event.time.timestamp(),
                                                               time.time()))

    async def on_alert(self, event: LensAlert) -> None:
        """An alert transition, queued for its receivers (acked once queued)."""
        if self.deliverer is not None:
            await self.deliverer.deliver(event)

    async def _insert_deliveries(self, rows: list[list[Any]], token: str) -> None:
        assert self.client is not None
        client = self.client
        await self._store(lambda: client.insert(
            f"{self.db}.{DELIVERIES_TABLE}", rows, column_names=DELIVERY_COLUMNS,
            settings={"insert_deduplication_token": token}), kind="alert_delivery")

    def _insert_rows(self, tables: dict[str, list[list[Any]]]) -> None:
        assert self.client is not None
        for table, rows in tables.items():
            # Same rows -> same token: ClickHouse drops a redelivered batch.
            id_at = COLUMNS[table].index(EVENT_ID_COLUMN.get(table, "event_id"))
            token = hashlib.sha256("\n".join(str(r[id_at]) for r in rows).encode()).hexdigest()
            self.client.insert(f"{self.db}.{table}", rows, column_names=COLUMNS[table],
                               settings={"insert_deduplication_token": f"{table}-{token}"})
            self.rows_written[table] += len(rows)

    async def on_telemetry(self, msgs: list[Msg]) -> list[tuple[Msg, str]]:
        """Telemetry handed to the engine as raw JSON; the refused, with why."""
        groups: dict[Route, list[Item]] = {}
        others: list[Msg] = []
        early: list[tuple[Msg, str]] = []
        if self._figures is not None:
            self._figures.batch_messages.observe(len(msgs))
        for msg in msgs:
            route = route_of(msg.subject)
            if route is None:
                others.append(msg)
                continue
            reason = envelope_refusal(route, msg.data)
            if reason is not None:
                early.append((msg, reason))
                continue
            headers = msg.headers
            event_id = (headers.get("Nats-Msg-Id") if headers else None) or event_id_of(msg.data)
            groups.setdefault(route, []).append(Item(
                msg.data, event_id, msg.subject[len(route.prefix):], _delivered(msg), msg))
        refused: list[tuple[Msg, str]] = early + await self._store(self._ingest, groups,
                                                                        kind="telemetry")
        await self._announce_first_steps()
        events: list[tuple[Event, int]] = []
        for msg in others:  # not telemetry after all: read as every consumer reads events
            read = event_or_reason(msg.subject, msg.data)
            if isinstance(read, str):
                refused.append((msg, read))
            else:
                events.append((read[0], msg.metadata.sequence.stream))
        if events:
            await self._store(self._insert_rows, rows_for(events))
        self.refused += len(refused)
        return refused

    def _ingest(self, groups: dict[Route, list[Item]]) -> list[tuple[Any, str]]:
        assert self.client is not None
        refused: list[tuple[Any, str]] = []
        for route, items in groups.items():
            self.redelivered += sum(1 for i in items if i.delivered > 1)
            stored, bad = store(self.client, self.db, route, items)
            self.rows_written[route.table] += stored
            refused += bad
            if route.table == "ingest_worker_log":
                self._parse_output(items, {id(ref) for ref, _ in bad})
        self.inserts += 1
        return refused

    async def _announce_first_steps(self) -> None:
        """An attempt's first step read from its output, for failover (the
        id makes a repeat, from another replica or a restart, a no-op)."""
        steps, self.log_telemetry.first_steps = self.log_telemetry.first_steps, []
        for job, attempt, iteration in steps:
            assert self.bus is not None
            await self.bus.publish(JobProgress(
                id=f"{job}-a{attempt}-progress", source=self.name, job=job,
                data=JobProgressData(attempt=attempt, iteration=iteration)))

    def _parse_output(self, items: list[Item], refused: set[int]) -> None:
        """Job telemetry from the stored batches of workers' output."""
        assert self.client is not None
        rows: list[list[Any]] = []
        for item in items:
            if id(item.ref) in refused or not self.log_telemetry.wants(item.key):
                continue
            try:
                rows += self.log_telemetry.rows(json.loads(item.data))
            except (ValueError, KeyError, TypeError) as exc:  # stored, yet unreadable here
                self._log.warning("output batch not parsed", event_id=item.event_id,
                                  error=repr(exc))
        if rows:
            token = hashlib.sha256("\n".join(r[5] for r in rows).encode()).hexdigest()
            self.client.insert(f"{self.db}.job_metrics", rows, column_names=PARSED_COLUMNS,
                               settings={"insert_deduplication_token": f"parsed-{token}"})
            self.rows_written["job_metrics"] += len(rows)

    def _format_of(self, job: str) -> JobFormat | None:
        """What the job asked for (its job.submitted; the store's copy when
        this replica started after it)."""
        known = self._job_formats.get(job)
        if known is not None or self.client is None:
            return known
        rows = self.client.query(SUBMITTED_SQL.replace("{db}", self.db),
                                 parameters={"job": job}).result_rows
        if not rows:
            return None
        spec = json.loads(rows[0][0]).get("spec", {})
        return JobFormat(spec.get("log_format", "auto"), spec.get("log_formats") or {})

    def _logs_retention(self) -> None:
        """Keep log lines ``lens_logs_ttl_days`` (changed only when it differs)."""
        assert self.client is not None
        days = self.settings.lens_logs_ttl_days
        table = data_table("logs", self.layout)  # the TTL is the data's own
        ddl = self.client.query(
            "SELECT create_table_query FROM system.tables WHERE database = {d:String} "
            "AND name = {t:String}", parameters={"d": self.db, "t": table}).result_rows
        if ddl and f"toIntervalDay({days})" not in ddl[0][0]:
            for sql in cluster_statements(logs_ttl(days), self.db, self.layout):
                self.client.command(sql, settings={"materialize_ttl_after_modify": 0})

    # ------------------------------------------------------------------ reading

    async def _sql(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        assert self.client is not None
        client = self.client
        text = sql.replace("{db}", self.db)
        return await self._store(lambda: client.query(text, parameters=params).result_rows,
                                 kind="alert_rules")

    async def on_query(self, request: LensQuery) -> LensRows:
        try:
            sql, params = resolve(request.query, request.params, self.db)
        except QueryError as exc:
            return LensRows(ok=False, error=str(exc))
        assert self.client is not None
        client = self.client
        result = await self._store(lambda: client.query(sql, parameters=params), kind="queries")
        return LensRows(columns=list(result.column_names),
                        rows=[list(r) for r in result.result_rows])

    async def stop(self) -> None:
        await cancel_and_wait([self._alert_task, self._resend_task])
        if self.deliverer is not None:
            await self.deliverer.stop()  # what is left is retried by whoever leads next
        if self.election is not None:
            await self.election.stop()  # a standby takes over now, not after the TTL
        await asyncio.to_thread(self._store_thread.shutdown)

    def metrics(self, metrics: ServiceMetrics) -> Callable[[], None]:
        self._figures = CollectorFigures(metrics)
        return metrics.add_source(collector_families(self))

    def health(self) -> dict[str, Any]:
        return {"rows_written": dict(self.rows_written), "refused": self.refused,
                "parsed_lines": self.log_telemetry.parsed,
                "redelivered": self.redelivered, "inserts": self.inserts,
                # Time spent storing telemetry: the store thread's own count.
                "insert_s": round(self.store_s["telemetry"], 3),
                "store_s": {k: round(v, 3) for k, v in sorted(self.store_s.items())},
                "alerts_published": self.alerts.published if self.alerts else 0,
                "alerts": self.election.describe() if self.election else None,
                "alert_deliveries": dict(self.deliverer.counts) if self.deliverer else None}


def _delivered(msg: Msg) -> int:
    """How often this message was delivered, from its ack subject (cheaply)."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[4])
    return msg.metadata.num_delivered if msg.reply else 1
