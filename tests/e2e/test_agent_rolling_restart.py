"""A rolling restart of every bench agent, one at a time, during a 2-node
training job on the embedded stack (what upgrading the agent DaemonSet
does): each agent stays away longer than the heartbeat deadline and comes
back. The first is stopped cleanly (SIGTERM): it says so and failover waits
for it. The second is killed (SIGKILL, a crash in the middle of the
rollout): it says nothing, and failover asks the driver, which sees the
node's workers still run. Either way no node is quarantined, no fault is
opened, the job is never restarted, and Lens misses no telemetry beyond
each agent's own restart gap (the job's, sent by its workers, none)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.embedded import EmbeddedStack
from libs.events import NodeHeartbeat, parse_event
from tests.e2e.test_embedded_stack import bucket, poll
from tests.helpers import ROOT, run_cli, stack_cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

AWAY_S = 6.0  # twice the default heartbeat deadline (1 s x 3)


# One stack for both ways an agent goes away: a stack and a job cost more
# than the restarts themselves.
SIGNALS = (signal.SIGTERM, signal.SIGKILL)


def test_a_rolling_restart_of_the_agents_moves_nothing(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack", nodes=len(SIGNALS)).start()
    try:
        asyncio.run(_rolling(stack, tmp_path))
    finally:
        codes = stack.stop()
    assert codes == dict.fromkeys(codes, 0), f"unclean exits: {codes}; {stack.stragglers}"


async def _rolling(stack: EmbeddedStack, tmp_path: Path) -> None:
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "e2e", token=stack.nats.token)
    env = stack_cli_env(stack.state_dir)
    beats: dict[str, int] = {}  # node -> the pid of the agent that beat last

    async def on_beat(msg: Any) -> None:
        event = parse_event(msg.data)
        assert isinstance(event, NodeHeartbeat) and event.node is not None
        beats[event.node] = event.data.pid

    listener = await bus.nc.subscribe("safe.live.*.heartbeat", cb=on_beat)
    try:
        async def all_ready() -> bool:
            nodes = await bucket(bus, "nodes")
            return len(nodes) == 2 and all(n["state"] == "ready" for n in nodes.values())

        await poll(all_ready, "nodes to be ready")
        job_file = tmp_path / "job.yaml"
        job_file.write_text("name: rolling\nworkers: 2\ngpus_per_worker: 1\n"
                            "checkpoint_interval: 50\nmax_retry: 2\n"
                            f"workdir: {ROOT}\n"
                            "command: [python, examples/train_tiny.py, --iterations, '1000000']\n")
        submitted = await asyncio.to_thread(run_cli, "submit", str(job_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()

        async def running() -> dict | None:  # type: ignore[type-arg]
            record = (await bucket(bus, "jobs")).get(job)
            return record if record and record["status"] == "running" else None

        placed = await poll(running, "the job to run")

        async def training() -> bool:
            return await _last_iteration(bus, job) > 0

        await poll(training, "the job's first steps in Lens")
        away: dict[str, tuple[float, float]] = {}  # node -> (killed, beating again), epoch s
        for node, sig in zip(stack.node_names, SIGNALS, strict=True):
            name = f"agent-{node}"
            proc = stack.procs[name]
            killed = time.time()
            os.killpg(proc.pid, sig)  # SIGTERM: what a DaemonSet rollout sends
            assert await asyncio.to_thread(proc.wait, 30) == (0 if sig == signal.SIGTERM
                                                              else -signal.SIGKILL)
            await asyncio.sleep(AWAY_S)
            new = stack.restart(name)

            async def back(node: str = node, pid: int = new.pid) -> bool:
                return beats.get(node) == pid

            await poll(back, f"{name} to beat again", timeout=60)
            away[node] = (killed, time.time())
        await asyncio.sleep(4.0)  # a fault decided late would show by now

        record = (await bucket(bus, "jobs"))[job]
        assert record["status"] == "running" and record["attempt"] == 1
        assert record["retries"] == 0
        # (an agent starved of CPU while onboarding on this 2-core machine may
        # have missed beats before the job; what counts is nothing since)
        faults = {k: f for k, f in (await bucket(bus, "faults")).items()
                  if f["opened_at"] >= placed["started_at"]}
        assert faults == {}, faults
        nodes = await bucket(bus, "nodes")
        assert {n: r["state"] for n, r in nodes.items()} == dict.fromkeys(stack.node_names,
                                                                          "ready")
        steps_before = await _last_iteration(bus, job)
        await asyncio.sleep(2.0)
        assert await _last_iteration(bus, job) > steps_before  # still training
        # Telemetry: each node's has one gap, inside its agent's restart;
        # the job's (its workers report themselves) has none.
        until = time.time() - 2.0  # what Lens has surely stored by now
        for node, window in away.items():
            gaps = _gaps(await _seconds_with_rows(bus, "node_series", node=node),
                         placed["started_at"] + 3.0, until)
            assert gaps, f"{node}: its agent was away {AWAY_S} s and Lens shows no gap"
            assert all(window[0] - 2.0 <= a and b <= window[1] + 2.0 for a, b in gaps), \
                f"{node}: telemetry gaps {gaps} outside its restart {window}"
        gaps = _gaps(await _seconds_with_rows(bus, "job_throughput", job=job),
                     min(w[0] for w in away.values()), until)
        assert gaps == [], f"the job's telemetry stopped: {gaps}"
        started = time.monotonic()
        cancel = await asyncio.to_thread(run_cli, "cancel", job, env=env, timeout=120)
        assert cancel.returncode == 0, cancel.stderr
        assert time.monotonic() - started < 60
    finally:
        await listener.unsubscribe()
        await bus.close()


async def _last_iteration(bus: Bus, job: str) -> int:
    reply = await bus.request("safe.query.lens.query",
                              {"query": "job_summary", "params": {"job": job}}, timeout_s=20)
    assert reply["ok"], reply
    rows = [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]
    return int(rows[0]["last_iteration"]) if rows and rows[0]["last_iteration"] else 0


async def _seconds_with_rows(bus: Bus, query: str, **params: str) -> list[float]:
    """The one-second buckets (epoch s) in which Lens holds rows of ``query``."""
    reply = await bus.request("safe.query.lens.query",
                              {"query": query, "params": {**params, "step": 1}},
                              timeout_s=20)
    assert reply["ok"], reply
    at = reply["columns"].index("t")
    return sorted(datetime.fromisoformat(r[at]).replace(tzinfo=UTC).timestamp()
                  for r in reply["rows"])


def _gaps(seconds: list[float], start: float, end: float, *, longer_than: float = 3.0
          ) -> list[tuple[float, float]]:
    """Stretches longer than ``longer_than`` within [start, end] with no bucket."""
    marks = [start, *(s for s in seconds if start < s < end), end]
    return [(a, b) for a, b in zip(marks, marks[1:], strict=False) if b - a > longer_than]
