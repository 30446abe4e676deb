"""lens-collector replicas under load, one of them SIGKILLed.

Two real ``primus-safe lens-collector`` processes share the ``lens-events``
and ``lens-telemetry`` consumers of a real nats-server while agent-shaped
node telemetry (400 nodes of 8 GPUs at 1 Hz, the 100k-GPU message at a
smaller count) and a trickle of control events are published. A replica
chosen at random (the seed is printed; ``PRIMUS_REPLICA_SEED`` replays it)
is SIGKILLed mid-run and started again a second later, as its Deployment
would.

Each replica has a chDB store of its own here (chDB is one engine per
process; a deployment's replicas share one ClickHouse server). So "stored
exactly once" is checked the way one shared table would hold the rows:
every published GPU row and event is in the union of the stores, nothing
else is, no store holds a row twice once ReplacingMergeTree has merged
(FINAL), and a row in two stores is one the dead replica stored but had
not acked (at most what it had in hand when killed), which a shared
table's key merges into one. The lag recovers within 10 s: every message
is stored within 2 s of when it was sampled, or, for one sampled around
the kill, by 10 s after the kill plus those 2 s (so what the dead replica
had in hand moved on in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.embedded import NatsServer
from libs.events import NodeStateChanged, NodeStateData
from tests.helpers import ROOT, load_bench, until, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

REPLICAS = 2
NODES, GPUS = 400, 8
SECONDS = 30
KILL_AT_S, DOWN_S = 10.0, 1.0
EVENTS_PER_S = 20
RECOVER_S, LAG_OK_S = 10.0, 2.0
bench = load_bench("lens_ingest")

READ_STORE = """
import json, sys
import clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
def rows(sql):
    return client.query(sql).result_rows
print(json.dumps({
    "gpu": {f"{e}/{g}": n for e, g, n in rows(
        "SELECT event_id, gpu, count() FROM primus.gpu_metrics GROUP BY event_id, gpu")},
    "gpu_final": rows("SELECT count() FROM primus.gpu_metrics FINAL")[0][0],
    "events": {i: n for i, n in rows("SELECT id, count() FROM primus.events GROUP BY id")},
    "events_final": rows("SELECT count() FROM primus.events FINAL")[0][0],
    # when each message was sampled, and stored (ms): a node's GPU 0 row, an event
    "timing": [[e, t, r] for e, t, r in rows(
        "SELECT event_id, toUnixTimestamp64Milli(time), toUnixTimestamp64Milli(received) "
        "FROM primus.gpu_metrics WHERE gpu = 0 UNION ALL "
        "SELECT id, toUnixTimestamp64Milli(time), toUnixTimestamp64Milli(received) "
        "FROM primus.events")],
}))
"""


def test_a_replica_killed_under_load_loses_nothing_and_lag_recovers(tmp_path: Path) -> None:
    seed = int(os.environ.get("PRIMUS_REPLICA_SEED", time.time_ns() % 10_000))
    print(f"replica seed {seed} (replay: PRIMUS_REPLICA_SEED={seed})")
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    names = [f"lens-{i}" for i in range(REPLICAS)]
    procs = {n: replica(server.url, n, tmp_path) for n in names}
    try:
        found = asyncio.run(_run(server, procs, names, random.Random(seed), tmp_path))
    finally:
        for proc in procs.values():
            bench.stop_collector(proc)
        server.stop()
    stores = [json.loads(subprocess.run(
        [sys.executable, "-c", READ_STORE, str(tmp_path / n)], capture_output=True, text=True,
        check=True, cwd=ROOT).stdout) for n in names]
    _check(found, stores, seed)


def replica(nats_url: str, name: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A collector process named ``name`` with its own store (the same one
    again after a restart)."""
    return bench.start_collector(nats_url, tmp_path / name, tmp_path / f"{name}.log", name)


