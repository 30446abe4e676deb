"""The state services share: one typed record model per KV bucket.

Each bucket has one owner that writes it (its route table says so) and any
number of readers; all of them read and write through these models, never
by dict keys. Records are versioned like events: a reader refuses a record
of a newer ``version`` than its model (its fields may mean something else)
and reads fields a newer owner added without them (``extra="ignore"``).
``libs.kv.Records`` reads and writes them, every write revision-checked.

Owners may keep richer state in memory; what crosses a process boundary is
what is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from libs.events import (
    BenchOutcome,
    BenchResultData,
    JobSpec,
    NodeStateName,
    WorkerSlot,
)
from libs.inventory import HostsFile, HostSpec


class UnsupportedRecord(ValueError):
    """A record written by a newer release than this reader knows."""


class Record(BaseModel):
    """A KV record: a ``version`` like an event's, fields a newer owner added
    read without them."""

    model_config = ConfigDict(extra="ignore")
    VERSION: ClassVar[int] = 1

    version: int = Field(default=1, ge=1, description="schema version of this record")

    @classmethod
    def check_version(cls, version: Any) -> None:
        """Refuse a record of a newer version than this model, whatever its shape."""
        if isinstance(version, int) and version > cls.VERSION:
            raise UnsupportedRecord(
                f"{cls.__name__} version {version} not supported (max {cls.VERSION}): "
                "written by a newer release; upgrade this one")


R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class BucketSpec(Generic[R]):
    """A KV bucket: its name, its record model, what it holds."""

    name: str
    record: type[R]
    description: str
    history: int = 5


# --------------------------------------------------------------------------- nodes


class NodeRecord(Record):
    """A node as bootstrap knows it: its hosts file entry and where its
    onboarding stands. Written by bootstrap only."""

    spec: HostSpec
    registration: str = Field(default="", description="id of its node.registered event")
    state: NodeStateName = "registered"
    reason: str = ""
    remove_by: Literal["kubespray"] | None = Field(
        default=None, description="kubespray: removed only once remove-node.yml has run")
    drained: bool = Field(default=False, description="draining and no job is left on it")
    cordoned: bool = Field(default=False, description="an operator's hold: no new job is "
                           "placed there (running ones stay; a drain moves them)")
    cordoned_by: str = Field(default="", description="who cordoned or drained it, and why")
    degraded: bool = Field(default=False, description="its last bench passed but below its "
                           "fleet: used last, or not at all (the scheduler's degraded_nodes)")
    rebench_attempts: int = Field(default=0, description="re-benches since it was quarantined")
    next_rebench_at: float | None = Field(default=None, description="when a quarantined node "
                                          "is benched again (None: not scheduled)")
    verdict_due_at: float | None = Field(
        default=None, description="its standard/full bench passed on the agent: the fleet "
        "verdict (bench-coordinator) is awaited until then, after which the agent's result "
        "stands")

    @property
    def name(self) -> str:
        return self.spec.name


# --------------------------------------------------------------------------- jobs

JobStatus = Literal["pending", "running", "stopping", "stopped", "completed", "failed",
                   "cancelled"]
# After a gang is stopped, what becomes of the job once every rank has exited:
# queued again (a retry), queued at the head (preempted), failed, stopped (an
# operator's stop: resumable), cancelled, or deleted (forgotten).
AfterStop = Literal["requeue", "fail", "preempted", "stop", "cancel", "delete"]


class JobRecord(Record):
    """A job's lifecycle, placement and pending reason. Written by the
    scheduler leader only; its transitions are ``services/scheduler/lifecycle.py``."""

    model_config = ConfigDict(extra="ignore", validate_assignment=False)

    id: str
    spec: JobSpec
    submitted_at: float
    status: JobStatus = "pending"
    attempt: int = Field(default=0, description="placements so far")
    retries: int = Field(default=0, description="failed attempts so far (preemptions do not count)")
    slots: list[WorkerSlot] = Field(default_factory=list)
    exits: dict[int, int] = Field(default_factory=dict, description="rank -> exit code")
    started_at: float | None = None
    not_before: float = Field(default=0.0, description="retry back-off until then")
    recovering: bool = False
    preempted: bool = False
    exclude_nodes: list[str] = Field(default_factory=list)
    prefer_nodes: list[str] = Field(default_factory=list)
    last_nodes: list[str] = Field(default_factory=list, description="where the last attempt ran")
    after_stop: AfterStop | None = None
    stop_requested_at: float | None = None
    grace_s: float = Field(default=0.0, description="the running stop's grace before SIGKILL")
    stops: int = Field(default=0, description="times an operator's stop completed")
    stopped_by: str = Field(default="", description="who asked for the last stop/cancel/delete")
    last_command: str = Field(default="", description="event id of the last operator request "
                              "done (a redelivered one is not done twice)")
    run_s: float = Field(default=0.0, description="seconds run by attempts that ended")
    finished_at: float | None = Field(default=None, description="when it reached a final state")
    reason: str = ""
    code: str = ""
    blocked: str = Field(default="", description="why the last launch was refused before "
                         "anything was created (a missing Secret or claim); tried again later")
    notes: list[str] = Field(default_factory=list, description="said once at submit: what the "
                             "driver does not honour of the spec")
    position: int = 0
    leader_term: int = Field(default=0, description="the scheduler term that wrote it")
    updated_at: float = 0.0

    @field_validator("status", mode="before")
    @classmethod
    def _old_status(cls, value: Any) -> Any:
        return "stopping" if value == "terminating" else value  # its name before 0.2

    @property
    def holds_gpus(self) -> bool:
        return self.status in ("running", "stopping")

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.slots]


# --------------------------------------------------------------------------- faults


class FaultRecord(Record):
    """A fault and what its recovery took. Failover's fault book keeps these
    records themselves (``services/failover/faults.py``); written by
    failover only."""

    fault_id: str
    kind: str
    scope: Literal["node", "job"]
    key: str = Field(description="the node or the job")
    reason: str
    jobs: list[str] = Field(default_factory=list)
    failover: bool = True
    last_good: float = Field(description="when the key was last seen healthy")
    opened_at: float
    status: Literal["opened", "mitigated", "closed"] = "opened"
    mitigated_at: float | None = None
    closed_at: float | None = None
    closed_by: str = Field(default="", description="the operator who closed it, if one did")
    close_reason: str = ""
    replaced_at: dict[str, float] = Field(default_factory=dict, description="job -> re-placement")
    replaced_attempt: dict[str, int] = Field(default_factory=dict)
    first_step_at: dict[str, float] = Field(default_factory=dict, description="job -> first step")
    resume_step: dict[str, int] = Field(
        default_factory=dict, description="job -> the step of its newest complete checkpoint "
        "when the fault opened: where its restart continues")
    lost_work_s: dict[str, float] = Field(
        default_factory=dict, description="job -> training time redone: from that "
        "checkpoint's save to the last healthy sign")

    def timings(self) -> dict[str, float | None]:
        """Seconds from the last healthy sign: detection, mitigation (the node
        quarantined, or the job told to restart), re-placement, first step."""
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.last_good, 3)

        return {
            "detection_s": since(self.opened_at),
            "mitigation_s": since(self.mitigated_at),
            "replacement_s": since(min(self.replaced_at.values(), default=None)),
            "first_step_s": since(max(self.first_step_at.values(), default=None)
                                  if len(self.first_step_at) == len(self.jobs) else None),
        }


# --------------------------------------------------------------------------- bench


class BenchRun(BenchResultData):
    """A node's latest run of one level, as the coordinator keeps it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node: str
    time: float = Field(description="when the run's result was stamped")
    event_id: str


