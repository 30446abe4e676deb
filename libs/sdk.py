"""The training SDK: what a training script calls to report progress and to
save and find checkpoints. It reads the environment the driver sets
(``libs.worker_env.WorkerEnv``).

Reporting never blocks training: samples go into a bounded queue that a
background thread publishes to ``safe.telemetry.job.<job>`` (pipelined: a
batch of publishes in flight, then their acks); when the queue is full the
sample is dropped and counted (``Run.dropped``, also sent along with the
next samples so Lens sees it). A NaN or infinite loss is reported as such
(``loss_nonfinite``: JSON has no NaN), so Lens can alert on it.

Checkpoints are written atomically (temp file, then rename) as one file per
rank under ``<dir>/step-<iteration>/``; a step is complete when every rank's
file is there, and only complete steps are offered for resuming. Saving one
reports its step, path, size and how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.events import (
    Event,
    JobTelemetry,
    JobTelemetryData,
    LogRecord,
    LogRecordData,
    WorkerLog,
    encode_event,
)
from libs.nats_urls import servers
from libs.routes import Routes, event_subject
from libs.worker_env import WorkerEnv

_STOP = object()

# What a training worker may say on the bus: its own telemetry and log lines
# (each job's NATS credential, libs.job_credentials, follows from this).
ROUTES = Routes(
    service="trainer",
    summary="training workers (this SDK): their own telemetry and log lines",
    publishes=(JobTelemetry, LogRecord, WorkerLog),
    service_shell=False,
    nats_user=False,
)


def job_subject(cls: type[Event], job: str) -> str:
    """The subject a worker of ``job`` publishes ``cls`` on: the event's own
    subject keyed by the job, or, for one whose subject names no job (a log
    line: ``safe.telemetry.log``), that subject narrowed with ``.job.<job>``
    (Lens reads both), so a job's credential can be held to its own."""
    if "{job}" in cls.subject_template:
        subject = event_subject(cls, job=job)
    else:
        subject = f"{event_subject(cls)}.job.{job}"
    assert "*" not in subject and ">" not in subject, subject
    return subject


def job_inbox(job: str) -> str:
    """The inbox prefix of a job's connections: its JetStream acks come back
    here, and its credential may receive nothing else."""
    return f"_INBOX.job-{job}"


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    path: Path

    def rank_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pt"


class TelemetryPublisher(threading.Thread):
    """Owns an asyncio loop and a NATS connection in a daemon thread; ``offer``
    never blocks and says whether the event was queued."""

    BATCH = 256  # publishes in flight before waiting for their acks

    RETRY_S = 5.0  # a failed or lost connection is tried again this often

    def __init__(self, url: str, token: str | None, max_pending: int,
                 *, name: str = "primus-telemetry", job: str | None = None,
                 user: str | None = None, password: str | None = None,
                 tls: Any = None) -> None:
        super().__init__(name=name, daemon=True)
        self.url = url
        self.token = token
        self.job = job
        self.user, self.password = user, password
        self.tls = tls  # an ssl.SSLContext: a service's log shipper on a TLS bus
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self.published = 0
        self.failed = 0
        self.dropped = 0
        self.connected = threading.Event()  # the first connect attempt is over
        self.reached = False  # a connect ever succeeded

    def offer(self, event: Event) -> bool:
        try:
            self.queue.put_nowait(event)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def run(self) -> None:
        asyncio.run(self._main())

    async def _connect(self) -> Any:
        import nats  # local import: the SDK must import without a bus

        async def quiet(_: Exception) -> None:  # training output stays clean; see .failed
            return None

        # With the job's credential (libs.job_credentials) the server lets
        # it publish only the job's subjects and read only its own inbox.
        auth: dict[str, Any] = ({"user": self.user, "password": self.password or ""}
                                if self.user else {"token": self.token})
        if self.job:
            auth["inbox_prefix"] = job_inbox(self.job)
        if self.tls is not None:
            auth["tls"] = self.tls
        try:
            nc = await nats.connect(servers(self.url), connect_timeout=2,
                                    max_reconnect_attempts=-1, reconnect_time_wait=1,
                                    error_cb=quiet, **auth)
            self.reached = True
            return nc
        except Exception:
            return None
        finally:
            self.connected.set()

    async def _main(self) -> None:
        nc = await self._connect()
        tried_at = time.monotonic()
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            items = [await loop.run_in_executor(None, self.queue.get)]
            while len(items) < self.BATCH:
                try:
                    items.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if items[-1] is _STOP or _STOP in items:
                stopping = True
                items = [i for i in items if i is not _STOP]
            if nc is not None and nc.is_closed:
                # Closed for good: the job credential's JWT expired (the
                # server checks the job again on the next connect), or the
                # server refused it.
                nc = None
            if nc is None and time.monotonic() - tried_at > self.RETRY_S:
                nc, tried_at = await self._connect(), time.monotonic()
            if nc is None:
                self.failed += len(items)
                continue
            await self._publish(nc.jetstream(), items)
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.drain()

    async def _publish(self, js: Any, items: list[Event]) -> None:
        acks = []
        for item in items:
            try:
                subject = job_subject(type(item), item.job) if self.job and item.job \
                    else item.subject
                acks.append(await js.publish_async(subject, encode_event(item),
                                                   headers={"Nats-Msg-Id": item.id}))
            except Exception:
                self.failed += 1
        for result in await asyncio.gather(*(asyncio.wait_for(a, 10) for a in acks),
                                           return_exceptions=True):
            if isinstance(result, BaseException):
                self.failed += 1
            else:
                self.published += 1

    def close(self, timeout_s: float) -> None:
        with contextlib.suppress(queue.Full):
            self.queue.put(_STOP, timeout=timeout_s)
        self.join(timeout_s)


