"""The bus, over NATS JetStream: one place that knows how to connect,
publish events de-duplicated, read and write the state buckets, consume
(``libs.consume``), dead-letter, and serve and call request/reply endpoints.

Nothing this module sends may exceed the server's payload limit: the server
answers an oversized message by closing the connection, and nats-py then
gives up on it for good. A dead letter whose body would not fit is cut, with
the body's size and digest in its headers; an event too large to publish is
refused here with a clear error; a reply too large is replaced by an error
reply. A connection that closes all the same is reported to
``on_connection_lost`` watchers (the service shell reconnects).

The connection is made by faststream's ``NatsBroker``, whose typed core
subscribers answer the endpoints of a service's route table: the request
is validated into its model at the edge, the handler's return value is the
reply, and a refused or failed request is answered ``{"ok": false,
"error": ...}``, never with silence. A bus that carries a route table
(``routes``) refuses to publish an event or use an endpoint the table does
not name (``UndeclaredRoute``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from faststream import ExceptionMiddleware
from faststream.nats import NatsBroker
from faststream.nats.broker.broker import UNRECOVERABLE_CONNECT_ERRORS
from faststream.nats.security import NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from libs.consume import (
    MAX_ORIGIN_CHARS,
    BatchHandler,
    Consumers,
    ConsumerStats,
    EventHandler,
    RawBatchHandler,
    event_or_reason,
)
from libs.events import Event, encode_event, parse_event
from libs.kv import Records
from libs.logs import get_logger
from libs.metrics import ServiceMetrics, subject_label
from libs.nats_urls import servers, split_login, with_login
from libs.records import BUCKETS, BucketSpec, R
from libs.routes import Endpoint, Reply, Routes, event_subject
from libs.topology import (  # noqa: F401  (the bus's names for them)
    CONTROL,
    DEADLETTER,
    HEALTH_SUBJECT,
    KV_BUCKETS,
    QUERY_SUBJECT,
    STREAMS,
    TELEMETRY,
    StreamSpec,
    stream_of,
)

__all__ = ["CONTROL", "DEADLETTER", "TELEMETRY", "Bus", "ConsumerStats", "MessageTooLarge",
           "UndeclaredRoute", "dlq_subject", "event_or_reason", "on_connection_lost"]

REASON_HEADER = "Primus-Reason"
ORIGIN_HEADER = "Primus-Subject"
SERVICE_HEADER = "Primus-Service"  # the service that refused it
BODY_SIZE_HEADER = "Primus-Body-Size"  # set when the body was cut: its full size,
BODY_SHA256_HEADER = "Primus-Body-Sha256"  # and the digest of the whole body
# What a dead letter keeps of a long reason.
MAX_REASON_CHARS = 1000
# Room left under the server's limit for the protocol's own framing.
PAYLOAD_MARGIN = 64
# JetStream's answers while a cluster settles, each of which goes away once
# every member has been heard from: "no suitable peers for placement" (a
# member that has just started, or missed its last report under load, counts
# as offline) and "insufficient resources" (too few members known yet to
# place a replicated stream).
NO_SUITABLE_PEERS = 10005
INSUFFICIENT_RESOURCES = 10023
SETTLING_ERRORS = frozenset({NO_SUITABLE_PEERS, INSUFFICIENT_RESOURCES})
# "stream name already in use with a different configuration": the stream is
# there, and its update moves it to this configuration.
STREAM_NAME_IN_USE = 10058
# How long a stop waits for requests being answered.
STOP_WAIT_S = 5.0
E = TypeVar("E", bound=Event)


class MessageTooLarge(ValueError):
    """An event (with its headers) that the server would refuse by closing
    the connection: refused before it is sent."""


class UndeclaredRoute(RuntimeError):
    """A service used an event or endpoint its route table does not name."""


def headers_size(headers: dict[str, str] | None) -> int:
    """Bytes of the NATS/1.0 header block nats-py sends for ``headers``
    (the server counts them against its payload limit with the body)."""
    if not headers:
        return 0
    return len(b"NATS/1.0\r\n\r\n") + sum(
        len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


def _header_text(value: str, limit: int) -> str:
    # Header values are one line of printable ASCII; a hostile subject or
    # reason must not break the header block or grow it without bound.
    text = value.encode("ascii", "backslashreplace").decode()
    text = "".join(c if " " <= c <= "~" else " " for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_url(url: str) -> str:
    """``url`` fit for a message: a password in it (``user:password@``) masked."""
    return re.sub(r"(://[^/:@,]+):[^/@,]*@", r"\1:***@", url)


def tls_context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The client TLS context of the settings' NATS files (None: plain TCP)."""
    if not (ca or cert):
        return None
    if bool(cert) != bool(key):
        raise ConnectionError("PRIMUS_NATS_TLS_CERT and PRIMUS_NATS_TLS_KEY go "
                              "together: set both (a client certificate) or neither")
    try:
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=str(ca) if ca else None)
        if cert and key:
            tls.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConnectionError(
            f"cannot load the NATS TLS files (PRIMUS_NATS_TLS_CA {ca}, "
            f"PRIMUS_NATS_TLS_CERT {cert}, PRIMUS_NATS_TLS_KEY {key}): {exc}; "
            "point them at readable PEM files") from exc
    return tls