class BenchVerdict(BaseModel):
    outcome: BenchOutcome
    reason: str = ""
    request_id: str
    time: float
    flagged: list[str] = Field(default_factory=list)
    score: float | None = None
    score_median: float | None = None


class BenchPending(BaseModel):
    """A first run that looked unhealthy, waiting for its repeat."""

    request_id: str
    outcome: BenchOutcome
    reason: str = ""
    flagged: list[str] = Field(default_factory=list)
    time: float
    repeats: list[tuple[float, float]] = Field(
        default_factory=list, description="(score ratio, robust z) of the repeats so far")


class BenchProbe(BaseModel):
    time: float
    reason: str


class BenchRecord(Record):
    """A node's latest bench run per level and the coordinator's verdict.
    Written by the bench-coordinator leader only."""

    model_config = ConfigDict(extra="ignore", validate_assignment=False)
    VERSION: ClassVar[int] = 2  # 1 held one run, before levels were kept apart

    version: int = 2
    node: str
    levels: dict[str, BenchRun] = Field(default_factory=dict)
    verdict: BenchVerdict | None = None
    pending: BenchPending | None = None
    probe: BenchProbe | None = None

    @classmethod
    def upgrade(cls, key: str, doc: dict[str, Any]) -> dict[str, Any]:
        """A version 1 record (one run, no levels) as version 2."""
        if "levels" in doc:
            return doc
        run = {"node": key, "time": doc.get("time", 0.0), "event_id": doc.get("event_id", ""),
               **doc}
        return {"version": 2, "node": key, "levels": {doc.get("level", "quick"): run}}


# --------------------------------------------------------------------------- inventory


class InventoryRecord(Record):
    """The hosts file ``bootstrap apply`` last handed over, and the boot file
    it was handed over under. Written by bootstrap only."""

    hosts: HostsFile
    boot: str | None = Field(default=None, description="fingerprint of the boot hosts file")


# --------------------------------------------------------------------------- leases


class LeaseRecord(Record):
    """A leader lease (``libs.leader``): who holds the role, since which term."""

    holder: str
    role: str
    term: int | None = Field(default=None, description="revision of the write that won it")
    ttl_s: int
    pid: int
    written_at: float


NODES = BucketSpec("nodes", NodeRecord, "bootstrap: inventory and onboarding state per node")
INVENTORY = BucketSpec(
    "inventory", InventoryRecord,
    "bootstrap: the hosts file an operator last handed over with bootstrap apply")
JOBS = BucketSpec("jobs", JobRecord,
                  "scheduler: job lifecycle, placement and pending reason per job")
FAULTS = BucketSpec("faults", FaultRecord, "failover: fault records")
BENCH = BucketSpec("bench", BenchRecord, "bench-coordinator: latest bench result per node")
# Written with a per-message TTL (libs.leader), so a dead leader's key expires.
LEASES = BucketSpec("leases", LeaseRecord,
                    "scheduler, bench-coordinator, lens-collector: the leader lease per role")

BUCKETS: tuple[BucketSpec[Any], ...] = (NODES, INVENTORY, JOBS, FAULTS, BENCH, LEASES)
