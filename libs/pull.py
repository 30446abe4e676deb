"""Fetching from a JetStream pull consumer: one implementation, two links.

nats-py's ``PullSubscription.fetch`` waits for each message with
``asyncio.wait_for`` (a task per message), which caps a consumer at a few
thousand messages a second. ``Puller`` instead sends ``CONSUMER.MSG.NEXT``
requests itself and files the messages its link delivers into a buffer; a
fetch is one request plus one wait for "enough" (the batch filled, or the
server's status that the request ended). Each request replies to its own
``<inbox>.<n>`` subject, so a late status of an earlier request cannot end
the current one.

Two ways to fetch:

- prompt (``fill_s=0``): return as soon as anything is there: take what
  arrived already, else ask with ``no_wait`` for what is stored, else wait
  up to the timeout for the next message (one-by-one handlers get the
  latency of a single round trip);
- filling (``fill_s>0``): ask for ``batch`` messages that expire after
  ``fill_s`` and return when the batch is full or the time is up; a batch
  keeps filling while ``busy()`` says the previous one is still being
  handled (hot paths: fewer, larger inserts), and one cut short by the
  byte bound of a request is completed by the next request.

Where messages come from is the link's business: ``NatsLink`` subscribes
the inbox on the service's own nats-py connection; ``natsfast.LeanLink``
speaks the few frames a pull consumer needs on a socket of its own (the
telemetry hot path). Both deliver messages with ``subject``, ``reply``,
``data``, ``headers``, ``metadata``, ``ack()`` and ``nak()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

# Status codes that end a pull request: no messages, request timeout,
# request conflicts (max waiting, consumer deleted, leadership change).
ENDS = frozenset({"404", "408", "409"})
_NS = 1_000_000_000
# Bytes one pull request may bring: a bound on what the server queues for us
# (it cuts off a client with 64 MiB pending as a slow consumer).
MAX_BYTES = 16 << 20
_ACK = b"+ACK"
WORKING = b"+WPI"  # "work in progress": the message's ack wait starts again


class Link(Protocol):
    """Carries a puller's requests out and its messages in."""

    inbox: str

    @property
    def alive(self) -> bool: ...

    async def start(self, puller: Puller) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, subject: str, reply: str, body: bytes) -> None: ...

    async def ack(self, msgs: list[Any]) -> None: ...

    async def progress(self, msgs: list[Any]) -> None: ...