# The old name, for code written against it.
_Publisher = TelemetryPublisher


def _loss_fields(loss: float | None) -> dict[str, Any]:
    if loss is None or math.isfinite(loss):
        return {"loss": loss}
    return {"loss": None, "loss_nonfinite": "nan" if math.isnan(loss) else
            ("inf" if loss > 0 else "-inf")}


def path_size(path: str | os.PathLike[str]) -> int | None:
    """Bytes in a file, or in every file under a directory; None if it is not there."""
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return None


class Run:
    """One worker's view of its job. Build it with ``Run.from_env()``."""

    def __init__(self, *, job: str, rank: int, world_size: int, attempt: int, node: str,
                 checkpoint_dir: Path, checkpoint_interval: int, nats_url: str | None,
                 nats_token: str | None = None, max_pending: int = 10_000,
                 nats_user: str | None = None, nats_password: str | None = None) -> None:
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.node = node
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_interval = checkpoint_interval
        self._publisher = (TelemetryPublisher(nats_url, nats_token, max_pending, job=job,
                                              user=nats_user, password=nats_password)
                           if nats_url else None)
        if self._publisher:
            self._publisher.start()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Run:
        """The run the driver described in the environment (``WorkerEnv``);
        outside the platform, a single local rank without a bus."""
        env = WorkerEnv.from_env(environ)
        return cls(job=env.job, rank=env.rank, world_size=env.world_size, attempt=env.attempt,
                   node=env.node, checkpoint_dir=env.checkpoints,
                   checkpoint_interval=env.checkpoint_interval, nats_url=env.nats_url,
                   nats_token=env.nats_token, nats_user=env.nats_user,
                   nats_password=env.nats_password)

    # ------------------------------------------------------------------ telemetry

    @property
    def dropped(self) -> int:
        """Samples and log lines dropped because the queue was full."""
        return self._publisher.dropped if self._publisher else 0

    @property
    def stats(self) -> dict[str, int]:
        p = self._publisher
        if p is None:
            return {"published": 0, "failed": 0, "dropped": 0, "pending": 0}
        return {"published": p.published, "failed": p.failed, "dropped": p.dropped,
                "pending": p.queue.qsize()}

    def report(self, iteration: int, *, loss: float | None = None,
               throughput: float | None = None, step_time_s: float | None = None,
               checkpoint_path: str | None = None, grad_norm: float | None = None,
               tokens_per_s: float | None = None, checkpoint_bytes: int | None = None,
               checkpoint_duration_s: float | None = None) -> None:
        """Queue one sample; returns at once, dropping (and counting) when full.

        ``throughput`` is samples per second of this rank; ``tokens_per_s`` too.
        """
        if self._publisher is None:
            return
        self._publisher.offer(JobTelemetry(
            id=f"{self.job}-a{self.attempt}-r{self.rank}-i{iteration}"
            + ("-ckpt" if checkpoint_path else ""),
            source=f"sdk/{self.node}",
            job=self.job,
            node=self.node,
            data=JobTelemetryData(
                rank=self.rank, attempt=self.attempt, iteration=iteration,
                **_loss_fields(loss), throughput=throughput, step_time_s=step_time_s,
                checkpoint_path=checkpoint_path, grad_norm=_finite(grad_norm),
                tokens_per_s=_finite(tokens_per_s), checkpoint_bytes=checkpoint_bytes,
                checkpoint_duration_s=checkpoint_duration_s,
                dropped=self._publisher.dropped or None),
        ))

    def report_checkpoint(self, iteration: int, path: str | os.PathLike[str], *,
                          size_bytes: int | None = None, duration_s: float | None = None
                          ) -> None:
        """Tell Lens a checkpoint was saved (its size is measured when not given)."""
        self.report(iteration, checkpoint_path=str(path),
                    checkpoint_bytes=size_bytes if size_bytes is not None else path_size(path),
                    checkpoint_duration_s=duration_s)

    def log(self, message: str, *, level: str = "info", **fields: Any) -> None:
        """A log line that Lens stores with this job, node and rank; never blocks."""
        if self._publisher is None:
            return
        self._publisher.offer(LogRecord(
            source=f"sdk/{self.node}", node=self.node, job=self.job,
            data=LogRecordData(level=level, message=message, service="training",
                               fields={"rank": self.rank, "attempt": self.attempt, **fields})))

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the publisher."""
        if self._publisher is not None:
            self._publisher.close(timeout_s)

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
        started = time.monotonic()
        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.report_checkpoint(iteration, final,
                               duration_s=round(time.monotonic() - started, 6))
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


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None
