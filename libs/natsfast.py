"""A lean NATS connection for one hot pull consumer (lens telemetry).

nats-py parses the wire protocol with a regular expression per frame, a
header parser, a ``Msg``, a queue and a callback per message: about 30 µs of
CPU each, a third of a core at 12,500 node messages a second. This speaks
the few frames a pull consumer needs (INFO, CONNECT, PING/PONG, SUB, PUB,
MSG/HMSG) on its own socket, parses a whole read at once with ``find`` and
slices, and acks a batch with one write. Messages come out as ``FastMsg``:
the part of nats-py's ``Msg`` the bus uses (subject, reply, data, headers,
metadata, ack, nak), bound to the service's main client, so naks and
dead-lettering work unchanged.

Only plain ``nats://`` URLs with a token or user/password; for anything else
(TLS, credentials files) the bus uses ``libs.pull.Puller`` on nats-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable
from urllib.parse import urlparse

from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.logs import get_logger

_ENDS = (b"NATS/1.0 404", b"NATS/1.0 408", b"NATS/1.0 409")
_NS = 1_000_000_000
_MSG_ID = b"NATS/1.0\r\nNats-Msg-Id: "
# Bytes one pull request may bring: a bound on what the server queues for us
# (it cuts off a client with 64 MiB pending as a slow consumer).
MAX_BYTES = 16 << 20


class FastMsg:
    """A delivered message; the subset of ``nats.aio.msg.Msg`` the bus uses."""

    __slots__ = ("_nc", "subject", "reply", "data", "headers", "_metadata")

    def __init__(self, nc: Client, subject: str, reply: str, data: bytes,
                 headers: dict[str, str] | None) -> None:
        self._nc, self.subject, self.reply, self.data, self.headers = (
            nc, subject, reply, data, headers)
        self._metadata: Msg.Metadata | None = None

    @property
    def metadata(self) -> Msg.Metadata:
        if self._metadata is None:
            self._metadata = Msg(self._nc, subject=self.subject, reply=self.reply).metadata
        return self._metadata

    async def ack(self) -> None:
        await self._nc.publish(self.reply, b"")

    async def nak(self, delay: float | None = None) -> None:
        await Msg(self._nc, subject=self.subject, reply=self.reply).nak(delay=delay)


def supported(url: str) -> bool:
    return urlparse(url).scheme == "nats"


async def connect(url: str, token: str | None, name: str
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connected, authenticated NATS socket (INFO, CONNECT, PING/PONG done)."""
    u = urlparse(url)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(u.hostname or "127.0.0.1", u.port or 4222), 5)
    await asyncio.wait_for(reader.readline(), 5)  # INFO
    options: dict[str, object] = {"verbose": False, "pedantic": False, "headers": True,
                                  "no_responders": True, "protocol": 1, "lang": "python",
                                  "version": "primus-fast", "name": name}
    if token:
        options["auth_token"] = token
    elif u.username:
        options.update(user=u.username, **({"pass": u.password} if u.password else {}))
    writer.write(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 5)
    while line.startswith((b"+OK", b"INFO")):
        line = await asyncio.wait_for(reader.readline(), 5)
    if not line.startswith(b"PONG"):
        writer.close()
        raise ConnectionError(f"NATS refused the connection: {line.decode(errors='replace')}")
    return reader, writer


