"""Alert delivery's shell: sends each ``lens.alert`` transition to the
receivers its route names, records every attempt in ``alert_deliveries``,
retries in the background, and re-sends open alerts to Alertmanager.

The collector hands it each alert event (the shared ``lens-alert-delivery``
consumer, so replicas split them). For each receiver its route names, a
``queued`` row (with the event) is inserted before the event is acked: the
outbox. The attempts then run in background tasks, at most ``concurrency``
sends at once, each bounded by its receiver's timeout, retried with
exponential backoff and jitter; neither the alert loop, which only
publishes, nor the next alerts wait for a slow receiver. Each attempt is a
row; a chain ends delivered, gave_up, silenced or skipped, never silently.
A replica that stops leaves its chains as queued or failed rows whose next
attempt is overdue; the leader of the alert role takes them over
(``recover``). A redelivered event whose transition already has rows for a
receiver is not queued again (``delivery_id`` is deterministic).

The leader also re-sends every open alert to each Alertmanager every
``resend_interval_s`` with endsAt a few intervals ahead, as Prometheus does
(Alertmanager resolves what is not re-sent), except those an active silence
covers: those are recorded ``silenced`` and left out, still stored in
``alerts`` as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

import aiohttp

from libs.events import LensAlert, encode_event, parse_event
from libs.logs import get_logger
from services.lens_collector.delivery import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    AlertFacts,
    Outcome,
    Silence,
    active_silences,
    after_failure,
    alertmanager_alert,
    delivery_id,
    facts_of,
    labels,
    link,
    retry_delay,
    route,
    signature,
    silenced_by,
    webhook_body,
)
from services.lens_collector.delivery_config import Backoff, DeliveryConfig, Receiver
from services.lens_collector.delivery_schema import CHAINS_SQL, DELIVERY_COLUMNS, ORPHANS_SQL

Query = Callable[[str, dict[str, Any]], Awaitable[list[tuple[Any, ...]]]]
Insert = Callable[[list[list[Any]], str], Awaitable[None]]  # rows, de-duplication token

WORKSPACE_SQL = """SELECT JSONExtractString(data, 'spec', 'workspace') FROM {db}.events
WHERE type = 'job.submitted' AND job = {job:String} ORDER BY time DESC LIMIT 1"""
OPEN_ALERTS_SQL = """SELECT alert_id, rule, subject_key, node, job, gpu, value, threshold,
       severity, message, toUnixTimestamp64Milli(opened_at), event_id
FROM {db}.alerts FINAL WHERE state = 'open'
  AND alert_id NOT IN (SELECT alert_id FROM {db}.alerts WHERE state = 'closed')