def dlq_subject(service: str) -> str:
    return f"safe.dlq.{service}"


@dataclass
class Link:
    """What the connection's callbacks last said: ``connected``,
    ``disconnected`` (nats-py is reconnecting) or ``closed`` (for good)."""

    state: str = "connecting"
    disconnects: int = 0
    reason: str = ""
    closing: bool = False  # our own close: not a loss
    # The error log of an outage: nats-py reports every failed reconnect
    # (twice a second here), so a repeat of the same error is counted and
    # logged at most every ERROR_LOG_EVERY_S.
    logged: str = ""
    logged_at: float = float("-inf")
    unlogged: int = 0
    down_since: float | None = None

    def log_error(self, reason: str, now: float) -> int | None:
        """Whether to log ``reason`` now: None to keep it quiet, else how
        many repeats were kept quiet before it."""
        if reason == self.logged and now - self.logged_at < ERROR_LOG_EVERY_S:
            self.unlogged += 1
            return None
        quiet, self.unlogged = self.unlogged, 0
        self.logged, self.logged_at = reason, now
        return quiet

    def back(self, now: float) -> tuple[float, int] | None:
        """The connection is back: how long it was down and how many errors
        went unlogged (None when it was not down)."""
        down, quiet = self.down_since, self.unlogged
        self.down_since, self.logged, self.logged_at, self.unlogged = None, "", float("-inf"), 0
        return None if down is None else (now - down, quiet)


ERROR_LOG_EVERY_S = 30.0


# Called with the reason when a connection closes that nobody closed on purpose.
_LOST_WATCHERS: list[Callable[[str], None]] = []


def on_connection_lost(watcher: Callable[[str], None]) -> Callable[[], None]:
    """Register ``watcher``; returns the function that removes it again."""
    _LOST_WATCHERS.append(watcher)
    return lambda: _LOST_WATCHERS.remove(watcher) if watcher in _LOST_WATCHERS else None


