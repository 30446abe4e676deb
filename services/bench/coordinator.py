"""The bench coordinator: one replica that keeps the latest bench result of
every node (the ``bench`` KV bucket) and answers the fleet report: each
figure against the median of nodes with the same GPU model
(``services.bench.fleet``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from libs.bus import CONTROL, QUERY_SUBJECT, Bus
from libs.events import BenchResult, Event
from libs.logs import get_logger
from libs.settings import Settings
from services.bench.fleet import NodeFigure, compare_with_fleet

# Figures where more is better; the others are shown but not judged.
HIGHER_IS_BETTER = {"gemm_fp32_512_tflops"}
REPORT_SUBJECT = QUERY_SUBJECT.format(name="bench.report")


class BenchCoordinator:
    name = "bench-coordinator"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.latest: dict[str, dict[str, Any]] = {}
        self.kv: KeyValue | None = None
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.kv = await bus.kv("bench")
        try:
            for key in await self.kv.keys():
                self.latest[key] = json.loads((await self.kv.get(key)).value)
        except NoKeysError:
            pass
        bus.consume(durable="bench-coordinator", subjects=["safe.bench.*.result"],
                    stream=CONTROL, handler=self._on_result)
        await bus.serve(REPORT_SUBJECT, self._report, queue="bench-coordinator")

    async def _on_result(self, event: Event) -> None:
        assert isinstance(event, BenchResult) and self.kv is not None
        known = self.latest.get(event.node)
        if known is not None and known["time"] >= event.time.timestamp():
            return  # older than what we hold (redelivery or replay)
        record = {"node": event.node, "time": event.time.timestamp(), "event_id": event.id,
                  **event.data.model_dump(mode="json")}
        value = json.dumps(record).encode()
        try:
            entry = await self.kv.get(event.node)
            await self.kv.update(event.node, value, last=entry.revision)
        except KeyNotFoundError:
            await self.kv.create(event.node, value)
        self.latest[event.node] = record

    def report(self) -> list[dict[str, Any]]:
        figures = [NodeFigure(r["node"], r["gpu_model"] or r["device"], f["name"], f["value"],
                              f["unit"])
                   for r in self.latest.values() for f in r["figures"]]
        judged = compare_with_fleet(figures, higher_is_better=HIGHER_IS_BETTER)
        rows = [{**asdict(d), "passed": self.latest[d.node]["passed"],
                 "level": self.latest[d.node]["level"]} for d in judged]
        return rows

    async def _report(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "rows": self.report()}

    async def stop(self) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {"nodes_with_results": len(self.latest)}
