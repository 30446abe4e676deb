"""GPU rows name the job using each GPU, end to end: a bench agent (recorded
GPUs) learns its node's placements from the jobs bucket at start and from
the scheduler's events after, its telemetry carries the job, attempt and
rank of each GPU, lens-collector stores them, and ``primus-safe lens job``
and ``lens gpu-hours`` show them. Real nats-server, real chDB engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.events import (
    JobPlaced,
    JobPlacedData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    WorkerExited,
    WorkerExitedData,
    WorkerSlot,
)
from libs.gpu import GpuInventory, GpuSample, ProbeResult
from libs.records import JobRecord
from libs.settings import Settings
from libs.store import open_store
from services.bench.agent import BenchAgent
from services.bench.node_sampler import GpuSource
from services.lens_collector.rollups import backfill
from tests.helpers import lens_rows as lens
from tests.helpers import run_cli, running_collector, until

pytestmark = pytest.mark.timeout(120)

NODE = "n1"
EIGHT_GPUS = ProbeResult(status="ok", tool="rocm-smi", inventory=GpuInventory(
    tool="rocm-smi", gpus=tuple(GpuSample(index=i, utilization_pct=90.0 + i, power_w=600.0,
                                          vram_used_bytes=100 << 30, vram_total_bytes=192 << 30)
                                for i in range(8))))


def recorded_gpus(tmp_path: Path) -> GpuSource:
    return GpuSource(probe=lambda *_, **__: EIGHT_GPUS, sysfs_root=tmp_path, pcie_bw=False)


def agent(nats_url: str, tmp_path: Path) -> BenchAgent:
    config = tmp_path / "bench.yaml"
    config.write_text("probes: []\n")
    settings = Settings(nats_url=nats_url, state_dir=tmp_path, telemetry_interval_s=0.2)
    return BenchAgent(settings, NODE, config, gpus=recorded_gpus(tmp_path))


def spec(workspace: str, workers: int, gpus: int) -> JobSpec:
    return JobSpec(name="t", workers=workers, gpus_per_worker=gpus, command=["train"],
                   workspace=workspace)


async def test_gpu_rows_carry_the_job_using_them(nats_url: str, bus: Bus, clickhouse_dsn: str,
                                                 database: str, tmp_path: Path) -> None:
    # Running before the agent starts: only the jobs bucket tells it.
    train = JobRecord(id="train-1", spec=spec("research", 2, 4), submitted_at=time.time(),
                      status="running", attempt=2, started_at=time.time(),
                      slots=[WorkerSlot(rank=0, node=NODE, gpus=4),
                             WorkerSlot(rank=1, node="n2", gpus=4)])
    await (await bus.kv("jobs")).put("train-1", train.model_dump_json().encode())
    for job, ws in (("train-1", "research"), ("infer-2", "serving")):
        await bus.publish(JobSubmitted(source="scheduler", job=job, data=JobSubmittedData(
            spec=spec(ws, 1, 2))))
    collector = contextlib.AsyncExitStack()
    await collector.enter_async_context(running_collector(nats_url, clickhouse_dsn, database))
    first = agent(nats_url, tmp_path)
    await first.start(bus)
    try:
        await bus.publish(JobPlaced(source="scheduler", job="infer-2", data=JobPlacedData(
            attempt=1, workers=[WorkerSlot(rank=0, node=NODE, gpus=2)])))

        async def gpus_of(job: str, count: int) -> list[dict[str, Any]] | None:
            rows = await lens(bus, "job_gpus", job=job)
            return rows if len(rows) == count else None

        train_gpus = await until(lambda: gpus_of("train-1", 4), "train-1's GPUs in Lens")
        assert [(g["node"], g["gpu"], g["rank"], g["attempt"]) for g in train_gpus] == [
            (NODE, i, 0, 2) for i in range(4)]
        assert train_gpus[0]["util_pct"] == 90.0 and train_gpus[0]["power_w"] == 600.0
        infer = await until(lambda: gpus_of("infer-2", 2), "infer-2's GPUs in Lens")
        assert [(g["gpu"], g["rank"], g["attempt"]) for g in infer] == [(4, 0, 1), (5, 0, 1)]

        # Its worker exits (a requeue publishes nothing else): the GPUs are idle.
        await bus.publish(WorkerExited(source="scheduler", job="infer-2", node=NODE,
                                       data=WorkerExitedData(attempt=1, rank=0, exit_code=0)))
        await until(lambda: asyncio.sleep(0, "infer-2/0" not in first.placements.snapshot()),
                    "the agent to free infer-2's GPUs")
        freed_at = datetime.now(UTC)
        client = open_store(clickhouse_dsn)

        async def newest_owner(gpu: int) -> list[Any] | None:
            rows = client.query(
                f"SELECT job, attempt, rank FROM {database}.gpu_metrics WHERE node = {{n:String}} "
                f"AND gpu = {{g:UInt8}} AND time > {{t:DateTime64(3, 'UTC')}} "
                "ORDER BY time DESC LIMIT 1",
                parameters={"n": NODE, "g": gpu, "t": freed_at}).result_rows
            return list(rows[0]) if rows else None

        assert await until(lambda: newest_owner(4), "a sample after the exit") == ["", 0, None]
        assert await newest_owner(0) == ["train-1", 2, 0]
    finally:
        await first.stop()

    # A restarted agent reads the bucket again; replaying the last minutes
    # of events does not bring back what ended.
    second = agent(nats_url, tmp_path)
    await second.start(bus)
    try:
        await asyncio.sleep(1.0)  # the replayed events are in
        assert second.placements.snapshot() == {
            "train-1/0": {"attempt": 2, "gpus": 4, "devices": [0, 1, 2, 3]}}
        assert second.health()["placements"] == second.placements.snapshot()
    finally:
        await second.stop()

    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(tmp_path / "state"))
    try:
        shown = await asyncio.to_thread(run_cli, "lens", "job", "train-1", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        job = json.loads(shown.stdout)
        assert [g["gpu"] for g in job["gpus"]] == [0, 1, 2, 3]
        assert job["gpu_hours"] == pytest.approx(sum(g["gpu_hours"] for g in job["gpus"]))
        assert 0 < job["gpu_hours"] < 4 * 60 / 3600  # four GPUs for less than a minute
        text = await asyncio.to_thread(run_cli, "lens", "job", "train-1", env=env)
        assert text.returncode == 0, text.stderr  # no SDK telemetry: the GPUs alone
        assert "train-1: 4 GPU(s)" in text.stdout
        assert "NODE   GPU   RANK   ATTEMPT   UTIL" in text.stdout and "90.0%" in text.stdout

        since = datetime.now(UTC) - timedelta(minutes=5)
        backfill(client, database, since, datetime.now(UTC) + timedelta(minutes=1))
        per_job = await asyncio.to_thread(run_cli, "lens", "gpu-hours", "--since", "10m",
                                          "--json", env=env)
        assert per_job.returncode == 0, per_job.stderr
        rows = {r["job"]: r for r in json.loads(per_job.stdout)}
        assert set(rows) == {"train-1", "infer-2"}
        assert (rows["train-1"]["workspace"], rows["train-1"]["gpus"]) == ("research", 4)
        assert (rows["infer-2"]["workspace"], rows["infer-2"]["gpus"]) == ("serving", 2)
        per_ws = await asyncio.to_thread(run_cli, "lens", "gpu-hours", "--by", "workspace",
                                         "--workspace", "serving", "--json", env=env)
        [serving] = json.loads(per_ws.stdout)
        assert serving["workspace"] == "serving" and serving["jobs"] == 1
        assert serving["gpu_hours"] == pytest.approx(rows["infer-2"]["gpu_hours"])
        bad = await asyncio.to_thread(run_cli, "lens", "gpu-hours", "--since", "yesterday",
                                      env=env)
        assert bad.returncode == 1 and "--since 'yesterday'" in bad.stderr
    finally:
        await collector.aclose()
