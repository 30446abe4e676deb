"""The training SDK: what a training script calls to report progress and to
save and find checkpoints. It reads the PRIMUS_* environment the driver sets.

Reporting never blocks training: samples go into a bounded queue that a
background thread publishes to ``safe.telemetry.job.<job>``; when the queue is
full the sample is dropped and counted (``Run.dropped``).

Checkpoints are written atomically (temp file, then rename) as one file per
rank under ``<dir>/step-<iteration>/``; a step is complete when every rank's
file is there, and only complete steps are offered for resuming.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.events import JobTelemetry, JobTelemetryData

_STOP = object()


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    path: Path

    def rank_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pt"


class _Publisher(threading.Thread):
    """Owns an asyncio loop and a NATS connection in a daemon thread."""

    def __init__(self, url: str, token: str | None, max_pending: int) -> None:
        super().__init__(name="primus-telemetry", daemon=True)
        self.url = url
        self.token = token
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self.published = 0
        self.failed = 0
        self.connected = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        import nats  # local import: the SDK must import without a bus

        try:
            nc = await nats.connect(self.url, token=self.token, connect_timeout=2,
                                    max_reconnect_attempts=5)
        except Exception:
            nc = None
        self.connected.set()
        js = nc.jetstream() if nc else None
        loop = asyncio.get_running_loop()
        while True:
            item = await loop.run_in_executor(None, self.queue.get)
            if item is _STOP:
                break
            if js is None:
                self.failed += 1
                continue
            try:
                await js.publish(item.subject, item.model_dump_json().encode(),
                                 headers={"Nats-Msg-Id": item.id}, timeout=5)
                self.published += 1
            except Exception:
                self.failed += 1
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.drain()


class Run:
    """One worker's view of its job. Build it with ``Run.from_env()``."""

    def __init__(self, *, job: str, rank: int, world_size: int, attempt: int, node: str,
                 checkpoint_dir: Path, checkpoint_interval: int, nats_url: str | None,
                 nats_token: str | None = None, max_pending: int = 10_000) -> None:
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.node = node
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_interval = checkpoint_interval
        self.dropped = 0
        self._publisher = _Publisher(nats_url, nats_token, max_pending) if nats_url else None
        if self._publisher:
            self._publisher.start()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Run:
        env = os.environ if environ is None else environ
        job = env.get("PRIMUS_JOB_ID", "local")
        return cls(
            job=job,
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            attempt=int(env.get("PRIMUS_ATTEMPT", "1")),
            node=env.get("PRIMUS_NODE_NAME", "local"),
            checkpoint_dir=Path(env.get("PRIMUS_CHECKPOINT_DIR", f"checkpoints/{job}")),
            checkpoint_interval=int(env.get("PRIMUS_CHECKPOINT_INTERVAL", "50")),
            nats_url=env.get("PRIMUS_NATS_URL"),
            nats_token=env.get("PRIMUS_NATS_TOKEN"),
        )

    # ------------------------------------------------------------------ telemetry

    def report(self, iteration: int, *, loss: float | None = None,
               throughput: float | None = None, step_time_s: float | None = None,
               checkpoint_path: str | None = None) -> None:
        """Queue one sample; returns at once, dropping (and counting) when full."""
        if self._publisher is None:
            return
        sample = JobTelemetry(
            id=f"{self.job}-a{self.attempt}-r{self.rank}-i{iteration}"
            + ("-ckpt" if checkpoint_path else ""),
            source=f"sdk/{self.node}",
            job=self.job,
            node=self.node,
            data=JobTelemetryData(rank=self.rank, attempt=self.attempt, iteration=iteration,
                                  loss=loss,
                                  throughput=throughput, step_time_s=step_time_s,
                                  checkpoint_path=checkpoint_path),
        )
        try:
            self._publisher.queue.put_nowait(sample)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the publisher."""
        if self._publisher is None:
            return
        with contextlib.suppress(queue.Full):
            self._publisher.queue.put(_STOP, timeout=timeout_s)
        self._publisher.join(timeout_s)

    # ------------------------------------------------------------------ checkpoints

    # ------------------------------------------------------------------ preemption

    def handle_preemption(self) -> None:
        """Turn SIGTERM (preemption, a gang stop) into ``stop_requested`` so
        the training loop can checkpoint and exit cleanly instead of dying."""
        import signal

        self.stop_requested = False

        def _on_term(_signum: int, _frame: object) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, _on_term)

    stop_requested: bool = False

    def should_checkpoint(self, iteration: int) -> bool:
        return iteration > 0 and iteration % self.checkpoint_interval == 0

    def save_checkpoint(self, iteration: int, state: dict[str, Any]) -> Path:
        """Write this rank's state for ``iteration`` atomically; returns its path."""
        import torch

        step_dir = self.checkpoint_dir / f"step-{iteration:08d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        final = step_dir / f"rank-{self.rank}.pt"
        tmp = step_dir / f".rank-{self.rank}.pt.tmp-{os.getpid()}"
        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.report(iteration, checkpoint_path=str(final))
        return final

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest step that every rank finished writing, if any."""
        return latest_complete_checkpoint(self.checkpoint_dir, self.world_size)

    def load_checkpoint(self) -> tuple[int, dict[str, Any]] | None:
        import torch

        found = self.latest_checkpoint()
        if found is None:
            return None
        return found.iteration, torch.load(found.rank_file(self.rank), weights_only=True)


def latest_complete_checkpoint(directory: Path, world_size: int) -> Checkpoint | None:
    if not directory.exists():
        return None
    steps = []
    for step_dir in directory.glob("step-*"):
        try:
            iteration = int(step_dir.name.removeprefix("step-"))
        except ValueError:
            continue
        if all((step_dir / f"rank-{r}.pt").exists() for r in range(world_size)):
            steps.append(Checkpoint(iteration, step_dir))
    return max(steps, key=lambda c: c.iteration, default=None)