class FastPublisher:
    """Fire-and-forget publishes with a Nats-Msg-Id, for load generators: no
    acks are awaited, so the caller checks the stream afterwards."""

    def __init__(self, url: str, token: str | None = None, name: str = "fast-publisher") -> None:
        self._url, self._token, self._name = url, token, name
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        reader, self._writer = await connect(self._url, self._token, self._name)

        async def answer_pings() -> None:
            while line := await reader.readline():
                if line.startswith(b"PING") and self._writer is not None:
                    self._writer.write(b"PONG\r\n")

        self._task = asyncio.create_task(answer_pings())

    @staticmethod
    def frame(subject: bytes, data: bytes, msg_id: bytes) -> bytes:
        """The wire frame of one publish with a Nats-Msg-Id header."""
        hdr = b"NATS/1.0\r\nNats-Msg-Id: " + msg_id + b"\r\n\r\n"
        return b"HPUB %s %d %d\r\n%s%s\r\n" % (subject, len(hdr), len(hdr) + len(data),
                                                  hdr, data)

    def publish(self, subject: bytes, data: bytes, msg_id: bytes) -> None:
        self.write(self.frame(subject, data, msg_id))

    def write(self, frames: bytes) -> None:
        """Frames made by ``frame`` (any number, joined)."""
        assert self._writer is not None
        self._writer.write(frames)

    async def flush(self) -> None:
        assert self._writer is not None
        await self._writer.drain()

    async def stop(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer.drain()
                self._writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class FastPuller:
    """Fetches batches from one durable pull consumer over its own connection."""

    def __init__(self, nc: Client, url: str, token: str | None, stream: str, durable: str,
                 *, name: str = "fast-puller") -> None:
        self._nc, self._url, self._token, self._name = nc, url, token, name
        self._next = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}".encode()
        self._inbox = f"_INBOX.{secrets.token_hex(11)}".encode()
        self._request = 0  # each pull request replies to <inbox>.<n>: its status is its own
        self._current = b""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._buffer: list[FastMsg] = []
        self._want = 0
        self._ended = False
        self._wake = asyncio.Event()

    async def start(self) -> None:
        reader, writer = await connect(self._url, self._token, self._name)
        writer.write(b"SUB " + self._inbox + b".* 1\r\n")
        self._reader, self._writer = reader, writer
        self._task = asyncio.create_task(self._read_loop(), name=f"{self._name}:read")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._task = self._reader = self._writer = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def fetch(self, batch: int, *, timeout_s: float = 0.5, fill_s: float = 0.2,
                    busy: Callable[[], bool] | None = None) -> list[FastMsg]:
        """Up to ``batch`` messages, waiting at most ``fill_s`` for the batch to
        fill, and longer while ``busy()`` says the previous batch is still being
        handled: a batch handed over then would only queue behind it, so it
        keeps filling instead and is handed over as the handler frees up. One
        pull request brings at most ``MAX_BYTES``; the next asks for the rest."""
        if not self.alive:
            await self.stop()
            await self.start()  # after a dropped connection: unacked ones come back anyway
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(fill_s, 0.05)
        while len(self._buffer) < batch and self.alive:
            expires = deadline - loop.time()
            if expires < 0.01:
                if busy is None or not busy():
                    break
                expires = 0.05
            self._pull(batch - len(self._buffer), expires)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(expires + 1.0):
                    while len(self._buffer) < batch and not self._ended and self.alive:
                        self._wake.clear()
                        await self._wake.wait()
        taken, self._buffer = self._buffer[:batch], self._buffer[batch:]
        return taken

    def _pull(self, count: int, expires: float) -> None:
        """Send one pull request; its status (end, or cut short by the byte
        bound) comes to its own inbox subject."""
        body = json.dumps({"batch": count, "max_bytes": MAX_BYTES,
                           "expires": int(expires * _NS)}).encode()
        self._request += 1
        self._current = b"%s.%d" % (self._inbox, self._request)
        self._ended = False
        self._wake.clear()
        self._write(b"PUB %s %s %d\r\n%s\r\n" % (self._next, self._current, len(body), body))
        self._want = len(self._buffer) + count

    async def ack(self, msgs: list[FastMsg]) -> None:
        """Ack every message with one write (an empty payload is an ack); over the
        main client when this connection is down (reconnecting)."""
        if self._writer is not None and not self._writer.is_closing():
            self._write(b"".join(b"PUB %s 0\r\n\r\n" % m.reply.encode() for m in msgs))
            return
        for msg in msgs:
            await msg.ack()

    def _write(self, data: bytes) -> None:
        if self._writer is None:
            raise ConnectionError("fast puller is not connected")
        self._writer.write(data)

    async def _read_loop(self) -> None:
        assert self._reader is not None and self._writer is not None
        buf = bytearray()
        reader = self._reader
        try:
            while chunk := await reader.read(1 << 20):
                buf += chunk
                pos = self._parse(buf)
                del buf[:pos]
                if len(self._buffer) >= self._want or self._ended:
                    self._wake.set()
                if self._writer.transport.get_write_buffer_size() > 1 << 20:
                    await self._writer.drain()
        except (OSError, ValueError, IndexError) as exc:  # reset, or a frame we misread
            get_logger(component="natsfast").warning("connection lost", error=repr(exc))
        finally:
            self._wake.set()  # the next fetch reconnects

    def _parse(self, buf: bytearray) -> int:
        """Frames in ``buf``; returns how many bytes were used. Each payload is
        copied out once (through a memoryview: slicing the bytearray itself
        would copy twice), and the view is let go before ``buf`` shrinks."""
        pos, size, out, nc = 0, len(buf), self._buffer, self._nc
        with memoryview(buf) as view:
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return pos
                hmsg = buf.startswith(b"HMSG", pos)
                if hmsg or buf.startswith(b"MSG", pos):
                    parts = buf[pos:eol].split()
                    if hmsg:
                        reply = parts[3] if len(parts) == 6 else b""
                        hlen, total = int(parts[-2]), int(parts[-1])
                    else:
                        reply = parts[3] if len(parts) == 5 else b""
                        hlen, total = 0, int(parts[-1])
                    start = eol + 2
                    if start + total + 2 > size:
                        return pos  # the rest of this frame has not arrived yet
                    hdr = bytes(view[start:start + hlen]) if hlen else b""
                    data = bytes(view[start + hlen:start + total])
                    pos = start + total + 2
                    if not data and hdr.startswith(b"NATS/1.0 "):
                        if hdr.startswith(_ENDS) and parts[1] == self._current:
                            self._ended = True  # this request ended (not an earlier one)
                        continue  # 100: heartbeat / flow control
                    out.append(FastMsg(nc, parts[1].decode(), reply.decode(), data,
                                       _headers(hdr) if hdr else None))
                    continue
                if buf.startswith(b"PING", pos):
                    self._write(b"PONG\r\n")
                elif buf.startswith(b"-ERR", pos):
                    self._ended = True
                pos = eol + 2  # +OK, PONG, INFO


def _headers(raw: bytes) -> dict[str, str]:
    if raw.startswith(_MSG_ID) and raw.count(b"\r\n") == 3:  # the usual: just the event id
        return {"Nats-Msg-Id": raw[len(_MSG_ID):-4].decode()}
    out = {}
    for line in raw.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().decode()] = value.strip().decode("utf-8", "replace")
    return out
