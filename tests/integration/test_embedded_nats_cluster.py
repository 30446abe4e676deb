"""The embedded stack's NATS cluster (``EmbeddedStack(nats_cluster=3)``):
its members are children of the stack like any other, recorded in
``stack.json`` and started again by ``supervise`` after a crash, on the same
port and store, where they rejoin the cluster."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from libs.bus import Bus
from libs.embedded import STACK_FILE, EmbeddedStack, NatsCluster, read_stack_file


def test_a_dead_member_is_restarted_and_rejoins(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack", nodes=1, nats_cluster=3)
    stack.state_dir.mkdir(parents=True)
    (stack.state_dir / "logs").mkdir()
    cluster = NatsCluster(stack.state_dir / "nats", password="pw")
    stack.nats = cluster.start(stack.state_dir / "logs")
    try:
        assert set(stack.nats_members) == {"nats-0", "nats-1", "nats-2"}
        assert stack._service_env()["PRIMUS_NATS_REPLICAS"] == "3"
        assert stack._service_env()["PRIMUS_NATS_URL"].count(",") == 2
        stack.record()
        info = read_stack_file(stack.state_dir / STACK_FILE)
        assert info is not None and info.nats_url == cluster.url
        assert {"nats-0", "nats-1", "nats-2"} <= set(info.children)

        asyncio.run(_declare(cluster.url))
        victim = cluster.servers[1]
        port, old = victim.port, victim.proc
        victim.kill()
        now = time.monotonic()
        assert stack.supervise(now) == []  # noted; restarted after its backoff
        assert stack.supervise(now + 1.0) == ["nats-1"]
        assert victim.port == port and victim.proc is not old
        assert asyncio.run(_leader_with_three_peers(cluster.url))
        info = read_stack_file(stack.state_dir / STACK_FILE)
        assert info is not None and info.children["nats-1"].restarts == 1
    finally:
        cluster.stop()


async def _declare(url: str) -> None:
    bus = await Bus.connect(url, "test")
    try:
        await bus.ensure_topology(3)
    finally:
        await bus.close()


async def _leader_with_three_peers(url: str) -> bool:
    """CONTROL has a leader and both other members current again."""
    bus = await Bus.connect(url, "test")
    try:
        for _ in range(100):
            try:
                info = await bus.js.stream_info("CONTROL")
                peers = info.cluster.replicas or [] if info.cluster else []
                if info.cluster and info.cluster.leader and len(peers) == 2 and all(
                        p.current for p in peers):
                    return True
            except Exception:
                pass
            await asyncio.sleep(0.3)
        return False
    finally:
        await bus.close()
