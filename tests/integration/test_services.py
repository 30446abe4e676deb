"""Each service runs alone as ``primus-safe <service>`` against a real
nats-server, answers its health request, keeps serving after bad input
(dead-lettered with the reason, counted) and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from libs.bus import DEADLETTER, REASON_HEADER, Bus, dlq_subject
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from libs.service import instance_token
from tests.helpers import ROOT, start_service, wait_healthy

SERVICES = [("bootstrap", []), ("scheduler", []), ("failover", []), ("bench-coordinator", []),
            ("lens-collector", []), ("bench-agent", ["--node", "node-1"])]


start = start_service


@pytest.mark.parametrize(("verb", "args"), SERVICES, ids=[s for s, _ in SERVICES])
async def test_service_runs_alone_answers_health_and_stops_on_sigterm(
        verb: str, args: list[str], nats_url: str, bus: Bus, tmp_path: Path) -> None:
    proc = start(verb, args, nats_url, tmp_path)
    try:
        reply = await wait_healthy(bus, verb, "node-1" if verb == "bench-agent" else None)
        assert reply["ok"] is True and reply["service"] == verb
        assert reply["dead_lettered"] == 0
        if verb != "bench-agent":  # the replica on this host answers its own probe
            own = await wait_healthy(bus, verb, instance_token(), timeout=10)
            assert own["ok"] is True and own["service"] == verb
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    log = (tmp_path / f"{verb}.log").read_text()
    assert code == 0, log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert {"started", "stopped"} <= {line["event"] for line in lines}
    assert all(line["service"] == verb for line in lines)


async def test_bad_message_is_dead_lettered_and_the_service_keeps_serving(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    proc = start("scheduler", [], nats_url, tmp_path)
    try:
        await wait_healthy(bus, "scheduler")
        await bus.js.publish("safe.job.j-1.submitted", b'{"type": "job.submitted", "job": "j-1"}')
        good = JobSubmitted(source="test", job="j-2", data=JobSubmittedData(
            spec=JobSpec(name="ok", workers=1, gpus_per_worker=1, command=["true"])))
        await bus.publish(good)
        for _ in range(100):
            reply = await wait_healthy(bus, "scheduler")
            if reply["dead_lettered"] == 1 and reply["jobs"].get("pending") == 1:
                break
            await asyncio.sleep(0.1)
        assert reply["dead_lettered"] == 1 and reply["jobs"] == {"pending": 1}
        sub = await bus.js.pull_subscribe(dlq_subject("scheduler"), stream=DEADLETTER.name)
        [msg] = await sub.fetch(1, timeout=2)
        assert "invalid event" in msg.headers[REASON_HEADER]
        reason = msg.headers[REASON_HEADER]
        assert "data" in reason and "Field required" in reason
        kv = await bus.kv("jobs")
        assert json.loads((await kv.get("j-2")).value)["status"] == "pending"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0


async def test_bootstrap_refuses_a_bad_hosts_file_before_any_effect(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("nodes:\n  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}\n"
                     "  - {name: b, ip: nope, gpu_model: cpu, gpu_count: 1}\n")
    proc = start("bootstrap", ["--hosts", str(hosts)], nats_url, tmp_path)
    code = await asyncio.to_thread(proc.wait, 30)
    out = (tmp_path / "bootstrap.log").read_text()
    assert code == 1
    assert "Traceback" not in out and "line 3, field 'nodes.1.ip'" in out
    assert (await bus.js.stream_info("CONTROL")).state.messages == 0  # nothing half-applied


STUCK_SERVICE = """
import asyncio, sys, time
import libs.service as shell
from libs.settings import Settings

class Stuck:
    name = "stuck"
    async def start(self, bus):  # a thread that will not end (a GEMM in C++)
        asyncio.get_running_loop().run_in_executor(None, time.sleep, 3600)
    async def stop(self): await asyncio.Event().wait()  # never returns
    def health(self): return {}

shell.STOP_STEP_S = shell.SERVICE_STOP_S = shell.EXIT_THREADS_S = 1.0
sys.exit(shell.serve(Stuck(), Settings()))
"""


async def test_a_stop_that_hangs_is_named_and_bounded_and_sigusr1_dumps_stacks(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    proc = subprocess.Popen([sys.executable, "-c", STUCK_SERVICE], cwd=ROOT,
                            env={**env, "PRIMUS_NATS_URL": nats_url}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        await wait_healthy(bus, "stuck")
        proc.send_signal(signal.SIGUSR1)  # a dump, not a stop
        assert (await wait_healthy(bus, "stuck"))["ok"] is True
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 20)
    finally:
        proc.kill()
    out = proc.stdout.read().decode()  # type: ignore[union-attr]
    assert code == 0, out
    assert "Current thread" in out and "most recent call first" in out  # faulthandler
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    overran = [e for e in events if e["event"] == "stop step overran; going on"]
    assert [e["step"] for e in overran] == ["stop service"], out
    assert [e["event"] for e in events[-2:]] == [
        "stopped", "threads still working at exit; leaving without them"], out
    assert events[-1]["threads"] == ["service-worker_0"]
