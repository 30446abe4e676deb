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

import json
import math
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from libs.log_formats import Format, check_format_name
from libs.workload import (
    Resources,
    SecretRef,
    Toleration,
    Volume,
    check_names,
    check_node_selector,
)

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
    # High-rate events leave unset (None) readings out of their JSON.
    compact_json: ClassVar[bool] = False

    id: str = Field(default_factory=new_event_id, description="unique; also the Nats-Msg-Id")
    type: str
    time: datetime = Field(default_factory=utcnow, description="UTC")
    source: str = Field(description="service (and node) that published the event")
    node: str | None = None
    job: str | None = None
    version: int = Field(default=1, ge=1, description="schema version of this event type")
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


class NodeDescription(Frozen):
    """What a node is: its address, GPUs, roles and labels (rack, switch,
    pool). One model from the hosts file to the scheduler: a hosts file
    entry (``libs.inventory.HostSpec``) is a name, this, and SSH access;
    ``node.registered`` carries it; the ``nodes`` bucket keeps it
    (``libs.records.NodeRecord``). The placement core has its own frozen
    copy, made in one place (``services/scheduler/view.py``)."""

    ip: str
    roles: list[str] = Field(default_factory=lambda: ["worker"])
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_model: str
    gpu_count: int = Field(ge=0)

    @property
    def rack(self) -> str:
        return self.labels.get("rack", "")

    @property
    def switch(self) -> str:
        return self.labels.get("switch", "")

    @property
    def pool(self) -> str:
        return self.labels.get("pool", "default")

    def registered(self) -> NodeRegisteredData:
        """The description alone, as ``node.registered`` carries it."""
        return NodeRegisteredData.model_validate(
            self.model_dump(include=set(NodeDescription.model_fields)))


class NodeRegisteredData(NodeDescription):
    """The registered node's description."""


class NodeRegistered(Event):
    subject_template = "{root}.node.{node}.registered"
    type: Literal["node.registered"] = "node.registered"
    node: str
    data: NodeRegisteredData


# Only "ready" is usable. "quarantined": out of service after a fault or a
# failed bench, back once it passes bench again. The states after it come
# with bootstrap's provisioning pipeline and node removal.
NodeStateName = Literal["registered", "preflight", "ready", "quarantined",
                        "provisioning", "provisioned", "repair", "draining"]


class NodeStateData(Frozen):
    state: NodeStateName
    reason: str = ""
    schedulable: bool = Field(default=True, description="false: cordoned by an operator; "
                              "no new job is placed there, running ones stay")
    drain: bool = Field(default=False, description="an operator drains the node: its jobs "
                        "move away now (checkpointed, no retry spent)")
    degraded: bool = Field(default=False, description="its last bench passed but below its "
                           "fleet: the scheduler uses it last, or not at all")


class NodeStateChanged(Event):
    """Bootstrap's word on what a node may be used for; the scheduler obeys it."""

    subject_template = "{root}.node.{node}.state"
    type: Literal["node.state"] = "node.state"
    node: str
    data: NodeStateData


class NodeProvisionedData(Frozen):
    ok: bool
    reason: str = ""


class NodeProvisioned(Event):
    """Kubespray's result for one node (from ``bootstrap apply``)."""

    subject_template = "{root}.node.{node}.provisioned"
    type: Literal["node.provisioned"] = "node.provisioned"
    node: str
    data: NodeProvisionedData


class NodeRemovedData(Frozen):
    reason: str = ""


class NodeRemoved(Event):
    """The node left the hosts file and its jobs were moved away: forget it."""

    subject_template = "{root}.node.{node}.removed"
    type: Literal["node.removed"] = "node.removed"
    node: str
    data: NodeRemovedData


class HeartbeatData(Frozen):
    seq: int = Field(ge=0)
    pid: int
    interval_s: float = Field(gt=0)


class NodeCommandData(Frozen):
    by: str = Field(default="", description="who asked (the operator's user name)")
    reason: str = Field(default="", max_length=1000)


class NodeCordonRequested(Event):
    """An operator asks that no new job be placed on the node (running ones stay)."""

    subject_template = "{root}.node.{node}.cordon"
    type: Literal["node.cordon"] = "node.cordon"
    node: str
    data: NodeCommandData


class NodeUncordonRequested(Event):
    """An operator lets the scheduler place jobs on the node again."""

    subject_template = "{root}.node.{node}.uncordon"
    type: Literal["node.uncordon"] = "node.uncordon"
    node: str
    data: NodeCommandData


class NodeDrainRequested(Event):
    """An operator cordons the node and moves its jobs away (each checkpoints
    and is queued again at the head, no retry spent)."""

    subject_template = "{root}.node.{node}.drain"
    type: Literal["node.drain"] = "node.drain"
    node: str
    data: NodeCommandData


class AgentStoppingData(Frozen):
    back_within_s: float = Field(ge=0, le=3600, description="how soon its agent expects to "
                                 "beat again (a restart or an upgrade of the agent)")
    reason: str = Field(default="", max_length=1000)


