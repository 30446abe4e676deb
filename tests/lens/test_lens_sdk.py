"""The training SDK's telemetry and the opt-in log shipping, against a real
nats-server: every figure reaches the stream, NaN losses are said as such,
checkpoints carry size and duration, and nothing blocks training."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
import structlog

from libs import logs
from libs.bus import TELEMETRY, Bus
from libs.events import JobTelemetry, LogRecord, parse_event
from libs.sdk import Run


def make_run(tmp_path: Path, url: str | None, **kw: object) -> Run:
    return Run(job="j1", rank=1, world_size=2, attempt=2, node="n1",
               checkpoint_dir=tmp_path / "ckpt", checkpoint_interval=10, nats_url=url, **kw)


async def telemetry(bus: Bus, count: int) -> list[object]:
    sub = await bus.js.pull_subscribe("safe.telemetry.>", stream=TELEMETRY.name)
    events = []
    deadline = time.monotonic() + 20
    while len(events) < count and time.monotonic() < deadline:
        try:
            events += [parse_event(m.data) for m in await sub.fetch(count, timeout=1)]
        except Exception:
            continue
    return events


async def test_every_figure_reaches_the_stream(tmp_path: Path, bus: Bus, nats_url: str) -> None:
    run = make_run(tmp_path, nats_url)
    run.report(1, loss=2.5, throughput=100.0, step_time_s=0.2, grad_norm=1.25,
               tokens_per_s=4096.0)
    run.report(2, loss=math.nan)
    run.report(3, loss=-math.inf, grad_norm=math.inf)
    (tmp_path / "ckpt-file").write_bytes(b"x" * 1234)
    run.report_checkpoint(3, tmp_path / "ckpt-file", duration_s=0.75)
    run.log("loss spiked", level="warning", step=3)
    await asyncio.to_thread(run.close)
    assert run.stats == {"published": 5, "failed": 0, "dropped": 0, "pending": 0}
    events = await telemetry(bus, 5)
    samples = {e.data.iteration: e for e in events if isinstance(e, JobTelemetry)
               and not e.data.checkpoint_path}
    first = samples[1].data
    assert (first.loss, first.throughput, first.grad_norm, first.tokens_per_s) == (
        2.5, 100.0, 1.25, 4096.0)
    assert (first.rank, first.attempt) == (1, 2) and samples[1].node == "n1"
    assert samples[2].data.loss is None and samples[2].data.loss_nonfinite == "nan"
    assert samples[3].data.loss_nonfinite == "-inf" and samples[3].data.grad_norm is None
    [ckpt] = [e for e in events if isinstance(e, JobTelemetry) and e.data.checkpoint_path]
    assert (ckpt.data.checkpoint_bytes, ckpt.data.checkpoint_duration_s) == (1234, 0.75)
    [line] = [e for e in events if isinstance(e, LogRecord)]
    assert (line.job, line.node, line.data.level, line.data.message) == (
        "j1", "n1", "warning", "loss spiked")
    assert line.data.fields == {"rank": 1, "attempt": 2, "step": 3}


def test_saving_a_checkpoint_reports_its_size_and_duration(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    run = make_run(tmp_path, None)
    reported: list[dict[str, object]] = []
    run.report = lambda it, **kw: reported.append({"iteration": it, **kw})  # type: ignore[method-assign]
    path = run.save_checkpoint(10, {"w": torch.ones(100)})
    [r] = reported
    assert r["iteration"] == 10 and r["checkpoint_path"] == str(path)
    assert r["checkpoint_bytes"] == path.stat().st_size > 400
    assert isinstance(r["checkpoint_duration_s"], float)


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path: Path, nats_url: str) -> None:
    run = make_run(tmp_path, nats_url, max_pending=3)
    started = time.perf_counter()
    for i in range(20_000):
        run.report(i, loss=1.0)
        run.log("x")
    assert time.perf_counter() - started < 5.0
    run.close()
    assert run.dropped > 0 and run.stats["dropped"] == run.dropped


def test_without_a_bus_reporting_is_a_no_op(tmp_path: Path) -> None:
    run = make_run(tmp_path, None)
    run.report(1, loss=1.0)
    run.log("x")
    run.close()
    assert run.stats["published"] == 0 and run.dropped == 0


async def test_shipped_log_lines_carry_service_node_and_job(bus: Bus, nats_url: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    try:
        log = logs.configure("scheduler", "info", ship_to=(nats_url, None), node="n7")
        log.info("placed", job="j9", workers=2)
        structlog.get_logger().bind(job="not a key!").warning("odd")
        await asyncio.to_thread(logs.stop_shipping)
    finally:
        logs._shipper = None
        # configure() bound this test's captured stderr, closed after it: later
        # tests (migrations log) would write to a closed file.
        structlog.reset_defaults()
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    assert {x["event"] for x in lines} >= {"placed", "odd"}  # still on stderr too
    shipped = [e for e in await telemetry(bus, 2) if isinstance(e, LogRecord)]
    placed = next(e for e in shipped if e.data.message == "placed")
    assert (placed.node, placed.job, placed.data.service, placed.data.level) == (
        "n7", "j9", "scheduler", "info")
    assert placed.data.fields["workers"] == 2
    odd = next(e for e in shipped if e.data.message == "odd")
    assert odd.job is None  # not a valid key: kept in the fields, not the envelope
