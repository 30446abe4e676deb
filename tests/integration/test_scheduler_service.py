"""The scheduler service on a real bus: pending jobs carry a reason and a
queue position (shown by `primus-safe jobs` and `explain`), and a
higher-priority job preempts a lower one, which is checkpointed, requeued at
the head and placed again once room returns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from tests.helpers import ROOT, ready_nodes, run_cli, until

pytestmark = pytest.mark.timeout(180)


def scheduler(nats_url: str, state: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    full.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(state), **env)
    return subprocess.Popen([sys.executable, "-m", "cli.main", "scheduler"], env=full, cwd=ROOT,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def submit(job: str, *, workers: int, priority: str, seconds: float, **kw: Any) -> JobSubmitted:
    spec = JobSpec(name=job, workers=workers, gpus_per_worker=1, priority=priority,  # type: ignore[arg-type]
                   command=["python", "-c", f"import time; time.sleep({seconds})"],
                   workdir=str(ROOT), **kw)
    return JobSubmitted(source="test", job=job, data=JobSubmittedData(spec=spec))


async def record(bus: Bus, job: str) -> dict[str, Any]:
    kv = await bus.kv("jobs")
    return json.loads((await kv.get(job)).value)



async def test_reasons_positions_and_preemption(nats_url: str, bus: Bus, tmp_path: Path) -> None:
    state = tmp_path / "state"
    sched_file = tmp_path / "scheduler.yaml"
    sched_file.write_text("preemption_grace_s: 5\nworkspaces:\n  - {name: default}\n")
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1"), "n3": (1, "r2")})
    proc = scheduler(nats_url, state, tmp_path / "sched.log",
                     PRIMUS_SCHEDULER_CONFIG=str(sched_file))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    try:
        await bus.publish(submit("low", workers=2, priority="medium", seconds=60))

        async def low_running() -> bool:
            return (await record(bus, "low"))["status"] == "running"

        await until(low_running, "the low-priority job to run")
        await bus.publish(submit("big", workers=3, priority="medium", seconds=1))

        async def big_explained() -> dict[str, Any] | None:
            r = await record(bus, "big")
            return r if r["reason"] else None

        big = await until(big_explained, "a reason for the job that cannot fit")
        assert big["status"] == "pending" and big["position"] == 1
        assert "needs 3 GPUs" in big["reason"]
        shown = await asyncio.to_thread(run_cli, "jobs", "--json", env=env)
        rows = {r["job"]: r for r in json.loads(shown.stdout)}
        assert rows["big"]["position"] == 1 and "needs 3 GPUs" in rows["big"]["reason"]
        text = (await asyncio.to_thread(run_cli, "explain", "big", env=env)).stdout
        assert "waits: position 1 in workspace default" in text and "needs 3 GPUs" in text

        # big cannot preempt a job of its own class. A high-priority job needs
        # low's GPUs: low is preempted, and comes back first once urgent is done.
        await bus.publish(submit("urgent", workers=2, priority="high", seconds=1))

        async def urgent_ran() -> bool:
            return (await record(bus, "urgent"))["status"] == "completed"

        await until(urgent_ran, "the urgent job to run and finish")
        low = await record(bus, "low")
        assert low["attempt"] >= 1 and low["retries"] == 0  # preemption spends no retry

        async def low_back() -> bool:
            r = await record(bus, "low")
            return r["status"] == "running" and r["attempt"] == 2

        await until(low_back, "the preempted job to be placed again", timeout=90)
        last = (await bus.js.stream_info("CONTROL")).state.last_seq
        kinds = [json.loads((await bus.js.get_msg("CONTROL", s)).data) for s in range(1, last + 1)]
        preempted = [k for k in kinds if k["type"] == "job.preempted"]
        assert [(p["job"], p["data"]["preemptor"]) for p in preempted] == [("low", "urgent")]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        reap_all(state)
    assert code == 0


async def test_a_lost_end_of_job_is_published_again_on_a_redelivered_exit(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """The scheduler saves a job's end, then publishes it: when that publish
    is lost (NATS away) the worker's exit comes again, and the end must go
    out then, once."""
    from libs.events import WorkerExited, WorkerExitedData

    state = tmp_path / "state"
    await ready_nodes(bus, {"n1": (1, "r1")})
    proc = scheduler(nats_url, state, tmp_path / "sched.log")
    subject = "safe.job.short.completed"
    try:
        await bus.publish(submit("short", workers=1, priority="medium", seconds=0.1))

        async def completed() -> bool:
            return (await record(bus, "short"))["status"] == "completed"

        await until(completed, "the job to complete")
        await until(lambda: bus.js.get_last_msg("CONTROL", subject), "job.completed")
        # As if that publish had never reached the stream: gone, and its id
        # out of the de-duplication window.
        config = (await bus.js.stream_info("CONTROL")).config
        config.duplicate_window = 1.0
        await bus.js.update_stream(config)
        await bus.js.purge_stream("CONTROL", subject=subject)
        await asyncio.sleep(1.5)
        attempt = (await record(bus, "short"))["attempt"]

        async def end_again() -> Any:
            """The exit, delivered again, as often as it takes: the server
            forgets a de-duplicated id on a timer, so the first republished
            end may still fall inside the window on a busy machine."""
            await bus.publish(WorkerExited(source="test", node="n1", job="short",
                                           data=WorkerExitedData(rank=0, attempt=attempt,
                                                                 exit_code=0)))
            for _ in range(10):
                await asyncio.sleep(0.3)
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    return await bus.js.get_last_msg("CONTROL", subject)
            return None

        again = await until(end_again, "job.completed again")
        assert json.loads(again.data)["id"] == "short-completed"
        info = await bus.js.stream_info("CONTROL", subjects_filter=subject)
        assert info.state.subjects == {subject: 1}
        # Once it is there, a further redelivery adds nothing: past the 1 s
        # window, so the stream check (not de-duplication) is what holds.
        await asyncio.sleep(1.5)
        await bus.publish(WorkerExited(source="test", node="n1", job="short", data=WorkerExitedData(
            rank=0, attempt=attempt, exit_code=0)))
        await asyncio.sleep(2)
        info = await bus.js.stream_info("CONTROL", subjects_filter=subject)
        assert info.state.subjects == {subject: 1}
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)
        reap_all(state)


async def test_a_node_state_that_changes_nothing_placed_wakes_no_cycle(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """At 12,500 nodes bootstrap's notes (a new reason, the same state) come
    several a second; each used to cost a cycle over every node. A change
    that matters (a cordon) still wakes one at once."""
    from libs.events import NodeStateChanged, NodeStateData
    from tests.helpers import wait_healthy

    await ready_nodes(bus, {"n1": (1, "r1")})
    proc = scheduler(nats_url, tmp_path / "state", tmp_path / "sched.log")
    try:
        await until(lambda: wait_healthy(bus, "scheduler", timeout=2), "the scheduler", 60)

        async def ready() -> bool:
            return (await wait_healthy(bus, "scheduler"))["nodes_ready"] == 1

        await until(ready, "the node ready in the scheduler")
        before, t0 = (await wait_healthy(bus, "scheduler"))["cycles"], time.monotonic()
        for i in range(20):  # farther apart than cycles are coalesced
            await bus.publish(NodeStateChanged(source="test", node="n1", data=NodeStateData(
                state="ready", reason=f"re-benched, passed ({i})")))
            await asyncio.sleep(0.15)
        cycles = (await wait_healthy(bus, "scheduler"))["cycles"] - before
        assert cycles <= time.monotonic() - t0 + 2  # the once-a-second cycle, nothing more
        cordon_at = (await wait_healthy(bus, "scheduler"))["cycles"]
        await bus.publish(NodeStateChanged(source="test", node="n1", data=NodeStateData(
            state="ready", reason="operator", schedulable=False)))

        async def woke() -> bool:
            return (await wait_healthy(bus, "scheduler"))["cycles"] > cordon_at

        await until(woke, "a cycle for the cordon", timeout=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)


async def test_a_node_its_driver_found_down_is_held_out_and_costs_no_retry(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """A node dies, and before failover judges it a gang is placed there
    (a resume, a queued job): the driver cannot start that rank. The job
    spends no retry, and the scheduler keeps the node out of placement, so
    the gang waits for room rather than landing on the dead node again,
    and runs on the next node that comes."""
    from libs.drivers.local import power_off
    from tests.helpers import wait_healthy

    state = tmp_path / "state"
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1")})
    power_off(state, "n1")  # dead; failover has not said so (no failover runs here)
    proc = scheduler(nats_url, state, tmp_path / "sched.log")
    try:
        await bus.publish(submit("gang", workers=2, priority="medium", seconds=600,
                                 max_retry=1))

        async def requeued() -> dict[str, Any] | None:
            r = await record(bus, "gang")
            # Its reason first says the rank could not start, then (the
            # next cycle) why it waits.
            return r if r["status"] == "pending" and "held out" in r["reason"] else None

        job = await until(requeued, "the gang requeued after n1 refused its rank")
        assert (job["attempt"], job["retries"]) == (1, 0) and "n1 until" in job["reason"], job
        held = (await wait_healthy(bus, "scheduler"))["nodes_held"]
        assert list(held) == ["n1"] and held["n1"]["reason"] == "node n1 is down"
        await asyncio.sleep(2)  # the gang fits only with n1: it waits, placed nowhere
        job = await record(bus, "gang")
        assert (job["status"], job["attempt"], job["retries"]) == ("pending", 1, 0), job
        await ready_nodes(bus, {"n3": (1, "r1")})

        async def running() -> dict[str, Any] | None:
            r = await record(bus, "gang")
            return r if r["status"] == "running" else None

        job = await until(running, "the gang running on n2 and n3", timeout=30)
        assert sorted(s["node"] for s in job["slots"]) == ["n2", "n3"]
        assert (job["attempt"], job["retries"]) == (2, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)
        reap_all(state)
