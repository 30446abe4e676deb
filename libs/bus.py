"""Bus helpers over NATS JetStream: one place that knows streams, KV buckets,
de-duplicated publishing, durable batch pull consumers and dead-lettering.

Delivery is at-least-once. A consumer acks only after its handler returned
(the effect is durable); a message that cannot be decoded or validated (or is
of a newer version than this code reads, or is on a subject its type does not
belong to) goes to ``safe.dlq.<service>`` with the reason in a header, is
counted, and is acked so it never blocks the stream; a handler that keeps
failing is dead-lettered after ``max_deliver`` tries.

Nothing this module sends may exceed the server's payload limit: the server
answers an oversized message by closing the connection, and nats-py then
gives up on it for good. A dead letter whose body would not fit is cut, with
the body's size and digest in its headers; an event too large to publish is
refused here with a clear error. A connection that closes all the same is
reported to ``on_connection_lost`` watchers (the service shell reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.kv import KeyValue
from pydantic import ValidationError

from libs import natsfast
from libs.events import SUBJECT_ROOT, Event, UnsupportedVersion, encode_event, read_event
from libs.logs import get_logger
from libs.natsfast import FastPuller
from libs.pull import Puller

DAY = 24 * 3600.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    duplicate_window_s: float = 120.0

    def config(self, replicas: int = 1) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            max_age=self.max_age_s,
            duplicate_window=self.duplicate_window_s,
            num_replicas=replicas,
        )


CONTROL = StreamSpec(
    "CONTROL",
    tuple(f"{SUBJECT_ROOT}.{d}.>" for d in ("node", "job", "worker", "bench", "fault"))
    # Lens alerts only: safe.lens.query is request-reply and must stay out.
    + (f"{SUBJECT_ROOT}.lens.alert.>",),
    max_age_s=30 * DAY,
)
# ClickHouse keeps the telemetry history; the stream only buffers it.
TELEMETRY = StreamSpec("TELEMETRY", (f"{SUBJECT_ROOT}.telemetry.>",), 1 * DAY, 30.0)
DEADLETTER = StreamSpec("DEADLETTER", (f"{SUBJECT_ROOT}.dlq.>",), 30 * DAY)
STREAMS: tuple[StreamSpec, ...] = (CONTROL, TELEMETRY, DEADLETTER)

# Current state, each bucket written by its owner only.
KV_BUCKETS: dict[str, str] = {
    "nodes": "bootstrap: inventory and onboarding state per node",
    "inventory": "bootstrap: the hosts file an operator last handed over with bootstrap apply",
    "jobs": "scheduler: job lifecycle, placement and pending reason per job",
    "faults": "failover: fault records",
    "bench": "bench-coordinator: latest bench result per node",
    # Written with a per-message TTL (libs.leader), so a dead leader's key expires.
    "leases": "scheduler, bench-coordinator: the leader lease per role",
}

HEALTH_SUBJECT = SUBJECT_ROOT + ".health.{service}"
# Request-reply queries live outside every stream's subjects.
QUERY_SUBJECT = SUBJECT_ROOT + ".query.{name}"
REASON_HEADER = "Primus-Reason"
ORIGIN_HEADER = "Primus-Subject"
SERVICE_HEADER = "Primus-Service"  # the service that refused it
BODY_SIZE_HEADER = "Primus-Body-Size"  # set when the body was cut: its full size,
BODY_SHA256_HEADER = "Primus-Body-Sha256"  # and the digest of the whole body
# What a dead letter keeps of a long reason and of the subject it came from.
MAX_REASON_CHARS = 1000
MAX_ORIGIN_CHARS = 512
# Room left under the server's limit for the protocol's own framing.
PAYLOAD_MARGIN = 64


class MessageTooLarge(ValueError):
    """An event (with its headers) that the server would refuse by closing
    the connection: refused before it is sent."""


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


def dlq_subject(service: str) -> str:
    return f"{SUBJECT_ROOT}.dlq.{service}"


EventHandler = Callable[[Event], Awaitable[None]]
# A batch handler gets each event with its stream sequence number.
BatchHandler = Callable[[list[tuple[Event, int]]], Awaitable[None]]
# A raw batch handler decodes messages itself and returns those it refuses,
# each with the reason (they are dead-lettered); the rest are acked.
RawBatchHandler = Callable[[list[Msg]], Awaitable[list[tuple[Msg, str]]]]
_ACK = b"+ACK"


@dataclass
class ConsumerStats:
    delivered: int = 0
    handled: int = 0
    dead_lettered: int = 0
    dead_letter_reasons: list[str] = field(default_factory=list)
    # Fields a known version does not define (a newer producer), by path: read without them.
    unknown_fields: dict[str, int] = field(default_factory=dict)
    # Events whose stamp is further than the clock skew from when the server
    # stored them, by source: their senders' clocks are wrong.
    skewed: dict[str, int] = field(default_factory=dict)


@dataclass
class Link:
    """What the connection's callbacks last said: ``connected``,
    ``disconnected`` (nats-py is reconnecting) or ``closed`` (for good)."""

    state: str = "connecting"
    disconnects: int = 0
    reason: str = ""
    closing: bool = False  # our own close: not a loss


# Called with the reason when a connection closes that nobody closed on purpose.
_LOST_WATCHERS: list[Callable[[str], None]] = []


def on_connection_lost(watcher: Callable[[str], None]) -> Callable[[], None]:
    """Register ``watcher``; returns the function that removes it again."""
    _LOST_WATCHERS.append(watcher)
    return lambda: _LOST_WATCHERS.remove(watcher) if watcher in _LOST_WATCHERS else None


class Bus:
    """A connected NATS client plus JetStream context for one service."""

    def __init__(self, nc: Client, service: str, *, url: str | None = None,
                 token: str | None = None, link: Link | None = None) -> None:
        self.nc = nc
        self.link = link or Link(state="connected")
        self.clock_skew_s = 30.0  # see Settings.clock_skew_s
        self.url, self.token = url, token  # for a hot consumer's own connection
        self.js = nc.jetstream()
        self.service = service
        self.stats = ConsumerStats()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pull_subs: list[Any] = []
        self._log = get_logger(component="bus")

    # ------------------------------------------------------------------ setup

    @classmethod
    async def connect(
        cls, url: str, service: str, *, token: str | None = None, user: str | None = None,
        password: str | None = None, tls_ca: Path | None = None, tls_cert: Path | None = None,
        tls_key: Path | None = None, timeout_s: float = 10.0,
    ) -> Bus:
        """Connect as ``service``: with a token (the embedded stack), or as a
        NATS user (the chart: one per service, libs/nats_permissions.py), and
        over TLS when a CA or a client certificate is given."""
        link = Link()
        log = get_logger(component="bus")

        async def _error(exc: Exception) -> None:
            if link.state != "connecting":  # a first connect that fails says so once, below
                log.warning("nats error", error=str(exc) or type(exc).__name__)
            link.reason = str(exc) or type(exc).__name__

        async def _disconnected() -> None:
            if link.state == "connected":
                link.disconnects += 1
            if link.state != "closed":
                link.state = "disconnected"

        async def _reconnected() -> None:
            link.state = "connected"

        async def _closed() -> None:
            link.state = "closed"
            if not link.closing:
                log.error("nats connection closed", service=service, reason=link.reason)
                for watcher in list(_LOST_WATCHERS):
                    watcher(link.reason or "closed by the server")

        tls: ssl.SSLContext | None = None
        if tls_ca or tls_cert:
            if bool(tls_cert) != bool(tls_key):
                raise ConnectionError("PRIMUS_NATS_TLS_CERT and PRIMUS_NATS_TLS_KEY go "
                                      "together: set both (a client certificate) or neither")
            try:
                tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                                 cafile=str(tls_ca) if tls_ca else None)
                if tls_cert and tls_key:
                    tls.load_cert_chain(str(tls_cert), str(tls_key))
            except (OSError, ssl.SSLError) as exc:
                raise ConnectionError(
                    f"cannot load the NATS TLS files (PRIMUS_NATS_TLS_CA {tls_ca}, "
                    f"PRIMUS_NATS_TLS_CERT {tls_cert}, PRIMUS_NATS_TLS_KEY {tls_key}): {exc}; "
                    "point them at readable PEM files") from exc
        try:
            # Reconnects forever once connected, but the first connection
            # must succeed within timeout_s so a wrong URL fails loudly.
            nc = await asyncio.wait_for(nats.connect(
                url,
                name=service,
                token=token,
                user=user,
                password=password,
                tls=tls,
                connect_timeout=2,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                drain_timeout=5,  # a stop must fit the 30 s a pod gets after SIGTERM
                error_cb=_error,
                disconnected_cb=_disconnected,
                reconnected_cb=_reconnected,
                closed_cb=_closed,
                allow_reconnect=True,
            ), timeout_s)
        except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
            # The server's own word (a wrong token: Authorization Violation)
            # says more than the client's "no servers available".
            why = link.reason if link.reason and link.reason not in str(exc) else ""
            raise ConnectionError(
                f"cannot reach NATS at {url}: {exc}{f' ({why})' if why else ''}; "
                "start it (primus-safe up) or set PRIMUS_NATS_URL"
            ) from exc
        link.state, link.reason = "connected", ""
        # The hot consumer's lean connection (libs.natsfast) speaks plain TCP
        # and takes a user from the URL: no fast path over TLS.
        fast_url: str | None = url
        if tls is not None:
            fast_url = None
        elif user:
            auth = user + (f":{password}" if password else "")
            parts = urlsplit(url)
            # natsfast reads the user from the URL as is: only safe characters.
            fast_url = None if quote(auth, safe=":") != auth else urlunsplit(parts._replace(
                netloc=f"{auth}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")))
        return cls(nc, service, url=fast_url, token=token, link=link)

    async def ensure_topology(self, replicas: int = 1) -> None:
        """Declare streams and KV buckets; safe to call from every service.
        ``replicas``: copies of each on a NATS cluster (3 survives the loss of
        a server); a running stream is moved to the new count by its update."""
        for spec in STREAMS:
            try:
                await self.js.add_stream(spec.config(replicas))
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(spec.config(replicas))
        for bucket, description in KV_BUCKETS.items():
            await self.js.create_key_value(
                api.KeyValueConfig(bucket=bucket, description=description, history=5,
                                   storage=api.StorageType.FILE, replicas=replicas)
            )

    async def kv(self, bucket: str) -> KeyValue:
        return await self.js.key_value(bucket)

    # ------------------------------------------------------------------ publish

    @property
    def max_payload(self) -> int:
        """The server's limit on one message, headers included."""
        return self.nc.max_payload

    async def publish(self, event: Event) -> bool:
        """Publish durably; returns False when JetStream saw this id already.
        Raises ``MessageTooLarge`` for an event the server would not take."""
        body = encode_event(event)
        headers = {"Nats-Msg-Id": event.id}
        size = len(body) + headers_size(headers)
        if size > self.max_payload:
            raise MessageTooLarge(
                f"{event.type} event {event.id} is {size} bytes; the bus takes at most "
                f"{self.max_payload} bytes per message (the server's max_payload)")
        ack = await self.js.publish(event.subject, body, headers=headers)
        return not ack.duplicate

    # ------------------------------------------------------------------ consume

    def consume(
        self,
        *,
        durable: str,
        subjects: Sequence[str],
        stream: StreamSpec,
        handler: EventHandler | None = None,
        batch_handler: BatchHandler | None = None,
        batch: int = 64,
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
    ) -> None:
        """Start a durable pull consumer in the background.

        Exactly one of ``handler`` (events one at a time, in stream order) and
        ``batch_handler`` (a whole fetched batch at once) is given.
        """
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")

        async def on_msgs(msgs: list[Msg], _: Any) -> None:
            await self._dispatch(msgs, handler, batch_handler, max_deliver)

        self._start_consumer(durable, list(subjects), stream, on_msgs, batch=batch,
                             fill_s=0.0, max_deliver=max_deliver, ack_wait_s=ack_wait_s,
                             inflight=1)

    def consume_raw(
        self,
        *,
        durable: str,
        subjects: Sequence[str],
        stream: StreamSpec,
        handler: RawBatchHandler,
        batch: int = 1000,
        fill_s: float = 0.2,
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
        inflight: int = 2,
        own_connection: bool = True,
    ) -> None:
        """A durable pull consumer for hot paths that decode messages themselves.

        Fetches up to ``batch`` messages, waiting at most ``fill_s`` for a batch
        to fill, and runs up to ``inflight`` handler calls at once (so decoding
        the next batch overlaps storing this one). A batch keeps filling past
        ``fill_s`` while the previous one is still being handled, so it is
        handed over as the handler frees up instead of queueing behind it.
        The handler returns the messages it refuses, with the reason: those
        are dead-lettered; every
        other message is acked once the handler returned. Replicas that use
        the same ``durable`` share the consumer (a queue group). With
        ``own_connection`` (and a plain nats:// URL) messages come over a lean
        connection of their own (``libs.natsfast``) and are acked in one write.
        """

        async def on_msgs(msgs: list[Msg], puller: Any) -> None:
            self.stats.delivered += len(msgs)
            await self._run_raw(handler, msgs, max_deliver, puller)

        self._start_consumer(durable, list(subjects), stream, on_msgs, batch=batch,
                             fill_s=fill_s, max_deliver=max_deliver, ack_wait_s=ack_wait_s,
                             inflight=inflight, fast=own_connection)

    def _start_consumer(self, durable: str, subjects: list[str], stream: StreamSpec,
                        on_msgs: Callable[[list[Msg], Any], Awaitable[None]], *, batch: int,
                        fill_s: float, max_deliver: int, ack_wait_s: float,
                        inflight: int, fast: bool = False) -> None:
        config = api.ConsumerConfig(
            # Created by name, a single filter travels in the API subject
            # (CONSUMER.CREATE.<stream>.<name>.<filter>), where the server's
            # permissions can check it (libs/nats_permissions.py).
            name=durable,
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            max_deliver=max_deliver + 1,  # the last delivery is dead-lettered by us
            ack_wait=ack_wait_s,
            filter_subjects=subjects if len(subjects) > 1 else None,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
            max_ack_pending=max(1000, batch * (inflight + 3)),
        )
        task = asyncio.create_task(
            self._consume_loop(durable, stream, config, on_msgs, batch, fill_s, inflight, fast),
            name=f"consume:{durable}",
        )
        self._tasks.append(task)

    async def _consume_loop(
        self,
        durable: str,
        stream: StreamSpec,
        config: api.ConsumerConfig,
        on_msgs: Callable[[list[Msg], Any], Awaitable[None]],
        batch: int,
        fill_s: float,
        inflight: int,
        fast: bool,
    ) -> None:
        try:
            await self.js.add_consumer(stream.name, config)
        except nats.js.errors.APIError as exc:  # exists with other settings: use it
            self._log.warning("consumer kept as it was", durable=durable, error=str(exc))
        puller: Puller | FastPuller
        if fast and self.url and natsfast.supported(self.url):
            puller = FastPuller(self.nc, self.url, self.token, stream.name, durable,
                                name=f"{self.service}:{durable}")
        else:
            puller = Puller(self.nc, stream.name, durable)
        if isinstance(puller, Puller):  # a FastPuller connects on its first fetch (and retries)
            await puller.start()
        self._pull_subs.append(puller)
        slots = asyncio.Semaphore(inflight)
        running: set[asyncio.Task[None]] = set()

        async def handle(msgs: list[Msg]) -> None:
            try:
                await on_msgs(msgs, puller)
            finally:
                slots.release()

        try:
            while not self._stopping.is_set():
                await slots.acquire()
                try:
                    msgs = await puller.fetch(batch, timeout_s=0.5, fill_s=fill_s,
                                              busy=lambda: bool(running))
                except (nats.errors.ConnectionClosedError, nats.errors.DrainTimeoutError):
                    slots.release()
                    return
                except Exception as exc:  # reconnecting, leader change: wait and retry
                    slots.release()
                    self._log.warning("fetch failed", durable=durable, error=str(exc))
                    await asyncio.sleep(0.5)
                    continue
                if not msgs:
                    slots.release()
                    continue
                if inflight == 1:
                    await handle(msgs)
                else:
                    task = asyncio.create_task(handle(msgs))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            if running:  # let batches in flight finish: their effect is durable, ack it
                await asyncio.gather(*running, return_exceptions=True)

    async def _dispatch(
        self,
        msgs: list[Msg],
        handler: EventHandler | None,
        batch_handler: BatchHandler | None,
        max_deliver: int,
    ) -> None:
        self.stats.delivered += len(msgs)
        good: list[tuple[Msg, Event]] = []
        for msg in msgs:
            reason = self._refusal(msg)
            if isinstance(reason, str):
                await self.dead_letter(msg, reason)
                await msg.ack()
            else:
                good.append((msg, reason))
                self._check_stamp(msg, reason)
        if batch_handler is not None:
            batch = [(e, m.metadata.sequence.stream) for m, e in good]
            await self._run(batch_handler, batch, [m for m, _ in good], max_deliver)
        else:
            assert handler is not None
            for msg, event in good:
                await self._run(handler, event, [msg], max_deliver)

    def _refusal(self, msg: Msg) -> Event | str:
        """The event in ``msg``, or why this consumer refuses it."""
        read = event_or_reason(msg.subject, msg.data)
        if isinstance(read, str):
            return read
        event, unknown = read
        for path in unknown:
            self.stats.unknown_fields[path] = self.stats.unknown_fields.get(path, 0) + 1
        return event

    def _check_stamp(self, msg: Msg, event: Event) -> None:
        """Flag an event stamped far from when the server stored it: the
        server's clock, not the sender's and not ours (replayed after a
        restart, every event is old here and that is no fault of its sender).
        Consumers must not order or time anything by such a stamp."""
        if not msg.reply:
            return
        stored = msg.metadata.timestamp.timestamp()
        off_s = event.time.timestamp() - stored
        if abs(off_s) <= self.clock_skew_s:
            return
        key = event.source[:64]
        if key not in self.stats.skewed and len(self.stats.skewed) >= 100:
            key = "(other sources)"
        count = self.stats.skewed[key] = self.stats.skewed.get(key, 0) + 1
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a clock stays wrong
            self._log.warning("event stamped beyond the clock skew", source=event.source,
                              type=event.type, off_s=round(off_s, 3), limit_s=self.clock_skew_s,
                              seen=count)

    async def _run(
        self, fn: Callable[[Any], Awaitable[None]], arg: Any, msgs: list[Msg], max_deliver: int
    ) -> None:
        if not msgs:
            return
        try:
            await fn(arg)
        except asyncio.CancelledError:
            await _give_back(msgs)
            raise
        except Exception as exc:
            await self._failed(msgs, exc, max_deliver)
            return
        for msg in msgs:
            await msg.ack()
        self.stats.handled += len(msgs)

    async def _run_raw(self, fn: RawBatchHandler, msgs: list[Msg], max_deliver: int,
                       puller: Any) -> None:
        try:
            refused = await fn(msgs)
        except asyncio.CancelledError:
            await _give_back(msgs)
            raise
        except Exception as exc:
            await self._failed(msgs, exc, max_deliver)
            return
        for msg, reason in refused:
            await self.dead_letter(msg, reason)
        if isinstance(puller, FastPuller):
            await puller.ack(msgs)
        else:
            for msg in msgs:  # the ack of Msg.ack(), without its per-message checks
                await self.nc.publish(msg.reply, _ACK)
        self.stats.handled += len(msgs) - len(refused)

    async def _failed(self, msgs: list[Msg], exc: Exception, max_deliver: int) -> None:
        self._log.exception("handler failed", subject=msgs[0].subject, error=repr(exc))
        for msg in msgs:
            if msg.metadata.num_delivered >= max_deliver:
                await self.dead_letter(msg, f"handler failed {max_deliver} times: {exc!r}")
                await msg.ack()
            else:
                await msg.nak(delay=0.5 * msg.metadata.num_delivered)

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
        reasons = self.stats.dead_letter_reasons + [reason[:MAX_REASON_CHARS]]
        self.stats.dead_letter_reasons = reasons[-20:]
        self._log.warning("dead-lettered", subject=msg.subject[:MAX_ORIGIN_CHARS],
                          reason=reason[:MAX_REASON_CHARS], size=len(msg.data or b""))

    # ------------------------------------------------------------------ request-reply

    async def serve(
        self, subject: str, handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        *, queue: str = "",
    ) -> Any:
        """Answer JSON requests on a core NATS subject (health, queries);
        returns the subscription (unsubscribe it to stop answering) once the
        server has it, so a request sent next from anywhere is answered."""

        async def _on(msg: Msg) -> None:
            try:
                request = json.loads(msg.data or b"{}")
                if not isinstance(request, dict):
                    raise ValueError("request must be a JSON object")
                reply = await handler(request)
            except Exception as exc:
                reply = {"ok": False, "error": _short(exc)}
            if msg.reply:
                body = json.dumps(reply, default=str).encode()
                if len(body) > self.max_payload - PAYLOAD_MARGIN:  # answer, not silence
                    body = json.dumps({"ok": False, "error": (
                        f"the reply is {len(body)} bytes, over the bus's limit of "
                        f"{self.max_payload}: ask for less (a narrower range, a limit)")}).encode()
                await msg.respond(body)

        sub = await self.nc.subscribe(subject, queue=queue, cb=_on)
        try:
            await self.flush()  # answering once this returns, to any connection
        except (nats.errors.Error, TimeoutError) as exc:
            # Kept on the client all the same: nats-py subscribes again on reconnect.
            self._log.warning("server has not confirmed a subscription yet", subject=subject,
                              error=str(exc) or type(exc).__name__)
        return sub

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

    async def request(
        self, subject: str, body: dict[str, Any] | None = None, timeout_s: float = 5.0
    ) -> dict[str, Any]:
        msg = await self.nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout_s)
        return json.loads(msg.data)

    # ------------------------------------------------------------------ shutdown

    async def stop_consuming(self) -> None:
        """Let every consumer finish its current batch, then stop fetching."""
        self._stopping.set()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=5)
            for task in pending:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self._log.error("consumer ended with error", error=repr(task.exception()))
        self._tasks.clear()
        # A pull subscription's inbox would block drain() forever: drop it first.
        for puller in self._pull_subs:
            with contextlib.suppress(Exception):
                await puller.stop()
        self._pull_subs.clear()

    async def close(self) -> None:
        """Stop consumers, then drain the connection (flushes what is pending)."""
        self.link.closing = True
        await self.stop_consuming()
        with contextlib.suppress(Exception):
            await self.nc.drain()


def event_or_reason(subject: str, data: bytes) -> tuple[Event, tuple[str, ...]] | str:
    """What a consumer makes of a message on ``subject``: the event and the
    paths of fields its version does not define, or the reason it is
    refused (one line: not an event, a newer version, or not this subject's
    event). Pure."""
    try:
        event, unknown = read_event(data)
    except UnsupportedVersion as exc:
        return str(exc)
    except (ValidationError, ValueError, RecursionError) as exc:
        return f"invalid event: {_short(exc)}"
    if event.subject != subject:
        return (f"a {event.type} event does not belong on {subject[:MAX_ORIGIN_CHARS]} "
                f"(its subject is {event.subject})")
    return event, unknown


async def _give_back(msgs: list[Msg]) -> None:
    """A handler cancelled mid-way (the service stops): hand its messages
    back now, so the next consumer gets them without waiting out the ack
    wait (the bench agent's is 30 minutes). Handlers are idempotent."""
    for msg in msgs:
        with contextlib.suppress(Exception):
            await msg.nak()


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", "; ")
    return text[:500]
