"""Bench never disturbs training: a node that runs a job is skipped by a
sweep and refused by a split search and by ``bench run`` unless the
operator says ``--force`` (services/bench/busy.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.settings import Settings
from services.bench.busy import busy_nodes
from services.bench.coordinator import BenchCoordinator
from services.bench.protocol import SEARCH, SWEEP, SearchRequest, SweepRequest
from tests.helpers import job_record, ready_nodes, run_cli, until

pytestmark = pytest.mark.timeout(120)


def test_busy_nodes_are_those_a_job_holds() -> None:
    from libs.records import JobRecord

    records = [JobRecord.model_validate_json(job_record("a", "running", "n1", "n2")),
               JobRecord.model_validate_json(job_record("b", "stopping", "n3")),
               JobRecord.model_validate_json(job_record("c", "pending"))]
    assert busy_nodes(records) == {"n1": "a", "n2": "a", "n3": "b"}


async def test_sweeps_searches_and_runs_leave_a_training_node_alone(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1")})
    await (await bus.kv("jobs")).put("train-1", job_record("train-1", "running", "n1"))
    coordinator = BenchCoordinator(Settings(nats_url=nats_url, state_dir=tmp_path))
    await coordinator.start(bus)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_NATS_URL"] = nats_url
    try:
        async def leading() -> bool:
            reply = await bus.ask(SWEEP, SweepRequest(nodes=["n1"]), timeout_s=2)
            return reply.ok or "runs a job" in (reply.error or "")

        await until(leading, "the coordinator to lead", timeout=30)
        reply = await bus.ask(SWEEP, SweepRequest(nodes=["n1"]), timeout_s=5)
        assert not reply.ok and reply.skipped == {"n1": "runs job train-1"}  # type: ignore[attr-defined]
        search = await bus.ask(SEARCH, SearchRequest(nodes=["n1", "n2"]), timeout_s=5)
        assert not search.ok and "node n1 runs job train-1" in (search.error or "")

        run = await asyncio.to_thread(run_cli, "bench", "run", "--node", "n1", env=env)
        assert run.returncode == 1
        assert "node n1 runs job train-1: a bench would disturb it" in run.stderr
        assert "--force" in run.stderr and len(run.stderr.strip().splitlines()) == 1
        cli_search = await asyncio.to_thread(run_cli, "bench", "search", "n1", "n2", env=env)
        assert cli_search.returncode == 1 and "node n1 runs job train-1" in cli_search.stderr
    finally:
        await coordinator.stop()


async def test_heavy_probes_are_skipped_while_a_job_runs_on_the_node(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """The agent asks the driver (through the scheduler) before a GEMM probe:
    while workers run on its node the probe is skipped, not run; once they
    are gone it runs. Light probes (temperatures, ECC, ...) always run."""
    from libs.drivers.base import NODE_WORKERS, NodeWorkers, NodeWorkersRequest
    from services.bench.agent import BenchAgent

    config = tmp_path / "bench.yaml"
    config.write_text("probes:\n"
                      "  - {name: gemm, kind: gemm, interval_s: 0.3, failures_before_report: 1}\n"
                      "  - {name: count, kind: gpu_count, interval_s: 0.3}\n")
    workers = {"n1": 2}
    asked: list[str] = []

    async def answer(request: NodeWorkersRequest) -> NodeWorkers:  # plays the scheduler
        asked.append(request.node)
        running = workers.get(request.node, 0)
        return NodeWorkers(node=request.node, workers=running, alive=running > 0)

    served = await bus.serve(NODE_WORKERS, answer)
    agent = BenchAgent(Settings(nats_url=nats_url, state_dir=tmp_path), "n1", config)
    await agent.start(bus)
    try:
        async def probed(status: str) -> dict[str, object] | None:
            state = agent.schedule.snapshot()["gemm"]
            return state if state["last"] == status and state["runs"] >= 2 else None

        skipped = await until(lambda: probed("unavailable"), "the GEMM probe to be skipped")
        assert skipped["detail"] == "skipped: 2 worker(s) of a job run here"
        count = agent.schedule.snapshot()["count"]  # a read runs regardless
        assert count["runs"] >= 1 and not str(count["detail"]).startswith("skipped")
        assert asked and set(asked) == {"n1"}
        workers["n1"] = 0  # the job ended
        await until(lambda: probed("ok"), "the GEMM probe to run once the node is free")
    finally:
        await agent.stop()
        await served.stop()