class NodeAgentStopping(Event):
    """A node's bench agent stops cleanly (SIGTERM: a restart, a rolling
    upgrade of its DaemonSet). Its node and its workers run on; failover
    waits ``back_within_s`` for the next heartbeat before it opens a fault."""

    subject_template = "{root}.node.{node}.agent_stopping"
    type: Literal["node.agent_stopping"] = "node.agent_stopping"
    node: str
    data: AgentStoppingData


class NodeHeartbeat(Event):
    """A node's agent is alive: one a second from every node. Liveness only,
    so it goes out on core NATS under ``safe.live`` (no stream keeps it, no
    history table stores it): at 12,500 nodes a stream would keep about a
    billion beats a day that no one reads twice. Its receiver judges it by
    its subject (the node) and the moment it arrives."""

    subject_template = "{root}.live.{node}.heartbeat"
    type: Literal["node.heartbeat"] = "node.heartbeat"
    node: str
    data: HeartbeatData


# --------------------------------------------------------------------------- bench

BenchLevel = Literal["quick", "standard", "full"]
BenchOutcome = Literal["healthy", "degraded", "failed"]


class BenchRendezvous(Frozen):
    """Where the agents of a multi-node test meet (torch.distributed TCP store).

    Every node in ``nodes`` gets a request with the same rendezvous; a node's
    index in ``nodes`` is its node rank, the first node hosts the store."""

    session: str = Field(description="shared by every request of one multi-node test")
    nodes: list[str] = Field(min_length=2, description="node rank order; nodes[0] is the master")
    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    ranks_per_node: int = Field(default=1, ge=1, le=64)
    timeout_s: float = Field(default=120.0, gt=0)
    purpose: str = Field(default="", description="e.g. 'pair with healthy partner', 'split search'")


class BenchSweep(Frozen):
    """A fleet sweep: nodes measured side by side and judged against each other.

    With ``turn_subject`` the nodes share hardware (several agents on one
    machine): they take turns, one timed sample at a time, by request-reply
    on that subject, so every node is measured under the same conditions."""

    session: str
    nodes: list[str] = Field(min_length=1)
    turn_subject: str | None = Field(default=None, description="take turns here when set")


class BenchRequestData(Frozen):
    level: BenchLevel = "quick"
    reason: str = ""
    expected_devices: int | None = Field(default=None, ge=0, description="from the inventory")
    attempt: int = Field(default=1, ge=1, description="2 when repeating a failed run")
    retry_of: str | None = Field(default=None, description="id of the request this one repeats")
    rendezvous: BenchRendezvous | None = Field(
        default=None, description="set: run only the multi-node collective with these nodes")
    sweep: BenchSweep | None = Field(default=None, description="set: part of a fleet sweep")
    expires_at: datetime | None = Field(
        default=None, description="an agent that reads it later skips it (a periodic re-bench "
        "of a quarantined node is superseded by the next one)")


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


class BenchCheck(Frozen):
    """One pass/fail check of a bench run or health probe."""

    name: str
    status: Literal["ok", "failed", "unavailable", "skipped"]
    detail: str = ""


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
    outcome: BenchOutcome | None = Field(
        default=None, description="healthy, degraded or failed; failed only after a repeat")
    attempt: int = Field(default=1, ge=1)
    retry_of: str | None = Field(default=None, description="id of the request this run repeats")
    judged_by: Literal["agent", "coordinator"] = Field(
        default="agent", description="coordinator: the fleet-relative verdict on a node's run")
    verdict_of: str | None = Field(default=None, description="id of the bench.result judged")
    trigger: Literal["request", "probe"] = Field(
        default="request", description="probe: a periodic health check failed repeatedly")
    fault_kind: str | None = Field(
        default=None, max_length=64, description="a probe's report: the fault kind its "
        "catalogue entry names (services/bench/health), for failover's rule probe:<kind>")
    checks: list[BenchCheck] = Field(default_factory=list)
    session: str | None = Field(default=None, description="rendezvous session of a multi-node test")
    peers: list[str] = Field(default_factory=list, description="nodes of a multi-node test")
    sweep: str | None = Field(default=None, description="session of the fleet sweep of this run")


class BenchResult(Event):
    subject_template = "{root}.bench.{node}.result"
    type: Literal["bench.result"] = "bench.result"
    node: str
    data: BenchResultData


# --------------------------------------------------------------------------- job


# A job's name is a lower-case RFC 1123 label (what Kubernetes accepts as a
# name, and safe as a NATS subject token): the job id is built from it.
JOB_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_JOB_NAME_RE = re.compile(JOB_NAME_PATTERN)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The NATS server's default max_payload is 1 MiB; job.submitted and the job's
# record carry the whole spec plus their own fields, so the spec gets half.
NATS_MAX_PAYLOAD = 1024 * 1024
MAX_SPEC_BYTES = NATS_MAX_PAYLOAD // 2


