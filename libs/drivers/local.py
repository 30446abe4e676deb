"""LocalDriver: "nodes" are names on this machine and workers are real
subprocesses, so the whole platform runs on a laptop with real training.

Every worker gets the torchrun-style environment (MASTER_ADDR, MASTER_PORT,
WORLD_SIZE, RANK, LOCAL_RANK) plus the PRIMUS_* variables the training SDK
reads. Each worker runs in its own session (process group), its pid is kept in
``<state>/pids/<node>/`` so a whole "node" can be killed for fault tests and
leftovers can be reaped after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from libs.drivers.base import EventSink
from libs.events import (
    JobSpec,
    WorkerExited,
    WorkerExitedData,
    WorkerSlot,
    WorkerStarted,
    WorkerStartedData,
)
from libs.logs import get_logger


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Worker:
    job: str
    attempt: int
    rank: int
    node: str
    proc: asyncio.subprocess.Process
    pid_file: Path
    watcher: asyncio.Task[None] | None = None


class LocalDriver:
    def __init__(self, state_dir: Path, sink: EventSink, *, nats_url: str,
                 source: str = "scheduler/local-driver", nats_token: str | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.sink = sink
        self.nats_url = nats_url
        self.nats_token = nats_token
        self.source = source
        self._workers: dict[str, list[_Worker]] = {}
        self._log = get_logger(component="local-driver")

    def _env(self, job: str, attempt: int, spec: JobSpec, slot: WorkerSlot, world: int,
             port: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(spec.env)
        env.update(
            # Every local node is this machine; loopback is where rank 0 listens.
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(slot.rank),
            LOCAL_RANK="0",
            PRIMUS_JOB_ID=job,
            PRIMUS_ATTEMPT=str(attempt),
            PRIMUS_NODE_NAME=slot.node,
            PRIMUS_NATS_URL=self.nats_url,
            PRIMUS_CHECKPOINT_DIR=str(self.state_dir / "checkpoints" / job),
            PRIMUS_CHECKPOINT_INTERVAL=str(spec.checkpoint_interval),
            PRIMUS_DEVICE_SLOTS=str(slot.gpus),
        )
        if self.nats_token:
            env["PRIMUS_NATS_TOKEN"] = self.nats_token
        return env

    @staticmethod
    def _argv(spec: JobSpec) -> list[str]:
        # "python" means the interpreter the platform runs on, so the job
        # sees the same installed packages (torch, the SDK).
        head, *rest = spec.command
        return [sys.executable if head in ("python", "python3") else head, *rest]

    async def launch(self, job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot]) -> None:
        port = free_port()
        run_dir = self.state_dir / "jobs" / job / f"attempt-{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        workers = self._workers.setdefault(job, [])
        for slot in sorted(slots, key=lambda s: s.rank):
            log_path = run_dir / f"rank-{slot.rank}.log"
            with log_path.open("ab") as log_file:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(spec),
                    cwd=spec.workdir or os.getcwd(),
                    env=self._env(job, attempt, spec, slot, len(slots), port),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            pid_dir = self.state_dir / "pids" / slot.node
            pid_dir.mkdir(parents=True, exist_ok=True)
            pid_file = pid_dir / f"{proc.pid}"
            pid_file.write_text(f"{job} {attempt} {slot.rank}\n")
            worker = _Worker(job, attempt, slot.rank, slot.node, proc, pid_file)
            workers.append(worker)
            self._log.info("worker started", job=job, node=slot.node, rank=slot.rank, pid=proc.pid)
            await self.sink(
                WorkerStarted(
                    id=f"{job}-a{attempt}-r{slot.rank}-started",
                    source=self.source, job=job, node=slot.node,
                    data=WorkerStartedData(attempt=attempt, rank=slot.rank, pid=proc.pid),
                )
            )
            worker.watcher = asyncio.create_task(self._watch(worker))

    async def _watch(self, worker: _Worker) -> None:
        code = await worker.proc.wait()
        with contextlib.suppress(FileNotFoundError):
            worker.pid_file.unlink()
        self._log.info("worker exited", job=worker.job, node=worker.node, rank=worker.rank,
                       exit_code=code)
        with contextlib.suppress(ValueError):
            self._workers.get(worker.job, []).remove(worker)
        await self.sink(
            WorkerExited(
                id=f"{worker.job}-a{worker.attempt}-r{worker.rank}-exited",
                source=self.source, job=worker.job, node=worker.node,
                data=WorkerExitedData(attempt=worker.attempt, rank=worker.rank, exit_code=code),
            )
        )

    async def stop(self, job: str, *, grace_s: float = 10.0) -> None:
        workers = list(self._workers.get(job, []))
        for worker in workers:
            _signal_group(worker.proc.pid, signal.SIGTERM)
        watchers = [w.watcher for w in workers if w.watcher is not None]
        if not watchers:
            return
        _, pending = await asyncio.wait(watchers, timeout=grace_s)
        if pending:
            for worker in workers:
                _signal_group(worker.proc.pid, signal.SIGKILL)
            await asyncio.wait(pending, timeout=5)

    async def close(self) -> None:
        for job in list(self._workers):
            await self.stop(job, grace_s=5.0)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_node_workers(state_dir: Path, node: str,
                      sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Kill every worker the LocalDriver started on ``node`` (a node failure)."""
    pid_dir = state_dir.resolve() / "pids" / node
    killed = []
    for pid_file in sorted(pid_dir.glob("*")) if pid_dir.exists() else []:
        pid = int(pid_file.name)
        _signal_group(pid, sig)
        killed.append(pid)
    return killed


def reap_all(state_dir: Path) -> list[int]:
    """Kill workers left behind by a crashed driver (their pid files remain)."""
    root = state_dir.resolve() / "pids"
    killed = []
    for node_dir in sorted(root.glob("*")) if root.exists() else []:
        killed += kill_node_workers(state_dir, node_dir.name)
        for pid_file in node_dir.glob("*"):
            pid_file.unlink(missing_ok=True)
    return killed
