"""Scheduler service shell: folds node, job and worker events into the
in-memory ``SchedulerState``, runs a scheduling cycle whenever something
changed, publishes the decisions (``job.placed`` / ``job.pending`` /
``job.completed`` / ``job.failed``), keeps the ``jobs`` KV bucket current and
hands placed gangs to the cluster driver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from libs.bus import CONTROL, Bus
from libs.drivers.base import ClusterDriver
from libs.drivers.local import LocalDriver
from libs.events import (
    Event,
    JobCompleted,
    JobEndedData,
    JobFailed,
    JobPending,
    JobPendingData,
    JobPlaced,
    JobPlacedData,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    NodeStateChanged,
    WorkerExited,
    WorkerSlot,
)
from libs.logs import get_logger
from libs.settings import Settings
from services.scheduler.core import JobRecord, NodeView, SchedulerState, plan, retry_backoff_s

SOURCE = "scheduler"


class Scheduler:
    name = "scheduler"

    def __init__(self, settings: Settings, driver: ClusterDriver | None = None) -> None:
        self.settings = settings
        self.state = SchedulerState()
        self.driver = driver
        self.bus: Bus | None = None
        self.kv: KeyValue | None = None
        self._dirty = asyncio.Event()
        self._cycle_task: asyncio.Task[None] | None = None
        self._published_pending: dict[str, tuple[int, str]] = {}
        self.cycles = 0
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.kv = await bus.kv("jobs")
        if self.driver is None and self.settings.driver == "kubernetes":
            raise RuntimeError("PRIMUS_DRIVER=kubernetes: the Kubernetes driver is not part of "
                               "this build yet; use PRIMUS_DRIVER=local")
        if self.driver is None:
            self.driver = LocalDriver(self.settings.state_dir, bus.publish,
                                      nats_url=self.settings.nats_url,
                                      nats_token=self.settings.nats_token)
        await self._load_jobs()
        bus.consume(
            durable="scheduler",
            subjects=["safe.node.*.registered", "safe.node.*.state", "safe.job.*.submitted",
                      "safe.worker.*.exited"],
            stream=CONTROL,
            handler=self._on_event,
        )
        self._cycle_task = asyncio.create_task(self._cycle_loop())

    async def _load_jobs(self) -> None:
        assert self.kv is not None
        try:
            keys = await self.kv.keys()
        except NoKeysError:
            return
        for key in keys:
            raw = json.loads((await self.kv.get(key)).value)
            self.state.jobs[key] = JobRecord(
                id=raw["id"], spec=JobSpec.model_validate(raw["spec"]),
                submitted_at=raw["submitted_at"], status=raw["status"], attempt=raw["attempt"],
                slots=[WorkerSlot.model_validate(s) for s in raw["slots"]],
                reason=raw.get("reason", ""), position=raw.get("position", 0),
                not_before=raw.get("not_before", 0.0),
            )

    # ------------------------------------------------------------------ events

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, NodeRegistered):
            d = event.data
            old = self.state.nodes.get(event.node)
            self.state.nodes[event.node] = NodeView(
                name=event.node, gpus=d.gpu_count, gpu_model=d.gpu_model, ip=d.ip,
                rack=d.labels.get("rack", ""), state=old.state if old else "registered",
            )
        elif isinstance(event, NodeStateChanged):
            node = self.state.nodes.get(event.node)
            if node is not None:
                node.state = event.data.state
                if node.state != "ready":
                    await self._evacuate(event.node, event.data.reason)
        elif isinstance(event, JobSubmitted):
            if event.job not in self.state.jobs:  # idempotent
                record = JobRecord(id=event.job, spec=event.data.spec,
                                   submitted_at=event.time.timestamp())
                self.state.jobs[event.job] = record
                await self._save(record)
        elif isinstance(event, WorkerExited):
            await self._on_exit(event)
        self._dirty.set()

    async def _on_exit(self, event: WorkerExited) -> None:
        job = self.state.jobs.get(event.job)
        if job is None or job.status != "running" or event.data.attempt != job.attempt:
            return  # a stale attempt, or already handled
        job.exits[event.data.rank] = event.data.exit_code
        if event.data.exit_code != 0:
            await self._end_attempt(job, f"rank {event.data.rank} on {event.node} exited "
                                         f"with code {event.data.exit_code}")
        elif len(job.exits) == len(job.slots) and all(c == 0 for c in job.exits.values()):
            job.status = "completed"
            await self._publish(JobCompleted(
                id=f"{job.id}-completed", source=SOURCE, job=job.id,
                data=JobEndedData(attempt=job.attempt,
                                  duration_s=max(0.0, time.time() - job.submitted_at)),
            ))
            await self._save(job)

    async def _evacuate(self, node: str, reason: str) -> None:
        for job in list(self.state.jobs.values()):
            if job.status == "running" and any(s.node == node for s in job.slots):
                await self._end_attempt(job, f"node {node} left service: {reason}",
                                        backoff=False)

    async def _end_attempt(self, job: JobRecord, reason: str, *, backoff: bool = True) -> None:
        """Stop the whole gang; retry it later or give up after max_retry."""
        assert self.driver is not None
        self._log.warning("attempt ended", job=job.id, attempt=job.attempt, reason=reason)
        job.status = "pending"
        await self.driver.stop(job.id)
        if job.attempt > job.spec.max_retry:
            job.status = "failed"
            job.reason = reason
            await self._publish(JobFailed(
                id=f"{job.id}-failed", source=SOURCE, job=job.id,
                data=JobEndedData(attempt=job.attempt,
                                  duration_s=max(0.0, time.time() - job.submitted_at),
                                  reason=f"gave up after {job.attempt} attempt(s): {reason}"),
            ))
        else:
            job.reason = reason
            job.not_before = time.time() + (retry_backoff_s(job.attempt) if backoff else 0.0)
        job.slots, job.exits = [], {}
        await self._save(job)

    # ------------------------------------------------------------------ cycle

    async def _cycle_loop(self) -> None:
        while True:
            # Also re-plan once a second: retry back-offs expire with time.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=1.0)
            self._dirty.clear()
            try:
                await self.cycle()
            except Exception:
                self._log.exception("scheduling cycle failed")

    async def cycle(self) -> None:
        assert self.driver is not None
        t0 = time.perf_counter()
        decided = plan(self.state, time.time())
        self.cycles += 1
        for placement in decided.placements:
            job = self.state.jobs[placement.job]
            job.attempt += 1
            job.status, job.slots, job.exits, job.reason = "running", placement.slots, {}, ""
            self._published_pending.pop(job.id, None)
            await self._publish(JobPlaced(
                id=f"{job.id}-placed-{job.attempt}", source=SOURCE, job=job.id,
                data=JobPlacedData(attempt=job.attempt, workers=placement.slots),
            ))
            await self._save(job)
            self._log.info("job placed", job=job.id, attempt=job.attempt,
                           nodes=[s.node for s in placement.slots])
            await self.driver.launch(job.id, job.attempt, job.spec, placement.slots)
        for pending in decided.pending:
            job = self.state.jobs[pending.job]
            job.reason, job.position = pending.reason, pending.position
            shown = (pending.position, pending.reason)
            if self._published_pending.get(job.id) != shown:
                self._published_pending[job.id] = shown
                await self._publish(JobPending(
                    source=SOURCE, job=job.id,
                    data=JobPendingData(position=pending.position, reason=pending.reason),
                ))
                await self._save(job)
        if decided.placements:
            self._log.info("cycle", placed=len(decided.placements),
                           pending=len(decided.pending),
                           ms=round(1000 * (time.perf_counter() - t0), 2))

    # ------------------------------------------------------------------ output

    async def _publish(self, event: Event) -> None:
        assert self.bus is not None
        await self.bus.publish(event)

    async def _save(self, job: JobRecord) -> None:
        assert self.kv is not None
        value = json.dumps({
            "id": job.id, "spec": job.spec.model_dump(), "submitted_at": job.submitted_at,
            "status": job.status, "attempt": job.attempt,
            "slots": [s.model_dump() for s in job.slots], "reason": job.reason,
            "position": job.position, "not_before": job.not_before, "updated_at": time.time(),
        }).encode()
        try:
            entry = await self.kv.get(job.id)
            await self.kv.update(job.id, value, last=entry.revision)
        except KeyNotFoundError:
            await self.kv.create(job.id, value)

    async def stop(self) -> None:
        if self._cycle_task is not None:
            self._cycle_task.cancel()
        if self.driver is not None:
            await self.driver.close()

    def health(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for job in self.state.jobs.values():
            counts[job.status] = counts.get(job.status, 0) + 1
        ready = sum(1 for n in self.state.nodes.values() if n.state == "ready")
        return {"cycles": self.cycles, "jobs": counts, "nodes_ready": ready}
