"""A node whose agent falls silent while the driver sees its workers run is
watched, not evacuated, and failover asks the driver again every
``SUSPECT_RECHECK_S``. The driver answers through the scheduler, so right
after a NATS or scheduler restart nobody answers for a moment: a chaos run
(seed 1, ``tests/chaos/test_chaos_stack.py``) evacuated a node whose agent
was restarting because the first question after NATS came back found no
responder. No word now keeps the node watched; the driver saying the
workers stopped, or no word for ``no_word_s``, opens the fault.

Failover runs in-process on a real nats-server; the test plays the
scheduler's part on ``NODE_WORKERS`` and the agents' heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.base import NODE_WORKERS, NodeWorkers, NodeWorkersRequest
from libs.events import (
    FaultCloseData,
    FaultCloseRequested,
    HeartbeatData,
    JobPlaced,
    JobPlacedData,
    NodeHeartbeat,
    WorkerSlot,
)
from libs.settings import Settings
from services.failover.app import SUSPECT_RECHECK_S, Failover
from tests.helpers import job_record, ready_nodes, until

pytestmark = pytest.mark.timeout(90)

INTERVAL_S = 0.5  # beats; 3 missed: a 1.5 s deadline
LEASE_S = 3  # the scheduler's lease: failover waits 6 s for the driver's word


async def _beat(bus: Bus, nodes: set[str], stop: asyncio.Event) -> None:
    seq = 0
    while not stop.is_set():
        seq += 1
        for node in sorted(nodes):
            await bus.publish(NodeHeartbeat(source=f"bench-agent:{node}", node=node,
                                            time=datetime.now(UTC),
                                            data=HeartbeatData(seq=seq, pid=1,
                                                               interval_s=INTERVAL_S)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), INTERVAL_S / 2)


@contextlib.asynccontextmanager
async def two_nodes_one_job(nats_url: str, bus: Bus,
                            tmp_path: Path) -> AsyncIterator[tuple[Failover, set[str]]]:
    """In-process failover; n1 and n2 beat (the set says which) and run j1,
    and failover has heard both."""
    await ready_nodes(bus, {"n1": (8, "r1"), "n2": (8, "r1")})
    failover = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "state",
                                 heartbeat_interval_s=INTERVAL_S, heartbeat_missed=3,
                                 leader_ttl_s=LEASE_S))
    await failover.start(bus)
    beating = {"n1", "n2"}
    stop = asyncio.Event()
    beats = asyncio.create_task(_beat(bus, beating, stop))
    try:
        await bus.publish(JobPlaced(source="scheduler", job="j1", data=JobPlacedData(
            attempt=1, workers=[WorkerSlot(rank=0, node="n1", gpus=1),
                                WorkerSlot(rank=1, node="n2", gpus=1)])))
        await until(lambda: asyncio.sleep(0, failover.health()["beats_heard"] > 0 and
                                          failover.placements.get("j1")),
                    "failover to hear the beats and the placement", 30)
        yield failover, beating
    finally:
        stop.set()
        await beats
        await failover.stop()


async def watching(failover: Failover, nodes: list[str], what: str) -> None:
    await until(lambda: asyncio.sleep(0, failover.health()[
        "silent_agents_with_live_workers"] == nodes), what, 15)


def open_faults(failover: Failover) -> Any:
    return asyncio.sleep(0, [f for f in failover.book.faults.values() if f.status != "closed"])


async def test_no_word_from_the_driver_keeps_a_silent_node_watched_for_a_while(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    async def answer(request: NodeWorkersRequest) -> NodeWorkers:  # plays the scheduler
        return NodeWorkers(node=request.node, workers=1, alive=True)

    async with two_nodes_one_job(nats_url, bus, tmp_path) as (failover, beating):
        served = await bus.serve(NODE_WORKERS, answer)
        try:
            # n1's agent restarts: silent, its worker runs on.
            beating.discard("n1")
            await watching(failover, ["n1"], "n1 to be watched")
            # The scheduler restarts: nobody answers failover's next question.
            await served.stop()
            await asyncio.sleep(SUSPECT_RECHECK_S + 0.5)
            health = failover.health()
            assert health["faults_open"] == [] and health[
                "silent_agents_with_live_workers"] == ["n1"], health
            served = await bus.serve(NODE_WORKERS, answer)
            await asyncio.sleep(SUSPECT_RECHECK_S + 0.5)  # answered: still running
            beating.add("n1")  # the agent is back
            await watching(failover, [], "n1 to be heard again")
            assert failover.health()["faults_open"] == []

            # n2's agent falls silent and the driver stays away: after
            # no_word_s without its word the node is judged by its heartbeats.
            beating.discard("n2")
            await watching(failover, ["n2"], "n2 to be watched")
            await served.stop()
            lost = asyncio.get_running_loop().time()
            [fault] = await until(lambda: open_faults(failover), "n2's fault", 30)
            waited = asyncio.get_running_loop().time() - lost
            assert fault.key == "n2" and fault.kind == "heartbeat_missed"
            assert "no word on its workers" in fault.reason, fault.reason
            assert failover.no_word_s - SUSPECT_RECHECK_S <= waited <= failover.no_word_s + 3, \
                waited
        finally:
            await served.stop()


async def test_a_node_silent_while_nobody_answers_is_watched_until_the_driver_does(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """An upgrade of the whole platform restarts the scheduler with the
    agents: a node falls silent while nobody answers for the driver (a chaos
    run, seed 30 with 8 kills, evacuated node-1 so). It is watched from its
    last beat; the driver, back, says n1's workers run (its agent then beats
    again: no fault) and n2's stopped (its fault opens at once)."""
    async def answer(request: NodeWorkersRequest) -> NodeWorkers:  # plays the scheduler
        return NodeWorkers(node=request.node, workers=1, alive=request.node == "n1")

    async with two_nodes_one_job(nats_url, bus, tmp_path) as (failover, beating):
        beating.clear()  # both agents restart while no scheduler answers
        await watching(failover, ["n1", "n2"], "both nodes watched")
        assert failover.health()["faults_open"] == []
        served = await bus.serve(NODE_WORKERS, answer)  # the scheduler is back
        try:
            [fault] = await until(lambda: open_faults(failover), "n2's fault",
                                  SUSPECT_RECHECK_S + 5)
            assert fault.key == "n2" and "its workers have stopped too" in fault.reason, fault
            beating.add("n1")  # n1's agent is back
            await watching(failover, [], "n1 to be heard again")
            assert [f.key for f in (await open_faults(failover))] == ["n2"]
        finally:
            await served.stop()


