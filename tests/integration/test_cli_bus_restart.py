"""Operator verbs while nats-server restarts under them (an upgrade, a
crash): a verb that waits for its request to be carried out keeps waiting,
and ``--watch`` shows the outage in place of its table and goes on."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.embedded import NatsServer
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from tests.helpers import ROOT, bus_cli_env, ready_nodes, run_cli, until
from tests.integration.test_job_control import events_of
from tests.integration.test_scheduler_service import scheduler


async def test_a_waiting_stop_rides_out_a_bus_restart(tmp_path: Path) -> None:
    """``stop`` waits until the scheduler has carried it out. Once the
    request is on the bus it is durable, so nats-server restarting during
    the wait (an upgrade, a crash; here 12 s, longer than a request's
    timeout) does not end the wait: the CLI reconnects and reports the stop.
    The scheduler is held still (SIGSTOP) until the server is back, so the
    whole outage falls inside the wait."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    bus = await Bus.connect(server.url, "test")
    await bus.ensure_topology()
    state = tmp_path / "state"
    await ready_nodes(bus, {"n1": (1, "r1")})
    proc = scheduler(server.url, state, tmp_path / "sched.log")
    env = bus_cli_env(server.url)
    job = "sleepy"
    spec = JobSpec(name=job, workers=1, gpus_per_worker=1, workdir=str(ROOT),
                   command=["python", "-c", "import time; time.sleep(600)"])
    try:
        await bus.publish(JobSubmitted(source="test", job=job, data=JobSubmittedData(spec=spec)))

        async def running() -> bool:
            return "worker.started" in await events_of(bus, job)

        await until(running, "the job's worker to start", timeout=60)
        proc.send_signal(signal.SIGSTOP)
        try:
            stop = asyncio.create_task(asyncio.to_thread(
                run_cli, "stop", job, "--json", "--timeout", "90", env=env, timeout=120))

            async def requested() -> bool:
                return "job.stop" in await events_of(bus, job)

            await until(requested, "the stop request on the bus", timeout=30)
            server.kill()
            await asyncio.sleep(12)  # longer than a request's timeout
            server.restart(tmp_path / "nats.log")
        finally:
            proc.send_signal(signal.SIGCONT)
        done = await stop
        assert done.returncode == 0, done.stderr[-2000:]
        answer = json.loads(done.stdout)
        assert answer["status"] == "stopped" and answer["changed"] is True
        assert "the request is on it already, still waiting" in done.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        reap_all(state)
        await bus.close()
        server.stop()
    assert code == 0


async def test_watch_shows_the_outage_and_goes_on(tmp_path: Path) -> None:
    """``nodes --watch`` in a pipe prints each new state once: the table,
    then why it cannot read the bus while nats-server is down, then the
    table again when the server is back."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    bus = await Bus.connect(server.url, "test")
    await bus.ensure_topology()
    await ready_nodes(bus, {"n1": (8, "r1")})
    await bus.close()
    env = bus_cli_env(server.url)
    watch = subprocess.Popen([sys.executable, "-m", "cli.main", "nodes", "--watch",
                              "--interval", "0.3"], env=env, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert watch.stdout is not None

    async def line() -> str:
        while True:
            text = await asyncio.to_thread(watch.stdout.readline)  # type: ignore[union-attr]
            if text.strip():
                return text.strip()
            assert text or watch.poll() is None, f"the watch ended with {watch.returncode}"

    try:
        assert (await line()).split()[:2] == ["NODE", "STATUS"]
        assert (await line()).split()[:2] == ["n1", "ready"]
        server.kill()
        down = await line()
        assert down.startswith("primus-safe: cannot reach the bus at ") \
            and down.endswith("(trying again every 0.3 s)"), down
        server.restart(tmp_path / "nats.log")
        assert (await line()).split()[:2] == ["NODE", "STATUS"]
        assert (await line()).split()[:2] == ["n1", "ready"]
        assert watch.poll() is None
    finally:
        watch.terminate()
        watch.wait(10)
        server.stop()
