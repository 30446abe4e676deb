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