async def test_a_silent_node_whose_fault_an_operator_closed_faults_again(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """An operator closes the fault of a node that is still dead (they
    thought it repaired). Bootstrap benches it again, which nobody answers;
    failover reported the silence once, so the node sat in ``repair`` with
    no open fault, for good. Now it gets one deadline to beat, then a new
    fault opens; a node that does beat again stays clear."""
    async def answer(request: NodeWorkersRequest) -> NodeWorkers:  # plays the scheduler
        return NodeWorkers(node=request.node, workers=1, alive=False)

    async with two_nodes_one_job(nats_url, bus, tmp_path) as (failover, beating):
        served = await bus.serve(NODE_WORKERS, answer)
        try:
            beating.clear()  # both nodes die
            first = await until(lambda: open_faults(failover), "both faults", 15)
            assert sorted(f.key for f in first) == ["n1", "n2"]
            beating.add("n1")  # n1 was repaired; n2 was not
            for fault in first:
                await bus.publish(FaultCloseRequested(source="cli", node=fault.key,
                                                      data=FaultCloseData(
                                                          fault_id=fault.fault_id, by="op")))
            [again] = await until(
                lambda: asyncio.sleep(0, [f for f in failover.book.faults.values()
                                          if f.status != "closed" and f not in first]),
                "n2's new fault", 15)
            assert again.key == "n2" and again.kind == "heartbeat_missed", again
            await asyncio.sleep(2 * INTERVAL_S * 3)  # n1 keeps beating: no new fault
            assert [f.key for f in await open_faults(failover)] == ["n2"]
        finally:
            await served.stop()


async def test_a_failover_that_restarts_knows_where_jobs_run_from_the_records(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """An upgrade restarts failover with the agents. The placement of the
    running job was heard by the last failover, and the scheduler's
    re-announcement is dropped by JetStream as a repeat, so the new one
    learns where jobs run from the ``jobs`` bucket: a node whose agent is
    still restarting is watched while its workers run, not evacuated (a chaos
    run, seed 8, evacuated node-2 so, and the gang no longer fit)."""
    await ready_nodes(bus, {"n1": (8, "r1"), "n2": (8, "r1")})
    await (await bus.kv("jobs")).put("j1", job_record("j1", "running", "n1", "n2"))

    async def answer(request: NodeWorkersRequest) -> NodeWorkers:  # plays the scheduler
        return NodeWorkers(node=request.node, workers=1, alive=True)

    served = await bus.serve(NODE_WORKERS, answer)
    failover = Failover(Settings(nats_url=nats_url, state_dir=tmp_path / "state",
                                 heartbeat_interval_s=INTERVAL_S, heartbeat_missed=3,
                                 leader_ttl_s=LEASE_S))
    await failover.start(bus)
    try:
        assert failover._jobs_on("n2") == ["j1"]
        # n1 beats; n2's agent never comes back from the upgrade.
        stop = asyncio.Event()
        beats = asyncio.create_task(_beat(bus, {"n1"}, stop))
        try:
            await watching(failover, ["n2"], "n2 to be watched")
            assert failover.health()["faults_open"] == []
        finally:
            stop.set()
            await beats
    finally:
        await failover.stop()
        await served.stop()
