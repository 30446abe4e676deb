"""Hearing heartbeats: the receiving end of the liveness path.

Every agent sends one ``NodeHeartbeat`` a second on core NATS
(``safe.live.<node>.heartbeat``, kept by no stream). What a judge of
liveness needs from a beat is who sent it and when it arrived; the node is
in the subject, so nothing is decoded. At 12,500 nodes that is 12,500
messages a second: nats-py spends about 30 µs on each (a third of a core),
so where the URL allows (``libs.natsfast``) the beats come over a lean
connection of this listener's own, a whole socket read parsed at once and
handed over as one list of nodes. It reconnects by itself, trying every
server the bus knows in turn; while it is down ``connected`` is False, and a
judge must take that silence as its own deafness, not the nodes' death.
Elsewhere (TLS, credential files) it is a nats-py subscription that only
reads the subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from libs import natsfast
from libs.events import NodeHeartbeat
from libs.logs import get_logger
from libs.routes import event_subject
from libs.tasks import cancel_and_wait

RETRY_S = 0.5  # between attempts to reach a server again
READ_SIZE = 1 << 20

BeatsCallback = Callable[[list[str], float], None]


class BeatListener:
    """Calls ``on_beats(nodes, at)`` for the beats of one read (``at``: the
    moment they were read, on this process's clock). ``bus`` is the
    service's ``libs.bus.Bus``: its ``url`` and ``token`` (the lean
    connection's), its client and ``listen`` (the nats-py path)."""

    def __init__(self, bus: Any, on_beats: BeatsCallback, *, name: str = "beats") -> None:
        self._bus, self._on_beats, self._name = bus, on_beats, name
        self.subject = event_subject(NodeHeartbeat)
        head, _, tail = self.subject.partition("*")
        self._head, self._tail = head.encode(), tail.encode()
        self.heard = 0  # beats handed over
        self.connects = 0
        self._lean = bool(bus.url) and natsfast.supported_all(bus.url)
        self._up = False
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._log = get_logger(component="beats")

    @property
    def lean(self) -> bool:
        return self._lean

    @property
    def connected(self) -> bool:
        if self._lean:
            return self._up
        return bool(self._bus.nc.is_connected)

    async def start(self, timeout_s: float = 10.0) -> None:
        """Listen; returns once the server has the subscription."""
        if not self._lean:
            self._sub = await self._bus.listen(NodeHeartbeat, self._on_msg, raw=True)
            return
        self._task = asyncio.create_task(self._run(), name=f"{self._name}:read")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            await cancel_and_wait([self._task])
            self._task = None
            raise ConnectionError(f"no NATS server took the heartbeat subscription "
                                  f"({self.subject}) within {timeout_s:.0f} s") from None

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        self._task = self._sub = None
        self._up = False

    def node_of(self, subject: bytes) -> str:
        """The node of a beat's subject: what the subscription's ``*`` matched
        (the server delivers nothing else on it)."""
        return subject[len(self._head):len(subject) - len(self._tail)].decode()

    # ------------------------------------------------------------------ nats-py

    async def _on_msg(self, msg: Any) -> None:
        self.heard += 1
        self._on_beats([self.node_of(msg.subject.encode())], time.time())

    # ------------------------------------------------------------------ lean

    async def _run(self) -> None:
        said, first = False, self._bus.url or ""
        while True:
            # Every server the main client knows now (a cluster's members it
            # was told of, and those the cluster announced since), in turn.
            try:
                reader, writer = await natsfast.connect(self._bus.url or first, self._bus.token,
                                                        self._name)
            except Exception as exc:  # refused, timed out, not NATS: all retried
                if not said:
                    self._log.warning("cannot reach NATS for heartbeats; retrying",
                                      error=repr(exc))
                    said = True
                await asyncio.sleep(RETRY_S)
                continue
            said = False
            writer.write(b"SUB %s 1\r\nPING\r\n" % self.subject.encode())
            try:
                await self._read(reader, writer)
            except Exception as exc:  # whatever it was, a fresh connection follows
                self._log.warning("heartbeat connection lost", error=repr(exc))
            finally:
                was_up, self._up = self._up, False
                if was_up:
                    self._log.warning("heartbeat connection down; reconnecting")
                with contextlib.suppress(Exception):
                    writer.close()
            # A connection that was up goes again at once (its server died:
            # another one takes over); one that never took the SUB waits.
            await asyncio.sleep(0 if was_up else RETRY_S)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = bytearray()
        while chunk := await reader.read(READ_SIZE):
            buf += chunk
            used, nodes = self._parse(buf, writer)
            del buf[:used]
            if nodes:
                self.heard += len(nodes)
                self._on_beats(nodes, time.time())

    def _parse(self, buf: bytearray, writer: asyncio.StreamWriter) -> tuple[int, list[str]]:
        """The nodes of the whole frames in ``buf``, and the bytes used."""
        pos, size, nodes = 0, len(buf), []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return pos, nodes
            if buf.startswith(b"MSG", pos) or buf.startswith(b"HMSG", pos):
                parts = buf[pos:eol].split()
                end = eol + 2 + int(parts[-1])
                if end + 2 > size:
                    return pos, nodes  # the rest of this frame has not arrived yet
                nodes.append(self.node_of(bytes(parts[1])))
                pos = end + 2
                continue
            if buf.startswith(b"PING", pos):
                writer.write(b"PONG\r\n")
            elif buf.startswith(b"PONG", pos) and not self._up:
                self._up = True  # the server has our SUB
                self.connects += 1
                self._ready.set()
            elif buf.startswith(b"-ERR", pos):
                raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
            pos = eol + 2  # +OK, INFO
