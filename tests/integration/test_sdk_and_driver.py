"""The training SDK and the LocalDriver with real processes and a real bus."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.drivers.local import (
    LOST_REASON,
    LocalDriver,
    kill_node_workers,
    power_off,
    reap_all,
)
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot, WorkerStarted
from libs.sdk import Run, latest_complete_checkpoint

torch = pytest.importorskip("torch")


def make_run(tmp_path: Path, rank: int, world: int = 2, url: str | None = None,
             **kw: object) -> Run:
    return Run(job="j1", rank=rank, world_size=world, attempt=1, node=f"n{rank}",
               checkpoint_dir=tmp_path / "ckpt", checkpoint_interval=10, nats_url=url, **kw)


def test_checkpoint_is_complete_only_when_every_rank_wrote(tmp_path: Path) -> None:
    r0, r1 = make_run(tmp_path, 0), make_run(tmp_path, 1)
    r0.save_checkpoint(10, {"w": torch.ones(2)})
    r1.save_checkpoint(10, {"w": torch.ones(2) * 2})
    r0.save_checkpoint(20, {"w": torch.zeros(2)})  # rank 1 died before writing step 20
    (tmp_path / "ckpt" / "step-00000020" / ".rank-1.pt.tmp-99").write_bytes(b"partial")
    found = latest_complete_checkpoint(tmp_path / "ckpt", 2)
    assert found is not None and found.iteration == 10
    iteration, state = r1.load_checkpoint()  # type: ignore[misc]
    assert iteration == 10 and state["w"].tolist() == [2.0, 2.0]
    # The SDK leaves no temp files of its own: only the planted partial is there.
    assert [p.name for p in (tmp_path / "ckpt").rglob("*.tmp-*")] == [".rank-1.pt.tmp-99"]
    assert r0.should_checkpoint(20) and not r0.should_checkpoint(0) and not r0.should_checkpoint(5)


def test_report_never_blocks_and_counts_drops(tmp_path: Path, nats_url: str) -> None:
    # A queue of 5 and a burst of 5,000 samples: report() returns at once.
    run = make_run(tmp_path, 0, 1, url=nats_url, max_pending=5)
    import time

    t0 = time.perf_counter()
    for i in range(5000):
        run.report(i, loss=1.0)
    elapsed = time.perf_counter() - t0
    run.close()
    assert run.dropped > 0
    assert elapsed < 2.0


async def test_reports_reach_the_telemetry_stream(tmp_path: Path, bus: Bus, nats_url: str) -> None:
    run = make_run(tmp_path, 0, 1, url=nats_url)
    for i in range(1, 21):
        run.report(i, loss=1.0 / i, throughput=100.0, step_time_s=0.01)
    await asyncio.to_thread(run.close)
    assert run.dropped == 0
    info = await bus.js.stream_info("TELEMETRY")
    assert info.state.messages == 20


async def test_local_driver_runs_real_workers_and_reports_exits(tmp_path: Path) -> None:
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    code = ("import os,sys; r=int(os.environ['RANK']); "
            "assert os.environ['WORLD_SIZE']=='2' and os.environ['PRIMUS_JOB_ID']=='j1'; "
            "sys.exit(3 if r == 1 else 0)")
    spec = JobSpec(name="j1", workers=2, command=[sys.executable, "-c", code])
    await driver.launch("j1", 1, spec, [WorkerSlot(rank=0, node="a", gpus=1),
                                        WorkerSlot(rank=1, node="b", gpus=1)])
    for _ in range(100):
        if sum(isinstance(e, WorkerExited) for e in events) == 2:
            break
        await asyncio.sleep(0.1)
    started = [e for e in events if isinstance(e, WorkerStarted)]
    exited = {e.data.rank: e.data.exit_code for e in events if isinstance(e, WorkerExited)}
    assert [(e.node, e.data.rank) for e in started] == [("a", 0), ("b", 1)]
    assert exited == {0: 0, 1: 3}
    assert (tmp_path / "jobs" / "j1" / "attempt-1" / "rank-1.log").exists()


async def test_a_rank_placed_on_a_powered_off_node_is_reported_as_the_nodes_loss(
        tmp_path: Path) -> None:
    """A gang placed on a node that died a moment before (failover has not
    judged it yet): that rank never starts, and its exit says its node was
    down, so the scheduler spends no retry on it. The other rank runs."""
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    power_off(tmp_path, "b")
    spec = JobSpec(name="j1", workers=2,
                   command=[sys.executable, "-c", "import time; time.sleep(60)"])
    await driver.launch("j1", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0),
                                        WorkerSlot(rank=1, node="b", gpus=0)])
    try:
        [exited] = [e for e in events if isinstance(e, WorkerExited)]
        assert (exited.node, exited.data.rank, exited.data.exit_code) == ("b", 1, -9)
        assert exited.data.node_down and not exited.data.lost
        assert exited.data.reason == "node b is down"
        assert [e.node for e in events if isinstance(e, WorkerStarted)] == ["a"]
    finally:
        await driver.stop("j1", grace_s=5)
        await driver.close()


async def test_an_exit_the_driver_decided_keeps_its_meaning_when_reported_unheard(
        tmp_path: Path) -> None:
    """A refusal (node down) and a loss are the platform's, not the job's:
    their exits say so (``node_down``, ``lost``), or the scheduler spends a
    retry. When the bus is down as the driver decides such an exit and the
    driver then stops, the next driver reports it from the exit file: it
    must say the same, not a bare -9."""
    async def unreachable(event: Event) -> None:
        raise ConnectionError("bus down")

    async def until_recorded(task: asyncio.Task[object], exit_file: Path) -> None:
        for _ in range(200):
            if exit_file.exists():
                break
            await asyncio.sleep(0.05)
        task.cancel()  # the driver stops while it still retries the publish
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert exit_file.exists()

    spec = JobSpec(name="j", workers=1,
                   command=[sys.executable, "-c", "import time; time.sleep(60)"])
    # A loss: the rank on node a was reaped while no driver watched, and the
    # driver that found it could not say so.
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    starting = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    await starting.launch("gone", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0)])
    await starting.detach()
    assert len(reap_all(tmp_path)) == 1
    finding = LocalDriver(tmp_path, unreachable, nats_url="nats://127.0.0.1:1")
    await until_recorded(asyncio.create_task(finding.adopt()), tmp_path / "exits" / "gone-a1-r0")

    # A refusal: node b is down.
    power_off(tmp_path, "b")
    refusing = LocalDriver(tmp_path, unreachable, nats_url="nats://127.0.0.1:1")
    await until_recorded(asyncio.create_task(refusing.launch(
        "down", 1, spec, [WorkerSlot(rank=0, node="b", gpus=0)])),
        tmp_path / "exits" / "down-a1-r0")
    events.clear()
    await LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1").adopt()
    said = {e.job: (e.data.exit_code, e.data.reason, e.data.lost, e.data.node_down)
            for e in events if isinstance(e, WorkerExited)}
    assert said == {"down": (-9, "node b is down", False, True),
                    "gone": (-9, LOST_REASON, True, False)}


async def test_an_unreadable_exit_record_still_reports_the_exit(tmp_path: Path) -> None:
    """The watcher reads a rank's exit code from the supervisor's record. A
    record it cannot read (here a directory where the file should be, so
    the supervisor cannot write it either) must not end the watcher before
    it reports: the scheduler holds the gang until every rank's exit is known."""
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    # The worker itself puts the directory in the way as it ends.
    in_the_way = tmp_path / "exits" / "j1-a1-r0" / "in-the-way"
    spec = JobSpec(name="j1", workers=1, command=[
        sys.executable, "-c", f"import os; os.makedirs({str(in_the_way)!r})"])
    await driver.launch("j1", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0)])
    for _ in range(100):
        if any(isinstance(e, WorkerExited) for e in events):
            break
        await asyncio.sleep(0.1)
    exited = [e for e in events if isinstance(e, WorkerExited)]
    assert [(e.node, e.data.rank) for e in exited] == [("a", 0)]
    assert exited[0].data.exit_code == -9  # its code is unknown: reported as killed
    assert not list((tmp_path / "pids" / "a").glob("[0-9]*"))  # the watcher finished
    await driver.close()


