"""Kubernetes: the agent of the node running a job's rank 0 watches the job's
directory on the (read-only) checkpoint claim and announces each newer
complete checkpoint; the directory may appear only after the job started,
and a job no longer led from this node is not watched."""

from __future__ import annotations

import asyncio
from pathlib import Path

from libs.events import JobCheckpoint, WorkerSlot
from services.bench.checkpoint_watches import CheckpointWatches
from services.bench.placements import Placements


async def until(fn, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.1)):
        if fn():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


async def test_rank_zeros_node_announces_the_jobs_checkpoints(tmp_path: Path) -> None:
    placements = Placements("node-1")
    placements.placed("job-a", 2, [WorkerSlot(rank=0, node="node-1", gpus=8),
                                   WorkerSlot(rank=1, node="node-2", gpus=8)])
    placements.placed("job-b", 1, [WorkerSlot(rank=0, node="node-2", gpus=8),
                                   WorkerSlot(rank=1, node="node-1", gpus=8)])
    assert placements.leading() == {"job-a": 2}  # job-b's rank 0 runs elsewhere

    told: list[JobCheckpoint] = []

    async def publish(event: JobCheckpoint) -> None:
        told.append(event)

    watches = CheckpointWatches(tmp_path, "node-1", publish, poll_s=0.5, settle_s=0.2)
    await watches.sync(placements.leading())
    try:
        assert set(watches.watches) == {"job-a"}
        # The job creates its directory (jobs/<job> on the claim) only now.
        ckpt = tmp_path / "jobs" / "job-a"
        (ckpt / "iter_0000100" / "mp_rank_00").mkdir(parents=True)
        (ckpt / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"w")
        (ckpt / "latest_checkpointed_iteration.txt").write_text("100")
        await until(lambda: len(told) == 1)
        [event] = told
        assert (event.job, event.node, event.data.attempt) == ("job-a", "node-1", 2)
        assert (event.data.iteration, event.data.layout) == (100, "megatron")
        assert event.id == "job-a-checkpoint-megatron-100"  # the same from any announcer
        await watches.sync({})
        assert watches.watches == {}
        (ckpt / "iter_0000200" / "mp_rank_00").mkdir(parents=True)
        (ckpt / "latest_checkpointed_iteration.txt").write_text("200")
        await asyncio.sleep(1.0)
        assert len(told) == 1  # no longer watched from here
    finally:
        await watches.close()
