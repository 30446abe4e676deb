"""Seeded Lens data for tests: a small cluster's last half hour (three nodes
of four GPUs, a two-rank job with checkpoints whose ranks hold the GPUs of
the first two nodes, logs, bench results, node states and alerts), stored
through the collector's own write paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from clickhouse_connect.driver.client import Client

from libs.events import (
    BenchResult,
    BenchResultData,
    DiskMetrics,
    Event,
    Figure,
    FsMetrics,
    GpuMetrics,
    JobPlaced,
    JobPlacedData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    JobTelemetry,
    JobTelemetryData,
    LensAlert,
    LensAlertData,
    LogRecord,
    LogRecordData,
    NicMetrics,
    NodeStateChanged,
    NodeStateData,
    NodeTelemetry,
    NodeTelemetryData,
    WorkerLog,
    WorkerLogData,
    WorkerSlot,
    encode_event,
)
from libs.store import migrate
from services.lens_collector.ingest import ROUTES, Item, store
from services.lens_collector.rollups import backfill
from services.lens_collector.rows import COLUMNS, rows_for
from services.lens_collector.schema import MIGRATIONS

NODES = ("node-a", "node-b", "node-c")
JOB = "train-7b"
WORKSPACE = "research"
STEP_S = 10


def node_event(node: str, at: datetime, k: int,
               owner: tuple[str, int, int] | None = None) -> NodeTelemetry:
    """A node's sample; ``owner`` (job, attempt, rank) holds all its GPUs."""
    job = dict(zip(("job", "attempt", "rank"), owner, strict=True)) if owner else {}
    gpus = [GpuMetrics(index=g, util_pct=90.0 - g - (k % 5), vram_used_bytes=150 << 30,
                       vram_total_bytes=192 << 30, temp_c=60.0 + g + (k % 7),
                       temp_junction_c=80.0 + g, temp_hbm_c=70.0, power_w=600.0 + g,
                       power_cap_w=750.0, sclk_mhz=2100.0, mclk_mhz=1300.0,
                       ecc_correctable=k // 50, ecc_uncorrectable=0,
                       pcie_rx_bytes_s=2e9, pcie_tx_bytes_s=1e9, **job) for g in range(4)]
    return NodeTelemetry(source=f"bench-agent/{node}", node=node, time=at, data=NodeTelemetryData(
        cpu_pct=20.0 + k % 10, mem_used_bytes=(200 + k) << 30, mem_total_bytes=1 << 41,
        load1=8.5, gpus=gpus, gpu_tool="amd-smi",
        nics=[NicMetrics(name="eth0", rx_bytes_s=1e6 * k, tx_bytes_s=2e6),
              NicMetrics(name="mlx5_0/1", rx_bytes_s=1e10, tx_bytes_s=9e9, rdma=True)],
        disks=[DiskMetrics(name="nvme0n1", read_bytes_s=5e8, write_bytes_s=1e8)],
        filesystems=[FsMetrics(mount="/", free_bytes=100 << 30, total_bytes=1 << 40),
                     FsMetrics(mount="/dev/shm", free_bytes=500 << 30, total_bytes=1 << 40)]))


