"""Turning events into table rows (pure): which table each event feeds and
the column values, so the writer only inserts columns."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from libs.events import Event, JobTelemetry, NodeTelemetry

COLUMNS: dict[str, list[str]] = {
    "events": ["id", "type", "time", "source", "node", "job", "subject", "stream_seq", "data"],
    "node_metrics": ["time", "node", "event_id", "cpu_pct", "mem_used_bytes",
                     "mem_total_bytes", "load1"],
    "gpu_metrics": ["time", "node", "gpu", "event_id", "util_pct", "vram_used_bytes",
                    "vram_total_bytes", "temp_c", "power_w"],
    "job_metrics": ["time", "job", "rank", "attempt", "node", "event_id", "iteration", "loss",
                    "throughput", "step_time_s", "checkpoint_path"],
}


def rows_for(events: list[tuple[Event, int]]) -> dict[str, list[list[Any]]]:
    """Rows per table for a batch of (event, stream sequence)."""
    out: dict[str, list[list[Any]]] = defaultdict(list)
    for event, seq in events:
        t = event.time.replace(tzinfo=None)  # the driver wants naive UTC
        if isinstance(event, NodeTelemetry):
            d = event.data
            out["node_metrics"].append([t, event.node, event.id, d.cpu_pct, d.mem_used_bytes,
                                        d.mem_total_bytes, d.load1])
            for g in d.gpus:
                out["gpu_metrics"].append([t, event.node, g.index, event.id, g.util_pct,
                                           g.vram_used_bytes, g.vram_total_bytes, g.temp_c,
                                           g.power_w])
        elif isinstance(event, JobTelemetry):
            d = event.data
            out["job_metrics"].append([t, event.job, d.rank, d.attempt, event.node or "",
                                       event.id,
                                       d.iteration, d.loss, d.throughput, d.step_time_s,
                                       d.checkpoint_path])
        else:
            out["events"].append([event.id, event.type, t, event.source, event.node or "",
                                  event.job or "", event.subject, seq,
                                  json.dumps(event.model_dump(mode="json")["data"])])
    return dict(out)
