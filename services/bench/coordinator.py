"""The bench coordinator: one replica that keeps the latest bench run of
every node per level (the ``bench`` KV bucket), judges standard and full runs
against the fleet of the same GPU model, asks for a retry when a first run
looks unhealthy and publishes its verdict — a ``bench.result`` with
``judged_by=coordinator`` that bootstrap acts on — only after the repeat.

A verdict also holds the run's driver, ROCm and CUDA versions against the
majority of its GPU model's fleet (``version_drift``: a ``driver_drift``
finding, acted on as the configuration's ``driver_versions`` probe says).

It also pairs a node with a known-healthy partner for the full level's
multi-node test, runs the binary-split search for the bad node(s) of a
failing multi-node collective (``multinode``), and answers the fleet report.
Decisions are in ``triage``, ``fleet``, ``version_drift`` and ``split_search``;
this is I/O.

Replicas elect a leader (``libs.leader``, role ``bench-coordinator``): only
the leader loads the bucket, consumes results and answers requests; a
standby answers health with ``role: standby`` and takes over from the
bucket when the leader's lease ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from libs.bus import Bus
from libs.events import (
    BenchRequest,
    BenchRequestData,
    BenchResult,
    BenchResultData,
    Figure,
)
from libs.kv import Records
from libs.leader import LeaderElection, NotLeader, follow
from libs.logs import get_logger
from libs.records import (
    BENCH,
    JOBS,
    BenchPending,
    BenchProbe,
    BenchRecord,
    BenchRun,
    BenchVerdict,
)
from libs.routes import Empty
from libs.settings import Settings
from libs.tasks import cancel_and_wait
from libs.wiring import Wiring, wire
from services.bench.busy import busy_nodes, why_busy
from services.bench.config import ConfigFile
from services.bench.fleet import (
    NodeFigure,
    NodeJudgement,
    Outcome,
    Spread,
    compare_with_fleet,
    judge_node,
    score_ratio,
    weigh_retries,
)
from services.bench.multinode import MultiNode
from services.bench.protocol import (
    FleetReport,
    FleetRow,
    PairReply,
    PairRequest,
    SearchReply,
    SearchRequest,
    SweepReply,
    SweepRequest,
)
from services.bench.routes import COORDINATOR
from services.bench.sweep import Sweeps
from services.bench.triage import decide, measure_again
from services.bench.version_drift import (
    DriftFinding,
    find_drift,
    fleet_versions,
    stated_versions,
    with_finding,
)

if TYPE_CHECKING:
    from prometheus_client import Counter

    from libs.metrics import ServiceMetrics

SOURCE = "bench-coordinator"
JUDGED_LEVELS = ("standard", "full")


class BenchCoordinator:
    name = "bench-coordinator"
    routes = COORDINATOR

    def __init__(self, settings: Settings, config_path: str | None = None) -> None:
        self.settings = settings
        self.config = ConfigFile(config_path or settings.bench_config)
        self.latest: dict[str, BenchRecord] = {}
        self.kv: Records[BenchRecord] | None = None
        self.bus: Bus | None = None
        self.multinode: MultiNode | None = None
        self.sweeps = Sweeps(self)
        self.retries = 0
        self.verdicts = 0
        self._verdicts_total: Counter | None = None
        self._searches_total: Counter | None = None
        self._search_rounds_total: Counter | None = None
        self._drift_total: Counter | None = None
        self.election: LeaderElection | None = None
        self._term: int | None = None
        self._acting = False  # loaded the bucket and answering (health says so)
        self._term_routes: Wiring | None = None  # the leader's consumer and endpoints
        self._follow_task: asyncio.Task[None] | None = None
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self._log = get_logger()  # bound after run_service configured logging
        self.kv = await bus.records(BENCH)
        self.election = LeaderElection.for_service(bus, "bench-coordinator", self.settings)
        await self.election.start()
        self._follow_task = await follow(self.election, lead=self._lead,
                                         abdicate=self._abdicate)

    async def _lead(self, term: int) -> None:
        """Elected: load every node's record, then consume and answer."""
        assert self.bus is not None and self.kv is not None
        self._log.info("leading", term=term)
        self._term = term
        self.latest = await self.kv.load()  # version 1 records are upgraded as they are read
        bus = self.bus
        self.multinode = MultiNode(bus, self.config, self.latest, SOURCE)
        self.sweeps = Sweeps(self)
        self._term_routes = await wire(bus, COORDINATOR, self, leader=True)
        self._acting = True

    async def _abdicate(self, reason: str) -> None:
        self._log.warning("standing by", reason=reason, term=self._term)
        self._term = None
        await self._stop_acting()

    async def _stop_acting(self) -> None:
        self._acting = False
        if self._term_routes is not None:
            await self._term_routes.stop()
            self._term_routes = None
        # A sweep or search in progress holds a request handler; end it so the
        # connection can drain and the service exits.
        self.sweeps.stop()
        if self.multinode is not None:
            self.multinode.stop()

    def _fence(self) -> None:
        """Raise NotLeader unless this replica still leads the term it loaded."""
        assert self.election is not None
        if self.election.check() != self._term:
            raise NotLeader(f"term {self._term} is over")

    # ------------------------------------------------------------------ results

    async def on_bench_result(self, event: BenchResult) -> None:
        assert self.multinode is not None
        self._fence()  # a deposed leader's last batch goes back for the new leader
        data = event.data
        if data.judged_by == "coordinator":
            return  # our own verdict
        if data.session is not None:
            return  # shares of multi-node tests come over the share endpoint
        self.config.reload()
        # The run is judged on a copy, in ``latest`` while it is judged (the
        # fleet comparison reads it there). A step that fails (a verdict or
        # retry request not sent, the save lost) puts the record back, so the
        # redelivered result is judged again rather than taken for one seen.
        before = self.latest.get(event.node)
        record = before.model_copy(deep=True) if before else BenchRecord(node=event.node)
        self.latest[event.node] = record
        try:
            await self._take(event, record)
        except BaseException:
            if before is None:
                self.latest.pop(event.node, None)
            else:
                self.latest[event.node] = before
            raise

    async def _take(self, event: BenchResult, record: BenchRecord) -> None:
        data = event.data
        stamp = event.time.timestamp()
        if data.trigger == "probe":
            record.probe = BenchProbe(time=stamp, reason=data.reason)
            await self.save(event.node, record)
            return
        known = record.levels.get(data.level)
        if known is not None and known.time >= stamp:
            return  # older than what we hold (redelivery or replay)
        record.levels[data.level] = BenchRun(node=event.node, time=stamp, event_id=event.id,
                                             **data.model_dump())
        if data.sweep is not None:  # judged with the rest of its sweep
            await self.save(event.node, record)
            self.sweeps.on_result(event)
            return
        if data.level in JUDGED_LEVELS:
            await self._judge(event, record)
        await self.save(event.node, record)

    async def on_share(self, event: BenchResult) -> None:
        """One node's share of a multi-node test (core NATS, not an event)."""
        assert self.multinode is not None
        if event.data.session is not None:
            self.multinode.on_share(event)

    async def on_pair(self, request: PairRequest) -> PairReply:
        assert self.multinode is not None
        return await self.multinode.pair(request)

    async def _busy(self) -> dict[str, str]:
        assert self.bus is not None
        return busy_nodes((await (await self.bus.records(JOBS)).load()).values())

    async def on_search(self, request: SearchRequest) -> SearchReply:
        assert self.multinode is not None
        if not request.force:
            busy = await self._busy()
            named = [*request.nodes, *(request.healthy or [])]
            if held := [n for n in named if n in busy]:
                return SearchReply(ok=False, error="; ".join(why_busy(n, busy[n]) for n in held))
        reply = await self.multinode.search(request)
        if self._searches_total is not None and self._search_rounds_total is not None:
            outcome = ("error" if not reply.ok else "found" if reply.bad
                       else "inconclusive" if reply.inconclusive else "cleared")
            self._searches_total.labels(outcome).inc()
            self._search_rounds_total.inc(reply.rounds)
        return reply

    async def on_sweep(self, request: SweepRequest) -> SweepReply:
        skipped: dict[str, str] = {}
        if not request.force:
            busy = await self._busy()
            skipped = {n: f"runs job {busy[n]}" for n in request.nodes if n in busy}
            left = [n for n in request.nodes if n not in skipped]
            if not left:
                return SweepReply(ok=False, skipped=skipped,
                                  error="every node named runs a job; --force to bench anyway")
            request = request.model_copy(update={"nodes": left})
        reply = await self.sweeps.run(request)
        return reply.model_copy(update={"skipped": skipped})

    def peers(self, node: str, gpu_model: str, now: float) -> dict[str, dict[str, float]]:
        """Latest standard/full figures of the other nodes of this model, without
        stale runs or nodes whose last verdict was a failure."""
        max_age = self.config.current.fleet.max_age_s
        out: dict[str, dict[str, float]] = {}
        for other, record in self.latest.items():
            if other == node or (record.verdict and record.verdict.outcome == "failed"):
                continue
            runs = sorted((r for lvl, r in record.levels.items() if lvl in JUDGED_LEVELS
                           and (r.gpu_model or r.device) == gpu_model
                           and now - r.time <= max_age), key=lambda r: r.time)
            values = {f.name: f.value for r in runs for f in r.figures}
            if values:
                out[other] = values
        return out

    def judge(self, data: BenchResultData, peers: dict[str, dict[str, float]],
              spread: Spread | None = None) -> tuple[NodeJudgement, tuple[Outcome, str]]:
        """The fleet judgement of a run against ``peers`` and the agent's own."""
        config = self.config.current
        model = data.gpu_model or data.device
        judged = judge_node([(f.name, f.value, f.unit) for f in data.figures], peers,
                            policy=config.fleet,
                            floors=config.floors_of(model, [f.name for f in data.figures]),
                            spread=spread)
        local: tuple[Outcome, str] = (data.outcome or ("healthy" if data.passed else "failed"),
                                      data.reason)
        return judged, local

    async def _judge(self, event: BenchResult, record: BenchRecord) -> None:
        assert self.bus is not None
        data = event.data
        judged, local = self.judge(data, self.peers(event.node, data.gpu_model or data.device,
                                                    event.time.timestamp()))
        pending = record.pending
        first: tuple[Outcome, str] | None = None
        repeated = True
        if data.retry_of is not None:
            if pending and pending.request_id == data.retry_of:
                first = (pending.outcome, pending.reason)
                policy = self.config.current.fleet
                earlier = list(pending.repeats)
                evidence, judged = weigh_retries(judged, earlier, policy=policy)
                if measure_again(evidence, attempt=data.attempt, max_retries=policy.max_retries,
                                 local=local[0], fleet=judged.outcome):
                    await self._repeat(event, record, pending, judged, earlier)
                    return
                repeated = bool(set(pending.flagged) & set(judged.flagged))
            else:  # we lost the first run: this repeat stands alone
                first = (judged.outcome, judged.reason)
        decision = decide(local=local, fleet=(judged.outcome, judged.reason), first=first,
                          repeated=repeated)
        request_id = data.retry_of or data.request_id or event.id
        if decision.action == "retry":
            self._fence()
            await self.bus.publish(BenchRequest(
                id=f"{request_id}-retry", source=SOURCE, node=event.node,
                data=BenchRequestData(level=data.level, reason=f"retry: {decision.reason}",
                                      attempt=data.attempt + 1, retry_of=request_id)))
            record.pending = BenchPending(request_id=request_id, outcome=decision.outcome,
                                          reason=decision.reason, flagged=judged.flagged,
                                          time=time.time())
            self.retries += 1
            self._log.info("bench retry requested", node=event.node, request=request_id,
                           outcome=decision.outcome, reason=decision.reason)
            return
        await self.publish_verdict(event, record, decision.outcome, decision.reason, judged,
                                   request_id)

    async def _repeat(self, event: BenchResult, record: BenchRecord,
                      pending: BenchPending, judged: NodeJudgement,
                      earlier: list[tuple[float, float]]) -> None:
        """A repeat that could not tell (see ``weigh_retries``): measure once more."""
        assert self.bus is not None
        data = event.data
        request_id = pending.request_id
        self._fence()
        await self.bus.publish(BenchRequest(
            id=f"{request_id}-retry{data.attempt}", source=SOURCE, node=event.node,
            data=BenchRequestData(level=data.level, reason=f"retry: unsure ({judged.reason})",
                                  attempt=data.attempt + 1, retry_of=request_id)))
        ratio = score_ratio(judged) or 1.0
        record.pending = pending.model_copy(update={
            "repeats": [*earlier, (ratio, judged.score_z)], "time": time.time()})
        self.retries += 1
        self._log.info("bench retry requested", node=event.node, request=request_id,
                       outcome="unsure", reason=judged.reason)

    async def publish_verdict(self, event: BenchResult, record: BenchRecord,
                              outcome: Outcome, reason: str, judged: NodeJudgement,
                              request_id: str) -> None:
        """Say what the fleet comparison (after any retry) found; bootstrap acts on it."""
        assert self.bus is not None
        data = event.data
        finding = self.version_drift(event)
        outcome, reason, checks = with_finding(outcome, reason, list(data.checks), finding)
        figures = list(data.figures)
        if judged.score is not None and judged.score_median:
            figures.append(Figure(name="node_score_vs_fleet", unit="ratio",
                                  value=round(judged.score / judged.score_median, 4)))
        self._fence()
        await self.bus.publish(BenchResult(
            id=f"{request_id}-verdict", source=SOURCE, node=event.node,
            data=BenchResultData(
                level=data.level, request_id=request_id, passed=outcome != "failed",
                reason=reason, device=data.device, device_count=data.device_count,
                gpu_model=data.gpu_model, dtype=data.dtype, figures=figures,
                duration_s=data.duration_s, outcome=outcome, attempt=data.attempt,
                retry_of=data.retry_of, judged_by="coordinator", verdict_of=event.id,
                checks=checks, sweep=data.sweep)))
        record.verdict = BenchVerdict(outcome=outcome, reason=reason, request_id=request_id,
                                      time=event.time.timestamp(), flagged=judged.flagged,
                                      score=judged.score, score_median=judged.score_median)
        record.pending = None
        self.verdicts += 1
        if self._verdicts_total is not None:
            self._verdicts_total.labels(data.level, outcome).inc()
        self._log.info("bench verdict", node=event.node, request=request_id, outcome=outcome,
                       reason=reason)

    def version_drift(self, event: BenchResult) -> DriftFinding | None:
        """The run's driver versions against the majority of its GPU model's
        fleet, as the configuration's ``driver_versions`` probe has it (its
        fault kind, severity and action); None when that probe is switched off."""
        config = self.config.current
        spec = next((c for c in config.scheduled_probes() if c.kind == "driver_versions"), None)
        if spec is None or spec.fault_kind is None:
            return None
        data = event.data
        fleet = fleet_versions(self.latest, gpu_model=data.gpu_model or data.device,
                               levels=JUDGED_LEVELS, now=event.time.timestamp(),
                               max_age_s=config.fleet.max_age_s)
        finding = find_drift(event.node, stated_versions(data.checks), fleet,
                             fault=spec.fault_kind, severity=spec.severity, action=spec.action,
                             min_peers=config.fleet.min_peers)
        if finding is not None:
            self._log.warning("version drift", node=event.node, fault=finding.fault,
                              severity=finding.severity, action=finding.action,
                              detail="; ".join(finding.drifted))
            if self._drift_total is not None:
                self._drift_total.labels(finding.action).inc()
        return finding

    async def save(self, node: str, record: BenchRecord) -> None:
        """The leader's record stands over one a deposed leader wrote meanwhile."""
        assert self.kv is not None
        self._fence()
        await self.kv.put(node, record, on_conflict=lambda _: self._fence())
        self.latest[node] = record

    # ------------------------------------------------------------------ report

    def report(self) -> list[FleetRow]:
        """Every judged figure of every node's latest run per level against the
        median of its GPU model and level, worst deviation first."""
        rows: list[FleetRow] = []
        levels = sorted({lvl for r in self.latest.values() for lvl in r.levels})
        for level in levels:
            figures = [NodeFigure(n, run.gpu_model or run.device, f.name, f.value, f.unit)
                       for n, r in self.latest.items() if (run := r.levels.get(level))
                       for f in run.figures]
            for d in compare_with_fleet(figures, k=self.config.current.fleet.k,
                                        min_peers=self.config.current.fleet.min_peers):
                record = self.latest[d.node]
                run = record.levels[level]
                verdict = record.verdict
                rows.append(FleetRow(
                    node=d.node, gpu_model=d.gpu_model, level=level, name=d.name,
                    value=d.value, unit=d.unit, median=d.median, relative=d.relative,
                    robust_z=d.robust_z, flagged=d.flagged, peers=d.peers, passed=run.passed,
                    outcome=(verdict.outcome if verdict else None) or run.outcome,
                    verdict=verdict.reason if verdict else ""))
        return sorted(rows, key=lambda r: (r.relative, r.node, r.name))

    async def on_report(self, _: Empty) -> FleetReport:
        return FleetReport(rows=self.report())

    async def stop(self) -> None:
        await cancel_and_wait([self._follow_task])
        await self._stop_acting()
        if self.election is not None:  # hand the lease over at once
            await self.election.stop(release=True)

    def metrics(self, metrics: ServiceMetrics) -> None:
        """Verdicts and split searches, by outcome (the shell serves them)."""
        self._verdicts_total = metrics.counter(
            "bench_verdicts", "fleet verdicts published, by level and outcome",
            ("level", "outcome"))
        self._searches_total = metrics.counter(
            "bench_searches", "split searches for a bad node, by outcome (found, cleared, "
            "inconclusive, error)", ("outcome",))
        self._search_rounds_total = metrics.counter(
            "bench_search_rounds", "rounds of split-search collectives run")
        self._drift_total = metrics.counter(
            "bench_version_drift", "verdicts whose node runs another driver, ROCm or CUDA "
            "version than its GPU model's fleet majority, by the finding's action "
            "(quarantine, report)", ("action",))

    def health(self) -> dict[str, Any]:
        leadership = self.election.describe() if self.election is not None else {}
        # "leader" comes from the lease; "acting" once the leader has loaded
        # every node's record and answers (a moment later on taking over).
        return {"acting": self._acting, "nodes_with_results": len(self.latest),
                "retries": self.retries,
                "verdicts": self.verdicts, "sweeps": self.sweeps.runs,
                "config_error": self.config.error, **leadership}
