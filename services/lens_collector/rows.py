"""Events as table rows (pure): which table each event feeds and the column
values. The collector stores control events this way; telemetry it hands to
ClickHouse as raw JSON (see ``ingest``), and ``tests/lens`` checks that both
ways give the same rows, so this module is also the readable reference of
what the ingest views compute."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from libs.events import Event, JobTelemetry, LensAlert, LogRecord, NodeTelemetry

GPU_READINGS: tuple[str, ...] = (
    "util_pct", "vram_used_bytes", "vram_total_bytes", "temp_c", "power_w", "temp_junction_c",
    "temp_hbm_c", "power_cap_w", "sclk_mhz", "mclk_mhz", "ecc_correctable", "ecc_uncorrectable",
    "pcie_rx_bytes_s", "pcie_tx_bytes_s", "xgmi_rx_bytes_s", "xgmi_tx_bytes_s",
)
# The worker a GPU is placed with (migration 9): '' and 0 for an idle GPU.
GPU_OWNER: tuple[str, ...] = ("job", "attempt", "rank")
JOB_FIGURES: tuple[str, ...] = (
    "grad_norm", "tokens_per_s", "checkpoint_bytes", "checkpoint_duration_s", "dropped")

COLUMNS: dict[str, list[str]] = {
    "events": ["id", "type", "time", "source", "node", "job", "subject", "stream_seq", "data"],
    "node_metrics": ["time", "node", "event_id", "cpu_pct", "mem_used_bytes",
                     "mem_total_bytes", "load1", "gpu_count", "gpu_tool", "net_rx_bytes_s",
                     "net_tx_bytes_s", "rdma_rx_bytes_s", "rdma_tx_bytes_s",
                     "disk_read_bytes_s", "disk_write_bytes_s", "fs_free_bytes",
                     "fs_total_bytes"],
    "gpu_metrics": ["time", "node", "gpu", "event_id", *GPU_READINGS, *GPU_OWNER],
    "job_metrics": ["time", "job", "rank", "attempt", "node", "event_id", "iteration", "loss",
                    "throughput", "step_time_s", "checkpoint_path", *JOB_FIGURES],
    "logs": ["time", "id", "service", "level", "node", "job", "message", "fields"],
    "alerts": ["time", "alert_id", "state", "rule", "severity", "subject_key", "node", "job",
               "gpu", "value", "threshold", "message", "opened_at", "event_id"],
}
# The column naming the event a row came from.
EVENT_ID_COLUMN: dict[str, str] = {"events": "id", "logs": "id"}

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def rows_for(events: list[tuple[Event, int]]) -> dict[str, list[list[Any]]]:
    """Rows per table for a batch of (event, stream sequence)."""
    out: dict[str, list[list[Any]]] = defaultdict(list)
    for event, seq in events:
        t = event.time.replace(tzinfo=None)  # the driver wants naive UTC
        if isinstance(event, NodeTelemetry):
            _node_rows(out, event, t)
        elif isinstance(event, JobTelemetry):
            d = event.data
            loss = _NONFINITE[d.loss_nonfinite] if d.loss_nonfinite else d.loss
            out["job_metrics"].append([t, event.job, d.rank, d.attempt, event.node or "",
                                       event.id, d.iteration, loss, d.throughput,
                                       d.step_time_s, d.checkpoint_path,
                                       *(getattr(d, f) for f in JOB_FIGURES)])
        elif isinstance(event, LogRecord):
            d = event.data
            out["logs"].append([t, event.id, d.service or event.source, d.level,
                                event.node or "", event.job or "", d.message,
                                json.dumps(d.fields, default=str)])
        else:
            out["events"].append([event.id, event.type, t, event.source, event.node or "",
                                  event.job or "", event.subject, seq,
                                  json.dumps(event.model_dump(mode="json")["data"])])
            if isinstance(event, LensAlert):
                a = event.data
                out["alerts"].append([t, a.alert_id, a.state, a.rule, a.severity,
                                      a.subject_key, event.node or "", event.job or "", a.gpu,
                                      a.value, a.threshold, a.message,
                                      a.opened_at.replace(tzinfo=None), event.id])
    return dict(out)


def _node_rows(out: dict[str, list[list[Any]]], event: NodeTelemetry, t: Any) -> None:
    d = event.data
    eth = [n for n in d.nics if not n.rdma]
    ib = [n for n in d.nics if n.rdma]
    out["node_metrics"].append([
        t, event.node, event.id, d.cpu_pct, d.mem_used_bytes, d.mem_total_bytes, d.load1,
        len(d.gpus), d.gpu_tool or "",
        {n.name: n.rx_bytes_s for n in eth}, {n.name: n.tx_bytes_s for n in eth},
        {n.name: n.rx_bytes_s for n in ib}, {n.name: n.tx_bytes_s for n in ib},
        {x.name: x.read_bytes_s for x in d.disks}, {x.name: x.write_bytes_s for x in d.disks},
        {f.mount: f.free_bytes for f in d.filesystems},
        {f.mount: f.total_bytes for f in d.filesystems},
    ])
    for g in d.gpus:
        out["gpu_metrics"].append([t, event.node, g.index, event.id,
                                   *(getattr(g, f) for f in GPU_READINGS),
                                   g.job or "", g.attempt or 0, g.rank])
