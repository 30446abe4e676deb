"""Durable pull consumers: fetch, decode, hand to the handler, ack after.

Delivery is at-least-once. A consumer acks only after its handler returned
(the effect is durable); a message that cannot be decoded or validated (or
is of a newer version than this code reads, or is on a subject its type
does not belong to) is dead-lettered with the reason and acked so it never
blocks the stream; a handler that keeps failing is dead-lettered after
``max_deliver`` tries. A handler cancelled mid-way (the service stops)
hands its messages back at once.

A ``Consumers`` group holds the consumers started together and stops them
together: a service's, or one leader term's (``Bus.group``).

Why not faststream's JetStream subscribers: they hand a fetched batch to
concurrent tasks, which breaks stream order (per node, per job) unless
each fetch brings one message, and then they are several times slower;
``bench/bus_latency.py`` measures both in the same run. Request/reply
endpoints, which have no order to keep, are faststream's (``libs.bus``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from pydantic import ValidationError

from libs import natsfast
from libs.events import Event, UnsupportedVersion, read_event
from libs.logs import get_logger
from libs.metrics import ServiceMetrics, subject_label
from libs.natsfast import LeanLink
from libs.pull import NatsLink, Puller
from libs.tasks import cancel_and_wait
from libs.topology import StreamSpec

EventHandler = Callable[[Event], Awaitable[None]]
# A batch handler gets each event with its stream sequence number.
BatchHandler = Callable[[list[tuple[Event, int]]], Awaitable[None]]
# A raw batch handler decodes messages itself and returns those it refuses,
# each with the reason (they are dead-lettered); the rest are acked.
RawBatchHandler = Callable[[list[Msg]], Awaitable[list[tuple[Msg, str]]]]
MAX_ORIGIN_CHARS = 512
_FAILED = object()  # a handler that raised (see Consumers._handled)
# Making a durable the server refused or did not answer: the first wait
# before asking again, doubled up to the last.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0


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


class Connection(Protocol):
    """What consumers need of the bus they run on (``libs.bus.Bus``)."""

    nc: Any
    js: Any
    url: str | None
    token: str | None
    service: str
    stats: ConsumerStats
    clock_skew_s: float
    metrics: ServiceMetrics | None

    async def dead_letter(self, msg: Any, reason: str) -> None: ...


class Consumers:
    """Consumers started together on one bus, stopped together."""

    def __init__(self, bus: Connection) -> None:
        self.bus = bus
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pullers: list[Puller] = []
        self._log = get_logger(component="bus")

    @property
    def stats(self) -> ConsumerStats:
        return self.bus.stats

    def durables(self) -> list[tuple[str, str]]:
        """(stream, durable) of every consumer of this group."""
        return [(p.stream, p.durable) for p in self._pullers]

    def consume(self, *, durable: str, subjects: Sequence[str], stream: StreamSpec,
                handler: EventHandler | None = None, batch_handler: BatchHandler | None = None,
                batch: int = 64, max_deliver: int = 5, ack_wait_s: float = 30.0,
                replay_s: float | None = None) -> None:
        """Start a durable pull consumer in the background. Exactly one of
        ``handler`` (events one at a time, in stream order) and
        ``batch_handler`` (a whole fetched batch at once) is given. With
        ``replay_s`` a durable made now starts that many seconds back in
        the stream (not at its beginning); one that exists goes on from where
        it was, whatever it was made with."""
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")

        async def on_msgs(msgs: list[Msg], _: Puller) -> None:
            await self._dispatch(durable, msgs, handler, batch_handler, max_deliver)

        self._start(durable, list(subjects), stream, on_msgs, batch=batch, fill_s=0.0,
                    max_deliver=max_deliver, ack_wait_s=ack_wait_s, inflight=1,
                    replay_s=replay_s)

    def consume_raw(self, *, durable: str, subjects: Sequence[str], stream: StreamSpec,
                    handler: RawBatchHandler, batch: int = 1000, fill_s: float = 0.2,
                    max_deliver: int = 5, ack_wait_s: float = 30.0, inflight: int = 2,
                    own_connection: bool = True) -> None:
        """A durable pull consumer for hot paths that decode messages themselves.

        Fetches up to ``batch`` messages, waiting at most ``fill_s`` for a
        batch to fill, and runs up to ``inflight`` handler calls at once (so
        decoding the next batch overlaps storing this one). The handler
        returns the messages it refuses, with the reason: those are
        dead-lettered; every other message is acked once the handler
        returned. Replicas that use the same ``durable`` share the consumer
        (a queue group). With ``own_connection`` (and a plain nats:// URL)
        messages come over a lean connection of their own (``libs.natsfast``)
        and are acked in one write."""

        async def on_msgs(msgs: list[Msg], puller: Puller) -> None:
            self.stats.delivered += len(msgs)
            await self._run_raw(durable, handler, msgs, max_deliver, puller)

        self._start(durable, list(subjects), stream, on_msgs, batch=batch, fill_s=fill_s,
                    max_deliver=max_deliver, ack_wait_s=ack_wait_s, inflight=inflight,
                    lean=own_connection)

    def _start(self, durable: str, subjects: list[str], stream: StreamSpec,
               on_msgs: Callable[[list[Msg], Puller], Awaitable[None]], *, batch: int,
               fill_s: float, max_deliver: int, ack_wait_s: float, inflight: int,
               lean: bool = False, replay_s: float | None = None) -> None:
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
        if replay_s is not None:
            config.deliver_policy = api.DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.now(UTC) - timedelta(seconds=replay_s)
        bus = self.bus
        if lean and bus.url and natsfast.supported_all(bus.url):
            first = bus.url
            link: Any = LeanLink(bus.nc, lambda: bus.url or first, bus.token,
                                 name=f"{bus.service}:{durable}")
        else:
            link = NatsLink(bus.nc)
        puller = Puller(link, stream.name, durable)
        self._pullers.append(puller)
        task = asyncio.create_task(
            self._loop(durable, stream, config, puller, on_msgs, batch, fill_s, inflight),
            name=f"consume:{durable}")
        self._tasks.append(task)

    async def _loop(self, durable: str, stream: StreamSpec, config: api.ConsumerConfig,
                    puller: Puller, on_msgs: Callable[[list[Msg], Puller], Awaitable[None]],
                    batch: int, fill_s: float, inflight: int) -> None:
        if not await self._made(durable, stream, config):
            return  # stopped before the server made it
        slots = asyncio.Semaphore(inflight)
        running: set[asyncio.Task[None]] = set()
        # Batches in hand, with when their ack wait last started: one that
        # is still being handled after a third of it is kept alive (+WPI),
        # so the ack wait can be short (a replica that dies hands its batch
        # on within it) without a slow insert being delivered twice.
        in_hand: dict[int, tuple[list[Msg], float]] = {}
        keeper = asyncio.create_task(self._keep_alive(puller, in_hand, config.ack_wait or 30.0),
                                     name=f"keep-alive:{durable}")

        async def handle(msgs: list[Msg]) -> None:
            key = id(msgs)
            in_hand[key] = (msgs, asyncio.get_running_loop().time())
            try:
                await on_msgs(msgs, puller)
            except Exception as exc:
                # Outside a handler (an ack, a dead letter that could not be
                # sent): the unacked messages come back after ack_wait. The
                # consumer goes on; a dead one would leave the service deaf.
                self._log.exception("batch not finished; its unacked messages come back",
                                    durable=durable, messages=len(msgs), error=repr(exc))
            finally:
                in_hand.pop(key, None)
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
            await cancel_and_wait([keeper])

    async def _keep_alive(self, puller: Puller, in_hand: dict[int, tuple[list[Msg], float]],
                          ack_wait_s: float) -> None:
        """Every tenth of the ack wait: ``+WPI`` for each batch in hand (and
        the next batch filling behind it) whose ack wait is a third gone."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(ack_wait_s / 10)
            now = loop.time()
            stale = [(key, msgs) for key, (msgs, since) in list(in_hand.items())
                     if now - since > ack_wait_s / 3]
            for key, msgs in stale:
                in_hand[key] = (msgs, now)
            waiting = puller.held(ack_wait_s / 3)
            try:
                for _, msgs in stale:
                    await puller.progress(msgs)
                if waiting:
                    await puller.progress(waiting)
            except Exception as exc:  # reconnecting: the server redelivers, dedup copes
                self._log.warning("could not keep a slow batch alive", error=repr(exc))

    async def _made(self, durable: str, stream: StreamSpec, config: api.ConsumerConfig) -> bool:
        """Make the durable, asking again until the server has it; False when
        the group stops first. A cluster electing leaders, or one without its
        quorum, lets the request time out or refuses it for a while, and a
        stream may not be there yet: a consumer that gave up on the first
        try would leave its service up, healthy and deaf."""
        delay = RETRY_FIRST_S
        while not self._stopping.is_set():
            try:
                if config.opt_start_time is None or not await self._exists(stream, durable):
                    await self.bus.js.add_consumer(stream.name, config)
                return True
            except (nats.errors.ConnectionClosedError, nats.errors.DrainTimeoutError):
                return False
            except Exception as exc:
                if await self._kept(stream, durable, exc):
                    return True
                self._log.warning("cannot make the consumer yet; asking again",
                                  durable=durable, stream=stream.name, error=repr(exc),
                                  retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, RETRY_MAX_S)
        return False

    async def _kept(self, stream: StreamSpec, durable: str, exc: Exception) -> bool:
        """Whether a refused create found the durable there with other
        settings (an older release made it): it is used as it is."""
        if not isinstance(exc, nats.js.errors.APIError):
            return False
        try:
            exists = await self._exists(stream, durable)
        except Exception:
            return False
        if exists:
            self._log.warning("consumer kept as it was", durable=durable, error=str(exc))
        return exists

    async def _exists(self, stream: StreamSpec, durable: str) -> bool:
        """Whether the durable is there already. A durable made to start at
        a time goes on from where it was: its start cannot be changed, and
        asking would only be refused."""
        try:
            await self.bus.js.consumer_info(stream.name, durable)
        except nats.js.errors.NotFoundError:
            return False
        return True

    # ------------------------------------------------------------------ handling

    async def _dispatch(self, durable: str, msgs: list[Msg], handler: EventHandler | None,
                        batch_handler: BatchHandler | None, max_deliver: int) -> None:
        self.stats.delivered += len(msgs)
        good: list[tuple[Msg, Event]] = []
        for msg in msgs:
            reason = self._refusal(msg)
            if isinstance(reason, str):
                await self.bus.dead_letter(msg, reason)
                await msg.ack()
            else:
                good.append((msg, reason))
                self._check_stamp(msg, reason)
        if batch_handler is not None:
            batch = [(e, m.metadata.sequence.stream) for m, e in good]
            await self._run(durable, batch_handler, batch, [m for m, _ in good], max_deliver)
        else:
            assert handler is not None
            for msg, event in good:
                await self._run(durable, handler, event, [msg], max_deliver)

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
        limit = self.bus.clock_skew_s
        if abs(off_s) <= limit:
            return
        key = event.source[:64]
        skewed = self.stats.skewed
        if key not in skewed and len(skewed) >= 100:
            key = "(other sources)"
        count = skewed[key] = skewed.get(key, 0) + 1
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a clock stays wrong
            self._log.warning("event stamped beyond the clock skew", source=event.source,
                              type=event.type, off_s=round(off_s, 3), limit_s=limit, seen=count)

    async def _run(self, durable: str, fn: Callable[[Any], Awaitable[None]], arg: Any,
                   msgs: list[Msg], max_deliver: int) -> None:
        if not msgs:
            return
        started = time.perf_counter()
        if await self._handled(fn(arg), msgs, max_deliver) is not _FAILED:
            for msg in msgs:
                await msg.ack()
            self.stats.handled += len(msgs)
            self._measured(durable, msgs, (), started)

    async def _run_raw(self, durable: str, fn: RawBatchHandler, msgs: list[Msg],
                       max_deliver: int, puller: Puller) -> None:
        started = time.perf_counter()
        refused = await self._handled(fn(msgs), msgs, max_deliver)
        if refused is _FAILED:
            return
        for msg, reason in refused:
            await self.bus.dead_letter(msg, reason)
        await puller.ack(msgs)
        self.stats.handled += len(msgs) - len(refused)
        self._measured(durable, msgs, [m for m, _ in refused], started)

    def _measured(self, durable: str, msgs: list[Msg], refused: Sequence[Msg],
                  started: float) -> None:
        """Count a handled batch into the service's metrics: per subject, the
        handler's time, and how late its newest message was handled (one
        message's metadata per batch: the hot paths handle thousands a second)."""
        metrics = getattr(self.bus, "metrics", None)
        if metrics is None:
            return
        took = time.perf_counter() - started
        skip = {id(m) for m in refused}
        by_subject = Counter(subject_label(m.subject) for m in msgs if id(m) not in skip)
        for subject, count in by_subject.items():
            metrics.handled.labels(durable, subject).inc(count)
        subject = by_subject.most_common(1)[0][0] if by_subject else subject_label(msgs[0].subject)
        metrics.handler_seconds.labels(durable, subject).observe(took)
        with contextlib.suppress(Exception):  # a core message has no JetStream metadata
            stored = msgs[-1].metadata.timestamp.timestamp()
            metrics.lag_seconds.labels(durable).observe(max(0.0, time.time() - stored))

    async def _handled(self, call: Awaitable[Any], msgs: list[Msg], max_deliver: int) -> Any:
        """What the handler returned, or ``_FAILED`` once its messages were
        given another try or dead-lettered; a cancelled handler hands them
        back at once."""
        try:
            return await call
        except asyncio.CancelledError:
            await _give_back(msgs)
            raise
        except Exception as exc:
            await self._failed(msgs, exc, max_deliver)
            return _FAILED

    async def _failed(self, msgs: list[Msg], exc: Exception, max_deliver: int) -> None:
        self._log.exception("handler failed", subject=msgs[0].subject, error=repr(exc))
        for msg in msgs:
            if msg.metadata.num_delivered >= max_deliver:
                await self.bus.dead_letter(msg, f"handler failed {max_deliver} times: {exc!r}")
                await msg.ack()
            else:
                await msg.nak(delay=0.5 * msg.metadata.num_delivered)

    # ------------------------------------------------------------------ stopping

    async def stop(self) -> None:
        """Let every consumer finish its current batch, then stop fetching."""
        self._stopping.set()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=5)
            await cancel_and_wait(pending)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self._log.error("consumer ended with error", error=repr(task.exception()))
        self._tasks.clear()
        # A pull subscription's inbox would block drain() forever: drop it first.
        for puller in self._pullers:
            with contextlib.suppress(Exception):
                await puller.stop()
        self._pullers.clear()


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
