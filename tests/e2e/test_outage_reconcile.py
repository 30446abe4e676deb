"""A job that finishes while the bus is down is not left running, and one
whose workers were killed while no driver watched runs again as a visible
attempt.

On the embedded stack a 2-rank job trains; in its last iterations
nats-server is SIGKILLed, so neither the workers' telemetry nor their exits
can be published. The workers finish anyway (the driver's supervisors
record each exit in a file), the whole stack is stopped, and a new stack in
the same state directory reconciles: the scheduler rebuilds from the
``jobs`` bucket, the driver adopts the workers it finds and reports the
exits recorded while no one could hear them, and the job completes, its
GPUs free — not ``running`` for ever.

When the stack is stopped mid-training its workers are reaped with their
supervisors (no exit recorded). The next stack's driver reports them lost,
and the scheduler runs the gang again as attempt 2 (new event ids, so
nothing is swallowed by de-duplication), first in the queue, without
spending a retry; ``explain`` and Lens show both attempts."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from cli.explain import describe
from libs.bus import Bus
from libs.embedded import EmbeddedStack
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from libs.sdk import latest_complete_checkpoint
from tests.e2e.test_embedded_stack import bucket, poll
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

ITERATIONS = 200


def test_exits_recorded_while_the_bus_was_down_end_the_job_after_a_restart(
        tmp_path: Path) -> None:
    state = tmp_path / "stack"
    stack = EmbeddedStack(state, nodes=2).start()
    try:
        job = asyncio.run(_train_until_the_bus_dies(stack))
    finally:
        stack.stop()  # services that lost their bus are stopped (or killed) all the same
    exits = sorted((state / "exits").glob(f"{job}-a1-r*"))
    assert len(exits) == 2 and all(p.read_text().strip() == "0" for p in exits)

    again = EmbeddedStack(state, nodes=2).start()
    try:
        record = asyncio.run(_ended(again, job))
    finally:
        codes = again.stop()
    assert record["status"] == "completed" and record["attempt"] == 1, record
    assert codes == dict.fromkeys(codes, 0), f"unclean exits: {codes}; {again.stragglers}"


async def _train_until(stack: EmbeddedStack, job: str, iteration: int) -> None:
    """Submit a 2-rank job and return once it checkpointed ``iteration``."""
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "e2e", token=stack.nats.token)
    try:
        async def all_ready() -> bool:
            nodes = await bucket(bus, "nodes")
            return len(nodes) == 2 and all(n["state"] == "ready" for n in nodes.values())

        await poll(all_ready, "nodes to be ready")
        spec = JobSpec(name=job, workers=2, gpus_per_worker=1, checkpoint_interval=20,
                       workdir=str(ROOT), command=["python", "examples/train_tiny.py",
                                                   "--iterations", str(ITERATIONS)])
        await bus.publish(JobSubmitted(source="e2e", job=job, data=JobSubmittedData(spec=spec)))
        ckpts = stack.state_dir / "checkpoints" / job

        async def far_enough() -> bool:
            newest = latest_complete_checkpoint(ckpts, 2)
            return newest is not None and newest.iteration >= iteration

        await poll(far_enough, f"checkpoint {iteration}", timeout=180, every=0.05)
    finally:
        await bus.close()


async def _train_until_the_bus_dies(stack: EmbeddedStack) -> str:
    assert stack.nats is not None
    job = "last-steps"
    await _train_until(stack, job, ITERATIONS - 60)
    stack.nats.kill()  # SIGKILL: no exit, no telemetry can be published now

    async def finished() -> bool:
        return len(list((stack.state_dir / "exits").glob(f"{job}-a1-r*"))) == 2

    await poll(finished, "both workers to finish with the bus down", timeout=120)
    return job


async def _ended(stack: EmbeddedStack, job: str) -> dict[str, object]:
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "e2e", token=stack.nats.token)
    try:
        async def completed() -> dict[str, object] | None:
            record = (await bucket(bus, "jobs")).get(job)
            return record if record and record["status"] in ("completed", "failed") else None

        started = time.monotonic()
        record = await poll(completed, "the job to end after the restart", timeout=120)
        print(f"reconciled {time.monotonic() - started:.1f} s after the restart: "
              f"{json.dumps(record)[:200]}")
        return record
    finally:
        await bus.close()


def test_workers_killed_while_no_driver_watched_run_again_as_a_new_attempt(
        tmp_path: Path) -> None:
    state = tmp_path / "stack"
    job = "reaped"
    stack = EmbeddedStack(state, nodes=2).start()
    try:
        asyncio.run(_train_until(stack, job, 20))
    finally:
        stack.stop()  # the scheduler stops first; then its workers are reaped (SIGKILL)
    assert not list((state / "exits").glob(f"{job}-a1-r*")), "an exit was recorded after all"

    again = EmbeddedStack(state, nodes=2).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_STATE_DIR=str(state))
    try:
        record = asyncio.run(_ended(again, job))

        def explained() -> dict[str, object] | None:
            out = run_cli("explain", job, "--json", env=env, timeout=60)
            doc = json.loads(out.stdout) if out.returncode == 0 else None
            placed = [e for e in (doc or {}).get("history", []) if e["type"] == "job.placed"]
            return doc if len(placed) == 2 else None

        doc = asyncio.run(poll(lambda: asyncio.to_thread(explained),
                               "Lens to hold both attempts", timeout=60))
    finally:
        codes = again.stop()
    assert record["status"] == "completed", record
    assert record["attempt"] == 2 and record["retries"] == 0, record
    history = doc["history"]
    lost = [json.loads(e["data"]) for e in history if e["type"] == "worker.exited"]
    assert sorted((d["attempt"], d["rank"], d.get("lost", False)) for d in lost) == [
        (1, 0, True), (1, 1, True), (2, 0, False), (2, 1, False)], lost
    started = sorted(json.loads(e["data"])["attempt"] for e in history
                     if e["type"] == "worker.started")
    assert started == [1, 1, 2, 2], started
    text = describe(doc)
    assert "attempt 2, 0 of 3 retries used" in text and "(lost)" in text, text
    log = (state / "jobs" / job / "attempt-2" / "rank-0.log").read_text()
    assert "resum" in log.lower(), log[-2000:]
    assert codes == dict.fromkeys(codes, 0), f"unclean exits: {codes}; {again.stragglers}"
