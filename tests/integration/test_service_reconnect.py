"""A connection the server closes for good does not leave a deaf service.

nats-py reconnects after network trouble, but after a protocol error from
the server (here the one an oversized message causes, as a malformed 1 MiB
message once did) it closes the connection for good. The service shell then
stops the service, connects again and starts a fresh instance; health says
how often. Real nats-server, the real failover service, in this process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import nats.errors
import pytest

from libs.bus import Bus, on_connection_lost
from libs.embedded import NatsServer
from libs.events import HeartbeatData, NodeHeartbeat
from libs.service import run_service
from libs.settings import Settings
from services.failover.app import Failover
from tests.helpers import ready_nodes, until, wait_healthy

pytestmark = pytest.mark.timeout(120)


async def _violate_payload_limit(victim: Bus) -> None:
    """Send what the server answers with -ERR and a closed connection: a
    message over its limit (the client's own check is lifted to get it out).
    On a loaded machine the write can stall before the server has read the
    header, so it is sent again until the connection is seen closed."""
    limit = victim.max_payload
    victim.nc._max_payload = 64 * limit  # type: ignore[attr-defined]
    for _ in range(3):
        try:
            await victim.nc.publish("safe.hostile", b"x" * (limit + 1024))
            await victim.nc.flush(timeout=2)
        except (nats.errors.Error, TimeoutError):
            pass
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            if victim.nc.is_closed:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the server never closed the connection over an oversized message")


async def test_a_closed_connection_is_replaced_and_the_service_serves_again(
        nats_url: str, bus: Bus) -> None:
    made: list[Failover] = []

    def make() -> Failover:
        made.append(Failover(Settings(nats_url=nats_url)))
        return made[-1]

    task = asyncio.create_task(run_service(make, Settings(nats_url=nats_url)))
    try:
        first = await wait_healthy(bus, "failover", timeout=30)
        assert first["connection"] == "connected" and first["reconnects"] == 0
        assert made[0].bus is not None
        await _violate_payload_limit(made[0].bus)

        async def reconnected() -> dict | None:  # type: ignore[type-arg]
            try:
                reply = await wait_healthy(bus, "failover", timeout=2)
            except Exception:
                return None
            return reply if reply["reconnects"] == 1 else None

        reply = await until(reconnected, "a fresh instance on a new connection", timeout=30)
        assert reply["connection"] == "connected" and len(made) == 2
        assert made[0].bus.nc.is_closed and made[1].bus is not made[0].bus  # type: ignore[union-attr]

        # The fresh instance consumes again: a registered node's beats reach it.
        await ready_nodes(bus, {"node-1": (8, "r1")})
        await bus.publish(NodeHeartbeat(source="test", node="node-1",
                                        data=HeartbeatData(seq=1, pid=1, interval_s=1)))

        async def watching() -> bool:
            return (await wait_healthy(bus, "failover"))["watched_nodes"] == 1
        await until(watching, "the fresh instance to hear the node", timeout=30)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # the shell's own handler: a clean stop
        assert await asyncio.wait_for(task, 40) == 0


async def test_a_service_without_a_factory_exits_for_its_supervisor(
        nats_url: str, bus: Bus) -> None:
    service = Failover(Settings(nats_url=nats_url))
    task = asyncio.create_task(run_service(service, Settings(nats_url=nats_url)))
    await wait_healthy(bus, "failover", timeout=30)
    assert service.bus is not None
    await _violate_payload_limit(service.bus)
    assert await asyncio.wait_for(task, 40) == 3


async def test_a_server_that_refuses_to_take_it_back_gets_a_fresh_connection(
        tmp_path: Path) -> None:
    """A server restarted with other credentials answers every reconnect with
    'Authorization Violation'. faststream ends nats-py's reconnecting on such
    an error, so the bus gives the connection up at once (the shell then
    connects afresh, with backoff) instead of hanging on as 'disconnected'."""
    server = NatsServer(tmp_path / "nats", token="first").start()
    lost: list[str] = []
    forget = on_connection_lost(lost.append)
    bus = await Bus.connect(server.url, "victim", token="first")
    try:
        assert bus.link.state == "connected"
        server.stop()
        again = NatsServer(tmp_path / "nats", port=server.port, token="rotated").start()
        try:
            await until(lambda: asyncio.sleep(0, lost), "the bus to give the connection up",
                        timeout=30)
            assert bus.link.state == "closed" and "authorization violation" in lost[0].lower()
            with pytest.raises(ConnectionError, match="Authorization Violation"):
                await Bus.connect(again.url, "victim", token="first", timeout_s=3)
        finally:
            again.stop()
    finally:
        forget()
        await bus.close()