def seed(client: Client, database: str, *, minutes: int = 30,
         now: datetime | None = None) -> dict[str, int]:
    """Migrate ``database`` and fill it; returns the rows stored per kind."""
    migrate(client, database, MIGRATIONS)
    now = now or datetime.now(UTC)
    start = now - timedelta(minutes=minutes)
    steps = minutes * 60 // STEP_S
    telemetry: list[Event] = []
    for k in range(steps):
        at = start + timedelta(seconds=k * STEP_S)
        telemetry += [node_event(n, at, k, (JOB, 1, i) if i < 2 else None)
                      for i, n in enumerate(NODES)]
        for rank in (0, 1):
            telemetry.append(JobTelemetry(
                source="sdk/node-a", job=JOB, node=NODES[rank], time=at,
                id=f"{JOB}-r{rank}-i{k}", data=JobTelemetryData(
                    rank=rank, iteration=k, loss=4.0 / (1 + k), throughput=250.0,
                    tokens_per_s=512_000.0, step_time_s=0.5, grad_norm=1.5)))
            if k and k % 30 == 0:
                telemetry.append(JobTelemetry(
                    source="sdk/node-a", job=JOB, node=NODES[rank], time=at,
                    id=f"{JOB}-r{rank}-i{k}-ckpt", data=JobTelemetryData(
                        rank=rank, iteration=k, checkpoint_path=f"/ckpt/step-{k}/rank-{rank}.pt",
                        checkpoint_bytes=7 << 30, checkpoint_duration_s=12.5)))
        if k % 20 == 0:
            telemetry.append(LogRecord(source="training", node=NODES[0], job=JOB, time=at,
                                       data=LogRecordData(level="info", message=f"step {k}",
                                                          service="training")))
            telemetry.append(WorkerLog(
                source="local-worker/node-a", job=JOB, node=NODES[0], time=at,
                id=f"{JOB}-a1-r0-l{k}", data=WorkerLogData(
                    attempt=1, rank=0, seq=k, text=[f"step {k} done", "a warning"],
                    stream=["stdout", "stderr"], t_ms=[0, 5])))
            telemetry.append(LogRecord(source="bench-agent", node=NODES[1], time=at,
                                       data=LogRecordData(level="warning", message="hot",
                                                          service="bench-agent")))
    stored = _ingest(client, database, telemetry)
    control: list[Event] = [
        JobSubmitted(source="scheduler", job=JOB, time=start - timedelta(minutes=1),
                     data=JobSubmittedData(spec=JobSpec(name=JOB, workers=2, gpus_per_worker=4,
                                                        command=["train"], workspace=WORKSPACE))),
        JobPlaced(source="scheduler", job=JOB, time=start, data=JobPlacedData(
            attempt=1, workers=[WorkerSlot(rank=r, node=NODES[r], gpus=4) for r in (0, 1)])),
    ]
    for i, node in enumerate(NODES):
        control.append(BenchResult(source=f"bench-agent/{node}", node=node,
                                   time=start + timedelta(minutes=1), data=BenchResultData(
                                       level="quick", passed=i != 2, device="rocm",
                                       device_count=4, gpu_model="MI300X", duration_s=30,
                                       figures=[Figure(name="gemm_bf16_tflops",
                                                       value=600.0 - 50 * i, unit="TFLOPS")])))
        control.append(NodeStateChanged(source="bootstrap", node=node,
                                        time=start + timedelta(minutes=2),
                                        data=NodeStateData(state="quarantined" if i == 2
                                                           else "ready")))
    opened = now - timedelta(minutes=10)
    for state in ("open", "closed"):
        control.append(_alert("gpu_temp_high", state, opened, node=NODES[1], gpu=2,
                              at=opened if state == "open" else now - timedelta(minutes=2)))
    control.append(_alert("throughput_low", "open", now - timedelta(minutes=5), job=JOB))
    control.append(_alert("node_down", "open", now - timedelta(minutes=4), node=NODES[2]))
    control.append(_alert("gpu_power_high", "open", now - timedelta(minutes=3), node=NODES[0],
                          gpu=1))
    for table, rows in rows_for([(e, i + 1) for i, e in enumerate(control)]).items():
        client.insert(f"{database}.{table}", rows, column_names=COLUMNS[table])
        stored[table] = len(rows)
    backfill(client, database, start, now + timedelta(minutes=1))
    return stored


def _alert(rule: str, state: str, opened: datetime, *, at: datetime | None = None,
           node: str | None = None, job: str | None = None, gpu: int | None = None) -> LensAlert:
    key = job or f"{node}" + (f"/gpu{gpu}" if gpu is not None else "")
    alert_id = f"{rule}-{key}".replace("/", "-")
    return LensAlert(id=f"{alert_id}-{state}", source="lens-collector", node=node, job=job,
                     time=at or opened, data=LensAlertData(
                         alert_id=alert_id, rule=rule, state=state, subject_key=key, gpu=gpu,
                         value=85.0, threshold=80.0, message=f"{rule} on {key}",
                         opened_at=opened))


def _ingest(client: Client, database: str, events: list[Event]) -> dict[str, int]:
    stored: dict[str, int] = {}
    for route in ROUTES:
        items = [Item(encode_event(e), e.id) for e in events if e.type == route.event_type]
        count, refused = store(client, database, route, items)
        assert not refused, refused
        stored[route.table] = count
    return stored
