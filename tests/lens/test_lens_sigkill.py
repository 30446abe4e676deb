"""Nothing lost, nothing twice: lens-collector is killed with SIGKILL in the
middle of a stream of telemetry and started again; in the end the tables
hold exactly the rows that were published, each once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.service import health_subject
from tests.helpers import ROOT
from tests.lens.lens_seed import node_event

pytestmark = pytest.mark.timeout(240)

# A short ack wait, so that what the killed process had fetched but not
# acked comes back quickly.
COLLECTOR = (
    "import asyncio, sys\n"
    "from libs.service import serve\n"
    "from libs.settings import Settings\n"
    "from services.lens_collector.app import LensCollector\n"
    "s = Settings()\n"
    "c = LensCollector(s, evaluate_alerts=False, ack_wait_s=3.0, batch=200, fill_s=0.1)\n"
    "sys.exit(serve(c, s))\n"
)
MESSAGES = 1500


def start(nats_url: str, tmp_path: Path, n: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_CLICKHOUSE_DSN=f"chdb://{tmp_path / 'chdb'}",
               PRIMUS_STATE_DIR=str(tmp_path / "state"))
    log = (tmp_path / f"collector-{n}.log").open("wb")
    return subprocess.Popen([sys.executable, "-c", COLLECTOR], env=env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)


async def health(bus: Bus) -> dict:  # type: ignore[type-arg]
    try:
        return await bus.request(health_subject("lens-collector"), timeout_s=2)
    except Exception:
        return {}


async def counts(bus: Bus) -> dict[str, tuple[int, int]]:
    try:
        reply = await bus.request("safe.query.lens.query", {"query": "table_counts"}, timeout_s=10)
    except Exception:
        return {}
    return {r[0]: (r[1], r[2]) for r in reply.get("rows", [])}


async def test_sigkill_mid_stream_loses_and_duplicates_nothing(nats_url: str, bus: Bus,
                                                               tmp_path: Path) -> None:
    first = start(nats_url, tmp_path, 1)
    for _ in range(300):
        if (await health(bus)).get("ok"):
            break
        await asyncio.sleep(0.2)
    now = datetime.now(UTC)
    published = 0

    async def publish(upto: int) -> None:
        nonlocal published
        while published < upto:
            await bus.publish(node_event(f"n{published % 50}", now, published).model_copy(
                update={"id": f"m{published:06d}"}))
            published += 1
            if published % 100 == 0:
                await asyncio.sleep(0.05)  # a stream, not one burst

    await publish(MESSAGES // 2)
    for _ in range(300):  # kill it once it is busy storing
        stored = (await health(bus)).get("rows_written", {}).get("ingest_node", 0)
        if 200 <= stored < published:  # busy: a batch is most likely in flight
            break
        await asyncio.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    await publish(MESSAGES)
    second = start(nats_url, tmp_path, 2)
    try:
        final: dict[str, tuple[int, int]] = {}
        for _ in range(600):
            final = await counts(bus)
            if final.get("node_metrics", (0, 0))[0] >= MESSAGES:
                await asyncio.sleep(4)  # redeliveries still due would show up now
                final = await counts(bus)
                break
            await asyncio.sleep(0.2)
        assert final["node_metrics"] == (MESSAGES, MESSAGES), final
        assert final["gpu_metrics"] == (4 * MESSAGES, 4 * MESSAGES), final
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, (tmp_path / "collector-2.log").read_text()[-3000:]
