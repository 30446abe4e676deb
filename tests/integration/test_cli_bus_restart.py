"""Operator verbs while nats-server restarts under them (an upgrade, a
crash): a verb that waits for its request to be carried out keeps waiting,
``bench run`` finds the result published while it was cut off, and
``--watch`` shows the outage in place of its table and goes on, and a verb
run while the stack's own bus is restarting waits for it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from cli.client import OWNED_BUS_WAIT_S
from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.embedded import STACK_FILE, NatsServer, StackInfo, process_start, write_stack_file
from libs.events import BenchRequest, BenchResult, JobSpec, JobSubmitted, JobSubmittedData
from tests.helpers import (
    ROOT,
    bus_cli_env,
    ready_nodes,
    run_cli,
    stack_cli_env,
    start_service,
    until,
    wait_healthy,
)
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
        # nats-py reports each failed reconnect, about 24 in the outage; the
        # CLI's log (warnings) says so once per kind of error.
        logged = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
        assert 1 <= sum(x.get("event") == "nats error" for x in logged) <= 2, done.stderr[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        reap_all(state)
        await bus.close()
        server.stop()
    assert code == 0


async def test_bench_run_finds_the_result_published_while_it_was_cut_off(
        tmp_path: Path) -> None:
    """``bench run`` watches its node's results live. One published while
    the CLI's connection was down (nats-server restarted under it) is not
    delivered when the CLI reconnects; the stream keeps it, and the CLI
    reads what was stored after its request. Deterministic: the CLI is held
    with SIGSTOP through the restart, and the real agent (held likewise
    until then) answers before the CLI runs again."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    bus = await Bus.connect(server.url, "test")
    await bus.ensure_topology()
    agent = start_service("bench-agent", ["--node", "n1"], server.url, tmp_path)
    cli: subprocess.Popen[str] | None = None
    try:
        await wait_healthy(bus, "bench-agent", "n1")
        agent.send_signal(signal.SIGSTOP)
        cli = subprocess.Popen([sys.executable, "-m", "cli.main", "bench", "run", "--node", "n1",
                                "--level", "quick", "--json", "--timeout", "60"],
                               env=bus_cli_env(server.url), cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        await until(lambda: bus.stored(BenchRequest, node="n1"), "the bench request", timeout=60)
        cli.send_signal(signal.SIGSTOP)
        server.kill()
        server.restart(tmp_path / "nats.log")
        agent.send_signal(signal.SIGCONT)
        await until(lambda: bus.stored(BenchResult, node="n1"), "the agent's result", timeout=60)
        cli.send_signal(signal.SIGCONT)
        out, err = await asyncio.to_thread(cli.communicate, timeout=90)
        assert cli.returncode == 0, err[-2000:]
        result = json.loads(out)
        assert result["node"] == "n1" and result["data"]["level"] == "quick"
        assert result["data"]["passed"] is True
    finally:
        for proc in (agent, cli):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                proc.wait(30)
        await bus.close()
        server.stop()


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


async def test_a_verb_waits_for_the_bus_its_stack_is_restarting(tmp_path: Path) -> None:
    """A verb run while the bus of a running ``primus-safe up`` is down
    (its supervisor starts nats-server again) says so once on stderr, waits,
    and does its work once the server is back; it does not tell the operator
    to start a stack that is running. ``PRIMUS_CLI_BUS_WAIT_S`` bounds the
    wait, and the error then points at the stack's logs."""
    server = NatsServer(tmp_path / "nats").start(tmp_path / "nats.log")
    bus = await Bus.connect(server.url, "test")
    await bus.ensure_topology()
    await ready_nodes(bus, {"n1": (8, "r1")})
    await bus.close()
    server.kill()
    state = tmp_path / "state"
    state.mkdir()
    # This test process stands in for the stack's owner: stack.json names it.
    write_stack_file(state / STACK_FILE, StackInfo(
        nats_url=server.url, pid=os.getpid(), pid_start=process_start(os.getpid())))
    env = stack_cli_env(state)
    verb = subprocess.Popen([sys.executable, "-m", "cli.main", "nodes", "--json"], env=env,
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert verb.stderr is not None
        said = await asyncio.wait_for(asyncio.to_thread(verb.stderr.readline), 20)
        assert f"restarts nats-server; waiting up to {OWNED_BUS_WAIT_S:g} s" in said, said
        await asyncio.sleep(2)  # it keeps knocking meanwhile
        assert verb.poll() is None, verb.communicate()
        server.restart(tmp_path / "nats.log")
        out, err = await asyncio.to_thread(verb.communicate, timeout=30)
        assert verb.returncode == 0, err
        assert [(n["node"], n["status"]) for n in json.loads(out)] == [("n1", "ready")]
        assert err.strip() == "", err  # one line about the wait, and no other

        server.kill()
        done = await asyncio.to_thread(run_cli, "nodes", env={**env, "PRIMUS_CLI_BUS_WAIT_S": "1"},
                                       timeout=20)
        assert done.returncode == 1 and done.stdout == ""
        waiting, error = done.stderr.strip().splitlines()
        assert "waiting up to 1 s" in waiting
        assert error.startswith(f"primus-safe: cannot reach the bus at {server.url} for 1 s")
        assert f"`primus-safe up` (pid {os.getpid()}) runs but its nats-server is not back" \
            in error and str(state.resolve() / "logs") in error
        assert "start the stack" not in error
    finally:
        if verb.poll() is None:
            verb.kill()
        server.stop()
