"""The bench service as processes for tests: a coordinator and agents run
through the CLI against a test's nats-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from libs.bus import Bus
from libs.events import BenchResult, parse_event
from tests.helpers import ROOT, run_cli, stop_process


async def bench_results(bus: Bus, subject: str = "safe.bench.*.result") -> list[BenchResult]:
    """A list that fills with every bench result published on ``subject``
    from now on (subscribed and flushed before it returns)."""
    results: list[BenchResult] = []

    async def on_result(msg: object) -> None:
        event = parse_event(msg.data)  # type: ignore[attr-defined]
        if isinstance(event, BenchResult):
            results.append(event)

    await bus.nc.subscribe(subject, cb=on_result)
    await bus.flush()
    return results


class Stack:
    def __init__(self, nats_url: str, tmp: Path, config: Path, path: str | None = None) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        self.env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(tmp / "state"),
                        PRIMUS_BENCH_CONFIG=str(config), OMP_NUM_THREADS="1")
        if path is not None:
            self.env["PATH"] = path
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        with (self.tmp / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)  # all at once: they stop in parallel
        return {name: stop_process(proc, self.tmp / f"{name}.log", signalled=True)
                for name, proc in self.procs.items()}

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, timeout=timeout)