async def test_stop_and_node_kill_end_real_processes(tmp_path: Path) -> None:
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    spec = JobSpec(name="sleepy", workers=2,
                   command=[sys.executable, "-c", "import time; time.sleep(60)"])
    await driver.launch("s1", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0),
                                        WorkerSlot(rank=1, node="b", gpus=0)])
    assert len(kill_node_workers(tmp_path, "b")) == 1  # node b dies
    for _ in range(50):
        if any(isinstance(e, WorkerExited) and e.node == "b" for e in events):
            break
        await asyncio.sleep(0.1)
    await driver.stop("s1", grace_s=5)
    exits = {e.node: e.data.exit_code for e in events if isinstance(e, WorkerExited)}
    assert exits == {"b": -9, "a": -15}


async def test_a_new_driver_adopts_workers_that_outlived_the_old_one(tmp_path: Path) -> None:
    """A scheduler restart must not lose how its workers end."""
    first: list[Event] = []
    second: list[Event] = []

    async def sink1(event: Event) -> None:
        first.append(event)

    async def sink2(event: Event) -> None:
        second.append(event)

    old = LocalDriver(tmp_path, sink1, nats_url="nats://127.0.0.1:1")
    code = "import os,sys,time; time.sleep(1.5); sys.exit(int(os.environ['RANK']) + 4)"
    spec = JobSpec(name="j", workers=2, command=[sys.executable, "-c", code])
    await old.launch("j", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0),
                                    WorkerSlot(rank=1, node="b", gpus=0)])
    await old.detach()  # the old scheduler goes away; its workers keep running
    new = LocalDriver(tmp_path, sink2, nats_url="nats://127.0.0.1:1")
    assert await new.adopt() == 2
    for _ in range(100):
        if sum(isinstance(e, WorkerExited) for e in second) == 2:
            break
        await asyncio.sleep(0.1)
    assert not any(isinstance(e, WorkerExited) for e in first)
    # The old driver announced the starts; the new one does not repeat them
    # (the bus forgets an id after its de-duplication window: tests/chaos).
    assert not any(isinstance(e, WorkerStarted) for e in second)
    assert len([e for e in first if isinstance(e, WorkerStarted)]) == 2
    assert sorted((e.node, e.data.exit_code) for e in second
                  if isinstance(e, WorkerExited)) == [("a", 4), ("b", 5)]
    assert not list((tmp_path / "pids").glob("*/*"))