class JobSpec(Frozen):
    """What a user asks for (the body of job.yaml)."""

    name: str = Field(description="a lower-case RFC 1123 label: a-z, 0-9 and '-', "
                      "starting and ending with a letter or digit, at most 63 characters")
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
    min_runtime_s: float = Field(default=0.0, ge=0, description="never preempted before this")
    preemptible: bool = True
    unit_workers: int = Field(default=1, ge=1, description="ranks per parallelism unit (TP x PP)")
    unit_scope: Literal["node", "rack"] = Field(
        default="node", description="a unit never straddles this boundary")
    expected_runtime_s: float | None = Field(
        default=None, gt=0, description="an estimate; lets the job backfill into held capacity")
    max_runtime_s: float | None = Field(
        default=None, gt=0, description="stopped and failed once it has run this long, over "
        "all its attempts (time stopped or queued does not count)")
    ttl_after_finished_s: float | None = Field(
        default=None, ge=0, description="forgotten by the scheduler this long after it "
        "completes, fails or is cancelled (its history stays in Lens)")
    # Where and with what the workers run (Kubernetes; see libs/workload.py).
    # Unset fields take the workspace's defaults when the scheduler accepts the job.
    image: str | None = Field(default=None, description="the workers' container image "
                              "(default: the workspace's)")
    resources: Resources = Field(default_factory=Resources,
                                 description="per worker, besides its GPUs")
    host_network: bool | None = Field(default=None, description="workers use the node's "
                                      "network (when the workspace allows it)")
    volumes: list[Volume] = Field(default_factory=list)
    secrets: list[SecretRef] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict,
                                          description="node labels the workers' nodes must have")
    tolerations: list[Toleration] = Field(default_factory=list)
    image_pull_secrets: list[str] = Field(default_factory=list)
    checkpoint_pvc: str | None = Field(
        default=None, description="a ReadWriteMany claim every attempt mounts for checkpoints "
        "(default: the workspace's)")
    # How Lens reads the workers' output as telemetry (libs/log_formats.py).
    log_formats: dict[str, Format] = Field(
        default_factory=dict, description="the job's own formats, shaped like "
        "libs/log_formats.yaml's; one of the same name replaces the built-in")
    log_format: str = Field(
        default="auto", description="auto (detected from the first lines), none, a built-in "
        "format (megatron, primus, torchtitan, deepspeed, hf_trainer, lightning) or one "
        "defined under log_formats")

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, value: str, info: ValidationInfo) -> str:
        return check_format_name(value, info.data.get("log_formats") or {})

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"image {value[:80]!r} is not an image reference (e.g. "
                             "rocm/pytorch:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0)")
        return value

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        return check_node_selector(value)

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull(cls, value: list[str]) -> list[str]:
        return check_names(value, "image pull secret")

    @field_validator("checkpoint_pvc")
    @classmethod
    def _ckpt(cls, value: str | None) -> str | None:
        return None if value is None else check_names([value], "checkpoint_pvc")[0]

    @model_validator(mode="after")
    def _mounts_unique(self) -> JobSpec:
        names = [v.name for v in self.volumes]
        paths = [v.mount_path for v in self.volumes] + [
            s.mount_path for s in self.secrets if s.mount_path]
        for what, seen in (("volume name", names), ("mount_path", paths)):
            twice = sorted({x for x in seen if seen.count(x) > 1})
            if twice:
                raise ValueError(f"{what} used twice: {', '.join(twice)}")
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _JOB_NAME_RE.match(value):
            raise ValueError(
                f"job name {value[:80]!r} is not a lower-case RFC 1123 label: use a-z, 0-9 "
                "and '-', starting and ending with a letter or digit, at most 63 characters "
                "(e.g. llama-70b-pretrain)")
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str) -> str:
        return check_key(value, "workspace")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _ENV_NAME_RE.match(key):
                raise ValueError(f"environment variable name {key[:80]!r} is not valid: use "
                                 "letters, digits and '_', not starting with a digit")
            if "\0" in text:
                raise ValueError(f"env {key}: a value cannot contain a NUL character")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _braces(cls, value: Any) -> Any:
        # YAML reads an unquoted {checkpoint_dir} as a mapping: say so.
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict) and len(item) == 1 and None in item.values():
                    name = next(iter(item))
                    raise ValueError(f"command[{i}] is a YAML mapping, not text: quote it, "
                                     f'"{{{name}}}"')
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if any("\0" in part for part in value):
            raise ValueError("a command argument cannot contain a NUL character")
        return value

    @field_validator("min_runtime_s", "expected_runtime_s", "max_runtime_s",
                     "ttl_after_finished_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("write a finite number of seconds")
        return value

    @model_validator(mode="after")
    def _fits_a_message(self) -> JobSpec:
        size = len(self.model_dump_json())
        if size > MAX_SPEC_BYTES:
            sizes = {"env": len(json.dumps(self.env)), "command": len(json.dumps(self.command))}
            field = max(sizes, key=lambda k: sizes[k])
            raise ValidationError.from_exception_data("JobSpec", [InitErrorDetails(
                type=PydanticCustomError("too_large", "{message}", {"message": (
                    f"the job is {size / 1024:.0f} KiB as JSON, over the {MAX_SPEC_BYTES // 1024} "
                    f"KiB limit for a job (it travels in one NATS message, at most "
                    f"{NATS_MAX_PAYLOAD // 1024} KiB by default); put large settings in a file "
                    f"the job reads")}),
                loc=(field,), input=None)])
        return self


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
    gpu_model: str = Field(default="", description="the node's GPU model (which device "
                           "plugin resource the worker asks for)")


class JobPlacedData(Frozen):
    attempt: int = Field(ge=1)
    workers: list[WorkerSlot]


class JobPlaced(Event):
    subject_template = "{root}.job.{job}.placed"
    type: Literal["job.placed"] = "job.placed"
    job: str
    data: JobPlacedData


class JobPendingData(Frozen):
    position: int = Field(ge=1, description="1 = next in its workspace's queue")
    reason: str
    code: str = Field(default="", description="capacity, quota, fifo, held, waiting, ...")


class JobPending(Event):
    subject_template = "{root}.job.{job}.pending"
    type: Literal["job.pending"] = "job.pending"
    job: str
    data: JobPendingData


class JobPreemptedData(Frozen):
    attempt: int = Field(ge=1)
    preemptor: str = Field(description="the higher-priority job that needs the GPUs")
    grace_s: float = Field(ge=0, description="time given to checkpoint before a hard stop")


class JobPreempted(Event):
    """A running job is asked to checkpoint and stop for a higher-priority
    one; it is queued again at the head of its class, retries untouched."""

    subject_template = "{root}.job.{job}.preempted"
    type: Literal["job.preempted"] = "job.preempted"
    job: str
    data: JobPreemptedData


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


class JobCommandData(Frozen):
    by: str = Field(default="", description="who asked (the operator's user name)")
    reason: str = Field(default="", max_length=1000)


class JobStopRequested(Event):
    """An operator asks to stop a job: its workers checkpoint and exit within
    the grace (then SIGKILL); the job keeps its checkpoints and can be resumed."""

    subject_template = "{root}.job.{job}.stop"
    type: Literal["job.stop"] = "job.stop"
    job: str
    data: JobCommandData


class JobResumeRequested(Event):
    """An operator asks to queue a stopped job again, from its newest checkpoint."""

    subject_template = "{root}.job.{job}.resume"
    type: Literal["job.resume"] = "job.resume"
    job: str
    data: JobCommandData


class JobCancelRequested(Event):
    """An operator asks to stop a job for good."""

    subject_template = "{root}.job.{job}.cancel"
    type: Literal["job.cancel"] = "job.cancel"
    job: str
    data: JobCommandData


class JobDeleteRequested(Event):
    """An operator asks the scheduler to forget a job (stopping it first if it
    runs); its history stays in Lens."""

    subject_template = "{root}.job.{job}.delete"
    type: Literal["job.delete"] = "job.delete"
    job: str
    data: JobCommandData


class JobChangedData(Frozen):
    attempt: int = Field(ge=0, description="placements so far (0: never placed)")
    reason: str = ""
    by: str = Field(default="", description="who asked, for an operator's act")


class JobStopped(Event):
    """Every worker of a stopped job has exited; it may be resumed."""

    subject_template = "{root}.job.{job}.stopped"
    type: Literal["job.stopped"] = "job.stopped"
    job: str
    data: JobChangedData


class JobCancelled(Event):
    subject_template = "{root}.job.{job}.cancelled"
    type: Literal["job.cancelled"] = "job.cancelled"
    job: str
    data: JobChangedData


class JobDeleted(Event):
    """The scheduler forgot the job (an operator's delete, or its
    ``ttl_after_finished_s``)."""

    subject_template = "{root}.job.{job}.deleted"
    type: Literal["job.deleted"] = "job.deleted"
    job: str
    data: JobChangedData


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
    reason: str | None = Field(default=None, description="why, when the driver knows "
                               "(e.g. 'command not found: X', exit 127)")
    lost: bool = Field(default=False, description=(
        "the platform ended the worker, not the job: it was killed while no driver "
        "watched (the stack or its node stopped), or Kubernetes disrupted its pod (a "
        "DisruptionTarget condition: a drain's eviction, node shutdown or pressure, the "
        "taint manager). The scheduler runs the gang again as a new attempt without "
        "spending a retry, whatever the exit code"))
    node_down: bool = Field(default=False, description=(
        "the rank never started because its node could not take it: the local driver "
        "found the node down, or the kubelet rejected the pod at admission (the node died "
        "or failed before failover had judged it). The platform's loss: no retry is "
        "spent, and the scheduler keeps the next attempt off that node until failover's "
        "verdict or a hold of 5 s (doubling) ends"))


class WorkerExited(Event):
    subject_template = "{root}.worker.{job}.exited"
    type: Literal["worker.exited"] = "worker.exited"
    job: str
    node: str
    data: WorkerExitedData


# --------------------------------------------------------------------------- fault


class FaultOpenedData(Frozen):
    fault_id: str
    kind: str = Field(description="e.g. heartbeat_missed, bench_failed, worker_infra_exit")
    reason: str
    jobs: list[str] = Field(default_factory=list, description="jobs running on the node")
    scope: Literal["node", "job"] = Field(
        default="node", description="node: the envelope's node is faulty; job: only the job")
    quarantine: bool = Field(default=True, description="take the node out of service "
                             "(bootstrap quarantines it until it passes bench again)")


class FaultOpened(Event):
    """A fault opened. Version 2 named the ``cordon`` flag ``quarantine``, the
    word for a node the platform took out of service; version 1 events are
    read as version 2."""

    subject_template = "{root}.fault.{node}.opened"
    type: Literal["fault.opened"] = "fault.opened"
    node: str
    version: int = 2
    data: FaultOpenedData

    @model_validator(mode="before")
    @classmethod
    def _from_version_1(cls, doc: Any) -> Any:
        if not isinstance(doc, dict) or doc.get("version", 1) != 1:
            return doc
        data = doc.get("data")
        if isinstance(data, dict) and "cordon" in data:
            data = {("quarantine" if k == "cordon" else k): v for k, v in data.items()}
        return {**doc, "version": 2, "data": data}


class FaultChangedData(Frozen):
    fault_id: str
    kind: str
    reason: str = Field(default="", description="why it changed, for an operator's act")
    by: str = Field(default="", description="who closed it, when an operator did")
    timings: dict[str, float | None] = Field(
        default_factory=dict,
        description="seconds from the last healthy sign: detection_s (opened), mitigation_s "
                    "(node quarantined or job told to restart), replacement_s, first_step_s")


class FaultCloseData(Frozen):
    fault_id: str
    by: str = Field(default="", description="who asked (the operator's user name)")
    reason: str = Field(default="", max_length=1000)


class FaultCloseRequested(Event):
    """An operator closes a fault (the cause is fixed or was not real); a
    node of a closed fault returns through bench."""

    subject_template = "{root}.fault.{node}.close"
    type: Literal["fault.close"] = "fault.close"
    node: str
    data: FaultCloseData


class FaultMitigated(Event):
    """The fault's node is out of service (or its job was told to restart)."""

    subject_template = "{root}.fault.{node}.mitigated"
    type: Literal["fault.mitigated"] = "fault.mitigated"
    node: str
    data: FaultChangedData


class FaultRecovered(Event):
    """Every job the fault moved made its first training step again."""

    subject_template = "{root}.fault.{node}.recovered"
    type: Literal["fault.recovered"] = "fault.recovered"
    node: str
    data: FaultChangedData


class FaultClosed(Event):
    """The node passed bench again and is back in service (or the job runs)."""

    subject_template = "{root}.fault.{node}.closed"
    type: Literal["fault.closed"] = "fault.closed"
    node: str
    data: FaultChangedData


class JobRecoverData(Frozen):
    fault_id: str
    reason: str
    exclude_nodes: list[str] = Field(default_factory=list)


class JobRecover(Event):
    """Failover asks the scheduler to stop the gang and re-place it first in
    the queue, from its newest complete checkpoint."""

    subject_template = "{root}.job.{job}.recover"
    type: Literal["job.recover"] = "job.recover"
    job: str
    data: JobRecoverData


class JobProgressData(Frozen):
    attempt: int = Field(ge=1)
    iteration: int = Field(ge=0)


class JobProgress(Event):
    """Lens read an attempt's first training step from the job's output (a
    job that does not report through the SDK); failover ends a recovery's
    timing with it, as it does with the SDK's first step."""

    subject_template = "{root}.job.{job}.progress"
    type: Literal["job.progress"] = "job.progress"
    job: str
    data: JobProgressData


class JobCheckpointData(Frozen):
    attempt: int = Field(ge=1, description="the attempt running when it was found")
    iteration: int = Field(ge=0, description="the step it holds (what a restart resumes from)")
    path: str
    layout: str = Field(description="megatron, deepspeed, torchtitan, dcp, hf or sdk "
                        "(libs/checkpoint_layouts.py)")
    saved_at: datetime = Field(description="when it was complete (its newest file's time)")


class JobCheckpoint(Event):
    """The newest complete checkpoint in a job's checkpoint directory changed:
    found by a directory watch, whichever framework wrote it."""

    subject_template = "{root}.job.{job}.checkpoint"
    type: Literal["job.checkpoint"] = "job.checkpoint"
    job: str
    data: JobCheckpointData


# --------------------------------------------------------------------------- telemetry


class GpuMetrics(Frozen):
    """One GPU at one moment. Every reading but the index is optional: no
    tool reports everything on every GPU, and a missing reading is NULL in
    Lens, never zero. ``job``, ``attempt`` and ``rank`` name the worker the
    GPU is placed with (the agent's placements, services/bench/placements.py),
    all three or none (an idle GPU)."""

    index: int = Field(ge=0)
    util_pct: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    temp_c: float | None = Field(default=None, description="edge (primary) temperature")
    power_w: float | None = None
    temp_junction_c: float | None = Field(default=None, description="hottest spot")
    temp_hbm_c: float | None = Field(default=None, description="memory (HBM/VRAM)")
    power_cap_w: float | None = None
    sclk_mhz: float | None = Field(default=None, description="graphics/SM clock")
    mclk_mhz: float | None = Field(default=None, description="memory clock")
    ecc_correctable: int | None = Field(default=None, ge=0)
    ecc_uncorrectable: int | None = Field(default=None, ge=0)
    pcie_rx_bytes_s: float | None = Field(default=None, ge=0)
    pcie_tx_bytes_s: float | None = Field(default=None, ge=0)
    xgmi_rx_bytes_s: float | None = Field(default=None, ge=0)
    xgmi_tx_bytes_s: float | None = Field(default=None, ge=0)
    job: str | None = Field(default=None, pattern=KEY_PATTERN,
                            description="the job whose worker holds the GPU")
    attempt: int | None = Field(default=None, ge=1, description="that job's attempt")
    rank: int | None = Field(default=None, ge=0, description="that worker's rank")

    @model_validator(mode="after")
    def _owner(self) -> GpuMetrics:
        if (self.job is None) != (self.attempt is None) or (self.job is None) != (
                self.rank is None):
            raise ValueError("job, attempt and rank are given together (the GPU's worker) "
                             "or not at all (an idle GPU)")
        return self


class NicMetrics(Frozen):
    """One network interface; ``rdma`` marks an InfiniBand/RoCE port
    (counters from /sys/class/infiniband)."""

    name: str
    rx_bytes_s: float = Field(ge=0)
    tx_bytes_s: float = Field(ge=0)
    rdma: bool = False


class DiskMetrics(Frozen):
    name: str
    read_bytes_s: float = Field(ge=0)
    write_bytes_s: float = Field(ge=0)


class FsMetrics(Frozen):
    mount: str
    free_bytes: int = Field(ge=0)
    total_bytes: int = Field(ge=0)


# telemetry.node version 2 sends these lists as columns: field -> (wire name,
# item model, the column every item has).
COLUMNAR: dict[str, tuple[str, type[Frozen], str]] = {
    "gpus": ("gpu_columns", GpuMetrics, "index"),
    "nics": ("nic_columns", NicMetrics, "name"),
}


def _columns_schema(schema: dict[str, Any]) -> None:
    """The wire form's ``*_columns`` in the JSON Schema (``proto/``): one
    array per item field; pydantic itself only sees the lists."""
    for field, (wire, model, key) in COLUMNAR.items():
        fields = model.model_json_schema()["properties"]
        schema["properties"][wire] = {
            "type": "object", "additionalProperties": False, "required": [key],
            "description": f"telemetry.node version 2 wire form of `{field}`: one array per "
                           f"field, the i-th value of each belonging to the i-th item; a field "
                           f"no item has is left out. Give `{field}` or this, not both.",
            "properties": {name: {"type": "array", "items": {k: v for k, v in f.items()
                                                             if k not in ("default", "title")}}
                           for name, f in fields.items()}}


def _rows(wire: str, key: str, columns: Any) -> list[dict[str, Any]]:
    if not isinstance(columns, dict) or not isinstance(columns.get(key), list):
        raise ValueError(f"{wire} must be an object of arrays, with the {key} array")
    count = len(columns[key])
    for name, values in columns.items():
        if not isinstance(values, list) or len(values) != count:
            raise ValueError(f"{wire}.{name} must be an array of {count} values, "
                             f"one per item in {key}")
    return [{name: values[i] for name, values in columns.items()} for i in range(count)]


class NodeTelemetryData(Frozen):
    """A node's readings at one moment.

    On the wire (version 2) GPUs and NICs travel as columns, ``gpu_columns``
    ``{"index": [0, 1, ...], "util_pct": [97.5, 96.0, ...], ...}`` and
    ``nic_columns``. At 1 s and eight GPUs a node this takes 47% off the
    bytes NATS carries and the JSON ClickHouse parses, where one object per
    item repeats every key. In Python, ``gpus`` and ``nics`` are lists of
    models either way, and version 1 messages (lists of objects) are still read."""

    model_config = ConfigDict(json_schema_extra=_columns_schema)

    cpu_pct: float = Field(ge=0)
    mem_used_bytes: int = Field(ge=0)
    mem_total_bytes: int = Field(ge=0)
    load1: float = Field(ge=0)
    gpus: list[GpuMetrics] = Field(default_factory=list)
    gpu_tool: str | None = Field(default=None, description="amd-smi, rocm-smi, nvidia-smi, sysfs")
    nics: list[NicMetrics] = Field(default_factory=list)
    disks: list[DiskMetrics] = Field(default_factory=list)
    filesystems: list[FsMetrics] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _lists_from_columns(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for field, (wire, _, key) in COLUMNAR.items():
            if wire in data:
                if field in data:
                    raise ValueError(f"give {field} or {wire}, not both")
                data = {**{k: v for k, v in data.items() if k != wire},
                        field: _rows(wire, key, data[wire])}
        return data

    @model_serializer(mode="wrap")
    def _lists_as_columns(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for field, (wire, model, _) in COLUMNAR.items():
            rows = out.pop(field, None)
            if rows:
                names = [n for n in model.model_fields if any(r.get(n) is not None for r in rows)]
                out[wire] = {n: [r.get(n) for r in rows] for n in names}
        return out


class NodeTelemetry(Event):
    """One message per node per interval, holding all its GPUs (GPUs and NICs
    as columns since version 2, see ``NodeTelemetryData``)."""

    subject_template = "{root}.telemetry.node.{node}"
    compact_json = True
    type: Literal["telemetry.node"] = "telemetry.node"
    node: str
    version: int = 2
    data: NodeTelemetryData


class JobTelemetryData(Frozen):
    rank: int = Field(ge=0)
    attempt: int = Field(default=1, ge=1)
    iteration: int = Field(ge=0)
    loss: float | None = None
    throughput: float | None = Field(default=None, description="samples per second")
    step_time_s: float | None = None
    checkpoint_path: str | None = Field(default=None, description="set when a checkpoint was saved")
    loss_nonfinite: Literal["nan", "inf", "-inf"] | None = Field(
        default=None, description="the loss was not a number (JSON cannot carry it); loss is null")
    grad_norm: float | None = None
    tokens_per_s: float | None = Field(default=None, ge=0)
    checkpoint_bytes: int | None = Field(default=None, ge=0)
    checkpoint_duration_s: float | None = Field(default=None, ge=0)
    dropped: int | None = Field(default=None, ge=0,
                                description="samples this rank dropped so far (buffer full)")


class JobTelemetry(Event):
    subject_template = "{root}.telemetry.job.{job}"
    compact_json = True
    type: Literal["telemetry.job"] = "telemetry.job"
    job: str
    data: JobTelemetryData


class LogRecordData(Frozen):
    level: str
    message: str
    service: str = ""
    fields: dict[str, Any] = Field(default_factory=dict, description="the rest of the log line")


class LogRecord(Event):
    """A structlog line shipped over the bus; node and job ids ride in the
    envelope so logs join metrics and events."""

    subject_template = "{root}.telemetry.log"
    compact_json = True
    type: Literal["log.record"] = "log.record"
    data: LogRecordData


LogStream = Literal["stdout", "stderr", "meta"]


class WorkerLogData(Frozen):
    """A batch of one worker's output lines, as columns (one entry per line).
    ``seq`` numbers the worker's lines of this attempt from 0, so a batch
    sent twice stores its lines once; ``meta`` lines are the shipper's own
    (how many lines the rate limit dropped)."""

    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    seq: int = Field(ge=0, description="the number of the batch's first line")
    text: list[str] = Field(min_length=1, description="the lines, without their newline; "
                            "bytes that are not UTF-8 are escaped (\\xNN)")
    stream: list[LogStream] = Field(description="each line's stream")
    t_ms: list[int] = Field(description="each line's time: milliseconds after the event's")
    dropped_lines: int = Field(default=0, ge=0, description="lines the rate limit dropped "
                               "just before this batch (told by its meta line)")
    dropped_bytes: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _columns(self) -> WorkerLogData:
        if not len(self.text) == len(self.stream) == len(self.t_ms):
            raise ValueError("text, stream and t_ms must have one entry per line")
        if any(t < 0 for t in self.t_ms):
            raise ValueError("t_ms are offsets after the event's time: not negative")
        return self


class WorkerLog(Event):
    """Output lines of one worker (rank) of a job, shipped by its supervisor
    (local driver) or its node's agent (Kubernetes); the id is
    ``<job>-a<attempt>-r<rank>-l<seq>``."""

    subject_template = "{root}.telemetry.output.{job}"
    compact_json = True
    type: Literal["log.worker"] = "log.worker"
    job: str
    data: WorkerLogData


AlertState = Literal["open", "closed"]


class LensAlertData(Frozen):
    alert_id: str = Field(description="the same for the open and the close of one alert")
    rule: str = Field(description="e.g. gpu_temp_high, job_hang, loss_nonfinite")
    state: AlertState
    severity: Literal["info", "warning", "critical"] = "warning"
    subject_key: str = Field(description="what the alert is about: node, node/gpu or job")
    gpu: int | None = Field(default=None, ge=0)
    value: float | None = None
    threshold: float | None = None
    message: str = ""
    opened_at: datetime
    fault_class: Literal["infra", "user"] | None = Field(
        default=None, description="log rules: infra (the job is the cluster's victim: "
        "failover recovers it) or user (the job's own error); None for metric rules")


class LensAlert(Event):
    """Lens opened or closed an alert. Subject ``safe.lens.alert.<job or node>``."""

    subject_template = "{root}.lens.alert.{node}"
    type: Literal["lens.alert"] = "lens.alert"
    data: LensAlertData

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.lens.alert.{self.job or self.node or '_'}"


EVENT_TYPES: tuple[type[Event], ...] = (
    NodeRegistered,
    NodeStateChanged,
    NodeProvisioned,
    NodeRemoved,
    NodeAgentStopping,
    NodeCordonRequested,
    NodeUncordonRequested,
    NodeDrainRequested,
    NodeHeartbeat,
    BenchRequest,
    BenchResult,
    JobSubmitted,
    JobPlaced,
    JobPending,
    JobPreempted,
    JobCompleted,
    JobFailed,
    JobStopRequested,
    JobResumeRequested,
    JobCancelRequested,
    JobDeleteRequested,
    JobStopped,
    JobCancelled,
    JobDeleted,
    WorkerStarted,
    WorkerExited,
    FaultOpened,
    FaultCloseRequested,
    FaultMitigated,
    FaultRecovered,
    FaultClosed,
    JobRecover,
    JobProgress,
    JobCheckpoint,
    NodeTelemetry,
    JobTelemetry,
    LogRecord,
    WorkerLog,
    LensAlert,
)

AnyEvent = Annotated[
    NodeRegistered
    | NodeStateChanged
    | NodeProvisioned
    | NodeRemoved
    | NodeAgentStopping
    | NodeCordonRequested
    | NodeUncordonRequested
    | NodeDrainRequested
    | NodeHeartbeat
    | BenchRequest
    | BenchResult
    | JobSubmitted
    | JobPlaced
    | JobPending
    | JobPreempted
    | JobCompleted
    | JobFailed
    | JobStopRequested
    | JobResumeRequested
    | JobCancelRequested
    | JobDeleteRequested
    | JobStopped
    | JobCancelled
    | JobDeleted
    | WorkerStarted
    | WorkerExited
    | FaultOpened
    | FaultCloseRequested
    | FaultMitigated
    | FaultRecovered
    | FaultClosed
    | JobRecover
    | JobProgress
    | JobCheckpoint
    | NodeTelemetry
    | JobTelemetry
    | LogRecord
    | WorkerLog
    | LensAlert,
    Field(discriminator="type"),
]

# A short title: the default names every member, pushing the actual problem
# out of the (length-capped) dead-letter reason as event types are added.
_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent, config=ConfigDict(title="Event"))
_BY_TYPE: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls for cls in EVENT_TYPES}


class UnsupportedVersion(ValueError):
    """An event of a schema version newer than this code knows: its fields
    may mean something else, so it is refused rather than guessed at."""


class UnknownEventType(ValueError):
    """The ``type`` field is missing or names no event of this contract."""


def max_version(event_type: str) -> int | None:
    """The newest version of ``event_type`` this code reads (None: unknown type)."""
    cls = _BY_TYPE.get(event_type)
    return None if cls is None else int(cls.model_fields["version"].default)


def parse_event(payload: bytes | str) -> Event:
    """Decode and validate one event; raises pydantic.ValidationError, or
    ``UnsupportedVersion`` for a version newer than its model's.
    Fields a known version does not have are refused (see ``read_event``)."""
    try:
        event = _ADAPTER.validate_json(payload)
    except ValidationError as exc:
        doc = _json_object(payload)
        if doc is not None:  # a newer version is refused as such, whatever its shape
            _check_version(doc.get("type"), doc.get("version", 1))
            _check_type(doc, exc)
        raise
    _check_version(event.type, event.version)
    return event


def read_event(payload: bytes | str) -> tuple[Event, tuple[str, ...]]:
    """Decode an event as a consumer should: the version is checked first (a
    newer one is refused with ``UnsupportedVersion``, whatever its shape),
    and fields a known version does not define are dropped and returned by
    their path (``data.foo``), so a producer one release ahead that added an
    optional field is still understood. Anything else invalid raises
    pydantic.ValidationError."""
    unknown: tuple[str, ...] = ()
    try:
        event = _ADAPTER.validate_json(payload)
    except ValidationError as exc:
        doc = _json_object(payload)
        if doc is None:
            raise
        _check_version(doc.get("type"), doc.get("version", 1))
        _check_type(doc, exc)
        errors = exc.errors()
        if any(e["type"] != "extra_forbidden" for e in errors):
            raise
        unknown = tuple(".".join(str(p) for p in _field_path(e["loc"])) for e in errors)
        for error in errors:
            _drop(doc, _field_path(error["loc"]))
        event = _ADAPTER.validate_python(doc)
    _check_version(event.type, event.version)
    return event, unknown


def _check_version(event_type: Any, version: Any) -> None:
    newest = max_version(event_type) if isinstance(event_type, str) else None
    if newest is not None and isinstance(version, int) and version > newest:
        raise UnsupportedVersion(
            f"{event_type} version {version} not supported (max {newest})")


def _check_type(doc: dict[str, Any], exc: ValidationError) -> None:
    """Say which field is wrong when it is ``type`` itself (pydantic's own
    message then names no field and lists every known type)."""
    if any(e["type"] in ("union_tag_invalid", "union_tag_not_found") for e in exc.errors()):
        kind = doc.get("type")
        if kind is None:
            raise UnknownEventType("field 'type' is missing: every event names its type")
        raise UnknownEventType(
            f"field 'type': {str(kind)[:64]!r} is not an event type of this contract")


def _json_object(payload: bytes | str) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _field_path(loc: tuple[Any, ...]) -> list[Any]:
    # The discriminated union puts the event type first: "job.submitted.data.x".
    return list(loc[1:]) if loc and isinstance(loc[0], str) and loc[0] in _BY_TYPE else list(loc)


def _drop(doc: Any, path: list[Any]) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc.pop(path[-1], None)


def encode_event(event: Event) -> bytes:
    return event.model_dump_json(exclude_none=event.compact_json).encode()


def event_type_name(cls: type[Event]) -> str:
    return cls.model_fields["type"].default
