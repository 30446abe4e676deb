"""A job that does not use the SDK is told where to resume (LocalDriver,
real processes): with a Megatron-layout checkpoint in its directory, every
rank of the next attempt gets ``PRIMUS_RESUME_STEP`` and its command's
``{checkpoint_dir}`` / ``{resume_step}`` filled; a newer iteration still
being written (the tracker not updated) is not resumed from; without a
checkpoint the step is 0 and the variable is absent."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from libs.drivers.local import LocalDriver
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot
from libs.resume import RESUME_ENV, render

DUMP = ("import json, os, sys; json.dump({'argv': sys.argv[1:], "
        f"'step': os.environ.get('{RESUME_ENV}')}}, "
        "open(os.environ['OUT'] + os.environ['RANK'], 'w'))")


def test_render_fills_only_the_placeholders() -> None:
    argv = ["torchrun", "x.py", "--load", "{checkpoint_dir}", "--it={resume_step}", "{x}", "{}"]
    assert render(argv, checkpoint_dir="/c", resume_step=200) == [
        "torchrun", "x.py", "--load", "/c", "--it=200", "{x}", "{}"]
    assert render(argv, checkpoint_dir="/c", resume_step=None)[4] == "--it=0"


async def run_attempt(driver: LocalDriver, job: str, attempt: int, out: Path) -> list[dict]:
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver.sink = sink
    spec = JobSpec(name=job, workers=2, env={"OUT": str(out)}, command=[
        sys.executable, "-c", DUMP, "--load", "{checkpoint_dir}", "--iter", "{resume_step}"])
    await driver.launch(job, attempt, spec, [WorkerSlot(rank=0, node="a", gpus=1),
                                             WorkerSlot(rank=1, node="b", gpus=1)])
    for _ in range(200):
        if sum(isinstance(e, WorkerExited) for e in events) == 2:
            break
        await asyncio.sleep(0.05)
    return [json.loads(Path(f"{out}{rank}").read_text()) for rank in (0, 1)]


async def test_the_next_attempt_resumes_from_the_frameworks_own_checkpoint(
        tmp_path: Path) -> None:
    driver = LocalDriver(tmp_path / "state", lambda e: None,  # type: ignore[arg-type,return-value]
                         nats_url="nats://127.0.0.1:1")
    ckpt = tmp_path / "state" / "checkpoints" / "j1"
    first = await run_attempt(driver, "j1", 1, tmp_path / "first-")
    assert [d["step"] for d in first] == [None, None]
    assert first[0]["argv"] == ["--load", str(ckpt), "--iter", "0"]
    # Megatron saved iteration 200; 300 is still being written.
    (ckpt / "iter_0000200").mkdir(parents=True)
    (ckpt / "iter_0000300").mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("200\n")
    second = await run_attempt(driver, "j1", 2, tmp_path / "second-")
    assert [d["step"] for d in second] == ["200", "200"]
    assert second[1]["argv"] == ["--load", str(ckpt), "--iter", "200"]
