"""The event contract: one envelope, one typed model per event type.

Every fact that crosses the bus is an `Event` subclass. The envelope carries
what every consumer needs to route, de-duplicate and join (id, type, time,
source, node/job keys, schema version); `data` carries the typed payload.
`proto/` is generated from these models (``make proto``) so other languages
and teams share the same contract, and a test fails when the two drift.

Compatibility rule: adding an optional field is fine; anything else is a new
``version`` of the event.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

# Node names and job ids become NATS subject tokens, so they may not contain
# dots, wildcards or whitespace.
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
_KEY_RE = re.compile(KEY_PATTERN)
SUBJECT_ROOT = "safe"


def new_event_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_key(value: str, what: str) -> str:
    """Raise ValueError unless ``value`` can be used as a subject token."""
    if not _KEY_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid name: use letters, digits, '-' or '_' "
            "(at most 63 characters, starting with a letter or digit)"
        )
    return value


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Event(Frozen):
    """The envelope every event shares."""

    subject_template: ClassVar[str]

    id: str = Field(default_factory=new_event_id, description="unique; also the Nats-Msg-Id")
    type: str
    time: datetime = Field(default_factory=utcnow, description="UTC")
    source: str = Field(description="service (and node) that published the event")
    node: str | None = None
    job: str | None = None
    version: int = 1
    data: Any

    @field_validator("node", "job")
    @classmethod
    def _subject_safe(cls, value: str | None) -> str | None:
        return None if value is None else check_key(value, "key")

    @field_validator("time")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Naive datetimes (as ClickHouse returns them) are taken as UTC.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @property
    def subject(self) -> str:
        return self.subject_template.format(root=SUBJECT_ROOT, node=self.node, job=self.job)


# --------------------------------------------------------------------------- node


class NodeRegisteredData(Frozen):
    ip: str
    gpu_model: str
    gpu_count: int = Field(ge=0)
    roles: list[str] = Field(default_factory=lambda: ["worker"])
    labels: dict[str, str] = Field(default_factory=dict)


class NodeRegistered(Event):
    subject_template = "{root}.node.{node}.registered"
    type: Literal["node.registered"] = "node.registered"
    node: str
    data: NodeRegisteredData


NodeStateName = Literal["registered", "preflight", "ready", "quarantined", "cordoned"]


class NodeStateData(Frozen):
    state: NodeStateName
    reason: str = ""


class NodeStateChanged(Event):
    """Bootstrap's word on what a node may be used for; the scheduler obeys it."""

    subject_template = "{root}.node.{node}.state"
    type: Literal["node.state"] = "node.state"
    node: str
    data: NodeStateData


class HeartbeatData(Frozen):
    seq: int = Field(ge=0)
    pid: int
    interval_s: float = Field(gt=0)


class NodeHeartbeat(Event):
    subject_template = "{root}.node.{node}.heartbeat"
    type: Literal["node.heartbeat"] = "node.heartbeat"
    node: str
    data: HeartbeatData


# --------------------------------------------------------------------------- bench

BenchLevel = Literal["quick", "standard", "full"]


class BenchRequestData(Frozen):
    level: BenchLevel = "quick"
    reason: str = ""
    expected_devices: int | None = Field(default=None, ge=0, description="from the inventory")


class BenchRequest(Event):
    subject_template = "{root}.bench.{node}.request"
    type: Literal["bench.request"] = "bench.request"
    node: str
    data: BenchRequestData


class Figure(Frozen):
    """One measured number with its unit, e.g. gemm_fp32_tflops = 0.21 TFLOPS."""

    name: str
    value: float
    unit: str


class BenchResultData(Frozen):
    level: BenchLevel
    request_id: str | None = Field(default=None, description="id of the bench.request")
    passed: bool
    reason: str = ""
    device: str = Field(description="cpu, cuda or rocm")
    device_count: int = Field(ge=0)
    gpu_model: str = ""
    dtype: str = "fp32"
    figures: list[Figure] = Field(default_factory=list)
    duration_s: float = Field(ge=0)


class BenchResult(Event):
    subject_template = "{root}.bench.{node}.result"
    type: Literal["bench.result"] = "bench.result"
    node: str
    data: BenchResultData


# --------------------------------------------------------------------------- job


class JobSpec(Frozen):
    """What a user asks for (the body of job.yaml)."""

    name: str
    workers: int = Field(ge=1, le=4096)
    gpus_per_worker: int = Field(default=0, ge=0, le=64)
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(default=None, description="working directory of the workers")
    priority: Literal["low", "medium", "high"] = "medium"
    workspace: str = "default"
    gpu_model: str | None = None
    max_retry: int = Field(default=3, ge=0, le=50)
    checkpoint_interval: int = Field(default=50, ge=1, description="iterations between checkpoints")


class JobSubmittedData(Frozen):
    spec: JobSpec