def _refused_request(exc: Exception) -> dict[str, Any]:
    """faststream's answer to a request it could not hand over (the body did
    not validate as the endpoint's request model)."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}"
                             for e in exc.errors()[:5])
        return {"ok": False, "error": f"invalid request: {problems}"[:MAX_REASON_CHARS]}
    return {"ok": False, "error": _short(exc)}


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def settling(exc: Exception) -> bool:
    """Whether a failed JetStream request is one a cluster still settling
    gives (no answer, no responders, 503, or ``SETTLING_ERRORS``), worth
    asking again for a while, rather than a refusal that stands."""
    if not isinstance(exc, nats.js.errors.APIError):
        return isinstance(exc, _NOT_READY)
    return exc.code == 503 or exc.err_code in SETTLING_ERRORS


def _unrecoverable(exc: Exception) -> bool:
    """An error after which nats-py (under faststream) will not reconnect."""
    reason = str(exc).removeprefix("nats: ").strip("'").lower()
    return isinstance(exc, nats.errors.Error) and reason in UNRECOVERABLE_CONNECT_ERRORS


class Served:
    """An endpoint being answered; ``stop`` stops answering (and the bus
    forgets it: a leader's endpoints come and go with its terms)."""

    def __init__(self, subject: str, subscriber: Any, served: set[Served]) -> None:
        self.subject = subject
        self._subscriber = subscriber
        self._served = served
        served.add(self)

    async def stop(self) -> None:
        self._served.discard(self)
        with contextlib.suppress(Exception):
            await self._subscriber.stop()


# How long a bucket that is not found is asked for again (see Bus.kv).
BUCKET_APPEAR_S = 10.0
# How long JetStream that does not answer, or answers that it is not ready
# (a cluster electing leaders, or without its quorum), is waited for.
JETSTREAM_READY_S = 60.0
# What JetStream says while it cannot answer yet: no answer in time, no
# server listening, or 503 (no leader).
_NOT_READY = (nats.errors.TimeoutError, nats.errors.NoRespondersError,
              nats.js.errors.ServiceUnavailableError)


class Bus:
    """A connected NATS client plus JetStream context for one service."""

    def __init__(self, nc: Client, service: str, *, broker: NatsBroker | None = None,
                 url: str | None = None, token: str | None = None, link: Link | None = None,
                 routes: Routes | None = None, login: tuple[str, str | None] | None = None
                 ) -> None:
        self.nc = nc
        self.broker = broker
        self.link = link or Link(state="connected")
        self.clock_skew_s = 30.0  # see Settings.clock_skew_s
        # For the lean connections (a hot consumer's, failover's heartbeats).
        self._lean_url, self._login, self.token = url, login, token
        self.js = nc.jetstream()
        self.service = service
        self.routes = routes
        self.stats = ConsumerStats()
        self.metrics: ServiceMetrics | None = None  # the process's (libs.service)
        self.consumers = Consumers(self)
        self._groups: list[Consumers] = [self.consumers]
        self._served: set[Served] = set()
        self._log = get_logger(component="bus")

    @property
    def url(self) -> str | None:
        """Where a lean connection (``libs.natsfast``) may go: every server
        the client knows now, those configured and those a cluster announced
        (so a lean connection given one URL still finds the others when its
        server dies), with the login in each; None when there is no lean
        path (TLS, or a login a URL cannot carry as is)."""
        if self._lean_url is None:
            return None
        known = ",".join(f"{u.scheme}://{u.netloc}" for u in self.nc.servers) or self._lean_url
        known = split_login(known)[0]
        return with_login(known, *self._login) if self._login else known

    # ------------------------------------------------------------------ setup

    @classmethod
    async def connect(
        cls, url: str, service: str, *, token: str | None = None, user: str | None = None,
        password: str | None = None, tls_ca: Path | None = None, tls_cert: Path | None = None,
        tls_key: Path | None = None, timeout_s: float = 10.0, routes: Routes | None = None,
    ) -> Bus:
        """Connect as ``service``: with a token (the embedded stack), or as a
        NATS user (the chart: one per service, libs/nats_permissions.py), and
        over TLS when a CA or a client certificate is given. With ``routes``
        the bus holds the caller to its route table from the start."""
        link = Link()
        log = get_logger(component="bus")
        shown = shown_url(url)
        url, url_user, url_password = split_login(url)
        if url_user is not None and not (token or user):
            if url_password is None:
                token = url_user  # nats://TOKEN@host, as nats-py reads it
            else:
                user, password = url_user, url_password

        async def _error(exc: Exception) -> None:
            link.reason = str(exc) or type(exc).__name__
            # A first connect that fails says so once, below.
            quiet = None if link.state == "connecting" else \
                link.log_error(link.reason, time.monotonic())
            if quiet is not None:
                log.warning("nats error", error=link.reason,
                            **({"repeats_not_logged": quiet} if quiet else {}))
            if link.state in ("connected", "disconnected") and not link.closing \
                    and _unrecoverable(exc):
                # faststream raises these again from this callback, which ends
                # nats-py's reconnecting for good: give the connection up now,
                # so the service shell builds a fresh one, with backoff.
                link.state = "closed"
                log.error("nats connection unusable", service=service, reason=link.reason)
                # The error ends the task that called us; it is handled here,
                # so asyncio need not report it when the task is collected.
                task = asyncio.current_task()
                if task is not None:
                    task.add_done_callback(_retrieved)
                for watcher in list(_LOST_WATCHERS):
                    watcher(link.reason)

        async def _disconnected() -> None:
            if link.state == "connected":
                link.disconnects += 1
                link.down_since = time.monotonic()
            if link.state != "closed":
                link.state = "disconnected"

        async def _reconnected() -> None:
            link.state = "connected"
            outage = link.back(time.monotonic())
            if outage is not None:
                log.info("nats reconnected", down_s=round(outage[0], 1),
                         errors_not_logged=outage[1])

        async def _closed() -> None:
            link.state = "closed"
            if not link.closing:
                log.error("nats connection closed", service=service, reason=link.reason)
                for watcher in list(_LOST_WATCHERS):
                    watcher(link.reason or "closed by the server")

        tls = tls_context(tls_ca, tls_cert, tls_key)
        security: NatsSecurity
        if token:
            security = NatsToken(token, ssl_context=tls)
        elif user:
            security = NatsUserPassword(user, password or "", ssl_context=tls)
        else:
            security = NatsSecurity(ssl_context=tls)
        broker = NatsBroker(
            servers(url),  # every server of a cluster: the first reachable one is used
            name=service,
            security=security,
            connect_timeout=2,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]
            drain_timeout=5,  # a stop must fit the 30 s a pod gets after SIGTERM
            error_cb=_error,
            disconnected_cb=_disconnected,
            reconnected_cb=_reconnected,
            closed_cb=_closed,
            allow_reconnect=True,
            logger=None,  # faststream would log every request at INFO
            graceful_timeout=STOP_WAIT_S,
            middlewares=[ExceptionMiddleware(publish_handlers={Exception: _refused_request})],
        )
        try:
            # Reconnects forever once connected, but the first connection
            # must succeed within timeout_s so a wrong URL fails loudly.
            nc = await asyncio.wait_for(broker.connect(), timeout_s)
            await broker.start()
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            # The server's own word (a wrong token: Authorization Violation)
            # says more than the client's "no servers available".
            why = link.reason if link.reason and link.reason not in str(exc) else ""
            raise ConnectionError(
                f"cannot reach NATS at {shown}: {exc}{f' ({why})' if why else ''}; "
                "start it (primus-safe up) or set PRIMUS_NATS_URL"
            ) from exc
        link.state, link.reason = "connected", ""
        # The lean connections (libs.natsfast) speak plain TCP and take a
        # user from the URL: none over TLS, or with a login a URL must escape.
        lean = tls is None and (not user or with_login(url, user, password) is not None)
        return cls(nc, service, broker=broker, url=url if lean else None, token=token,
                   link=link, routes=routes, login=(user, password) if user else None)

    async def ensure_topology(self, replicas: int = 1, *,
                              ready_s: float = JETSTREAM_READY_S) -> None:
        """Declare streams and KV buckets; safe to call from every service.
        ``replicas``: copies of each on a NATS cluster (3 survives the loss of
        a server); a running stream is moved to the new count by its update.
        A cluster that is still electing its JetStream leader (every member
        just started, or one is being replaced) is waited for up to
        ``ready_s``; then its last error is raised."""
        deadline = asyncio.get_running_loop().time() + ready_s
        while True:
            try:
                return await self._declare(replicas)
            except (*_NOT_READY, nats.js.errors.APIError) as exc:
                if not settling(exc) or asyncio.get_running_loop().time() > deadline:
                    raise
                self._log.warning("JetStream not ready; declaring the topology again",
                                  error=str(exc) or type(exc).__name__)
                await asyncio.sleep(1.0)

    async def _declare(self, replicas: int) -> None:
        for spec in STREAMS:
            try:
                await self.js.add_stream(spec.config(replicas))
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    raise  # not there: an update would only hide why
                await self.js.update_stream(spec.config(replicas))
        for bucket in BUCKETS:
            await self.js.create_key_value(api.KeyValueConfig(
                bucket=bucket.name, description=bucket.description, history=bucket.history,
                storage=api.StorageType.FILE, replicas=replicas))

    async def records(self, spec: BucketSpec[R], *, appear_s: float = BUCKET_APPEAR_S,
                      ready_s: float = JETSTREAM_READY_S) -> Records[R]:
        """A bucket as typed records (``libs.records``), written revision-checked."""
        return Records(await self.kv(spec.name, appear_s=appear_s, ready_s=ready_s),
                       spec, self.nc)

    async def kv(self, bucket: str, *, appear_s: float = BUCKET_APPEAR_S,
                 ready_s: float = JETSTREAM_READY_S) -> KeyValue:
        """A KV bucket. On a NATS cluster a bucket the topology just created
        can be unknown to the member answering for a moment (its stream is
        still being placed): asked again for up to ``appear_s`` before the
        BucketNotFoundError stands. A cluster that cannot answer yet (it is
        electing the bucket's leader, or a member is coming back) is asked
        again for up to ``ready_s``: a service starting then would otherwise
        exit on its first request."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = 0.1
        while True:
            try:
                return await self.js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                if loop.time() + delay > started + appear_s:
                    raise
            except _NOT_READY as exc:
                if loop.time() + delay > started + ready_s:
                    raise
                self._log.warning("JetStream not ready; asking for the bucket again",
                                  bucket=bucket, error=repr(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # ------------------------------------------------------------------ publish

    @property
    def max_payload(self) -> int:
        """The server's limit on one message, headers included."""
        return self.nc.max_payload

    async def publish(self, event: Event) -> bool:
        """Publish durably; returns False when JetStream saw this id already.
        An event no stream keeps (a heartbeat) goes out on core NATS.
        Raises ``MessageTooLarge`` for an event the server would not take."""
        ack = await self._publish(event)
        return ack is None or not ack.duplicate

    async def publish_at(self, event: Event) -> int:
        """Publish durably and return the event's sequence in its stream (the
        first copy's, when JetStream saw this id already): where to look for
        what answered it (``stored_after``)."""
        ack = await self._publish(event)
        if ack is None:
            raise ValueError(f"{event.type} goes out on core NATS: no stream keeps it")
        return ack.seq

    async def _publish(self, event: Event) -> api.PubAck | None:
        if self.routes is not None and not self.routes.may_publish(type(event)):
            raise UndeclaredRoute(f"{self.service} publishes {event.type} but its route table "
                                  f"does not say so: add it to the table's publishes")
        body = encode_event(event)
        headers = {"Nats-Msg-Id": event.id}
        size = len(body) + headers_size(headers)
        if size > self.max_payload:
            raise MessageTooLarge(
                f"{event.type} event {event.id} is {size} bytes; the bus takes at most "
                f"{self.max_payload} bytes per message (the server's max_payload)")
        if stream_of(event.subject) is None:
            # Liveness (heartbeats): core NATS, fire and forget. A beat lost
            # to a reconnect is a late beat; the next one follows.
            await self.nc.publish(event.subject, body, headers=headers)
            return None
        return await self.js.publish(event.subject, body, headers=headers)

    async def stored(self, cls: type[Event], *, node: str | None = None,
                     job: str | None = None) -> bool:
        """Whether the stream holds a ``cls`` event for these keys (events a
        service reads back, ``Routes.rereads``)."""
        stream, subject = self._reread(cls, node, job)
        try:
            await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return False
        return True

    async def stored_after(self, cls: type[Event], seq: int, *, node: str | None = None,
                           job: str | None = None) -> list[tuple[int, Event]]:
        """The ``cls`` events for these keys that the stream stored after
        sequence ``seq``, oldest first, with their sequences: what a live
        subscription missed while the connection was down (``Routes.rereads``;
        one read-only message get each, no consumer)."""
        stream, subject = self._reread(cls, node, job)
        found: list[tuple[int, Event]] = []
        while True:
            try:
                msg = await self.js.get_msg(stream, seq + 1, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return found
            seq = msg.seq or seq + 1
            with contextlib.suppress(ValueError, RecursionError):
                if isinstance(event := parse_event(msg.data or b""), cls):
                    found.append((seq, event))

    def _reread(self, cls: type[Event], node: str | None, job: str | None) -> tuple[str, str]:
        if self.routes is not None and cls not in self.routes.rereads:
            raise UndeclaredRoute(f"{self.service} reads back {cls.__name__} but its route "
                                  "table does not say so: add it to the table's rereads")
        subject = event_subject(cls, **{k: v for k, v in (("node", node), ("job", job)) if v})
        stream = stream_of(subject)
        assert stream is not None, f"no stream keeps {subject}"
        return stream.name, subject

    # ------------------------------------------------------------------ consume

    def consume(self, *, durable: str, subjects: Sequence[str], stream: StreamSpec,
                handler: EventHandler | None = None, batch_handler: BatchHandler | None = None,
                batch: int = 64, max_deliver: int = 5, ack_wait_s: float = 30.0) -> None:
        """A durable pull consumer (``libs.consume.Consumers.consume``)."""
        self.consumers.consume(durable=durable, subjects=subjects, stream=stream,
                               handler=handler, batch_handler=batch_handler, batch=batch,
                               max_deliver=max_deliver, ack_wait_s=ack_wait_s)

    def consume_raw(self, *, durable: str, subjects: Sequence[str], stream: StreamSpec,
                    handler: RawBatchHandler, batch: int = 1000, fill_s: float = 0.2,
                    max_deliver: int = 5, ack_wait_s: float = 30.0, inflight: int = 2,
                    own_connection: bool = True) -> None:
        """A hot-path consumer (``libs.consume.Consumers.consume_raw``)."""
        self.consumers.consume_raw(durable=durable, subjects=subjects, stream=stream,
                                   handler=handler, batch=batch, fill_s=fill_s,
                                   max_deliver=max_deliver, ack_wait_s=ack_wait_s,
                                   inflight=inflight, own_connection=own_connection)

    def group(self) -> Consumers:
        """Consumers of their own on this connection, stopped together (a
        leader's term); they count into this bus's stats."""
        group = Consumers(self)
        self._groups.append(group)
        return group

    def durables(self) -> list[tuple[str, str]]:
        """(stream, durable) of every consumer this bus runs now."""
        return [d for group in self._groups for d in group.durables()]

    async def measure_pending(self) -> None:
        """Each durable's pending and unacked counts into the metrics, from
        the server (one consumer-info request per durable)."""
        if self.metrics is None:
            return
        for stream, durable in self.durables():
            try:
                info = await self.js.consumer_info(stream, durable)
            except Exception:  # reconnecting, or a leader term ended: next round
                continue
            self.metrics.pending.labels(durable).set(info.num_pending or 0)
            self.metrics.ack_pending.labels(durable).set(info.num_ack_pending or 0)

    async def stop_group(self, group: Consumers) -> None:
        await group.stop()
        if group in self._groups and group is not self.consumers:
            self._groups.remove(group)

    async def dead_letter(self, msg: Msg, reason: str) -> None:
        """Keep what we could not use, with why, where an operator can look.

        One copy per refusing service: the id names the service and the
        message's place in its stream. The whole dead letter stays under the
        server's payload limit: a body that would not fit is cut, and its
        full size and SHA-256 are kept in headers."""
        meta = msg.metadata if msg.reply else None
        headers = {REASON_HEADER: _header_text(reason, MAX_REASON_CHARS),
                   ORIGIN_HEADER: _header_text(msg.subject, MAX_ORIGIN_CHARS),
                   SERVICE_HEADER: _header_text(self.service, 128)}
        if meta is not None:
            headers["Nats-Msg-Id"] = f"dlq-{self.service}-{meta.stream}-{meta.sequence.stream}"
        body = msg.data or b""
        room = self.max_payload - PAYLOAD_MARGIN - headers_size(
            {**headers, BODY_SIZE_HEADER: str(len(body)), BODY_SHA256_HEADER: "0" * 64})
        if len(body) > room:
            headers[BODY_SIZE_HEADER] = str(len(body))
            headers[BODY_SHA256_HEADER] = hashlib.sha256(body).hexdigest()
            body = body[: max(room, 0)]
        await self.js.publish(dlq_subject(self.service), body, headers=headers)
        self.stats.dead_lettered += 1
        if self.metrics is not None:
            self.metrics.dead_lettered.labels(subject_label(msg.subject)).inc()
        reasons = self.stats.dead_letter_reasons + [reason[:MAX_REASON_CHARS]]
        self.stats.dead_letter_reasons = reasons[-20:]
        self._log.warning("dead-lettered", subject=msg.subject[:MAX_ORIGIN_CHARS],
                          reason=reason[:MAX_REASON_CHARS], size=len(msg.data or b""))

    # ------------------------------------------------------------------ endpoints

    async def serve(self, endpoint: Endpoint, handler: Callable[[Any], Awaitable[Any]], *,
                    queue: str = "", **keys: str) -> Served:
        """Answer ``endpoint`` (at ``keys``) with ``handler``, which takes the
        request model and returns the reply model (or None for a one-way
        endpoint). Returns once the server has the subscription, so a
        request sent next from anywhere is answered."""
        if self.broker is None:
            raise RuntimeError("this bus has no broker to serve endpoints with")
        subject = endpoint.at(**keys) if keys else endpoint.pattern
        self._check_serve(subject)
        request_model, one_way = endpoint.request, endpoint.reply is None
        limit = self.max_payload - PAYLOAD_MARGIN

        async def answer(request: Any) -> Any:
            try:
                reply = await handler(request)
            except Exception as exc:
                self._log.warning("request failed", subject=subject, error=_short(exc))
                return None if one_way else Reply(ok=False, error=_short(exc))
            if one_way or reply is None:
                return None
            body = reply.model_dump_json() if isinstance(reply, BaseModel) else json.dumps(
                reply, default=str)
            if len(body) > limit:  # an answer, not silence
                return Reply(ok=False, error=(
                    f"the reply is {len(body)} bytes, over the bus's limit of "
                    f"{self.max_payload}: ask for less (a narrower range, a limit)"))
            return reply

        # faststream validates the request into its model from the signature.
        answer.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               annotation=request_model)])
        answer.__annotations__ = {"request": request_model}
        subscriber = self.broker.subscriber(subject, queue=queue, persistent=False,
                                            title=subject, include_in_schema=False)
        subscriber(answer)
        await subscriber.start()
        served = Served(subject, subscriber, self._served)
        try:
            await self.flush()  # answering once this returns, to any connection
        except (nats.errors.Error, TimeoutError) as exc:
            # Kept on the client all the same: nats-py subscribes again on reconnect.
            self._log.warning("server has not confirmed a subscription yet", subject=subject,
                              error=str(exc) or type(exc).__name__)
        return served

    async def request(self, subject: str, body: dict[str, Any] | None = None,
                      timeout_s: float = 5.0) -> dict[str, Any]:
        """A JSON request on a core subject; the JSON reply."""
        self._check_call(subject)
        msg = await self.nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout_s)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def ask(self, endpoint: Endpoint, request: BaseModel | None = None, *,
                  timeout_s: float = 5.0, **keys: str) -> Any:
        """Request ``endpoint`` (at ``keys``); its reply as the reply model.
        An error reply (``ok`` false) is returned as it is, for the caller
        to say why."""
        subject = endpoint.at(**keys) if keys else endpoint.subject
        body = request.model_dump(mode="json") if request is not None else {}
        reply = await self.request(subject, body, timeout_s=timeout_s)
        model = endpoint.reply or Reply
        try:
            return model.model_validate(reply)
        except ValidationError:
            if reply.get("ok") is False:  # an error reply lacks the model's fields
                return Reply.model_validate(reply)
            raise

    async def send(self, endpoint: Endpoint, message: BaseModel, **keys: str) -> None:
        """One message to a one-way endpoint (no reply is awaited)."""
        subject = endpoint.at(**keys) if keys else endpoint.subject
        self._check_call(subject)
        await self.nc.publish(subject, message.model_dump_json().encode())

    async def listen(self, cls: type[E], callback: Callable[[Any], Awaitable[None]], *,
                     node: str | None = None, job: str | None = None,
                     raw: bool = False) -> Any:
        """Watch ``cls`` events live (a core subscription: no history, no
        acks); messages that are not such an event are skipped. ``raw``: the
        callback takes the message undecoded (a liveness judge needs only its
        subject). Returns the subscription."""
        if self.routes is not None and cls not in self.routes.listens:
            raise UndeclaredRoute(f"{self.service} listens to {cls.__name__} but its route "
                                  "table does not say so: add it to the table's listens")
        subject = event_subject(cls, **{k: v for k, v in (("node", node), ("job", job)) if v})
        if raw:
            sub = await self.nc.subscribe(subject, cb=callback)
            await self.flush()
            return sub

        async def on_msg(msg: Msg) -> None:
            try:
                event = parse_event(msg.data)
            except (ValueError, RecursionError):
                return
            if isinstance(event, cls):
                await callback(event)

        sub = await self.nc.subscribe(subject, cb=on_msg)
        await self.flush()
        return sub

    async def subscribe(self, endpoint: Endpoint, callback: Callable[[Msg], Awaitable[None]],
                        **keys: str) -> Any:
        """A plain subscription to ``endpoint`` (at ``keys``, ``*`` for the
        rest), for who answers later than the request came (a sweep grants
        turns as they come free) or only listens (progress lines). Returns
        the subscription once the server has it."""
        subject = endpoint.at(**keys) if keys else endpoint.pattern
        self._check_serve(subject)
        sub = await self.nc.subscribe(subject, cb=callback)
        await self.flush()
        return sub

    def _check_serve(self, subject: str) -> None:
        if self.routes is not None and not self.routes.may_serve(subject):
            raise UndeclaredRoute(f"{self.service} serves {subject} but its route table does "
                                  "not say so: add the endpoint to the table's serves")

    def _check_call(self, subject: str) -> None:
        if self.routes is not None and not self.routes.may_call(subject):
            raise UndeclaredRoute(f"{self.service} calls {subject} but its route table does "
                                  "not say so: add the endpoint to the table's calls")

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Return once the server has processed everything this connection
        sent so far, subscriptions included: a publish from any connection
        after this reaches them.

        nats-py's ``flush()`` alone does not promise that: it writes its PING
        straight to the socket while a new SUB still waits in the client's
        pending buffer for the flusher task, so the PONG can come back before
        the server has the SUB, and a publish from another connection right
        then is lost (seen on a loaded machine). The flusher writes the buffer
        first, then the PING goes out behind it."""
        async with asyncio.timeout(timeout_s):
            await self.nc._flush_pending(force_flush=True)
            await self.nc.flush(timeout=timeout_s)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ shutdown

    async def stop_consuming(self) -> None:
        """Let every consumer finish its current batch, then stop fetching;
        stop answering endpoints."""
        for group in list(self._groups):
            await group.stop()
        self._groups = [self.consumers]
        for served in list(self._served):
            await served.stop()

    async def close(self) -> None:
        """Stop consumers, then drain the connection (flushes what is pending)."""
        self.link.closing = True
        await self.stop_consuming()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                await self.broker.stop()


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", "; ")
    return text[:500]
