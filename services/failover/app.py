"""Failover service shell: feeds every fault source into the pure
``FaultBook`` (heartbeats through ``HeartbeatMonitor``, bench verdicts,
worker exits, Lens alerts, node states) and acts on its decisions: publish
``fault.opened`` (bootstrap then quarantines the node and the scheduler moves
its jobs), ``job.recover`` for faults of a job, ``fault.mitigated`` /
``fault.recovered`` / ``fault.closed`` with the recovery's timings; every
fault record is kept in the ``faults`` KV bucket.

Liveness is judged on this process's clock: a beat counts when it is
received (``libs.beats``: core NATS, on a lean connection of its own), and
after a (re)start no node is judged before it has had a full deadline to
beat again (beats are not kept: silence before the start says nothing). The
nodes judged are those bootstrap registered (its ``nodes`` bucket and
``node.registered`` events); beats from other names open nothing.

Failover hosts the node half of the driver (``libs/drivers/nodes.py``): on
Kubernetes (``PRIMUS_DRIVER=kubernetes``) a node fault that acts cordons
and taints the node while it is open (``cordons.py`` does it, per node,
retrying), and the Node watch's conditions (NotReady, MemoryPressure, ...)
are a fault source (``conditions.py``). Locally there is nothing to cordon:
the quarantine keeps the platform's scheduler off the node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.beats import BeatListener
from libs.bus import Bus
from libs.drivers.base import NODE_WORKERS, NodeWorkers, NodeWorkersRequest
from libs.drivers.nodes import LocalNodes, NodeDriver, NodeUpdate
from libs.events import (
    BenchResult,
    FaultChangedData,
    FaultClosed,
    FaultCloseRequested,
    FaultMitigated,
    FaultOpened,
    FaultOpenedData,
    FaultRecovered,
    JobCancelled,
    JobCheckpoint,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobPreempted,
    JobProgress,
    JobRecover,
    JobRecoverData,
    JobStopped,
    JobTelemetry,
    LensAlert,
    NodeAgentStopping,
    NodeRegistered,
    NodeStateChanged,
    WorkerExited,
)
from libs.kv import Records
from libs.logs import get_logger
from libs.metrics import ServiceMetrics
from libs.records import FAULTS, JOBS, NODES, FaultRecord
from libs.settings import Settings
from libs.specs import load_model
from libs.tasks import cancel_and_wait
from libs.wiring import wire
from services.failover.conditions import (
    PREFIX,
    ConditionChange,
    ConditionTracker,
    cordons,
    mark_stays,
    marks_to_fix,
)
from services.failover.cordons import Cordons
from services.failover.faults import (
    Decision,
    FailoverRules,
    Fault,
    FaultBook,
    bench_fault_kind,
    classify_exit,
    infra_rule,
)
from services.failover.figures import FailoverFigures, failover_families
from services.failover.routes import ROUTES
from services.failover.rules import HeartbeatMonitor, MissedHeartbeat, WatchedNode

SOURCE = "failover"
WORKERS_ASK_S = 2.0  # how long to wait for the driver's word on a silent node
SUSPECT_RECHECK_S = 2.0  # how often a silent node whose workers ran is asked again
CHECK_PERIOD_S = 0.05  # how often silence is judged


def judge_period_s(interval_s: float) -> float:
    """How often silence is judged: twenty times a second, and at least four
    times per beat interval (so the judge's look-ahead, two periods, stays
    within half an interval)."""
    return min(CHECK_PERIOD_S, interval_s / 4)


def load_rules(path: Path | None) -> FailoverRules:
    return FailoverRules() if path is None else load_model(path, FailoverRules)


def node_driver(settings: Settings) -> NodeDriver:
    """The cluster's nodes: Kubernetes (in-cluster credentials, else the
    kubeconfig) or the local driver's, which has nothing to cordon."""
    if settings.driver == "kubernetes":
        from libs.drivers.k8s_nodes import KubernetesNodes
        return KubernetesNodes()
    return LocalNodes()