class JobSubmitted(Event):
    subject_template = "{root}.job.{job}.submitted"
    type: Literal["job.submitted"] = "job.submitted"
    job: str
    data: JobSubmittedData


class WorkerSlot(Frozen):
    rank: int = Field(ge=0)
    node: str
    gpus: int = Field(ge=0)


class JobPlacedData(Frozen):
    attempt: int = Field(ge=1)
    workers: list[WorkerSlot]


class JobPlaced(Event):
    subject_template = "{root}.job.{job}.placed"
    type: Literal["job.placed"] = "job.placed"
    job: str
    data: JobPlacedData


class JobPendingData(Frozen):
    position: int = Field(ge=1)
    reason: str


class JobPending(Event):
    subject_template = "{root}.job.{job}.pending"
    type: Literal["job.pending"] = "job.pending"
    job: str
    data: JobPendingData


class JobEndedData(Frozen):
    attempt: int = Field(ge=1)
    duration_s: float = Field(ge=0)
    reason: str = ""


class JobCompleted(Event):
    subject_template = "{root}.job.{job}.completed"
    type: Literal["job.completed"] = "job.completed"
    job: str
    data: JobEndedData


class JobFailed(Event):
    subject_template = "{root}.job.{job}.failed"
    type: Literal["job.failed"] = "job.failed"
    job: str
    data: JobEndedData


# --------------------------------------------------------------------------- worker


class WorkerStartedData(Frozen):
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    pid: int


class WorkerStarted(Event):
    subject_template = "{root}.worker.{job}.started"
    type: Literal["worker.started"] = "worker.started"
    job: str
    node: str
    data: WorkerStartedData


class WorkerExitedData(Frozen):
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    exit_code: int = Field(description="negative: killed by that signal")


class WorkerExited(Event):
    subject_template = "{root}.worker.{job}.exited"
    type: Literal["worker.exited"] = "worker.exited"
    job: str
    node: str
    data: WorkerExitedData


# --------------------------------------------------------------------------- fault


class FaultOpenedData(Frozen):
    fault_id: str
    kind: str = Field(description="e.g. heartbeat_missed, bench_failed, worker_crash")
    reason: str
    jobs: list[str] = Field(default_factory=list, description="jobs running on the node")


class FaultOpened(Event):
    subject_template = "{root}.fault.{node}.opened"
    type: Literal["fault.opened"] = "fault.opened"
    node: str
    data: FaultOpenedData


# --------------------------------------------------------------------------- telemetry


class GpuMetrics(Frozen):
    index: int = Field(ge=0)
    util_pct: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None


class NodeTelemetryData(Frozen):
    cpu_pct: float = Field(ge=0)
    mem_used_bytes: int = Field(ge=0)
    mem_total_bytes: int = Field(ge=0)
    load1: float = Field(ge=0)
    gpus: list[GpuMetrics] = Field(default_factory=list)


class NodeTelemetry(Event):
    subject_template = "{root}.telemetry.node.{node}"
    type: Literal["telemetry.node"] = "telemetry.node"
    node: str
    data: NodeTelemetryData


class JobTelemetryData(Frozen):
    rank: int = Field(ge=0)
    attempt: int = Field(default=1, ge=1)
    iteration: int = Field(ge=0)
    loss: float | None = None
    throughput: float | None = Field(default=None, description="samples per second")
    step_time_s: float | None = None
    checkpoint_path: str | None = Field(default=None, description="set when a checkpoint was saved")


class JobTelemetry(Event):
    subject_template = "{root}.telemetry.job.{job}"
    type: Literal["telemetry.job"] = "telemetry.job"
    job: str
    data: JobTelemetryData


EVENT_TYPES: tuple[type[Event], ...] = (
    NodeRegistered,
    NodeStateChanged,
    NodeHeartbeat,
    BenchRequest,
    BenchResult,
    JobSubmitted,
    JobPlaced,
    JobPending,
    JobCompleted,
    JobFailed,
    WorkerStarted,
    WorkerExited,
    FaultOpened,
    NodeTelemetry,
    JobTelemetry,
)

AnyEvent = Annotated[
    NodeRegistered
    | NodeStateChanged
    | NodeHeartbeat
    | BenchRequest
    | BenchResult
    | JobSubmitted
    | JobPlaced
    | JobPending
    | JobCompleted
    | JobFailed
    | WorkerStarted
    | WorkerExited
    | FaultOpened
    | NodeTelemetry
    | JobTelemetry,
    Field(discriminator="type"),
]

_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent)


def parse_event(payload: bytes | str) -> Event:
    """Decode and validate one event; raises pydantic.ValidationError."""
    return _ADAPTER.validate_json(payload)


def encode_event(event: Event) -> bytes:
    return event.model_dump_json().encode()


def event_type_name(cls: type[Event]) -> str:
    return cls.model_fields["type"].default
