"""An operator's hand on a job, on a real bus with the real scheduler and
real training workers (``examples/train_tiny.py``, DDP over gloo):
``stop`` checkpoints and frees the GPUs, ``resume`` continues from that
checkpoint, ``cancel`` is final, ``delete`` forgets; wrong ids and final
states are clear errors; ``max_runtime_s`` and ``ttl_after_finished_s``
are honoured."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cli.client import CliError
from cli.job_verbs import _control
from libs.bus import Bus
from libs.drivers.local import free_port, reap_all
from libs.embedded import nats_server_binary, wait_for_port
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from libs.records import JobRecord
from libs.sdk import latest_complete_checkpoint
from tests.helpers import ROOT, job_record, ready_nodes, run_cli, until
from tests.integration.test_scheduler_service import scheduler

pytestmark = pytest.mark.timeout(300)

TRAIN = str(ROOT / "examples" / "train_tiny.py")


async def stored(bus: Bus, job: str) -> dict[str, Any] | None:
    kv = await bus.kv("jobs")
    try:
        return json.loads((await kv.get(job)).value)
    except Exception:
        return None


async def events_of(bus: Bus, job: str) -> list[str]:
    last = (await bus.js.stream_info("CONTROL")).state.last_seq
    docs = [json.loads((await bus.js.get_msg("CONTROL", s)).data) for s in range(1, last + 1)]
    return [d["type"] for d in docs if d.get("job") == job]


def cli(env: dict[str, str], *args: str) -> Any:
    return run_cli(*args, env=env, timeout=180)


async def test_stop_resume_cancel_delete(nats_url: str, bus: Bus, tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "scheduler.yaml"
    config.write_text("stop_grace_s: 20\nworkspaces:\n  - {name: default}\n")
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1")})
    proc = scheduler(nats_url, state, tmp_path / "sched.log",
                     PRIMUS_SCHEDULER_CONFIG=str(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    job = "train"
    spec = JobSpec(name=job, workers=2, gpus_per_worker=1, checkpoint_interval=10,
                   command=["python", TRAIN, "--iterations", "100000"], workdir=str(ROOT))
    try:
        await bus.publish(JobSubmitted(source="test", job=job,
                                       data=JobSubmittedData(spec=spec)))
        ckpts = state / "checkpoints" / job

        async def checkpointed() -> Any:
            return latest_complete_checkpoint(ckpts, 2)

        await until(checkpointed, "a first checkpoint", timeout=120)

        # stop: the workers checkpoint where they are and exit; GPUs freed.
        stop = await asyncio.to_thread(cli, env, "stop", job, "--reason", "maintenance",
                                       "--json")
        assert stop.returncode == 0, stop.stderr
        answer = json.loads(stop.stdout)
        assert answer["status"] == "stopped" and answer["changed"] is True
        record = await stored(bus, job)
        assert record is not None and record["status"] == "stopped"
        assert record["slots"] == [] and record["retries"] == 0  # a stop spends no retry
        assert "maintenance" in record["reason"] and record["stopped_by"]
        at = latest_complete_checkpoint(ckpts, 2)
        assert at is not None
        logs = sorted((state / "jobs" / job / "attempt-1").glob("rank-*.log"))
        assert all(f"stopped at iteration {at.iteration}" in p.read_text() for p in logs)

        # tables an operator can copy from: nothing cut, in a pipe at 40 columns
        narrow = {**env, "COLUMNS": "40"}
        table = (await asyncio.to_thread(cli, narrow, "jobs")).stdout.splitlines()
        assert table[0].split()[:3] == ["JOB", "STATUS", "ATTEMPT"]
        assert table[1].split()[:4] == [job, "stopped", "1", "0/3"]
        assert "maintenance" in table[1]
        assert (await asyncio.to_thread(cli, narrow, "jobs", "-o", "name")).stdout == f"{job}\n"
        wide = (await asyncio.to_thread(cli, narrow, "jobs", "-o", "wide")).stdout
        assert "WORKSPACE" in wide and "default" in wide

        again = await asyncio.to_thread(cli, env, "stop", job, "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False

        # resume: queued again, the next attempt starts from that checkpoint.
        resume = await asyncio.to_thread(cli, env, "resume", job)
        assert resume.returncode == 0, resume.stderr

        async def resumed() -> bool:
            log = state / "jobs" / job / "attempt-2" / "rank-0.log"
            return log.exists() and f"resumed from checkpoint at iteration {at.iteration}" \
                in log.read_text()

        await until(resumed, "the second attempt to resume from the checkpoint", timeout=90)

        # cancel: final. Resuming or stopping it then says why not.
        cancel = await asyncio.to_thread(cli, env, "cancel", job, "--json")
        assert cancel.returncode == 0, cancel.stderr
        assert json.loads(cancel.stdout)["status"] == "cancelled"
        refused = await asyncio.to_thread(cli, env, "resume", job)
        assert refused.returncode == 1
        assert f"cannot resume job {job}: it is cancelled, a final state" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        explain = (await asyncio.to_thread(cli, env, "explain", job)).stdout
        assert f"job {job} (train): cancelled" in explain

        unknown = await asyncio.to_thread(cli, env, "stop", "no-such-job")
        assert unknown.returncode == 1 and "job no-such-job not found" in unknown.stderr
        bad = await asyncio.to_thread(cli, env, "cancel", "bad.id")
        assert bad.returncode == 1 and "not a valid name" in bad.stderr

        # delete: forgotten by the scheduler; every event stays in the stream.
        delete = await asyncio.to_thread(cli, env, "delete", job, "--json")
        assert delete.returncode == 0, delete.stderr
        assert json.loads(delete.stdout)["status"] == "deleted"
        assert await stored(bus, job) is None
        gone = await asyncio.to_thread(cli, env, "delete", job)
        assert gone.returncode == 1 and "not found" in gone.stderr
        kinds = await events_of(bus, job)
        for kind in ("job.stop", "job.stopped", "job.resume", "job.cancel", "job.cancelled",
                     "job.delete", "job.deleted"):
            assert kind in kinds, kinds
        assert kinds.count("job.placed") == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        reap_all(state)
    assert code == 0


async def test_max_runtime_and_ttl_after_finished(nats_url: str, bus: Bus,
                                                  tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "scheduler.yaml"
    config.write_text("stop_grace_s: 2\nworkspaces:\n  - {name: default}\n")
    await ready_nodes(bus, {"n1": (1, "r1")})
    proc = scheduler(nats_url, state, tmp_path / "sched.log",
                     PRIMUS_SCHEDULER_CONFIG=str(config))
    try:
        slow = JobSpec(name="slow", workers=1, gpus_per_worker=1, max_runtime_s=2,
                       command=["python", "-c", "import time; time.sleep(600)"],
                       workdir=str(ROOT))
        await bus.publish(JobSubmitted(source="test", job="slow",
                                       data=JobSubmittedData(spec=slow)))

        async def failed() -> dict[str, Any] | None:
            r = await stored(bus, "slow")
            return r if r and r["status"] == "failed" else None

        ended = await until(failed, "the job past its max_runtime_s to fail", timeout=60)
        assert ended["code"] == "deadline" and "max_runtime_s (2 s)" in ended["reason"]
        assert ended["retries"] == 0 and ended["slots"] == []

        quick = JobSpec(name="quick", workers=1, gpus_per_worker=1, ttl_after_finished_s=1,
                        command=["python", "-c", "pass"], workdir=str(ROOT))
        await bus.publish(JobSubmitted(source="test", job="quick",
                                       data=JobSubmittedData(spec=quick)))

        async def forgotten() -> bool:
            return "job.deleted" in await events_of(bus, "quick") \
                and await stored(bus, "quick") is None

        await until(forgotten, "the finished job to be forgotten after its TTL", timeout=60)
        assert "job.completed" in await events_of(bus, "quick")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        reap_all(state)
    assert code == 0


async def test_drain_moves_a_job_without_spending_a_retry(nats_url: str, bus: Bus,
                                                         tmp_path: Path) -> None:
    """`node drain`: the job checkpoints, leaves the node and runs on from its
    checkpoint elsewhere; the node is cordoned until `node uncordon`."""
    from libs.settings import Settings
    from services.bootstrap.app import Bootstrap

    state = tmp_path / "state"
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1"), "n3": (1, "r1")})
    bootstrap = Bootstrap(Settings(nats_url=nats_url, state_dir=tmp_path / "boot"))
    await bootstrap.start(bus)  # no hosts file: it keeps the nodes it finds
    proc = scheduler(nats_url, state, tmp_path / "sched.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    job = "moved"
    spec = JobSpec(name=job, workers=2, gpus_per_worker=1, checkpoint_interval=10,
                   max_retry=0, command=["python", TRAIN, "--iterations", "100000"],
                   workdir=str(ROOT))
    try:
        await bus.publish(JobSubmitted(source="test", job=job,
                                       data=JobSubmittedData(spec=spec)))

        async def checkpointed() -> Any:
            return latest_complete_checkpoint(state / "checkpoints" / job, 2)

        await until(checkpointed, "a first checkpoint", timeout=120)
        first = await stored(bus, job)
        assert first is not None
        victim = first["slots"][0]["node"]
        drain = await asyncio.to_thread(cli, env, "node", "drain", victim, "--reason",
                                        "firmware", "--json")
        assert drain.returncode == 0, drain.stderr
        assert json.loads(drain.stdout)["moved"] == [job]

        async def moved() -> dict[str, Any] | None:
            r = await stored(bus, job)
            return r if r and r["status"] == "running" and r["attempt"] == 2 else None

        again = await until(moved, "the job to run on the other nodes", timeout=90)
        assert victim not in [s["node"] for s in again["slots"]]
        assert again["retries"] == 0  # max_retry 0: a drain must not spend one
        at = latest_complete_checkpoint(state / "checkpoints" / job, 2)
        assert at is not None

        async def resumed() -> bool:
            log = state / "jobs" / job / "attempt-2" / "rank-0.log"
            return log.exists() and "resumed from checkpoint" in log.read_text()

        await until(resumed, "attempt 2 to resume from the checkpoint", timeout=60)
        nodes = json.loads((await asyncio.to_thread(cli, env, "nodes", "--json")).stdout)
        assert {n["node"]: n["cordoned"] for n in nodes}[victim] is True
        back = await asyncio.to_thread(cli, env, "node", "uncordon", victim)
        assert back.returncode == 0, back.stderr
        cancel = await asyncio.to_thread(cli, env, "cancel", job)
        assert cancel.returncode == 0, cancel.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        await bootstrap.stop()
        reap_all(state)
    assert code == 0


async def test_a_request_the_job_outran_is_answered_at_once(bus: Bus) -> None:
    """The job moved between the CLI's check and the scheduler reading the
    request (it completed; someone else cancelled it): the scheduler will act
    on nothing, so the CLI says why at once instead of waiting out --timeout."""
    kv = await bus.kv("jobs")

    async def becomes(job: str, status: str, after_stop: str | None = None) -> None:
        await asyncio.sleep(0.5)  # after the request went out
        record = JobRecord.model_validate_json(job_record(job, status, "n1"))
        record.after_stop = after_stop  # type: ignore[assignment]
        await kv.put(job, record.model_dump_json().encode())

    await kv.put("done-soon", job_record("done-soon", "running", "n1"))
    moved = asyncio.create_task(becomes("done-soon", "completed"))
    started = asyncio.get_running_loop().time()
    with pytest.raises(CliError, match=r"cannot stop job done-soon: it is completed, a final "
                                       r"state .* \(it changed after the stop was sent\)"):
        await _control(bus, "stop", "done-soon", "", True, 60)
    await moved
    assert asyncio.get_running_loop().time() - started < 10

    await kv.put("other-op", job_record("other-op", "running", "n1"))
    moved = asyncio.create_task(becomes("other-op", "stopping", "cancel"))
    result = await _control(bus, "cancel", "other-op", "", True, 60)
    await moved
    assert result["changed"] is False and "already being cancelled" in result["message"]


def test_a_verb_on_a_bus_whose_jetstream_does_not_answer_fails_at_once(tmp_path: Path) -> None:
    """A NATS server without JetStream (or a cluster without its quorum):
    services wait for it (``Bus.kv``'s ``ready_s``), an operator's verb does
    not. It fails on the first answer with one line on stderr, and its
    stdout, which scripts read with ``--json``, carries no retry warnings."""
    port = free_port()
    server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        env.update(PRIMUS_NATS_URL=f"nats://127.0.0.1:{port}",
                   PRIMUS_STATE_DIR=str(tmp_path / "state"))
        for verb in (["node", "cordon", "n1", "--json"], ["stop", "j1", "--json"],
                     ["jobs", "--json"]):
            started = time.monotonic()
            out = run_cli(*verb, env=env, timeout=120)
            took = time.monotonic() - started
            assert out.returncode != 0, (verb, out.stdout)
            assert out.stdout == "", (verb, out.stdout[:500])
            assert took < 15, (verb, took, out.stderr[-500:])
            # One line for the operator, not a traceback.
            assert "Traceback" not in out.stderr, (verb, out.stderr[-800:])
            assert out.stderr.strip().splitlines()[-1].startswith("primus-safe: "), \
                (verb, out.stderr[-500:])
    finally:
        server.terminate()
        server.wait(10)