class Puller:
    """Fetches batches from one durable pull consumer (created elsewhere)."""

    def __init__(self, link: Link, stream: str, durable: str) -> None:
        self.link, self.stream, self.durable = link, stream, durable
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._requests = 0
        self._current = ""
        self._buffer: list[Any] = []
        self._since = 0.0  # when the oldest buffered message arrived (or was last kept)
        self._want = 0
        self._ended = False
        self._wake = asyncio.Event()

    async def start(self) -> None:
        await self.link.start(self)

    async def stop(self) -> None:
        await self.link.stop()

    # ------------------------------------------------------------------ from the link

    def deliver(self, msg: Any) -> None:
        if not self._buffer:
            self._since = asyncio.get_running_loop().time()
        self._buffer.append(msg)
        if len(self._buffer) >= self._want:
            self._wake.set()

    def status(self, reply_subject: str, code: str) -> None:
        """A status message for request ``reply_subject``: ``ENDS`` end it
        (only the current request's count); 100 (heartbeat) needs nothing."""
        if code in ENDS and reply_subject == self._current:
            self._ended = True
            self._wake.set()

    def interrupted(self) -> None:
        """The link went down: wake a waiting fetch (the next one restarts it)."""
        self._ended = True
        self._wake.set()

    # ------------------------------------------------------------------ fetching

    async def fetch(self, batch: int, *, timeout_s: float = 0.5, fill_s: float = 0.0,
                    busy: Callable[[], bool] | None = None) -> list[Any]:
        """Up to ``batch`` messages; an empty list when none came in time."""
        if not self.link.alive:
            await self.link.stop()
            await self.link.start(self)  # unacked messages come back anyway
        if len(self._buffer) >= batch or (self._buffer and fill_s <= 0):
            return self._take(batch)
        if fill_s > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + fill_s
            while len(self._buffer) < batch and self.link.alive:
                expires = deadline - loop.time()
                if expires < 0.01:
                    if busy is None or not busy():
                        break
                    expires = 0.05  # the handler is busy: keep filling the next batch
                await self._request(batch - len(self._buffer), expires_s=expires)
                await self._wait(batch, expires + 1.0)
            return self._take(batch)
        if batch > 1:
            await self._request(batch, no_wait=True)
            await self._wait(batch, timeout_s)
            if self._buffer:
                return self._take(batch)
        # Nothing stored: linger for the next message only, so it comes back
        # at once; the next fetch asks for whatever followed it.
        await self._request(1, expires_s=timeout_s)
        await self._wait(1, timeout_s + 1.0)
        return self._take(batch)

    async def ack(self, msgs: list[Any]) -> None:
        """Ack every message, as cheaply as the link can."""
        await self.link.ack(msgs)

    async def progress(self, msgs: list[Any]) -> None:
        """Tell the server these messages are still being worked on (``+WPI``):
        their ack wait starts again, so a slow batch is not delivered twice."""
        await self.link.progress(msgs)

    def held(self, older_than_s: float) -> list[Any]:
        """The buffered messages when the oldest has waited ``older_than_s``
        (a batch filling while a slow one is handled); their clock restarts."""
        now = asyncio.get_running_loop().time()
        if not self._buffer or now - self._since < older_than_s:
            return []
        self._since = now
        return list(self._buffer)

    async def _request(self, count: int, *, expires_s: float = 0.0,
                       no_wait: bool = False) -> None:
        body: dict[str, int | bool] = {"batch": count, "max_bytes": MAX_BYTES}
        if expires_s > 0:
            body["expires"] = int(expires_s * _NS)
        if no_wait:
            body["no_wait"] = True
        self._requests += 1
        self._current = f"{self.link.inbox}.{self._requests}"
        self._ended = False
        self._wake.clear()
        self._want = len(self._buffer) + count
        await self.link.send(self._next_subject, self._current, json.dumps(body).encode())

    async def _wait(self, want: int, timeout_s: float) -> None:
        self._want = want
        if len(self._buffer) >= want or self._ended:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while len(self._buffer) < want and not self._ended and self.link.alive:
                    self._wake.clear()
                    await self._wake.wait()

    def _take(self, batch: int) -> list[Any]:
        # What stays behind keeps ``_since``: it may be younger than that,
        # never older, so it is kept alive in time (a little early at worst).
        taken, self._buffer = self._buffer[:batch], self._buffer[batch:]
        return taken


class NatsLink:
    """The puller's inbox on the service's own nats-py connection (which
    reconnects by itself): one subscription, a callback per message."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.inbox = nc.new_inbox()
        self._sub: Subscription | None = None

    @property
    def alive(self) -> bool:
        return self._sub is not None

    async def start(self, puller: Puller) -> None:
        async def on_msg(msg: Msg) -> None:
            status = msg.headers.get("Status") if msg.headers and not msg.data else None
            if status is None:
                puller.deliver(msg)
            else:
                puller.status(msg.subject, status)

        self._sub = await self._nc.subscribe(f"{self.inbox}.*", cb=on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def send(self, subject: str, reply: str, body: bytes) -> None:
        await self._nc.publish(subject, body, reply=reply)

    async def ack(self, msgs: list[Any]) -> None:
        for msg in msgs:  # the ack of Msg.ack(), without its per-message checks
            await self._nc.publish(msg.reply, _ACK)

    async def progress(self, msgs: list[Any]) -> None:
        for msg in msgs:
            await self._nc.publish(msg.reply, WORKING)
