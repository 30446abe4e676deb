"""Workers' output from real local workers to Lens and back: the supervisor
writes each rank's output to its file and ships it; lens-collector (in this
process, real NATS, the chDB engine) stores every line with its rank and
stream; ``primus-safe logs`` reads them with its filters; Megatron-format
lines become the job's loss curve; a worker printing far over its rate is
cut down, the drop counted, and never slowed; a rank's file is rotated."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.local import LocalDriver
from libs.drivers.local_worker import main as supervise
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot
from libs.log_shipper import LogLimits
from services.lens_collector.app import LensCollector
from tests.helpers import lens_rows as lens
from tests.helpers import run_cli, running_collector, until

LINE = (" [2026-12-01 12:00:00] iteration {it:8d}/     100 | consumed samples: {s:8d} | "
        "elapsed time per iteration (ms): 250.0 | learning rate: 1.000000E-04 | "
        "global batch size:     8 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 0.500 |"
        " number of skipped iterations:   0 | number of nan iterations:   0 |")
TRAIN = f"""
import os, sys
rank = int(os.environ["RANK"])
print("megatron-style job, rank", rank, flush=True)
print("a warning on stderr", file=sys.stderr, flush=True)
for it in range(1, 6):
    if rank == 1:
        print({LINE!r}.format(it=it, s=8 * it, loss=4.0 / it), flush=True)
