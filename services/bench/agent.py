"""The bench agent: one per node. It beats a heartbeat, samples node
telemetry, and answers ``bench.request`` for its node with a measured,
judged ``bench.result``. Measuring and judging live in probes/verdict; this
module only wires them to the bus."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from libs.bus import CONTROL, Bus
from libs.events import (
    BenchRequest,
    BenchResult,
    BenchResultData,
    Event,
    HeartbeatData,
    NodeHeartbeat,
    NodeTelemetry,
    NodeTelemetryData,
)
from libs.logs import get_logger
from libs.settings import Settings
from services.bench import probes
from services.bench.host_metrics import HostSampler
from services.bench.verdict import judge_quick


class BenchAgent:
    name = "bench-agent"

    def __init__(self, settings: Settings, node: str) -> None:
        self.settings = settings
        self.node = node
        self.source = f"bench-agent/{node}"
        self.bus: Bus | None = None
        self.host = HostSampler()
        self.beats = 0
        self.results = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._log = get_logger(node=node)

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self._tasks = [
            asyncio.create_task(self._heartbeat()),
            asyncio.create_task(self._telemetry()),
        ]
        bus.consume(
            durable=f"bench-agent-{self.node}",
            subjects=[BenchRequest.subject_template.format(root="safe", node=self.node)],
            stream=CONTROL,
            handler=self._on_request,
            batch=1,
            ack_wait_s=300,
        )

    async def _heartbeat(self) -> None:
        assert self.bus is not None
        interval = self.settings.heartbeat_interval_s
        while True:
            self.beats += 1
            with contextlib.suppress(Exception):
                await self.bus.publish(NodeHeartbeat(
                    source=self.source, node=self.node,
                    data=HeartbeatData(seq=self.beats, pid=os.getpid(), interval_s=interval),
                ))
            await asyncio.sleep(interval)

    async def _telemetry(self) -> None:
        assert self.bus is not None
        self.host.cpu_pct()  # prime the CPU counters
        while True:
            await asyncio.sleep(self.settings.telemetry_interval_s)
            used, total = self.host.memory()
            with contextlib.suppress(Exception):
                await self.bus.publish(NodeTelemetry(
                    source=self.source, node=self.node,
                    data=NodeTelemetryData(cpu_pct=self.host.cpu_pct(), mem_used_bytes=used,
                                           mem_total_bytes=total, load1=self.host.load1()),
                ))

    async def _on_request(self, event: Event) -> None:
        assert isinstance(event, BenchRequest) and self.bus is not None
        log = self._log.bind(request=event.id, level=event.data.level)
        log.info("bench started")
        t0 = time.monotonic()
        measured = await asyncio.to_thread(probes.quick)
        verdict = judge_quick(
            device_count=measured.device_count,
            expected_devices=event.data.expected_devices,
            gemm_tflops=measured.gemm_tflops,
            gemm_error=measured.gemm_max_abs_error,
        )
        # Deterministic id: a redelivered request yields the same result event.
        await self.bus.publish(BenchResult(
            id=f"{event.id}-result",
            source=self.source, node=self.node,
            data=BenchResultData(
                level=event.data.level, request_id=event.id, passed=verdict.passed,
                reason=verdict.reason, device=measured.device,
                device_count=measured.device_count, gpu_model=measured.device_name,
                dtype=measured.dtype, figures=measured.figures,
                duration_s=round(time.monotonic() - t0, 3),
            ),
        ))
        self.results += 1
        log.info("bench finished", passed=verdict.passed, reason=verdict.reason)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def health(self) -> dict[str, Any]:
        return {"heartbeats": self.beats, "bench_results": self.results}