class Failover:
    name = "failover"
    routes = ROUTES

    def __init__(self, settings: Settings, *, nodes: NodeDriver | None = None) -> None:
        # The judge looks every judge_period_s: it calls a silence up to two
        # looks early (one for the look, one for its own delay under load), so
        # a node is faulted within interval x missed of its last beat, not
        # after it: 1 s beats and 3 missed find a dead node within 3 s.
        self.monitor = HeartbeatMonitor(settings.heartbeat_interval_s, settings.heartbeat_missed,
                                        first_beat_grace_s=settings.heartbeat_first_grace_s,
                                        lead_s=2 * judge_period_s(settings.heartbeat_interval_s))
        self.book = FaultBook(load_rules(settings.failover_rules))
        self._figures: FailoverFigures | None = None
        self.placements: dict[str, tuple[int, set[str]]] = {}  # job -> (attempt, nodes)
        self.bus: Bus | None = None
        self.kv: Records[FaultRecord] | None = None
        self._unsent: list[Decision] = []  # made, not yet published and recorded
        # Silent agents whose node's workers still ran when asked: watched, not evacuated.
        self.suspects: dict[str, WatchedNode] = {}
        # The driver answers through the scheduler leader; a new leader
        # takes over within one lease, so twice that without its word is
        # more than a restart of the scheduler or of NATS.
        self.no_word_s = 2.0 * settings.leader_ttl_s
        self._sending = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.beats: BeatListener | None = None
        self._back: dict[str, float] = {}  # nodes heard again after a fault, not yet settled
        self._settings = settings
        self.nodes = nodes  # built at start when not given
        self.cordons: Cordons | None = None
        self.conditions = ConditionTracker()
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        # Silence before this moment says nothing: every node gets a full
        # deadline from now, whatever the replayed beats were stamped with.
        started = time.time()
        self.monitor.blind(started)
        for name, node in (await (await bus.records(NODES)).load()).items():
            # A node in service has beaten before; one still onboarding may not have.
            self.monitor.watch(name, started, heard=node.state == "ready")
        # Where jobs run now, from the scheduler's records. A placement made
        # before this start was taken by the last instance, and the
        # scheduler's re-announcement after its own restart is dropped by
        # JetStream as a repeat: without this a node whose agent restarts
        # with failover (an upgrade) looks empty and is evacuated at once.
        for job in (await (await bus.records(JOBS)).load()).values():
            if job.holds_gpus and job.slots:
                self.placements[job.id] = (job.attempt, set(job.nodes))
        self.kv = await bus.records(FAULTS)
        self.book.faults = await self.kv.load()
        if self.nodes is None:
            self.nodes = node_driver(self._settings)
        self.cordons = Cordons(self.nodes)
        await wire(bus, ROUTES, self)
        self.beats = BeatListener(bus, self._heard, name="failover:beats")
        await self.beats.start()
        self._task = asyncio.create_task(self._watch())
        await self.nodes.watch(self._node_update)

    def _jobs_on(self, node: str) -> list[str]:
        return sorted(j for j, (_, nodes) in self.placements.items() if node in nodes)

    # ------------------------------------------------------------------ fault sources

    # Every handler ends in ``_act``, with or without decisions: what an
    # outage kept from going out goes first.

    def _heard(self, nodes: list[str], at: float) -> None:
        """Beats, as the listener read them (no await: 12,500 a second). A
        node back from silence is settled by the watch loop, within a tick."""
        beat = self.monitor.beat
        for node in nodes:
            if beat(node, at):
                self._back[node] = at

    async def _settle_back(self) -> None:
        for node in list(self._back):
            # Taken off first: its decision is queued by ``_act`` before any
            # send, so an outage keeps it, and the others wait for the next tick.
            at = self._back.pop(node)
            if self.suspects.pop(node, None) is not None:
                self._log.info("agent back; its node was never evacuated", node=node)
            await self._act(self.book.observe("heartbeat_missed", node, bad=False, now=at))

    async def on_agent_stopping(self, event: NodeAgentStopping) -> None:
        """An agent restarts (a rolling upgrade): wait for it, within the
        grace it announced, before its silence counts."""
        now = time.time()
        self.monitor.pause(event.node, now + event.data.back_within_s)
        self._log.info("agent stopping; waiting for it", node=event.node,
                       back_within_s=event.data.back_within_s, reason=event.data.reason)
        await self._act([])

    async def on_fault_close(self, event: FaultCloseRequested) -> None:
        """An operator closes a fault; one unknown or closed already is logged.
        A node whose silence it was must beat again within the deadline, or
        a new fault opens (its agent may still be dead)."""
        now = time.time()
        decisions = self.book.close(event.data.fault_id, now, by=event.data.by,
                                    reason=event.data.reason)
        if not decisions:
            self._log.info("close of a fault that is not open", fault=event.data.fault_id)
        again: list[ConditionChange] = []
        for d in decisions:
            if d.fault.kind == "heartbeat_missed" and d.fault.scope == "node":
                self.monitor.judge_again(d.fault.key, now)
            elif d.fault.scope == "node" and (
                    bad := self.conditions.still_bad(d.fault.key, d.fault.kind)) is not None:
                again.append(bad)
        await self._act(decisions + self._judge(again, closed_by=event.data.by))

    async def on_node_registered(self, event: NodeRegistered) -> None:
        # Timed from when failover heard of it, whatever it was stamped.
        self.monitor.watch(event.node, time.time())
        # Its conditions, heard before it was registered, are judged now.
        await self._act(self._judge(self.conditions.current(event.node)))

    async def _node_update(self, update: NodeUpdate) -> None:
        """The node watch: a changed condition of a registered node is an
        observation; a complete listing also puts cordons right (one lost
        in a crash, or a mark left by a fault closed meanwhile)."""
        assert self.cordons is not None
        if update.complete:
            self.conditions.keep_only(v.name for v in update.nodes)
            for fix in marks_to_fix(update.nodes, self.book.faults.values()):
                if fix.action == "cordon":
                    self.cordons.cordon(fix.node, fix.kind, fix.reason)
                else:
                    self.cordons.uncordon(fix.node, fix.kind)
        for node in update.deleted:
            self.conditions.forget(node)
        changes = [c for v in update.nodes for c in self.conditions.update(v)]
        await self._act(self._judge(changes))

    def _judge(self, changes: list[ConditionChange], *, closed_by: str | None = None
               ) -> list[Decision]:
        """``closed_by``: the changes are conditions still bad after that
        operator closed their faults."""
        now = time.time()
        decisions: list[Decision] = []
        for c in changes:
            if c.node not in self.monitor.last_seen:
                continue  # only nodes the platform knows are judged
            name = c.kind.removeprefix(PREFIX)
            reason = (f"Kubernetes node {name}: {c.message}" if c.bad
                      else f"Kubernetes reports {name} cleared: {c.message}")
            if closed_by is not None:
                reason += (f" (still so after {closed_by or 'an operator'} closed the last "
                           f"fault: fix the node, or set this rule's failover to false)")
            decisions += self.book.observe(c.kind, c.node, bad=c.bad, now=now,
                                           jobs=self._jobs_on(c.node), reason=reason)
        return decisions

    async def on_node_state(self, event: NodeStateChanged) -> None:
        await self._act(self.book.node_state(event.node, event.data.state, time.time()))

    async def on_job_placed(self, event: JobPlaced) -> None:
        self.placements[event.job] = (event.data.attempt, {w.node for w in event.data.workers})
        self.book.job_placed(event.job, event.data.attempt, time.time())
        await self._act([])

    async def on_job_ended(self, event: JobCompleted | JobFailed | JobPreempted | JobStopped
                           | JobCancelled) -> None:
        """The run ended (a preempted or stopped job is placed again later, afresh)."""
        self.placements.pop(event.job, None)
        if isinstance(event, JobCompleted | JobFailed | JobCancelled):
            self.book.forget_job(event.job)  # done for good: no restart to account for
        await self._act(self.book.job_ended(event.job, time.time()))

    async def on_bench_result(self, event: BenchResult) -> None:
        # A periodic probe's report (its agent counted the failing streak) is
        # probe_failed; a bench run's verdict is bench_failed.
        kind = bench_fault_kind(self.book.rules, probe=event.data.trigger == "probe",
                                fault_kind=event.data.fault_kind)
        await self._act(self.book.observe(
            kind, event.node, bad=not event.data.passed, now=time.time(),
            reason=event.data.reason, jobs=self._jobs_on(event.node)))

    async def on_worker_exited(self, event: WorkerExited) -> None:
        kind = classify_exit(event.data.exit_code, self.book.rules.infra_exit_codes)
        await self._act([] if kind == "user" else self.book.observe(
            "worker_infra_exit", event.node, bad=kind == "infra", now=time.time(),
            reason=f"{event.job} rank {event.data.rank} exited {event.data.exit_code}",
            jobs=self._jobs_on(event.node)))

    async def on_lens_alert(self, event: LensAlert) -> None:
        key = event.job or event.node
        if not key:
            await self._act([])
            return
        now = time.time()
        kind = f"alert:{event.data.rule}"
        await self._act(self.book.observe(
            kind, key, bad=event.data.state == "open", now=now,
            reason=event.data.message or event.data.rule,
            jobs=[event.job] if event.job else self._jobs_on(key),
            # A sender's clock ahead of ours must not date detection in the future.
            last_good=min(event.data.opened_at.timestamp(), now),
            default=infra_rule(kind, event.data.fault_class, about_job=event.job is not None)))

    async def on_job_steps(self, batch: list[tuple[JobTelemetry, int]]) -> None:
        now = time.time()
        decisions = []
        for event, _ in batch:
            if event.data.checkpoint_path is None:
                decisions += self.book.job_stepped(event.job, event.data.attempt, now)
            else:  # the SDK saved one (every rank reports its part; the step is the same)
                self.book.checkpoint(event.job, event.data.iteration,
                                     min(event.time.timestamp(), now))
        await self._act(decisions)

    async def on_job_progress(self, event: JobProgress) -> None:
        """An attempt's first step, read by Lens from the job's output (no SDK)."""
        await self._act(self.book.job_stepped(event.job, event.data.attempt, time.time()))

    async def on_job_checkpoint(self, event: JobCheckpoint) -> None:
        """A newer complete checkpoint in the job's directory (the watch)."""
        self.book.checkpoint(event.job, event.data.iteration,
                             min(event.data.saved_at.timestamp(), time.time()))
        await self._act([])

    async def _watch(self) -> None:
        assert self.bus is not None
        # A check costs the silent nodes only (rules.HeartbeatMonitor.check):
        # twenty a second, looking two ahead, open a fault 0.05-0.1 s before
        # the deadline (the monitor's lead_s).
        period = judge_period_s(self.monitor.interval_s)
        while True:
            planned = time.monotonic() + period
            await asyncio.sleep(period)
            late = time.monotonic() - planned
            if not self.bus.nc.is_connected or (self.beats is not None
                                                and not self.beats.connected):
                # Our own bus (or the beats' connection) is down: every node
                # falls silent at once, and that says nothing about them (a
                # NATS restart would otherwise quarantine the whole fleet).
                self.monitor.blind(time.time())
                continue
            try:
                await self._settle_back()
                await self._act([])  # what an outage kept from going out
            except Exception as exc:
                self._log.warning("cannot send fault decisions yet", unsent=len(self._unsent),
                                  error=repr(exc))
                continue
            try:
                if late > self.monitor.stall_s:
                    self._log.warning("failover was stalled; no node judged on that silence",
                                      stalled_s=round(late, 2))
                for missed in self.monitor.check(time.time(), late_s=late):
                    await self._silent(missed)
                await self._recheck_suspects()
            except Exception:  # this loop is the only heartbeat judge: it must live
                self._log.exception("heartbeat check failed")

    async def _silent(self, missed: MissedHeartbeat) -> None:
        """A node's agent fell silent. If jobs run there, ask the driver
        first: workers that still run mean a dead agent, not a dead node —
        the node is watched (asked again) instead of evacuated. No word
        (the scheduler restarting with the agent, as in an upgrade of the
        whole platform) watches it too, as if its workers ran until its last
        beat: nothing could be moved before the scheduler is back, and then
        it answers."""
        jobs = self._jobs_on(missed.node)
        alive = await self._workers_alive(missed.node) if jobs else False
        watched = WatchedNode.first(missed, alive, time.monotonic(), time.time())
        if watched is None:  # nothing runs there, or its workers stopped too
            await self._open_silent(missed, "")
            return
        self.suspects[missed.node] = watched
        self._log.warning("agent silent but its node's workers run; not evacuating" if alive
                          else "agent silent and no word on its node's workers yet; watching",
                          node=missed.node, jobs=jobs, silent_s=round(missed.overdue_s, 1))

    async def _recheck_suspects(self) -> None:
        """Ask the driver again about each watched node (see ``WatchedNode``)."""
        for node, watched in list(self.suspects.items()):
            if not watched.due(time.monotonic(), SUSPECT_RECHECK_S):
                continue
            more = watched.answered(await self._workers_alive(node), time.monotonic(),
                                    self.no_word_s)
            if more:
                del self.suspects[node]
                await self._open_silent(watched.missed, more)

    async def _open_silent(self, missed: MissedHeartbeat, more: str) -> None:
        now = time.time()
        await self._act(self.book.observe(
            "heartbeat_missed", missed.node, bad=True, now=now,
            reason=f"no heartbeat for {now - missed.last_seen:.1f} s "
                   f"(limit {self.monitor.deadline_s:.1f} s){more}",
            jobs=self._jobs_on(missed.node), last_good=missed.last_seen))

    async def _workers_alive(self, node: str) -> bool | None:
        """The driver's word (through the scheduler) on whether the node's
        workers run; None when there is none (no answer, or an answer that
        cannot tell)."""
        assert self.bus is not None
        try:
            reply = await self.bus.ask(NODE_WORKERS, NodeWorkersRequest(node=node),
                                       timeout_s=WORKERS_ASK_S)
        except Exception as exc:
            self._log.warning("no word from the driver on a silent node", node=node,
                              error=repr(exc))
            return None
        if not (reply.ok and isinstance(reply, NodeWorkers)):
            self._log.warning("the driver cannot tell whether a silent node's workers run",
                              node=node, error=reply.error)
            return None
        return reply.alive

    async def _act(self, decisions: list[Decision]) -> None:
        """Carry out decisions in order, each published and then recorded.

        The fault book changed already when a decision was made, so a
        decision that could not be sent (NATS away longer than a publish
        waits) would never be made again: a redelivered event or the next
        heartbeat check finds the fault open and does nothing. So unsent
        decisions wait here, in order, and go out before anything newer —
        on the next event or the next heartbeat tick. Ids are fixed per
        fault and action, so a decision sent twice is one event."""
        self._unsent.extend(decisions)
        async with self._sending:  # the event handler and the heartbeat loop both act
            while self._unsent:
                await self._send(self._unsent[0])  # raises: it and the rest stay queued
                self._unsent.pop(0)

    async def _send(self, d: Decision) -> None:
        assert self.bus is not None
        f = d.fault
        node = f.key
        changed = FaultChangedData(fault_id=f.fault_id, kind=f.kind, timings=f.timings(),
                                   by=f.closed_by, reason=f.close_reason)
        if d.action == "open":
            await self.bus.publish(FaultOpened(
                id=f.fault_id, source=SOURCE, node=node, data=FaultOpenedData(
                    fault_id=f.fault_id, kind=f.kind, reason=f.reason, jobs=f.jobs,
                    scope=f.scope, quarantine=f.scope == "node" and f.failover)))
            self._log.warning("fault opened", fault=f.fault_id, key=node, kind=f.kind,
                              jobs=f.jobs)
            if cordons(f) and self.cordons is not None:
                self.cordons.cordon(node, f.kind, f.reason)
        elif d.action == "restart_job":
            await self.bus.publish(JobRecover(
                id=f"{f.fault_id}-recover", source=SOURCE, job=f.key,
                data=JobRecoverData(fault_id=f.fault_id, reason=f"{f.kind}: {f.reason}")))
        elif d.action == "mitigate":
            await self.bus.publish(FaultMitigated(id=f"{f.fault_id}-mitigated", source=SOURCE,
                                                  node=node, data=changed))
        elif d.action == "recovered":
            await self.bus.publish(FaultRecovered(id=f"{f.fault_id}-recovered",
                                                  source=SOURCE, node=node, data=changed))
            self._log.info("recovered", fault=f.fault_id, **{k: v for k, v in
                                                             f.timings().items()})
        elif d.action == "close":
            await self.bus.publish(FaultClosed(id=f"{f.fault_id}-closed", source=SOURCE,
                                               node=node, data=changed))
            # The node's other faults keep theirs, and one of this kind
            # opened again keeps this mark rather than it going and coming back.
            if cordons(f) and self.cordons is not None \
                    and not mark_stays(f, self.book.faults.values()):
                self.cordons.uncordon(node, f.kind)
        await self._record(f)
        if self._figures is not None:
            self._figures.sent(d.action, f)

    async def _record(self, fault: Fault) -> None:
        """Failover's fault book is the truth: its record stands over one
        written meanwhile (another failover during a rolling restart), logged."""
        assert self.kv is not None
        await self.kv.put(fault.fault_id, fault, on_conflict=lambda _: None)

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        if self.beats is not None:
            await self.beats.stop()
        if self.nodes is not None:
            await self.nodes.close()
        if self.cordons is not None:
            await self.cordons.close()

    def metrics(self, metrics: ServiceMetrics) -> Callable[[], None]:
        self._figures = FailoverFigures(metrics)
        return metrics.add_source(lambda: failover_families(self.book.faults, self.monitor))

    def health(self) -> dict[str, Any]:
        open_faults = [f.fault_id for f in self.book.faults.values() if f.status != "closed"]
        unknown = self.monitor.unknown_beats
        return {"watched_nodes": len(self.monitor.last_seen), "down": sorted(self.monitor.down),
                "silent_agents_with_live_workers": sorted(self.suspects),
                "faults_open": open_faults, "decisions_unsent": len(self._unsent),
                "cordons_pending": self.cordons.pending if self.cordons else 0,
                "beats_heard": self.beats.heard if self.beats else 0,
                "beats_link": ("lean" if self.beats.lean else "nats-py") if self.beats else "",
                # False: no beat can arrive, so no node is judged (not all down).
                "beats_connected": self.beats.connected if self.beats else False,
                "unknown_beats": sum(unknown.values()),
                "unknown_nodes": sorted(unknown)[:20]}
