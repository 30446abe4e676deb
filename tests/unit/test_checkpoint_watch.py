"""The checkpoint directory watch on a real directory (inotify): a Megatron
job's checkpoint is told once it is complete (its tracker names it), never
while its files are being written, and each newer one once; failover's book
turns the newest into the work a fault costs."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

from libs.checkpoint_layouts import Found
from libs.checkpoint_watch import CheckpointWatch
from services.failover.faults import FailoverRules, FaultBook


async def test_a_megatron_checkpoint_is_told_once_complete(tmp_path: Path) -> None:
    told: list[tuple[int, str, datetime]] = []

    async def tell(found: Found, step: int, saved_at: datetime) -> None:
        told.append((step, found.layout, saved_at))

    watch = CheckpointWatch(tmp_path / "ckpt", tell, settle_s=0.2)
    await watch.start()
    try:
        await asyncio.sleep(0.5)
        assert told == []  # an empty directory holds nothing to resume from
        for step in (10, 20):
            shard = tmp_path / "ckpt" / f"iter_{step:07d}" / "mp_rank_00"
            shard.mkdir(parents=True)
            (shard / "model_optim_rng.pt").write_bytes(b"x" * 1000)
            await asyncio.sleep(0.5)
            assert len(told) == step // 10 - 1  # written, not yet tracked: not complete
            (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text(f"{step}")
            for _ in range(50):
                if len(told) == step // 10:
                    break
                await asyncio.sleep(0.1)
        assert [(s, layout) for s, layout, _ in told] == [(10, "megatron"), (20, "megatron")]
        (tmp_path / "ckpt" / "unrelated.txt").write_text("touch")
        await asyncio.sleep(0.6)
        assert len(told) == 2  # a change that is not a newer checkpoint says nothing
    finally:
        await watch.stop()


def test_a_fault_counts_the_work_since_the_newest_checkpoint() -> None:
    book = FaultBook(FailoverRules())
    book.checkpoint("job-a", 100, saved_at=1000.0)
    book.checkpoint("job-a", 50, saved_at=900.0)  # older, told late: ignored
    [opened, *_] = book.observe("heartbeat_missed", "node-1", bad=True, now=1130.0,
                                jobs=["job-a", "job-b"], last_good=1120.0)
    fault = opened.fault
    assert fault.resume_step == {"job-a": 100}  # job-b never told of a checkpoint
    assert fault.lost_work_s == {"job-a": 120.0}
