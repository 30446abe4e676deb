"""A JetStream pull consumer fetch that costs no task per message.

nats-py's ``PullSubscription.fetch`` waits for each message with
``asyncio.wait_for`` (a task per message), which caps a consumer at a few
thousand messages a second. Here one inbox subscription files every message
into a list from its callback, and a fetch is one ``CONSUMER.MSG.NEXT``
request plus one wait for "enough" (the batch filled, or the server's status
that the request ended). Only public nats-py API is used; the messages are
ordinary ``Msg`` objects, so ``ack``/``nak``/``metadata`` work as usual.

Two ways to fetch:

- prompt (``fill_s=0``): return as soon as anything is there: take what
  arrived already, else ask with ``no_wait`` for what is stored, else wait
  up to the timeout for the next message (the one-by-one handlers'
  latency stays that of a single round trip);
- filling (``fill_s>0``): ask for ``batch`` messages that expire after
  ``fill_s`` and return when the batch is full or the request expired
  (hot paths: fewer, larger inserts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

# Status codes that end a pull request: no messages, request timeout,
# request conflicts (max waiting, consumer deleted, leadership change).
_ENDS = frozenset({"404", "408", "409"})
_NS = 1_000_000_000
MAX_BYTES = 16 << 20  # per request: bounds what the server queues for this client


class Puller:
    """Fetches batches from one durable pull consumer (created elsewhere)."""

    def __init__(self, nc: Client, stream: str, durable: str) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._requests = 0  # each request replies to <inbox>.<n>, so a late status
        self._current = ""  # of an earlier request cannot end the current one
        self._sub: Subscription | None = None
        self._buffer: list[Msg] = []
        self._want = 0
        self._ended = False
        self._wake = asyncio.Event()

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers and not msg.data else None
        if status is None:
            self._buffer.append(msg)
            if len(self._buffer) >= self._want:
                self._wake.set()
        elif status in _ENDS and msg.subject == self._current:
            self._ended = True
            self._wake.set()
        # 100 (heartbeat, flow control) needs nothing.

    async def fetch(self, batch: int, *, timeout_s: float = 0.5, fill_s: float = 0.0,
                    busy: Callable[[], bool] | None = None) -> list[Msg]:
        """Up to ``batch`` messages; an empty list when none came in time. With
        ``fill_s``, the batch keeps filling past it while ``busy()`` (the
        previous batch is still being handled; see ``libs.natsfast``)."""
        if len(self._buffer) >= batch or (self._buffer and fill_s <= 0):
            return self._take(batch)
        if fill_s > 0:
            await self._request(batch - len(self._buffer), expires_s=fill_s)
            await self._wait(batch, fill_s + 1.0)
            while busy is not None and busy() and len(self._buffer) < batch:
                await self._request(batch - len(self._buffer), expires_s=0.05)
                await self._wait(batch, 1.05)
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

    async def _request(self, batch: int, *, expires_s: float = 0.0,
                       no_wait: bool = False) -> None:
        body: dict[str, int | bool] = {"batch": batch, "max_bytes": MAX_BYTES}
        if expires_s > 0:
            body["expires"] = int(expires_s * _NS)
        if no_wait:
            body["no_wait"] = True
        self._requests += 1
        self._current = f"{self._inbox}.{self._requests}"
        self._ended = False
        self._wake.clear()
        await self._nc.publish(self._next_subject, json.dumps(body).encode(),
                               reply=self._current)

    async def _wait(self, want: int, timeout_s: float) -> None:
        self._want = want
        if len(self._buffer) >= want or self._ended:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while len(self._buffer) < want and not self._ended:
                    self._wake.clear()
                    await self._wake.wait()

    def _take(self, batch: int) -> list[Msg]:
        taken, self._buffer = self._buffer[:batch], self._buffer[batch:]
        return taken