LIMIT 100000"""
CLOSED_SQL = """SELECT count() FROM {db}.alerts WHERE alert_id = {id:String} AND state = 'closed'"""
MAX_ERROR_CHARS = 500
RESEND_CHUNK = 500  # alerts per POST to Alertmanager
ORPHAN_LOOKBACK_S = 86_400.0
# A row the store refused is inserted again after 0.5, 1, 2, ... s, at most 30 s apart.
RECORD_BACKOFF = Backoff(initial_s=0.5, multiplier=2, max_s=30, jitter=0)
RECORD_PATIENCE_S = 15.0  # then the log says the store is away


class Sent(NamedTuple):
    status: int | None  # None: no HTTP answer (refused, timed out)
    error: str
    latency_ms: float

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True)
class Delivery:
    """One transition to one receiver (every attempt shares the id)."""

    alert: AlertFacts
    receiver: Receiver
    id: str
    event: str  # the lens.alert event as JSON, kept on failed rows for a take-over
    cause: str = "transition"


class Deliverer:
    def __init__(self, config: DeliveryConfig, secrets: dict[str, bytes], *, query: Query,
                 insert: Insert, clock: Callable[[], float] = time.time,
                 rand: random.Random | None = None, orphan_grace_s: float = 120.0) -> None:
        self.config, self.secrets = config, secrets
        self.query, self.insert, self.clock = query, insert, clock
        self.rand = rand or random.Random()
        self.orphan_grace_s = orphan_grace_s
        # Chains are taken over as long as their receiver would still retry.
        self._lookback_s = max((r.give_up_after_s for r in config.receivers),
                               default=ORPHAN_LOOKBACK_S)
        self.counts: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(config.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[str] = set()
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self._silences: dict[str, tuple[float, list[Silence]]] = {}
        self._workspaces: dict[str, str] = {}
        self._closed: set[str] = set()
        self._resent: dict[tuple[str, str], tuple[str, str]] = {}
        self._log = get_logger(component="alert-delivery")

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(headers={"User-Agent": "primus-safe-lens"})

    async def stop(self) -> None:
        """Stop retrying (the failed rows say what is left: another replica
        takes the chains over) and close the connections."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._session is not None:
            await self._session.close()

    # ----------------------------------------------------------------- transitions

    async def deliver(self, event: LensAlert) -> None:
        """Queue one transition for its receivers: a ``queued`` row each (with
        the event), recorded before this returns (and the event is acked),
        then the attempts in the background. A transition that already has
        rows for a receiver (a redelivered event) is not queued again."""
        alert = facts_of(event, await self._workspace(event.job))
        if alert.state == "closed":
            self._closed.add(alert.alert_id)
        plans = [Delivery(alert, self.config.receiver(name), delivery_id(alert, name),
                          encode_event(event).decode())
                 for name in route(self.config, labels(alert))]
        if not plans:
            return
        known = {r[0] for r in await self.query(CHAINS_SQL, {"ids": [d.id for d in plans]})}
        fresh = [d for d in plans if d.id not in known]
        self.counts["duplicate"] += len(plans) - len(fresh)
        if not fresh:
            return
        rows = [self._row(d, 0, "queued", next_at=self.clock()) for d in fresh]
        await self.insert(rows, _token(rows))
        for d in fresh:
            self._spawn(self._chain(d, 1, 0.0))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _chain(self, d: Delivery, attempt: int, delay: float) -> None:
        """Attempts ``attempt``, ``attempt + 1``, ... after ``delay``, until one
        is not ``failed``; each recorded. One alert's attempts take turns
        (first come, first served), so its opening goes out before its close."""
        self._inflight.add(d.id)
        try:
            next_delay: float | None = delay
            while next_delay is not None:
                await asyncio.sleep(next_delay)
                async with self._turn(d.alert.alert_id):
                    row, next_delay = await self._attempt(d, attempt)
                    await self._record([row])
                attempt += 1
        finally:
            self._inflight.discard(d.id)

    @contextlib.asynccontextmanager
    async def _turn(self, alert_id: str) -> AsyncIterator[None]:
        lock, users = self._turns.get(alert_id, (asyncio.Lock(), 0))
        self._turns[alert_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[alert_id]
            if users <= 1:
                del self._turns[alert_id]
            else:
                self._turns[alert_id] = (lock, users - 1)

    async def _attempt(self, d: Delivery, attempt: int) -> tuple[list[Any], float | None]:
        """One try: the row to record and, when another try comes, the delay."""
        alert, receiver = d.alert, d.receiver
        if alert.state == "open" and receiver.kind == "alertmanager":
            silence = silenced_by(await self._silences_of(receiver), labels(alert))
            if silence is not None:
                return self._row(d, attempt, "silenced", silence_id=silence.id), None
        if alert.state == "open" and attempt > 1 and await self._has_closed(alert.alert_id):
            return self._row(d, attempt, "skipped",
                             error="the alert closed before its opening was delivered"), None
        sent = await self._send(d, attempt)
        if sent.ok:
            return self._row(d, attempt, "delivered", sent), None
        outcome = after_failure(attempt, receiver.max_attempts, sent.status,
                                age_s=self.clock() - alert.at,
                                give_up_after_s=receiver.give_up_after_s)
        if outcome == "gave_up":
            self._log.error("alert not delivered: gave up", receiver=receiver.name,
                            alert_id=alert.alert_id, attempts=attempt, error=sent.error)
            return self._row(d, attempt, outcome, sent), None
        delay = retry_delay(attempt, receiver.backoff, self.rand)
        return self._row(d, attempt, outcome, sent, next_at=self.clock() + delay), delay

    async def _send(self, d: Delivery, attempt: int) -> Sent:
        alert, receiver = d.alert, d.receiver
        url = link(self.config, alert)
        if receiver.kind == "alertmanager":
            body = json.dumps([alertmanager_alert(
                alert, url=url, now=self.clock(),
                resend_interval_s=self.config.resend_interval_s)]).encode()
            return await self._post(f"{receiver.url}/api/v2/alerts", body, {}, receiver)
        body = webhook_body(alert, receiver=receiver.name, delivery_id=d.id, url=url)
        headers = {SIGNATURE_HEADER: signature(self.secrets[receiver.name], body,
                                               int(self.clock())),
                   DELIVERY_HEADER: d.id, "X-Primus-Attempt": str(attempt)}
        return await self._post(receiver.url, body, headers, receiver)

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    receiver: Receiver) -> Sent:
        assert self._session is not None, "start() first"
        async with self._slots:
            started = time.perf_counter()
            try:
                async with self._session.post(
                        url, data=body, timeout=aiohttp.ClientTimeout(total=receiver.timeout_s),
                        headers={"Content-Type": "application/json", **headers}) as resp:
                    text = (await resp.read())[:MAX_ERROR_CHARS].decode(errors="replace")
                    status = resp.status
            except TimeoutError:
                return Sent(None, f"no answer within {receiver.timeout_s:g} s",
                            _ms(started))
            except aiohttp.ClientError as exc:
                return Sent(None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS], _ms(started))
        error = "" if 200 <= status < 300 else f"HTTP {status}: {text.strip()}"
        return Sent(status, error[:MAX_ERROR_CHARS], _ms(started))

    def _row(self, d: Delivery, attempt: int, outcome: Outcome, sent: Sent | None = None, *,
             error: str = "", silence_id: str = "", next_at: float | None = None
             ) -> list[Any]:
        self.counts[outcome] += 1
        a = d.alert
        values = {
            "time": _naive(self.clock()), "delivery_id": d.id, "alert_id": a.alert_id,
            "state": a.state, "rule": a.rule, "severity": a.severity, "node": a.node or "",
            "job": a.job or "", "workspace": a.workspace or "", "receiver": d.receiver.name,
            "kind": d.receiver.kind, "cause": d.cause, "attempt": attempt, "outcome": outcome,
            "status_code": sent.status if sent else None,
            "error": sent.error if sent else error,
            "latency_ms": sent.latency_ms if sent else None,
            "next_attempt_at": _naive(next_at) if next_at is not None else None,
            "silence_id": silence_id,
            "event": d.event if outcome in ("failed", "queued") else ""}
        return [values[c] for c in DELIVERY_COLUMNS]

    async def _record(self, rows: list[list[Any]]) -> None:
        """Insert from a background chain, until the store takes it: the
        outcome of an attempt is never dropped while this process lives (the
        chain's next attempt of the same alert waits its turn meanwhile; one
        that stops first leaves the last recorded row, which a take-over
        resends under the same delivery id)."""
        waited = 0.0
        for attempt in itertools.count(1):
            try:
                await self.insert(rows, _token(rows))
                if waited >= RECORD_PATIENCE_S:
                    self._log.info("delivery outcome recorded late", delivery_id=rows[0][1],
                                   waited_s=round(waited, 1))
                return
            except Exception as exc:
                wait = retry_delay(attempt, RECORD_BACKOFF)
                if waited < RECORD_PATIENCE_S <= waited + wait:
                    self._log.error("delivery outcome not recorded yet; still trying",
                                    error=repr(exc), delivery_id=rows[0][1])
                waited += wait
                await asyncio.sleep(wait)

    # ----------------------------------------------------------------- look-ups

    async def _workspace(self, job: str | None) -> str | None:
        """The job's workspace, from its job.submitted (cached once found)."""
        if not job:
            return None
        if job not in self._workspaces:
            try:
                rows = await self.query(WORKSPACE_SQL, {"job": job})
            except Exception as exc:
                self._log.warning("workspace not looked up", job=job, error=repr(exc))
                return None
            if not rows or not rows[0][0]:
                return None
            if len(self._workspaces) > 50_000:
                self._workspaces.clear()
            self._workspaces[job] = rows[0][0]
        return self._workspaces[job]

    async def _has_closed(self, alert_id: str) -> bool:
        if alert_id in self._closed:
            return True
        rows = await self.query(CLOSED_SQL, {"id": alert_id})
        return bool(rows and rows[0][0])

    async def _silences_of(self, am: Receiver) -> list[Silence]:
        """Alertmanager's active silences, read at most every silence_refresh_s;
        the last ones known while it does not answer."""
        now = self.clock()
        cached = self._silences.get(am.name)
        if cached is not None and now - cached[0] < self.config.silence_refresh_s:
            return cached[1]
        assert self._session is not None
        try:
            async with self._slots, self._session.get(
                    f"{am.url}/api/v2/silences",
                    timeout=aiohttp.ClientTimeout(total=am.timeout_s)) as resp:
                resp.raise_for_status()
                silences = active_silences(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._log.warning("silences not read", receiver=am.name, error=repr(exc))
            return cached[1] if cached is not None else []
        self._silences[am.name] = (now, silences)
        return silences

    # ----------------------------------------------------------------- the leader's part

    async def run(self, leads: Callable[[], bool] | None = None) -> None:
        """Every ``resend_interval_s`` while ``leads()`` (None: always): re-send
        open alerts to Alertmanager and take over orphaned retries."""
        while True:
            try:
                if leads is None or leads():
                    await self.resend()
                    await self.recover()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: next time
                self._log.warning("alert re-send failed", error=repr(exc))
            await asyncio.sleep(self.config.resend_interval_s)

    async def resend(self) -> None:
        ams = self.config.alertmanagers
        if not ams:
            return
        now = self.clock()
        alerts = [await self._open_alert(r, now) for r in await self.query(OPEN_ALERTS_SQL, {})]
        await asyncio.gather(*(self._resend_to(am, alerts) for am in ams))

    async def _open_alert(self, r: tuple[Any, ...], now: float) -> AlertFacts:
        alert_id, rule, key, node, job, gpu, value, threshold, severity, message, opened, ev = r
        return AlertFacts(alert_id=alert_id, event_id=ev, rule=rule, state="open",
                          severity=severity, subject_key=key, opened_at=opened / 1000, at=now,
                          node=node or None, job=job or None,
                          workspace=await self._workspace(job), gpu=gpu, value=value,
                          threshold=threshold, message=message)

    async def _resend_to(self, am: Receiver, alerts: list[AlertFacts]) -> None:
        mine = [a for a in alerts if am.name in route(self.config, labels(a))]
        silences = await self._silences_of(am) if mine else []
        outcomes: dict[str, tuple[Outcome, Sent | None, str]] = {}
        send: list[AlertFacts] = []
        for a in mine:
            silence = silenced_by(silences, labels(a))
            if silence is not None:
                outcomes[a.alert_id] = ("silenced", None, silence.id)
            else:
                send.append(a)
        now = self.clock()
        for i in range(0, len(send), RESEND_CHUNK):
            chunk = send[i:i + RESEND_CHUNK]
            body = json.dumps([alertmanager_alert(
                a, url=link(self.config, a), now=now,
                resend_interval_s=self.config.resend_interval_s) for a in chunk]).encode()
            sent = await self._post(f"{am.url}/api/v2/alerts", body, {}, am)
            for a in chunk:
                outcomes[a.alert_id] = ("delivered" if sent.ok else "failed", sent, "")
        rows = []
        for a in mine:
            outcome, sent, silence_id = outcomes[a.alert_id]
            key, seen = (a.alert_id, am.name), (outcome, silence_id)
            if self._resent.get(key) == seen:
                continue  # recorded when it changed, not every interval
            self._resent[key] = seen
            d = Delivery(a, am, delivery_id(replace(a, state="open"), f"{am.name}|resend"), "",
                         cause="resend")
            rows.append(self._row(d, 1, outcome, sent, silence_id=silence_id))
        live = {a.alert_id for a in mine}
        for key in [k for k in self._resent if k[1] == am.name and k[0] not in live]:
            del self._resent[key]
        if rows:
            await self.insert(rows, _token(rows))

    async def recover(self) -> None:
        """Take over retries whose replica stopped: the newest row failed and
        its next attempt is ``orphan_grace_s`` overdue."""
        now = self.clock()
        rows = await self.query(ORPHANS_SQL, {
            "since": int((now - self._lookback_s) * 1000),
            "stale": int((now - self.orphan_grace_s) * 1000)})
        for did, name, attempt, event_json in rows:
            if did in self._inflight or not event_json:
                continue
            event = parse_event(event_json)
            assert isinstance(event, LensAlert)
            alert = facts_of(event, await self._workspace(event.job))
            receiver = next((r for r in self.config.receivers if r.name == name), None)
            if receiver is None:
                gone = Receiver(name=name, kind="alertmanager", url="http://removed")
                await self.insert([self._row(Delivery(alert, gone, did, "", "recovered"),
                                             attempt + 1, "gave_up",
                                             error="the receiver is no longer configured")],
                                  f"gone-{did}-{attempt}")
                continue
            self._log.info("retry taken over", delivery_id=did, receiver=name)
            self._spawn(self._chain(Delivery(alert, receiver, did, event_json, "recovered"),
                                    attempt + 1, 0.0))


def _token(rows: list[list[Any]]) -> str:
    """The insert's de-duplication token: its rows' ids, attempts, outcomes, times."""
    keys = "\n".join(f"{r[1]}|{r[12]}|{r[13]}|{r[0]}|{r[11]}" for r in rows)
    return "deliveries-" + hashlib.sha256(keys.encode()).hexdigest()


def _naive(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)  # the driver wants naive UTC


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
