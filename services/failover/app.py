"""Failover service shell: feeds heartbeats and registrations into the pure
``HeartbeatMonitor``, checks it on a timer and opens a fault (``fault.opened``)
for every node that went silent, naming the jobs that ran there."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from libs.bus import CONTROL, Bus
from libs.events import (
    Event,
    FaultOpened,
    FaultOpenedData,
    JobCompleted,
    JobFailed,
    JobPlaced,
    NodeHeartbeat,
    NodeRegistered,
)
from libs.logs import get_logger
from libs.settings import Settings
from services.failover.rules import HeartbeatMonitor

SOURCE = "failover"


class Failover:
    name = "failover"

    def __init__(self, settings: Settings) -> None:
        self.monitor = HeartbeatMonitor(settings.heartbeat_interval_s, settings.heartbeat_missed)
        self.placements: dict[str, set[str]] = {}  # job -> nodes
        self.opened = 0
        self.bus: Bus | None = None
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        bus.consume(
            durable="failover",
            subjects=["safe.node.*.heartbeat", "safe.node.*.registered", "safe.job.*.placed",
                      "safe.job.*.completed", "safe.job.*.failed"],
            stream=CONTROL,
            handler=self._on_event,
            batch=256,
        )
        self._task = asyncio.create_task(self._watch())

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, NodeHeartbeat):
            if self.monitor.beat(event.node, event.time.timestamp()):
                self._log.info("node beats again", node=event.node)
        elif isinstance(event, NodeRegistered):
            # Time a new node from now, not from an old registration replayed.
            self.monitor.watch(event.node, max(event.time.timestamp(), time.time()))
        elif isinstance(event, JobPlaced):
            self.placements[event.job] = {w.node for w in event.data.workers}
        elif isinstance(event, JobCompleted | JobFailed):
            self.placements.pop(event.job, None)

    async def _watch(self) -> None:
        assert self.bus is not None
        period = min(0.5, self.monitor.interval_s / 2)
        while True:
            await asyncio.sleep(period)
            for missed in self.monitor.check(time.time()):
                jobs = sorted(j for j, nodes in self.placements.items() if missed.node in nodes)
                fault_id = f"hb-{missed.node}-{int(missed.last_seen * 1000)}"
                await self.bus.publish(FaultOpened(
                    id=fault_id, source=SOURCE, node=missed.node,
                    data=FaultOpenedData(
                        fault_id=fault_id, kind="heartbeat_missed", jobs=jobs,
                        reason=f"no heartbeat for {missed.overdue_s:.1f} s "
                               f"(limit {self.monitor.deadline_s:.1f} s)",
                    ),
                ))
                await self._record(fault_id, {
                    "fault_id": fault_id, "node": missed.node, "kind": "heartbeat_missed",
                    "status": "opened", "jobs": jobs, "opened_at": time.time(),
                    "last_seen": missed.last_seen,
                })
                self.opened += 1
                self._log.warning("fault opened", node=missed.node, kind="heartbeat_missed",
                                  jobs=jobs)

    async def _record(self, fault_id: str, record: dict[str, Any]) -> None:
        assert self.bus is not None
        kv = await self.bus.kv("faults")
        await kv.put(fault_id, json.dumps(record).encode())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def health(self) -> dict[str, Any]:
        return {"watched_nodes": len(self.monitor.last_seen), "down": sorted(self.monitor.down),
                "faults_opened": self.opened}
