"""Two scheduler processes on a real nats-server: one leads (the ``leases``
bucket says which), only it places jobs; when it is SIGKILLed the standby
takes over within the TTL plus a margin and places the next job; a leader
frozen past its TTL (SIGSTOP) is deposed and, once it runs again, places
nothing until it is elected again; a leader that stops cleanly hands over
at once. No job is placed
or started twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import KeyNotFoundError

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import JobPlaced, JobSpec, JobSubmitted, JobSubmittedData, parse_event
from libs.leader import LEASES_BUCKET
from libs.service import health_subject
from tests.helpers import ROOT, ready_nodes

pytestmark = pytest.mark.timeout(240)
TTL_S = 3
MARGIN_S = 3.0  # process scheduling on a loaded CI machine, one poll tick, rebuild
WORKER = str(Path(__file__).with_name("restart_worker.py"))


class Replica:
    """One ``primus-safe scheduler`` (or other leader-elected service)
    process with its own log."""

    def __init__(self, name: str, nats_url: str, tmp_path: Path, run: int = 1,
                 verb: str = "scheduler") -> None:
        self.name, self.nats_url, self.tmp_path, self.verb = name, nats_url, tmp_path, verb
        self.log = tmp_path / f"{name}-{run}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        # One state dir for both: the local driver's workers are the shared
        # cluster that a new leader adopts.
        env.update(PRIMUS_NATS_URL=self.nats_url, PRIMUS_STATE_DIR=str(self.tmp_path / "state"),
                   PRIMUS_LEADER_TTL_S=str(TTL_S), PRIMUS_LEADER_ID=self.name)
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.main", self.verb], env=env,
                                     cwd=ROOT, stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT)
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def signal_kill(self) -> None:
        self.signal(signal.SIGKILL)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, timeout)

    async def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a frozen process cannot handle SIGTERM
            self.signal(signal.SIGTERM)
            await self.wait()

    def lines(self) -> list[dict[str, Any]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def placed(self) -> list[str]:
        return [line["job"] for line in self.lines() if line["event"] == "job placed"]

    async def started(self) -> bool:
        return any(line["event"] == "started" for line in self.lines())


async def lease(bus: Bus, role: str = "scheduler") -> dict[str, Any] | None:
    kv = await bus.kv(LEASES_BUCKET)
    try:
        entry = await kv.get(role)
    except KeyNotFoundError:
        return None
    return {**json.loads(entry.value or b"{}"), "revision": entry.revision}


async def until(fn, what: str, timeout: float = 60) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await fn()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def leader_is(bus: Bus, name: str | None = None, *, other_than: str | None = None,
                    role: str = "scheduler", timeout: float = 60) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        held = await lease(bus, role)
        if held is None or held.get("term") is None:  # the term is written right after taking
            return None
        if (name is None or held["holder"] == name) and held["holder"] != other_than:
            return held
        return None

    return await until(check, f"leader {name or f'other than {other_than}'}", timeout)


async def every_health(bus: Bus, service: str, wait_s: float = 1.0) -> list[dict[str, Any]]:
    """Every replica's answer to one health request (a plain request keeps
    only the first)."""
    inbox = bus.nc.new_inbox()
    replies: list[dict[str, Any]] = []

    async def on(msg: Any) -> None:
        replies.append(json.loads(msg.data))

    sub = await bus.nc.subscribe(inbox, cb=on)
    await bus.nc.publish(health_subject(service), b"{}", reply=inbox)
    await asyncio.sleep(wait_s)
    await sub.unsubscribe()
    return replies


async def run_job(bus: Bus, job: str, marker: Path) -> dict[str, Any]:
    spec = JobSpec(name=job, workers=1, gpus_per_worker=1, command=[
        "python", WORKER, str(marker), "0.3", "0"], workdir=str(ROOT))
    await bus.publish(JobSubmitted(source="test", job=job, data=JobSubmittedData(spec=spec)))
    kv = await bus.kv("jobs")

    async def done() -> dict[str, Any] | None:
        try:
            record = json.loads((await kv.get(job)).value or b"{}")
        except KeyNotFoundError:
            return None
        return record if record["status"] == "completed" else None

    return await until(done, f"{job} to complete", timeout=60)


async def check_each_job_ran_once(bus: Bus, replicas: list[Replica], jobs: list[str],
                                  marker: Path) -> None:
    placed = Counter(job for r in replicas for job in r.placed())
    assert placed == Counter(jobs), placed  # one placement decision per job, cluster-wide
    started = Counter(line.split()[0] for line in marker.read_text().splitlines())
    assert started == Counter(jobs), started  # one worker process per job
    last = (await bus.js.stream_info("CONTROL")).state.last_seq
    events = [parse_event((await bus.js.get_msg("CONTROL", s)).data) for s in range(1, last + 1)]
    attempts = Counter(e.job for e in events if isinstance(e, JobPlaced))
    assert attempts == Counter(jobs), attempts


async def test_standby_takes_over_from_a_killed_leader_and_a_clean_stop_hands_over(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    marker = tmp_path / "started.txt"
    await ready_nodes(bus, {"n1": (2, "r1"), "n2": (2, "r1")})
    a = Replica("sched-a", nats_url, tmp_path).start()
    try:
        first = await leader_is(bus, "sched-a")
        b = Replica("sched-b", nats_url, tmp_path).start()
        await until(b.started, "the standby to start")
        health = {h["holder"]: h for h in await every_health(bus, "scheduler")}
        assert {n: (h["role"], h["term"]) for n, h in health.items()} == {
            "sched-a": ("leader", first["term"]), "sched-b": ("standby", None)}
        assert health["sched-b"]["leader"] == "sched-a"
        j1 = await run_job(bus, "j1", marker)
        assert j1["leader_term"] == first["term"]
        assert a.placed() == ["j1"] and b.placed() == []  # the standby placed nothing
        assert (await lease(bus) or {}).get("holder") == "sched-a"  # and took nothing

        # The leader dies without a word: its lease expires, the standby takes it.
        a.signal(signal.SIGKILL)
        killed = time.monotonic()
        await a.wait()
        second = await leader_is(bus, "sched-b", timeout=TTL_S + MARGIN_S + 5)
        took_s = time.monotonic() - killed
        assert took_s <= TTL_S + MARGIN_S, f"standby took {took_s:.1f}s (ttl {TTL_S}s)"
        assert second["term"] > first["term"]
        j2 = await run_job(bus, "j2", marker)
        assert j2["leader_term"] == second["term"]
        assert b.placed() == ["j2"]

        # A clean stop deletes the lease: the restarted replica (a standby
        # now) takes over without waiting out the TTL.
        killed_a, a = a, Replica("sched-a", nats_url, tmp_path, run=2).start()
        await until(a.started, "the restarted replica")
        assert (await lease(bus) or {}).get("holder") == "sched-b"
        # Watched as it happens: the leases bucket's history is short (renewals
        # and the server's expiry markers push a delete out of it within seconds).
        watcher = await (await bus.kv(LEASES_BUCKET)).watch("scheduler")
        b.signal(signal.SIGTERM)
        stopped = time.monotonic()
        third = await leader_is(bus, "sched-a", timeout=TTL_S + MARGIN_S + 5)
        handover_s = time.monotonic() - stopped
        assert await b.wait() == 0
        ops: list[str] = []
        deadline = time.monotonic() + 5
        while "DEL" not in ops and time.monotonic() < deadline:
            try:
                entry = await watcher.updates(timeout=0.5)
            except NatsTimeoutError:
                continue
            if entry is not None:  # None: the values the watch began with are all in
                ops.append(str(entry.operation))
        await watcher.stop()
        assert "DEL" in ops, ops  # released, not expired
        assert handover_s < TTL_S + MARGIN_S
        j3 = await run_job(bus, "j3", marker)
        assert j3["leader_term"] == third["term"] > second["term"]
        await check_each_job_ran_once(bus, [killed_a, a, b], ["j1", "j2", "j3"], marker)
    finally:
        for replica in (a, b) if "b" in locals() else (a,):
            await replica.terminate()
        reap_all(tmp_path / "state")


async def test_a_frozen_leader_is_deposed_and_places_nothing_when_it_wakes(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    marker = tmp_path / "started.txt"
    await ready_nodes(bus, {"n1": (2, "r1"), "n2": (2, "r1")})
    a = Replica("sched-a", nats_url, tmp_path).start()
    b: Replica | None = None
    try:
        first = await leader_is(bus, "sched-a")
        b = Replica("sched-b", nats_url, tmp_path).start()
        await until(b.started, "the standby to start")
        await run_job(bus, "j1", marker)

        # Freeze the leader (a long GC pause, a stalled VM): it cannot renew.
        a.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        second = await leader_is(bus, "sched-b", timeout=TTL_S + MARGIN_S + 5)
        assert time.monotonic() - frozen <= TTL_S + MARGIN_S
        assert second["term"] > first["term"]
        await bus.publish(JobSubmitted(source="test", job="j2", data=JobSubmittedData(
            spec=JobSpec(name="j2", workers=1, gpus_per_worker=1, workdir=str(ROOT),
                         command=["python", WORKER, str(marker), "3", "0"]))))

        # It wakes up still believing it leads, with a consumer and a cycle
        # running: it must see it is deposed before it does anything.
        a.signal(signal.SIGCONT)

        async def a_stood_by() -> bool:
            return any(x["event"] == "standing by" for x in a.lines())

        await until(a_stood_by, "the woken leader to stand by", timeout=TTL_S + MARGIN_S)
        await run_job(bus, "j3", marker)
        j2 = await run_job(bus, "j2", marker)
        assert j2["leader_term"] == second["term"]
        assert a.placed() == ["j1"] and sorted(b.placed()) == ["j2", "j3"]
        assert (await lease(bus) or {}).get("holder") == "sched-b"

        # The deposed process campaigns on: elected again, it rebuilds and places.
        b.signal(signal.SIGTERM)
        assert await b.wait() == 0
        third = await leader_is(bus, "sched-a", timeout=TTL_S + MARGIN_S)
        assert third["term"] > second["term"]
        j4 = await run_job(bus, "j4", marker)
        assert j4["leader_term"] == third["term"] and a.placed() == ["j1", "j4"]
        await check_each_job_ran_once(bus, [a, b], ["j1", "j2", "j3", "j4"], marker)
    finally:
        for replica in (a, b):
            if replica is not None:
                await replica.terminate()
        reap_all(tmp_path / "state")