async def _run(server: NatsServer, procs: dict[str, subprocess.Popen[bytes]],
               names: list[str], rng: random.Random, tmp_path: Path) -> dict[str, Any]:
    bus = await Bus.connect(server.url, "test")
    try:
        await bus.ensure_topology()
        for name in names:
            await wait_healthy(bus, "lens-collector", name)
        templates = [bench.Template(bench.node_event(f"n{i:04d}")) for i in range(NODES)]
        plan, first = bench.plan_run(templates, SECONDS)
        published_ids = [bench.message_id(0, s, sl, n) for s in range(SECONDS)
                         for sl in range(bench.SLICES)
                         for n in range(len(templates[sl::bench.SLICES]))]
        events: list[str] = []

        async def control() -> None:
            await asyncio.sleep(max(0.0, first - time.time()))
            for k in range(SECONDS * EVENTS_PER_S):
                event = NodeStateChanged(source="test", node=f"n{k % NODES:04d}",
                                         data=NodeStateData(state="ready", reason=f"#{k}"))
                await bus.publish(event)
                events.append(event.id)
                await asyncio.sleep(max(0.0, first + (k + 1) / EVENTS_PER_S - time.time()))

        async def kill() -> tuple[str, float, int]:
            await asyncio.sleep(max(0.0, first + KILL_AT_S - time.time()))
            victim = rng.choice(names)
            info = await bus.js.consumer_info("TELEMETRY", "lens-telemetry")
            in_hand = info.num_ack_pending  # what both replicas held, the victim's among it
            at = time.time()
            procs[victim].kill()
            procs[victim].wait()
            await asyncio.sleep(DOWN_S)
            procs[victim] = replica(server.url, victim, tmp_path)
            return victim, at, in_hand

        publisher = asyncio.create_task(bench.publish(server.url, plan))
        controls = asyncio.create_task(control())
        victim, killed_at, in_hand = await kill()
        await asyncio.gather(publisher, controls)
        ended_at = time.time()

        async def drained() -> bool:
            for durable, stream in (("lens-telemetry", "TELEMETRY"), ("lens-events", "CONTROL")):
                info = await bus.js.consumer_info(stream, durable)
                if info.num_pending or info.num_ack_pending:
                    return False
            return True

        with contextlib.suppress(AssertionError):  # what is missing is named by the checks
            await until(drained, "both consumers to drain", 90, every=0.5)
        restarted = await wait_healthy(bus, "lens-collector", victim)
        return {"victim": victim, "killed_at": killed_at, "ended_at": ended_at,
                "in_hand": in_hand, "published": published_ids,
                "events": events, "restarted_uptime_s": restarted["uptime_s"]}
    finally:
        await bus.close()


def _check(run: dict[str, Any], stores: list[dict[str, Any]], seed: int) -> None:
    where = f"(seed {seed}, killed {run['victim']})"
    published = {f"{e}/{g}" for e in run["published"] for g in range(GPUS)}
    stored: dict[str, int] = {}
    for store in stores:
        for key in store["gpu"]:
            stored[key] = stored.get(key, 0) + 1
    missing = published - set(stored)
    assert not missing, f"{len(missing)} GPU rows lost {where}, e.g. {sorted(missing)[:3]}"
    assert not set(stored) - published, f"rows nobody published were stored {where}"
    for store in stores:  # within one store a redelivered row merges with its first copy
        assert store["gpu_final"] == len(store["gpu"]), where
        assert store["events_final"] == len(store["events"]), where
    twice = sum(1 for n in stored.values() if n > 1) // GPUS  # in messages
    assert twice <= run["in_hand"], (
        f"{twice} messages stored by two replicas, more than the {run['in_hand']} in hand "
        f"when the victim died {where}")
    events = set(run["events"])
    held = set().union(*(s["events"] for s in stores))
    assert events <= held, f"{len(events - held)} control events lost {where}"
    assert held <= events, f"events nobody published were stored {where}"

    # Lag: each message is stored (its first copy) within LAG_OK_S of when it
    # was sampled, or, for what was sampled around the kill, of RECOVER_S after it.
    first: dict[str, tuple[int, int]] = {}
    for store in stores:
        for key, sampled, received in store["timing"]:
            if key not in first or received < first[key][1]:
                first[key] = (sampled, received)
    bound_ms = (run["killed_at"] + RECOVER_S) * 1000
    late = {k: (r - max(t, bound_ms)) / 1000 for k, (t, r) in first.items()
            if r - max(t, bound_ms) > LAG_OK_S * 1000}
    lags = sorted((r - t) / 1000 for t, r in first.values())
    after = sorted((r - t) / 1000 for t, r in first.values() if t >= bound_ms)
    print(f"replicas {where}: {len(first)} messages; lag p50 {lags[len(lags) // 2]:.2f} s, max "
          f"{lags[-1]:.2f} s; sampled from {RECOVER_S:.0f} s after the kill on: max "
          f"{after[-1] if after else 0:.2f} s; {twice} messages in two stores (in hand at the "
          f"kill: {run['in_hand']})")
    assert not late, (f"{len(late)} messages stored more than {LAG_OK_S} s after "
                      f"max(sampled, kill + {RECOVER_S} s) {where}, e.g. "
                      f"{sorted(late.items(), key=lambda kv: -kv[1])[:3]}")
