"""The liveness path's receiving end (libs/beats.py) on a real nats-server:
beats arrive by node from the subject alone, a crashed server leaves the
listener visibly deaf (``connected`` False) until it is back, and it
resubscribes by itself, also after its callback failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libs.beats import BeatListener
from libs.bus import Bus
from libs.embedded import NatsServer
from libs.events import HeartbeatData, NodeHeartbeat
from tests.helpers import until


def beat(node: str, seq: int = 1) -> NodeHeartbeat:
    return NodeHeartbeat(source="test", node=node, data=HeartbeatData(seq=seq, pid=1,
                                                                      interval_s=1.0))


async def test_beats_are_heard_by_node_and_the_listener_comes_back_after_a_crash(
        tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    heard: list[tuple[str, float]] = []
    bus = await Bus.connect(server.url, "test")
    listener = BeatListener(bus, lambda nodes, at: heard.extend((n, at) for n in nodes))
    try:
        assert listener.lean  # a plain nats:// URL: its own connection
        await listener.start()
        assert listener.connected
        for i in range(200):
            await bus.publish(beat(f"gpu-{i % 50:03d}", i))
        await until(lambda: asyncio.sleep(0, len(heard) == 200), "200 beats")
        assert sorted({n for n, _ in heard}) == [f"gpu-{i:03d}" for i in range(50)]

        server.kill()
        await until(lambda: asyncio.sleep(0, not listener.connected), "the listener to see it")
        server.start(tmp_path / "nats.log")
        await until(lambda: asyncio.sleep(0, listener.connected), "the listener back", timeout=30)
        assert listener.connects == 2
        await until(lambda: asyncio.sleep(0, bus.nc.is_connected), "the bus back", timeout=30)
        heard.clear()
        await bus.publish(beat("gpu-back"))
        await until(lambda: asyncio.sleep(0, [n for n, _ in heard] == ["gpu-back"]),
                    "a beat after the restart")
    finally:
        await listener.stop()
        await bus.close()
        server.stop()


async def test_no_server_is_a_clear_error_not_a_silent_judge() -> None:
    class Unreachable:
        url, token, nc = "nats://127.0.0.1:1", None, None

    listener = BeatListener(Unreachable(), lambda nodes, at: None)
    with pytest.raises(ConnectionError, match=r"heartbeat subscription \(safe.live.\*.heartbeat\)"):
        await listener.start(timeout_s=1.0)
    assert not listener.connected


async def test_a_failing_callback_does_not_leave_the_listener_deaf(tmp_path: Path) -> None:
    """Whatever goes wrong while reading (here the callback raises), the
    listener connects again and goes on hearing beats: failover judges
    every node by them."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    heard: list[str] = []

    def on_beats(nodes: list[str], _at: float) -> None:
        if "gpu-bad" in nodes:
            raise KeyError("gpu-bad")
        heard.extend(nodes)

    bus = await Bus.connect(server.url, "test")
    listener = BeatListener(bus, on_beats)
    try:
        await listener.start()
        await bus.publish(beat("gpu-bad"))
        await until(lambda: asyncio.sleep(0, listener.connects == 2), "a fresh connection",
                    timeout=30)
        await until(lambda: asyncio.sleep(0, listener.connected), "the listener back")
        await bus.publish(beat("gpu-001"))
        await until(lambda: asyncio.sleep(0, heard == ["gpu-001"]), "a beat after the error")
    finally:
        await listener.stop()
        await bus.close()
        server.stop()
