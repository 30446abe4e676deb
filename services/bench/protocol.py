"""The core-NATS endpoints of the bench service besides its events, shared
by the agent, the coordinator and the CLI.

Progress lines and request-reply queries live outside every JetStream
stream's subjects (``safe.progress.*``, ``safe.query.*``): they are
ephemeral, and the history consumers must never see them as events.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from libs.events import SUBJECT_ROOT, BenchOutcome, BenchRendezvous, BenchResult
from libs.routes import Empty, Endpoint, Reply, query


class FleetRow(BaseModel):
    """One figure of one node's latest run against its GPU model's median."""

    node: str
    gpu_model: str
    level: str
    name: str
    value: float
    unit: str
    median: float
    relative: float
    robust_z: float
    flagged: bool
    peers: int
    passed: bool
    outcome: BenchOutcome | None = None
    verdict: str = ""


class FleetReport(Reply):
    rows: list[FleetRow] = Field(default_factory=list)


class PairRequest(BaseModel):
    node: str
    request_id: str


class PairReply(Reply):
    rendezvous: BenchRendezvous | None = None


class SearchRequest(BaseModel):
    nodes: list[str] = Field(min_length=2, description="a collective over them failed")
    healthy: list[str] | None = Field(default=None, description="default: nodes judged healthy")
    force: bool = Field(default=False, description="also on nodes that run a job")


class SearchReply(Reply):
    bad: list[str] = Field(default_factory=list)
    cleared: list[str] = Field(default_factory=list)
    inconclusive: list[list[str]] = Field(default_factory=list)
    rounds: int = 0
    tests: int = 0
    log: list[str] = Field(default_factory=list)


class SweepRequest(BaseModel):
    nodes: list[str] = Field(min_length=1)
    level: Literal["standard", "full"] = "standard"
    turns: bool = Field(default=False, description="nodes share hardware: measure in turns")
    force: bool = Field(default=False, description="also nodes that run a job (else skipped)")


class SweepVerdict(BaseModel):
    outcome: BenchOutcome
    reason: str = ""
    retried: bool = False
    score: float | None = None
    duration_s: float = 0.0
    flagged: list[str] = Field(default_factory=list)


class SweepReply(Reply):
    session: str = ""
    verdicts: dict[str, SweepVerdict] = Field(default_factory=dict)
    missing: list[str] = Field(default_factory=list)
    suspects: list[str] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict, description="node -> why not measured")
    seconds: float = 0.0
    first_pass_s: float = 0.0


class TurnRequest(BaseModel):
    session: str
    node: str
    op: Literal["acquire", "release", "leave"]


class BenchProgress(BaseModel):
    request_id: str
    node: str
    step: str
    time: float


REPORT = Endpoint(query("bench.report"), Empty, FleetReport,
                  "every node's bench figures against the median of its GPU model")
PAIR = Endpoint(query("bench.pair"), PairRequest, PairReply,
                "a known-healthy partner and a rendezvous for a node's full-level test")
SEARCH = Endpoint(query("bench.search"), SearchRequest, SearchReply,
                  "binary-split search for the bad node(s) of a failing collective")
SWEEP = Endpoint(query("bench.sweep"), SweepRequest, SweepReply,
                 "measure nodes side by side and judge them against each other")
# One node's share of a multi-node test, core NATS only: a share says nothing
# about the node alone, so bootstrap must not act on it.
SHARE = Endpoint(query("bench.share.{session}"), BenchResult, None,
                 "a node's share of a multi-node test, for the coordinator")
# Answered when the turn is granted, which may be much later (sweep.py).
TURN = Endpoint(query("bench.turn.{session}"), TurnRequest, Reply,
                "take turns measuring on shared hardware during a sweep")
PROGRESS = Endpoint(f"{SUBJECT_ROOT}.progress.bench.{{node}}", BenchProgress, None,
                    "which step of a bench run an agent is at (bench run --wait shows it)")
