"""Scheduler service shell: folds node, job and worker events into its
records (``view``), asks the pure policy what to do once per cycle, and
acts: bind placements (``job.placed`` + the cluster driver), checkpoint and
requeue preemption victims (``job.preempted``), publish every pending job's
reason and position (``job.pending``), finish jobs (``job.completed`` /
``job.failed``). The ``jobs`` KV bucket holds every record; after a restart
the scheduler rebuilds from it, from bootstrap's ``nodes`` bucket and from
the driver's surviving workers.

Records change before events are published ("assume, then persist"): a
placement is written to KV, then announced, then launched, so a crash at any
point leaves a state a restart can finish (the driver's launch is
idempotent per attempt and rank).

Replicas elect a leader (``libs.leader``, role ``scheduler``): only the
leader rebuilds, consumes and places; a standby only campaigns and answers
health with ``role: standby``. Every effect first checks that this replica
still leads the term its records belong to, and every job record carries
that term (``leader_term``): a record written by a newer term is never
overwritten by an older one.

Admission (``policy.admission``): the leader answers
``safe.query.scheduler.admission`` so ``primus-safe submit`` learns before it
prints a job id whether the job can ever run; the same check runs when
``job.submitted`` is read (a refused job ends ``failed`` at once, its reason
in the record and in ``job.failed``) and every cycle (a job the registered
nodes cannot hold waits as ``unschedulable``, outside the queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from libs.bus import Bus
from libs.drivers.base import ClusterDriver, LaunchRefused, NodeWorkers, NodeWorkersRequest
from libs.drivers.local import LocalDriver
from libs.events import (
    Event,
    JobCancelRequested,
    JobDeleteRequested,
    JobPending,
    JobPendingData,
    JobRecover,
    JobResumeRequested,
    JobSpec,
    JobStopRequested,
    JobSubmitted,
    NodeRegistered,
    NodeStateChanged,
    WorkerExited,
)
from libs.gc_pause import paused_gc
from libs.inventory import HostSpec
from libs.kv import Records
from libs.leader import LeaderElection, NotLeader, follow
from libs.logs import get_logger
from libs.metrics import ServiceMetrics
from libs.records import JOBS, NODES, JobRecord, NodeRecord
from libs.settings import Settings
from libs.tasks import cancel_and_wait
from libs.wiring import Wiring, wire
from services.scheduler import config as scheduler_config
from services.scheduler import lifecycle, node_holds, workload
from services.scheduler.announcements import SOURCE, announcement, end_of
from services.scheduler.callout import AuthCallout
from services.scheduler.figures import SchedulerFigures, scheduler_families
from services.scheduler.policy import admission, schedule
from services.scheduler.protocol import AdmissionReply, AdmissionRequest
from services.scheduler.routes import ROUTES
from services.scheduler.view import (
    SchedulerState,
    policy_job,
    policy_nodes,
    worker_slots,
)
from services.scheduler.view import snapshot as build_snapshot

JobCommand = JobStopRequested | JobResumeRequested | JobCancelRequested | JobDeleteRequested
COMMANDS: dict[type[Event], lifecycle.Action] = {
    JobStopRequested: "stop", JobResumeRequested: "resume", JobCancelRequested: "cancel",
    JobDeleteRequested: "delete"}
MIN_CYCLE_INTERVAL_S = 0.1  # events arriving closer than this share one cycle

if TYPE_CHECKING:  # the kubernetes client is heavy; only that driver loads it
    from libs.drivers.kubernetes import KubernetesDriverConfig


@dataclass
class Wake:
    """Whether the event just handled may change a placement (it wakes the cycle)."""

    cycle: bool = True


class Scheduler:
    name = "scheduler"
    routes = ROUTES

    def __init__(self, settings: Settings, driver: ClusterDriver | None = None) -> None:
        self.settings = settings
        self.config = scheduler_config.load(settings.scheduler_config)
        self.limits = self.config.limits()
        self.workspaces = self.config.workspace_policies()
        self.state = SchedulerState()
        self.driver = driver
        # A driver of our own is made anew each term: a detached one may not
        # restart (the Kubernetes driver's pod watch does not).
        self._own_driver = driver is None
        self._driver_used = False
        self.bus: Bus | None = None
        # Every replica answers the NATS auth callout (job credentials).
        self.callout = AuthCallout(settings) if settings.nats_callout_seed else None
        self.kv: Records[JobRecord] | None = None
        self.election: LeaderElection | None = None
        self._term: int | None = None  # the term this replica's records belong to
        self._old_terms = 0  # the newest term found in the records at the rebuild
        self._term_routes: Wiring | None = None  # the leader's routes, dropped with the lease
        self._follow_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._cycle_task: asyncio.Task[None] | None = None
        self._fleet_now: admission.Fleet | None = None  # until a node (re)registers
        self._shown: dict[str, tuple[int, str]] = {}
        # Per job: the record and the effects a stored step left undone.
        self._unfinished: dict[str, tuple[JobRecord, tuple[lifecycle.Effect, ...]]] = {}
        self.cycles = 0
        self.last_cycle_ms = 0.0
        self._figures: SchedulerFigures | None = None
        self._log = get_logger()

    # ------------------------------------------------------------------ start

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self._log = get_logger()  # bound after run_service configured logging
        self.kv = await bus.records(JOBS)
        if self.driver is None:  # now, so that a bad driver setting fails the start
            self.driver = make_driver(self.settings, bus, self.limits)
        if self.callout is not None:
            await self.callout.start(bus)
        self.election = LeaderElection.for_service(bus, "scheduler", self.settings)
        await self.election.start()
        self._follow_task = await follow(self.election, lead=self._lead,
                                         abdicate=self._abdicate)

    async def _lead(self, term: int) -> None:
        """Elected: start from what the buckets hold now, then consume and place."""
        assert self.bus is not None
        self._log.info("leading", term=term)
        self._term = term
        self.state, self._shown, self._unfinished = SchedulerState(), {}, {}
        self._fleet_now = None
        if self._own_driver and self._driver_used:
            self.driver = make_driver(self.settings, self.bus, self.limits)
        self._driver_used = True
        await self._rebuild(self.bus)
        # The leader's consumer and admission endpoint (it alone has the
        # registered nodes), stopped with the term and nothing else.
        self._term_routes = await wire(self.bus, ROUTES, self, leader=True)
        self._cycle_task = asyncio.create_task(self._cycle_loop())

    async def _abdicate(self, reason: str) -> None:
        """Lost the lease: stop acting now; a new term starts from the buckets."""
        self._log.warning("standing by", reason=reason, term=self._term)
        self._term = None
        await self._stop_acting(wait_s=0)
        self.state, self._shown, self._unfinished = SchedulerState(), {}, {}

    async def _stop_acting(self, *, wait_s: float) -> None:
        await cancel_and_wait([self._cycle_task])
        self._cycle_task = None
        if self._term_routes is not None:
            await self._term_routes.stop()
            self._term_routes = None
        # Stops under way finish (within ``wait_s`` all together); the rest is
        # cancelled: a new leader sends every unfinished stop again.
        if self._tasks and wait_s > 0:
            await asyncio.wait(list(self._tasks), timeout=wait_s)
        await cancel_and_wait(list(self._tasks))
        if self.driver is not None:
            # Running workers keep running: the next leader adopts them.
            await self.driver.detach()

    async def _rebuild(self, bus: Bus) -> None:
        """Records from the KV buckets; workers that outlived the last run."""
        assert self.kv is not None and self.driver is not None
        self.state.nodes = await (await bus.records(NODES)).load()
        self.state.jobs = await self.kv.load()
        self._old_terms = max((job.leader_term for job in self.state.jobs.values()), default=0)
        if self._term is not None and self._old_terms > self._term:
            # Terms are lease revisions: only a deleted leases bucket starts them over.
            self._log.error("job records carry newer terms than ours; was the leases "
                            "bucket deleted? taking them as older", newest=self._old_terms,
                            term=self._term)
        adopted = await self.driver.adopt()
        for job in list(self.state.jobs.values()):
            await self._carry_out(job, lifecycle.Step(job, lifecycle.on_restart(job, self.limits)))
        if self.state.jobs or adopted:
            self._log.info("rebuilt", nodes=len(self.state.nodes), jobs=len(self.state.jobs),
                           adopted_workers=adopted)

    # ------------------------------------------------------------------ events

    @contextlib.asynccontextmanager
    async def _handling(self) -> AsyncIterator[Wake]:
        """Every event is handled by the leader of the term it rebuilt in (a
        deposed leader's last batch goes back for the new one), one at a
        time with the cycle, and wakes the cycle unless the handler says
        nothing changed for it (``Wake.cycle``)."""
        self._fence()
        wake = Wake()
        async with self._lock:
            yield wake
        if wake.cycle:
            self._dirty.set()

    async def on_node_registered(self, event: NodeRegistered) -> None:
        async with self._handling():
            self._fleet_now = None  # GPUs, model, pool or rack may have changed
            self.state.holds = node_holds.judged(self.state.holds, event.node)
            old = self.state.nodes.get(event.node)
            self.state.nodes[event.node] = NodeRecord(
                spec=HostSpec.of(event.node, event.data), registration=event.id,
                state=old.state if old else "registered")

    async def on_node_state(self, event: NodeStateChanged) -> None:
        async with self._handling() as wake:
            node = self.state.nodes.get(event.node)
            if node is not None:
                data = event.data
                before = (node.state, node.cordoned, node.degraded)
                node.state = data.state
                node.cordoned = not data.schedulable  # an operator's hold
                node.degraded = data.degraded
                if node.state != before[0]:  # failover's verdict replaces a hold
                    self.state.holds = node_holds.judged(self.state.holds, event.node)
                # A new reason alone changes no placement: at 12,500 nodes
                # such notes would otherwise each cost a cycle.
                wake.cycle = data.drain or (node.state, node.cordoned, node.degraded) != before
                fact: lifecycle.Fact | None = None
                if node.state != "ready":
                    # A node left service: its gangs stop and are re-placed
                    # first in the queue, preferring their healthy nodes.
                    fact = lifecycle.NodeLost(event.node, data.reason)
                elif data.drain:
                    fact = lifecycle.Drain(event.node, data.reason)
                if fact is not None:
                    for job in list(self.state.jobs.values()):
                        await self._apply(job, fact)

    async def on_job_submitted(self, event: JobSubmitted) -> None:
        async with self._handling():
            if event.job in self.state.jobs:  # idempotent on redelivery
                return
            resolved = self._resolve(event.data.spec)
            job = JobRecord(id=event.job, spec=resolved.spec or event.data.spec,
                            submitted_at=event.time.timestamp(),
                            notes=self._ignored(resolved.spec))
            verdict = (self._admit(job) if resolved.spec is not None
                       else admission.Admission("refused", resolved.reason, resolved.field))
            # Known once stored: a save that fails leaves the job unknown, so
            # the redelivered event is not taken for one already handled.
            if verdict.verdict == "refused":
                self._log.warning("job refused", job=job.id, reason=verdict.reason)
                await self._apply(job, lifecycle.Refuse(verdict.reason))
            else:
                await self._save(job)
                self.state.jobs[job.id] = job

    async def on_worker_exited(self, event: WorkerExited) -> None:
        async with self._handling():
            job = self.state.jobs.get(event.job)
            if job is None:  # forgotten (deleted, past its TTL), or never ours
                self._log.info("exit of a job the scheduler does not know", job=event.job,
                               attempt=event.data.attempt, rank=event.data.rank)
            else:
                if event.data.node_down:
                    # Keep the next placements off the dead node until
                    # failover judges it (before the lifecycle requeues).
                    self.state.holds = node_holds.refused(
                        self.state.holds, event.node, time.time(), event.data.reason or "",
                        self.limits)
                    self._log.warning("node held out of placement: a rank could not start "
                                      "there", node=event.node, job=job.id,
                                      until=self.state.holds[event.node].until)
                await self._apply(job, lifecycle.Exited(
                    attempt=event.data.attempt, rank=event.data.rank,
                    code=event.data.exit_code, node=event.node,
                    reason=event.data.reason or "", lost=event.data.lost,
                    node_down=event.data.node_down))

    async def on_job_recover(self, event: JobRecover) -> None:
        async with self._handling():
            job = self.state.jobs.get(event.job)
            if job is not None:
                await self._apply(job, lifecycle.Recover(event.data.reason,
                                                         tuple(event.data.exclude_nodes)))

    async def on_job_command(self, event: JobCommand) -> None:
        """An operator's stop, resume, cancel or delete. The CLI checked it
        before publishing; it is checked again here (the job may have moved
        since), and one that no longer applies is logged and acked."""
        async with self._handling():
            action = COMMANDS[type(event)]
            job = self.state.jobs.get(event.job)
            if job is None:
                self._log.warning("command for a job the scheduler does not know", job=event.job,
                                  action=action)
                return
            step = await self._apply(job, lifecycle.Command(
                action, by=event.data.by, reason=event.data.reason, id=event.id))
            self._log.info("job command", job=event.job, action=action, by=event.data.by,
                           answer=step.answer or "done", refused=step.refused)

    # ------------------------------------------------------------------ lifecycle

    async def _apply(self, job: JobRecord, fact: lifecycle.Fact) -> lifecycle.Step:
        """One fact through the pure lifecycle, then its effects. What an
        earlier step of the job left undone is done first, so that the
        job's announcements keep their order."""
        if job.id in self._unfinished:
            await self._finish(job.id)
            job = self.state.jobs.get(job.id, job)  # a leftover launch may have moved it on
        step = lifecycle.apply(job, fact, time.time(), self.limits)
        await self._carry_out(job, step)
        return step

    async def _carry_out(self, old: JobRecord, step: lifecycle.Step, *,
                         stored: bool = False) -> None:
        """The effects of a step, in order (assume, then persist: the record
        is in memory first, saved before anything is announced or launched).

        An effect that fails (NATS away, a write that timed out) must not
        leave the record in memory ahead of what is done. Before the step is
        stored, the record in memory goes back to what it was, so the fact
        that made the step counts again: the event is redelivered, the next
        cycle places the job again. Once it is stored (``stored``: it was,
        these effects are what a failed try left), what is left of it is kept
        and done again (``_finish``) before anything else happens to the job.
        Either way the error goes on to the caller."""
        job = step.record or old
        before = self.state.jobs.get(old.id)
        if step.record is not None and step.record is not old:
            self.state.jobs[old.id] = step.record
        for i, effect in enumerate(step.effects):
            try:
                await self._effect(job, effect)
            except NotLeader:
                raise  # the new leader starts from the buckets
            except Exception:
                if stored:
                    self._unfinished[old.id] = (job, step.effects[i:])
                elif before is None:
                    self.state.jobs.pop(old.id, None)
                else:
                    self.state.jobs[old.id] = before
                raise
            stored = stored or isinstance(effect, lifecycle.Save | lifecycle.Forget)

    async def _effect(self, job: JobRecord, effect: lifecycle.Effect) -> None:
        match effect:
            case lifecycle.Save():
                await self._save(job)
            case lifecycle.Forget():
                await self._forget(job)
            case lifecycle.Announce():
                await self._announce(job, effect)
            case lifecycle.Launch():
                await self._launch(job)
            case lifecycle.StopWorkers(wait=True):
                assert self.driver is not None
                try:
                    await self.driver.stop(job.id, grace_s=effect.grace_s)
                except Exception:  # the stop timeout and a restart send it again
                    self._log.exception("stopping workers failed", job=job.id)
            case lifecycle.StopWorkers():
                assert self.driver is not None
                self._background(self._stop_workers(job.id, effect.grace_s))
            case lifecycle.Reannounce():
                await self._announced(job)

    async def _finish(self, job_id: str) -> None:
        """Do again what a stored step of the job left undone; raises while
        it still fails (the rest stays kept)."""
        job, effects = self._unfinished.pop(job_id)
        await self._carry_out(job, lifecycle.Step(job, effects), stored=True)
        self._log.info("finished what a failed step left undone", job=job_id,
                       effects=[type(e).__name__ for e in effects])

    async def _finish_all(self) -> None:
        """Every job's leftovers, each on its own: one that still fails
        does not hold the others, or the cycle, back."""
        for job_id in list(self._unfinished):
            try:
                await self._finish(job_id)
            except NotLeader:
                raise
            except Exception as exc:
                self._log.warning("a failed step is still undone; retrying", job=job_id,
                                  error=repr(exc))

    async def _stop_workers(self, job: str, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after the grace. A stop that fails is logged;
        the stop timeout sends it again before it takes the gang as stopped."""
        assert self.driver is not None
        try:
            await self.driver.stop(job, grace_s=grace_s)
        except Exception:
            self._log.exception("stopping workers failed; the stop timeout retries",
                                job=job)

    async def _launch(self, job: JobRecord) -> None:
        assert self.driver is not None
        self._log.info("job placed", job=job.id, attempt=job.attempt, term=self._term,
                       nodes=job.nodes)
        try:
            self._fence()
            await self.driver.launch(job.id, job.attempt, job.spec, job.slots)
        except NotLeader:
            raise
        except LaunchRefused as exc:  # nothing created: wait, no retry spent
            self._log.warning("launch refused; the job waits", job=job.id,
                              attempt=job.attempt, reason=str(exc))
            await self._apply(job, lifecycle.LaunchBlocked(str(exc)))
        except Exception as exc:  # the cluster refused: end this attempt now
            self._log.exception("launch failed", job=job.id, attempt=job.attempt)
            await self._apply(job, lifecycle.LaunchFailed(str(exc)))

    async def _announce(self, job: JobRecord, what: lifecycle.Announce) -> None:
        if what.what == "completed":
            self._log.info("job completed", job=job.id, attempt=job.attempt)
        elif what.what != "placed":
            self._log.warning(f"job {what.what}", job=job.id, attempt=job.attempt,
                              reason=job.reason)
        await self._publish(announcement(job, what, now=time.time(),
                                         preemption_grace_s=self.limits.preemption_grace_s))

    def _background(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ admission

    def _fleet(self) -> admission.Fleet:
        """The registered nodes summarised; kept (with its answers) until a
        node registers: node states do not change what a job can ever get."""
        if self._fleet_now is None:
            self._fleet_now = admission.Fleet.of(policy_nodes(self.state),
                                                 self.config.pool_capacity())
        return self._fleet_now

    def _admit(self, job: JobRecord) -> admission.Admission:
        workspaces = {w.name: w for w in self.workspaces}
        return admission.admit(policy_job(job), workspaces, self._fleet(),
                               self.config.priorities)

    def _resolve(self, spec: JobSpec) -> workload.Resolution:
        """The job with its workspace's workload defaults, or why its
        workspace's limits refuse it (an unknown workspace is admission's)."""
        ws = next((w for w in self.config.workspaces if w.name == spec.workspace), None)
        if ws is None:
            return workload.Resolution(spec)
        return workload.resolve(spec, ws, self.config.workload,
                                kubernetes=self.settings.driver == "kubernetes",
                                fallback_checkpoint_pvc=self.settings.k8s_checkpoint_pvc)

    def _ignored(self, spec: JobSpec | None) -> list[str]:
        """What the driver will not honour of ``spec``, said once (explain)."""
        if spec is None or self.driver is None:
            return []
        fields = self.driver.ignored(spec)
        return [f"the {self.settings.driver} driver ignores {', '.join(fields)} (honoured on "
                "Kubernetes only)"] if fields else []

    async def on_admission(self, request: AdmissionRequest) -> AdmissionReply:
        """``primus-safe submit`` asks before it publishes: can this job run?"""
        self._fence()  # a deposed leader does not answer for the cluster
        resolved = self._resolve(request.spec)
        if resolved.spec is None:
            return AdmissionReply(verdict="refused", reason=resolved.reason,
                                  field=resolved.field, driver=self.settings.driver)
        verdict = self._admit(JobRecord(id="(submit)", spec=resolved.spec,
                                        submitted_at=time.time()))
        return AdmissionReply(verdict=verdict.verdict, reason=verdict.reason,
                              field=verdict.field, driver=self.settings.driver,
                              warnings=resolved.warnings + self._ignored(resolved.spec))

    async def on_node_workers(self, request: NodeWorkersRequest) -> NodeWorkers:
        """Failover asks before it evacuates a node whose agent is silent:
        the driver says whether that node's workers still run."""
        self._fence()
        assert self.driver is not None
        return await self.driver.node_workers(request.node)

    # ------------------------------------------------------------------ cycle

    async def _cycle_loop(self) -> None:
        started = 0.0
        while True:
            # Also re-plan once a second: back-offs expire, stops time out.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=1.0)
            # Events that come in a stream share one cycle: at most one per
            # MIN_CYCLE_INTERVAL_S, so a burst costs a few cycles, not one
            # per event (each cycle reads every node).
            await asyncio.sleep(max(0.0, started + MIN_CYCLE_INTERVAL_S - time.monotonic()))
            started = time.monotonic()
            self._dirty.clear()
            try:
                async with self._lock:
                    await self._finish_all()
                    await self._tick()
                    await self.cycle()
            except NotLeader as exc:
                # Deposed: _abdicate cancels this loop. Until it does (or when
                # a renewal's late ack still lands and keeps the term) the
                # loop waits for its next turn rather than ending, or the
                # leader would hold its lease and never place again.
                self._log.warning("cycle skipped: not the leader", reason=str(exc))
            except Exception:
                self._log.exception("scheduling cycle failed")

    async def _tick(self) -> None:
        """What the clock made happen: stops that timed out (the gang is
        killed and taken as stopped), jobs past ``max_runtime_s``, finished
        jobs past ``ttl_after_finished_s``."""
        now = time.time()
        for job in list(self.state.jobs.values()):
            fact = lifecycle.due(job, now, self.limits)
            if fact is not None:
                if isinstance(fact, lifecycle.StopTimedOut):
                    self._log.warning("stop timed out; taking the gang as stopped", job=job.id)
                await self._apply(job, fact)

    async def cycle(self) -> None:
        now = time.time()
        t0 = time.perf_counter()
        # A cycle builds a fresh view of every node, rack and job: many young
        # objects that are not garbage, over which the cyclic collector
        # would otherwise walk the service's whole heap again and again (a
        # third to half of a cycle at 100,000 GPUs; bench/scheduler_scale.py).
        with paused_gc():
            snap, held = build_snapshot(self.state, self.workspaces, now,
                                        self.config.degraded_nodes)
            # Jobs that cannot run stay out of the queue: a FIFO head the
            # cluster cannot hold today would otherwise block every later job.
            snap, verdicts = admission.screen(snap, self._fleet(), self.config.priorities)
            result = schedule(snap, self.config.policy(), now)
        self.state.reservations = dict(result.reservations)
        self.cycles += 1
        took = time.perf_counter() - t0
        self.last_cycle_ms = round(1000 * took, 3)
        if self._figures is not None:
            self._figures.cycle(took, result)
        for preemption in result.preemptions:
            await self._apply(self.state.jobs[preemption.victim],
                              lifecycle.Preempt(preemption.preemptor))
        for job_id, slots in result.placements.items():
            self._shown.pop(job_id, None)
            models = {n: self.state.nodes[n].spec.gpu_model for n, _ in slots
                      if n in self.state.nodes}
            await self._apply(self.state.jobs[job_id], lifecycle.Placed(
                tuple(worker_slots(slots, models))))
        holding = node_holds.note(self.state.holds, now)
        for job_id, pending in result.pending.items():
            job = self.state.jobs[job_id]
            # Only a gang that lost its attempt says so: a note on every
            # waiting job would republish thousands of reasons per hold.
            reason = f"{pending.reason}; {holding}" if holding and job.recovering \
                else pending.reason
            await self._show_pending(job, pending.position, reason, pending.code)
        for job_id, pending in held.items():
            await self._show_pending(self.state.jobs[job_id], pending.position, pending.reason,
                                     pending.code)
        for job_id, verdict in verdicts.items():
            if verdict.verdict == "refused":  # the configuration changed under it
                self._shown.pop(job_id, None)
                await self._apply(self.state.jobs[job_id], lifecycle.Refuse(verdict.reason))
            else:
                await self._show_pending(self.state.jobs[job_id], 1, verdict.reason,
                                         "unschedulable")
        if result.placements or result.preemptions:
            self._log.info("cycle", placed=len(result.placements),
                           preempted=len(result.preemptions), pending=len(result.pending),
                           ms=self.last_cycle_ms)

    async def _show_pending(self, job: JobRecord, position: int, reason: str, code: str) -> None:
        job.position, job.reason, job.code = position, reason, code
        if self._shown.get(job.id) == (position, reason):
            return
        await self._save(job)
        await self._publish(JobPending(source=SOURCE, job=job.id, data=JobPendingData(
            position=position, reason=reason, code=code)))
        self._shown[job.id] = (position, reason)  # only once shown: else shown again

    # ------------------------------------------------------------------ output

    def _fence(self) -> int:
        """The term to act in; raises NotLeader unless this replica still
        leads the term its records were rebuilt in."""
        assert self.election is not None
        term = self.election.check()
        if term != self._term:
            raise NotLeader(f"term {self._term} is over (now {term})")
        return term

    async def _announced(self, job: JobRecord) -> None:
        """A redelivered exit of an ended job: its end is saved, but the
        publish after the save may have failed (NATS away), and this exit is
        the only message that will come again. Publish the end once more
        unless the stream holds it (its id is fixed, so a repeat inside the
        de-duplication window is dropped anyway)."""
        assert self.bus is not None
        end = end_of(job, now=time.time())
        if await self.bus.stored(type(end), job=job.id):
            return
        self._log.warning("end of job not in the stream; publishing it again", job=job.id)
        await self._publish(end)

    async def _forget(self, job: JobRecord) -> None:
        """The scheduler no longer knows the job (its history stays in Lens)."""
        assert self.kv is not None
        self._fence()
        await self.kv.delete(job.id)
        self.state.jobs.pop(job.id, None)
        self._shown.pop(job.id, None)

    async def _publish(self, event: Event) -> None:
        assert self.bus is not None
        self._fence()
        await self.bus.publish(event)

    async def _save(self, job: JobRecord) -> None:
        """Write the record at the revision this leader last saw; if someone
        wrote it since, a newer leader has been here and we are stale."""
        assert self.kv is not None and self.election is not None
        term = self._fence()
        job.leader_term, job.updated_at = term, time.time()

        async def newer_term(current: JobRecord | None) -> None:
            written_by = current.leader_term if current is not None else 0
            if written_by > max(term, self._old_terms):
                assert self.election is not None
                await self.election.resign(f"job {job.id} was written by term {written_by}")
                raise NotLeader(f"job {job.id} belongs to term {written_by}, not {term}")

        await self.kv.put(job.id, job, on_conflict=newer_term)

    async def stop(self) -> None:
        await cancel_and_wait([self._follow_task])
        # Finish what this leader started, then hand the lease over at once.
        await self._stop_acting(wait_s=15)
        if self.election is not None:
            await self.election.stop(release=True)
        if self.callout is not None:
            await self.callout.stop()

    def metrics(self, metrics: ServiceMetrics) -> Callable[[], None]:
        """Cycle times, decisions and preemptions as they happen; the queue
        and the jobs by status read at scrape time (a standby reports none)."""
        self._figures = SchedulerFigures(metrics)
        return metrics.add_source(lambda: scheduler_families(
            self.state, leading=self._term is not None,
            workspaces=[w.name for w in self.workspaces]))

    def health(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for job in self.state.jobs.values():
            counts[job.status] = counts.get(job.status, 0) + 1
        ready = sum(1 for n in self.state.nodes.values() if n.state == "ready")
        leadership = self.election.describe() if self.election is not None else {}
        # Nodes kept out of placement because a driver found them down:
        # `primus-safe health scheduler` says which and until when.
        held = {n: {"until": round(h.until, 3), "reason": h.reason}
                for n, h in node_holds.active(self.state.holds, time.time()).items()}
        return {"cycles": self.cycles, "last_cycle_ms": self.last_cycle_ms, "jobs": counts,
                "nodes_ready": ready, "nodes_held": held, **leadership}


def kubernetes_config(settings: Settings, limits: lifecycle.Limits | None = None
                      ) -> KubernetesDriverConfig:
    """The Kubernetes driver's configuration from the settings (pure)."""
    from libs.drivers.kubernetes import KubernetesDriverConfig

    if not settings.k8s_image:
        raise RuntimeError("PRIMUS_DRIVER=kubernetes needs PRIMUS_K8S_IMAGE, the training "
                           "image workers run in")
    return KubernetesDriverConfig(
        namespace=settings.k8s_namespace, image=settings.k8s_image,
        gpu_resource=settings.k8s_gpu_resource, checkpoint_pvc=settings.k8s_checkpoint_pvc,
        service_account=settings.k8s_service_account, master_port=settings.k8s_master_port,
        # An eviction or drain gives a worker as long to checkpoint as
        # the platform's own stops and preemptions do.
        termination_grace_s=math.ceil(max(limits.stop_grace_s, limits.preemption_grace_s))
        if limits else 30,
        nats_token_secret=settings.k8s_nats_token_secret,
        cluster_domain=settings.k8s_cluster_domain,
        job_credentials=settings.job_credential_key is not None)


def make_driver(settings: Settings, bus: Bus,
                limits: lifecycle.Limits | None = None) -> ClusterDriver:
    """The driver the settings name: local processes, or pods via the API.
    With a job credential key, workers log in to NATS as their job."""
    key = settings.job_credential_key
    secret = key.get_secret_value().encode() if key else None
    if settings.driver == "kubernetes":
        from libs.drivers.kubernetes import KubernetesDriver

        return KubernetesDriver(kubernetes_config(settings, limits), bus.publish,
                                nats_url=settings.nats_url, job_credential_key=secret)
    return LocalDriver(settings.state_dir, bus.publish, nats_url=settings.nats_url,
                       nats_token=settings.nats_token,
                       job_credential_key=secret, log_limits=settings.worker_log_limits)