"""


async def test_output_of_every_rank_reaches_lens_and_the_cli(
        tmp_path: Path, nats_url: str, lens_collector: tuple[LensCollector, Bus],
        cli_env: dict[str, str]) -> None:
    _, bus = lens_collector
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path / "state", sink, nats_url=nats_url)
    spec = JobSpec(name="mega", workers=2, command=[sys.executable, "-c", TRAIN])
    await driver.launch("mega", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0),
                                          WorkerSlot(rank=1, node="b", gpus=0)])
    await until(lambda: _exits(events, 2), "both ranks to exit")
    # Every line of both ranks (2 + 7): waiting for 7 could end on rank 1's alone.
    rows = await until(lambda: _lines(bus, "mega", 9), "the lines in Lens")
    assert {(r["rank"], r["node"]) for r in rows} == {(0, "a"), (1, "b")}
    assert {r["stream"] for r in rows if "warning" in r["message"]} == {"stderr"}
    # The file keeps everything too.
    log = (tmp_path / "state" / "jobs" / "mega" / "attempt-1" / "rank-1.log").read_text()
    assert "lm loss: 8.000000E-01" in log
    # Megatron's lines are the job's loss curve (auto-detected).
    series = await until(lambda: _series(bus, "mega", 5), "the parsed loss curve")
    assert [r["iteration"] for r in series] == [1, 2, 3, 4, 5]
    assert series[-1]["loss"] == pytest.approx(0.8)

    env = {**cli_env, "PRIMUS_NATS_URL": nats_url}
    out = await asyncio.to_thread(run_cli, "logs", "mega", "--rank", "1", "--grep", "lm loss",
                                  "--since", "1h", env=env)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 5 and "lm loss" in out.stdout
    out = await asyncio.to_thread(run_cli, "logs", "mega", "--tail", "2", "--rank", "1",
                                  "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["seq"] for x in out.stdout.splitlines()] == [5, 6]
    shown = await asyncio.to_thread(run_cli, "lens", "job", "mega", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    output = {r["rank"]: r for r in json.loads(shown.stdout)["output"]}
    assert (output[0]["lines"], output[1]["lines"]) == (2, 7)
    assert output[1]["dropped_lines"] == 0
    out = await asyncio.to_thread(run_cli, "logs", "nope", env=env)
    assert out.returncode != 0 and "no output of job nope" in out.stderr


async def test_a_flood_is_cut_down_counted_and_never_slows_the_worker(
        tmp_path: Path, nats_url: str, lens_collector: tuple[LensCollector, Bus]) -> None:
    _, bus = lens_collector
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    # 200 MB in lines of 1 KB, as fast as Python can write them; the job may
    # ship 1 MB/s. Into /dev/null this takes about a second here.
    flood = ("import sys\nline = b'x' * 1023 + b'\\n'\nw = sys.stdout.buffer.write\n"
             "for _ in range(200_000): w(line)\nprint('done', flush=True)\n")
    limits = LogLimits(rate_bytes_s=1 << 20, min_rate_bytes_s=1 << 20, burst_s=1,
                       file_max_bytes=8 << 20, file_keep=2)
    driver = LocalDriver(tmp_path / "state", sink, nats_url=nats_url, log_limits=limits)
    spec = JobSpec(name="flood", workers=1, command=[sys.executable, "-c", flood])
    started = time.monotonic()
    await driver.launch("flood", 1, spec, [WorkerSlot(rank=0, node="a", gpus=0)])
    await until(lambda: _exits(events, 1), "the flood to end", timeout=60)
    elapsed = time.monotonic() - started
    # Every line printed is either stored or counted as dropped.
    output = await until(lambda: _accounted(bus, "flood", 200_001), "every line accounted for")
    assert output[0]["dropped_lines"] > 150_000  # most of it, and said so
    assert output[0]["lines"] < 20_000
    assert elapsed < 20, f"the worker took {elapsed:.1f} s: its output held it up"
    # Capped and rotated: the current file and two older ones, none over the cap.
    files = sorted((tmp_path / "state" / "jobs" / "flood" / "attempt-1").glob("rank-0.log*"))
    assert [f.name for f in files] == ["rank-0.log", "rank-0.log.1", "rank-0.log.2"]
    assert all(f.stat().st_size <= 8 << 20 for f in files)
    assert files[0].read_text().endswith("done\n")


def test_the_supervisor_without_a_bus_still_writes_the_file(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.delenv("PRIMUS_NATS_URL", raising=False)
    log = tmp_path / "rank-0.log"
    code = supervise([str(tmp_path / "exit"), str(tmp_path / "pids"), "j 1 0", "--log",
                      str(log), "--", sys.executable, "-c",
                      "import sys; print('out'); print('err', file=sys.stderr); "
                      "sys.stdout.buffer.write(b'no newline \\xff')"])
    assert code == 0
    assert sorted(log.read_bytes().split(b"\n")) == [b"", b"err", b"no newline \xff", b"out"]
    assert (tmp_path / "exit").read_text() == "0\n"


async def _exits(events: list[Event], n: int) -> bool:
    return sum(isinstance(e, WorkerExited) for e in events) >= n


async def _lines(bus: Bus, job: str, n: int) -> list[dict[str, Any]] | None:
    rows = await lens(bus, "worker_logs", job=job, limit=1000)
    return rows if len(rows) >= n else None


async def _series(bus: Bus, job: str, n: int) -> list[dict[str, Any]] | None:
    rows = await lens(bus, "job_series", job=job)
    return rows if len(rows) >= n else None


async def _accounted(bus: Bus, job: str, printed: int) -> list[dict[str, Any]] | None:
    rows = await lens(bus, "job_output", job=job)
    return rows if rows and rows[0]["dropped_lines"] + rows[0]["lines"] == printed else None


async def test_lines_survive_a_collector_restart_and_follow_shows_new_ones(
        tmp_path: Path, nats_url: str, clickhouse_dsn: str, database: str,
        cli_env: dict[str, str]) -> None:
    import subprocess

    from libs.log_shipper import Batcher
    from tests.helpers import ROOT

    batcher = Batcher.for_worker("steady", 1, 0, "a", 1, LogLimits(batch_lines=10))

    async def publish(bus: Bus, first: int, n: int) -> None:
        lines = [f"line {i}".encode() for i in range(first, first + n)]
        for event in batcher.feed(lines, "stdout", time.time()) + batcher.take(
                time.time(), flush=True):
            await bus.publish(event)

    def collector() -> Any:
        return running_collector(nats_url, clickhouse_dsn, database, evaluate_alerts=False)

    async with collector() as (_, bus):
        await publish(bus, 0, 30)
        await until(lambda: _lines(bus, "steady", 30), "the first lines", timeout=30)
    writer = await Bus.connect(nats_url, "workers")
    try:
        await publish(writer, 30, 30)  # while no collector runs: JetStream keeps them
        async with collector() as (_, bus):
            rows = await until(lambda: _lines(bus, "steady", 60),
                               "every line after the restart", timeout=30)
            assert [r["seq"] for r in rows] == list(range(60))  # each once, in order
            env = {**cli_env, "PRIMUS_NATS_URL": nats_url}
            follow = subprocess.Popen([sys.executable, "-m", "cli.main", "logs", "steady", "-f",
                                       "--tail", "1"], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert follow.stdout is not None and follow.stderr is not None

            async def shown(n: int) -> list[list[str]]:
                lines = [await asyncio.to_thread(follow.stdout.readline)  # type: ignore[union-attr]
                         for _ in range(n)]
                return [x.rstrip().rsplit(" ", 2)[-2:] for x in lines]

            try:
                assert await shown(1) == [["line", "59"]]
                await publish(writer, 60, 2)
                assert await shown(2) == [["line", "60"], ["line", "61"]]
            except BaseException:
                follow.terminate()
                raise
        # The collector is rolled out while follow runs: follow says so once,
        # waits, and shows what was printed meanwhile when it is back.
        try:
            await publish(writer, 62, 2)
            said = await asyncio.to_thread(follow.stderr.readline)
            assert "lens-collector did not answer" in said and "still following" in said, said
            assert follow.poll() is None
            async with collector():
                assert await shown(2) == [["line", "62"], ["line", "63"]]
                said = await asyncio.to_thread(follow.stderr.readline)
                assert said.strip() == "primus-safe: lens-collector answers again", said
        finally:
            follow.terminate()
            follow.wait(10)
    finally:
        await writer.close()