async def test_workers_reaped_while_no_driver_watched_are_reported_lost_once(
        tmp_path: Path) -> None:
    """The stack stopped: the driver detached, its workers were SIGKILLed with
    their supervisors (no exit recorded). The next driver reports each rank
    lost, once, and never starts it again under the same attempt."""
    first: list[Event] = []
    second: list[Event] = []

    async def sink1(event: Event) -> None:
        first.append(event)

    async def sink2(event: Event) -> None:
        second.append(event)

    old = LocalDriver(tmp_path, sink1, nats_url="nats://127.0.0.1:1")
    spec = JobSpec(name="j", workers=2,
                   command=[sys.executable, "-c", "import time; time.sleep(60)"])
    slots = [WorkerSlot(rank=0, node="a", gpus=0), WorkerSlot(rank=1, node="b", gpus=0)]
    await old.launch("j", 1, spec, slots)
    await old.detach()
    assert len(reap_all(tmp_path)) == 2
    assert not list((tmp_path / "exits").glob("j-a1-r*"))

    new = LocalDriver(tmp_path, sink2, nats_url="nats://127.0.0.1:1")
    assert await new.adopt() == 0
    lost = sorted((e.node, e.data.rank, e.data.exit_code, e.data.lost, e.data.reason)
                  for e in second if isinstance(e, WorkerExited))
    assert lost == [("a", 0, -9, True, LOST_REASON), ("b", 1, -9, True, LOST_REASON)]
    assert await new.adopt() == 0 and len(second) == 2  # reported once
    await new.launch("j", 1, spec, slots)  # a restarted leader launches again: a no-op
    assert not any(isinstance(e, WorkerStarted) for e in second)
    assert not list((tmp_path / "pids").glob("*/*"))
