"""The scheduler survives being killed at random points: after each restart
it rebuilds from KV, the streams and the workers that outlived it, and the
invariants hold over the whole run — no node ever holds more GPUs than it
has, no gang is partially started, no job is lost, nothing runs twice."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import (
    JobPlaced,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    WorkerExited,
    WorkerStarted,
    parse_event,
)
from libs.records import JOBS
from tests.helpers import ROOT, ready_nodes, until

pytestmark = pytest.mark.timeout(300)
NODES = {f"n{i}": (2, f"r{(i - 1) // 2 + 1}") for i in range(1, 7)}  # 6 nodes x 2 GPUs
WORKER = str(Path(__file__).with_name("restart_worker.py"))
STARTED = '"event": "started"'  # a scheduler process's log line once it serves


def jobs(rng: random.Random, marker: Path) -> list[JobSubmitted]:
    out = []
    for i in range(16):
        fail_first = i % 5 == 0
        spec = JobSpec(
            name=f"j{i}", workers=rng.choice([1, 2, 3]), gpus_per_worker=rng.choice([1, 2]),
            priority=rng.choice(["low", "medium", "high"]), max_retry=2,
            command=["python", WORKER, str(marker), f"{rng.uniform(0.5, 2.5):.2f}",
                     "1" if fail_first else "0"], workdir=str(ROOT))
        out.append(JobSubmitted(source="test", job=f"j{i}", data=JobSubmittedData(spec=spec)))
    return out


def start_scheduler(nats_url: str, state: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(state))
    return subprocess.Popen([sys.executable, "-m", "cli.main", "scheduler"], env=env, cwd=ROOT,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def test_invariants_hold_across_random_scheduler_kills(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("PRIMUS_TEST_SEED", "20261130")))
    state, marker, log = tmp_path / "state", tmp_path / "started.txt", tmp_path / "sched.log"
    await ready_nodes(bus, NODES)
    submitted = jobs(rng, marker)
    for event in submitted:
        await bus.publish(event)
    try:
        kills = 0
        for _ in range(5):
            proc = start_scheduler(nats_url, state, log)
            await asyncio.sleep(rng.uniform(1.0, 3.5))
            proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            kills += 1
        starts = log.read_text().count(STARTED)  # some were killed before they started
        proc = start_scheduler(nats_url, state, log)
        jobs_bucket = await bus.records(JOBS)
        deadline = time.monotonic() + 180
        records: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            records = [r.model_dump(mode="json") for r in (await jobs_bucket.load()).values()]
            if len(records) == 16 and all(r["status"] in ("completed", "failed")
                                          for r in records):
                break
            await asyncio.sleep(0.5)
        # The jobs may all have ended before the last scheduler got going: a
        # SIGTERM inside the interpreter's own start-up kills any process.
        async def last_started() -> bool:
            return log.read_text().count(STARTED) > starts

        await until(last_started, "the last scheduler to start")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:  # the test failed before it stopped the scheduler
            proc.kill()
            proc.wait()
        reap_all(state)
    statuses = {r["id"]: r["status"] for r in records}
    if statuses != dict.fromkeys(statuses, "completed"):
        raise AssertionError(await diagnose(bus, statuses, log))
    assert kills == 5
    await check_history(bus, submitted, marker)


async def diagnose(bus: Bus, statuses: dict[str, str], log: Path) -> str:
    """What a failure needs to be understood: the unfinished jobs' records
    and their KV history, their worker events, and the scheduler consumer."""
    unfinished = sorted(j for j, s in statuses.items() if s != "completed")
    kv = await bus.kv("jobs")
    lines = [f"not completed: {unfinished} of {statuses}"]
    for job in unfinished:
        for entry in await kv.history(job):
            r = json.loads(entry.value) if entry.value else {}
            lines.append(f"  kv {job} rev {entry.revision}: {r.get('status')} attempt "
                         f"{r.get('attempt')} term {r.get('leader_term')} exits {r.get('exits')}")
    last = (await bus.js.stream_info("CONTROL")).state.last_seq
    for seq in range(1, last + 1):
        msg = await bus.js.get_msg("CONTROL", seq)
        if any(f".{job}." in msg.subject for job in unfinished):
            lines.append(f"  seq {seq} {msg.subject} {msg.data[:300]!r}")
    for info in (await bus.js.consumers_info("CONTROL")):
        lines.append(f"  consumer {info.name}: delivered {info.delivered} ack_floor "
                     f"{info.ack_floor} pending {info.num_pending} ack_pending "
                     f"{info.num_ack_pending} redelivered {info.num_redelivered}")
    lines.append(log.read_text()[-6000:])
    return "\n".join(lines)


async def check_history(bus: Bus, submitted: list[JobSubmitted], marker: Path) -> None:
    last = (await bus.js.stream_info("CONTROL")).state.last_seq
    events = [parse_event((await bus.js.get_msg("CONTROL", s)).data) for s in range(1, last + 1)]
    placed: dict[tuple[str, int], dict[int, tuple[str, int]]] = {}
    started: dict[tuple[str, int], set[int]] = defaultdict(set)
    live: dict[tuple[str, int, int], tuple[str, int]] = {}
    used: Counter[str] = Counter()
    for e in events:
        if isinstance(e, JobPlaced):
            key = (e.job, e.data.attempt)
            slots = {w.rank: (w.node, w.gpus) for w in e.data.workers}
            # One placement per attempt; a re-announcement after a restart is identical.
            assert placed.setdefault(key, slots) == slots, f"{key} placed twice differently"
        elif isinstance(e, WorkerStarted):
            key = (e.job, e.data.attempt)
            node, gpus = placed[key][e.data.rank]  # never a worker without a placement
            assert e.node == node
            assert not any(j == e.job and a != e.data.attempt for (j, a, _) in live), \
                f"{e.job}: attempt {e.data.attempt} started while another still ran"
            live[(e.job, e.data.attempt, e.data.rank)] = (node, gpus)
            started[key].add(e.data.rank)
            used[node] += gpus
            assert used[node] <= NODES[node][0], f"{node} over-committed: {used[node]} GPUs"
        elif isinstance(e, WorkerExited):
            node, gpus = live.pop((e.job, e.data.attempt, e.data.rank))
            used[node] -= gpus
    for key, slots in placed.items():
        assert started[key] == set(slots), f"gang {key} partially started: {started[key]}"
    assert not live, f"workers never reported an exit: {live}"
    processes = Counter(tuple(line.split()[:3]) for line in marker.read_text().splitlines())
    assert max(processes.values()) == 1, "a rank of an attempt ran twice"
    assert {j for j, _, _ in processes} == {e.job for e in submitted}
    retried = {e.job for e in submitted if e.data.spec.command[-1] == "1"}
    assert {j for (j, a) in placed if a > 1} >= retried
