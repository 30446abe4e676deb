"""A lean NATS connection for one hot pull consumer (lens telemetry), and a
fire-and-forget publisher for load generators.

nats-py parses the wire protocol with a regular expression per frame, a
header parser, a ``Msg``, a queue and a callback per message: about 30 µs of
CPU each, a third of a core at 12,500 node messages a second. This speaks
the few frames a pull consumer needs (INFO, CONNECT, PING/PONG, SUB, PUB,
MSG/HMSG) on its own socket, parses a whole read at once with ``find`` and
slices, and acks a batch with one write. Messages come out as ``FastMsg``:
the part of nats-py's ``Msg`` the bus uses (subject, reply, data, headers,
metadata, ack, nak), bound to the service's main client, so naks and
dead-lettering work unchanged. ``LeanLink`` is the link of a
``libs.pull.Puller``: fetching is written once, there.

Only plain ``nats://`` URLs with a token or user/password; for anything else
(TLS, credentials files) the puller uses its link on the nats-py connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.logs import get_logger
from libs.nats_urls import servers
from libs.pull import WORKING, Puller
from libs.tasks import cancel_and_wait

_MSG_ID = b"NATS/1.0\r\nNats-Msg-Id: "


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


def supported_all(url: str) -> bool:
    """Whether every server of ``url`` (comma-separated) is plain NATS."""
    return all(supported(u) for u in servers(url))


async def connect(url: str, token: str | None, name: str
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connected, authenticated NATS socket (INFO, CONNECT, PING/PONG
    done). ``url`` may list several servers (a cluster): they are tried in
    turn from a random one, and the last refusal is raised when none takes us."""
    listed = servers(url)
    if not listed:
        raise ConnectionError("no NATS server to connect to (an empty URL)")
    first = random.randrange(len(listed))
    error: Exception = ConnectionError(f"no NATS server in {url!r}")
    for one in listed[first:] + listed[:first]:
        try:
            return await _connect_one(one, token, name)
        except (OSError, ConnectionError, TimeoutError) as exc:
            error = exc
    raise error


async def _connect_one(url: str, token: str | None, name: str
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
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
        await cancel_and_wait([self._task])


class LeanLink:
    """A puller's link (``libs.pull``) over a connection of its own: its
    socket is read a whole chunk at a time and parsed with ``find`` and
    slices, and a batch of acks is one write. Naks and dead letters go over
    the service's main client (``nc``), to which every message is bound."""

    def __init__(self, nc: Client, url: str | Callable[[], str], token: str | None, *,
                 name: str = "fast-puller") -> None:
        # ``url`` may be a function: asked again at every (re)connect, so a
        # cluster's servers as the main client knows them now are tried.
        self._nc, self._url, self._token, self._name = nc, url, token, name
        self.inbox = f"_INBOX.{secrets.token_hex(11)}"
        self._puller: Puller | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, puller: Puller) -> None:
        self._puller = puller
        url = self._url() if callable(self._url) else self._url
        reader, writer = await connect(url, self._token, self._name)
        writer.write(f"SUB {self.inbox}.* 1\r\n".encode())
        self._reader, self._writer = reader, writer
        self._task = asyncio.create_task(self._read_loop(), name=f"{self._name}:read")

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._task = self._reader = self._writer = None

    async def send(self, subject: str, reply: str, body: bytes) -> None:
        self._write(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(),
                                                    len(body), body))

    async def ack(self, msgs: list[Any]) -> None:
        """Every ack in one write (an empty payload is an ack); over the main
        client when this connection is down (reconnecting)."""
        if self._writer is not None and not self._writer.is_closing():
            self._write(b"".join(b"PUB %s 0\r\n\r\n" % m.reply.encode() for m in msgs))
            return
        for msg in msgs:
            await msg.ack()

    async def progress(self, msgs: list[Any]) -> None:
        """``+WPI`` for every message in one write (over the main client
        while this connection is down)."""
        if self._writer is not None and not self._writer.is_closing():
            self._write(b"".join(b"PUB %s %d\r\n%s\r\n" % (m.reply.encode(), len(WORKING),
                                                                WORKING) for m in msgs))
            return
        for msg in msgs:
            await self._nc.publish(msg.reply, WORKING)

    def _write(self, data: bytes) -> None:
        if self._writer is None:
            raise ConnectionError("the lean connection is not up")
        self._writer.write(data)

    async def _read_loop(self) -> None:
        assert self._reader is not None and self._writer is not None
        buf = bytearray()
        reader = self._reader
        try:
            while chunk := await reader.read(1 << 20):
                buf += chunk
                del buf[:self._parse(buf)]
                if self._writer.transport.get_write_buffer_size() > 1 << 20:
                    await self._writer.drain()
        except (OSError, ValueError, IndexError) as exc:  # reset, or a frame we misread
            get_logger(component="natsfast").warning("connection lost", error=repr(exc))
        finally:
            if self._puller is not None:
                self._puller.interrupted()  # the next fetch reconnects

    def _parse(self, buf: bytearray) -> int:
        """Frames in ``buf``; returns how many bytes were used. Each payload is
        copied out once (through a memoryview: slicing the bytearray itself
        would copy twice), and the view is let go before ``buf`` shrinks."""
        pos, size, nc, puller = 0, len(buf), self._nc, self._puller
        assert puller is not None
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
                        puller.status(parts[1].decode(), hdr[9:12].decode())
                        continue
                    puller.deliver(FastMsg(nc, parts[1].decode(), reply.decode(), data,
                                           _headers(hdr) if hdr else None))
                    continue
                if buf.startswith(b"PING", pos):
                    self._write(b"PONG\r\n")
                elif buf.startswith(b"-ERR", pos):
                    puller.interrupted()
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
