"""The bench agent: one per node. It beats a heartbeat, samples node
telemetry, runs the periodic health probes of its configuration file, and
answers ``bench.request`` for its node with a measured, judged
``bench.result``. Measuring lives in levels/probes, judging in verdict and
schedule; this module only wires them to the bus.

Its /metrics page (served by the service shell, see libs/metrics.py) shows
the node's last telemetry sample under the GPU exporters' names
(exporter_names) and the agent's own counts; a scrape reads that sample and
never runs a GPU tool.

Its telemetry names the job, attempt and rank holding each GPU: it keeps
this node's placements (``placements``) from the scheduler's events, read
afresh from the ``jobs`` bucket each time it starts.

A level whose checks fail is run once more before the result says so: a node
is reported failed only when the failure repeats. A request that carries a
rendezvous runs only this node's share of a multi-node collective.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libs.bus import Bus
from libs.drivers.base import NODE_WORKERS, NodeWorkers, NodeWorkersRequest
from libs.events import (
    AgentStoppingData,
    BenchCheck,
    BenchRendezvous,
    BenchRequest,
    BenchResult,
    BenchResultData,
    Event,
    HeartbeatData,
    JobCancelled,
    JobCompleted,
    JobDeleted,
    JobFailed,
    JobPlaced,
    JobStopped,
    NodeAgentStopping,
    NodeHeartbeat,
    NodeTelemetry,
    WorkerExited,
)
from libs.logs import get_logger
from libs.records import JOBS
from libs.settings import Settings
from libs.tasks import cancel_and_wait
from libs.wiring import wire
from services.bench import levels, probes
from services.bench.checkpoint_watches import CheckpointWatches
from services.bench.config import CheckConfig, ConfigFile
from services.bench.exporter_names import PageSample, render
from services.bench.host_metrics import HostSampler
from services.bench.node_sampler import GpuSource, NodeSampler
from services.bench.placements import Placements, attributed
from services.bench.pod_logs import PodLogShipper
from services.bench.protocol import PAIR, PROGRESS, SHARE, BenchProgress, PairRequest
from services.bench.routes import AGENT
from services.bench.schedule import ProbeSchedule, Report, Skip, Start
from services.bench.verdict import confirm

if TYPE_CHECKING:
    from prometheus_client import Counter

    from libs.metrics import ServiceMetrics

CONFIG_POLL_S = 2.0
# What runs in the measuring thread: given the step reporter and the check
# to call between timed samples.
Measuring = Callable[[levels.Progress, Callable[[], None]], levels.LevelRun]


class Interrupted(BaseException):
    """Raised in a measuring thread at its next step or timed sample once the
    measurement was cancelled (the agent stops): the thread ends instead of
    measuring on. A BaseException, like CancelledError, so that the level's
    "a broken kernel is a failed check" does not catch it."""


class TurnGate:
    """This node's side of turn-taking in a sweep on shared hardware (see
    turns.py), called from the measuring thread. If the turn server does not
    answer, the node measures without turns rather than hang."""

    def __init__(self, bus: Bus, loop: asyncio.AbstractEventLoop, subject: str, session: str,
                 node: str, wait_s: float = 300.0) -> None:
        self.bus, self.loop, self.subject = bus, loop, subject
        self.body = {"session": session, "node": node}
        self.wait_s = wait_s  # the ring takes a turn back after 120 s: never this long
        self.broken: str | None = None
        self._pending: concurrent.futures.Future[Any] | None = None

    def _ask(self, op: str, timeout_s: float) -> None:
        if self.broken:
            return
        body = {**self.body, "op": op}
        try:
            self._pending = asyncio.run_coroutine_threadsafe(
                self.bus.request(self.subject, body, timeout_s=timeout_s), self.loop)
            self._pending.result(timeout_s + 5)
        except (Exception, concurrent.futures.CancelledError) as exc:
            self.broken = self.broken or f"{op}: {type(exc).__name__}"
        finally:
            self._pending = None

    def abort(self) -> None:
        """The agent stops: no more waiting for turns."""
        self.broken = "agent stopping"
        pending = self._pending
        if pending is not None:
            pending.cancel()

    def acquire(self) -> None:
        self._ask("acquire", self.wait_s)

    def pass_turn(self) -> None:
        self._ask("release", 10)
        self.acquire()

    def leave(self) -> None:
        self._ask("leave", 10)

# Probes that load the GPUs (a GEMM) or whose reading a job changes (VRAM in
# use): on a node that runs a job they are skipped, never run.
SKIPPED_WHILE_TRAINING = frozenset({"gemm", "gpu_vram"})


class BenchAgent:
    name = "bench-agent"
    routes = AGENT

    def __init__(self, settings: Settings, node: str, config_path: str | Path | None = None,
                 *, gpus: GpuSource | None = None) -> None:
        self.settings = settings
        self.node = node
        self.gpus = gpus  # None: the node's own GPU tools (tests pass recorded ones)
        self.placements = Placements(node)
        # Kubernetes: its job pods' output, from the kubelet's log files.
        self.pod_logs = (PodLogShipper(settings, node) if settings.agent_pod_logs_dir
                         and settings.worker_log_ship else None)
        self.source = f"bench-agent/{node}"
        self.bus: Bus | None = None
        # Kubernetes: the checkpoints of the jobs whose rank 0 runs here.
        self.checkpoints = (CheckpointWatches(settings.agent_checkpoints_dir, node,
                                              self._publish)
                            if settings.agent_checkpoints_dir else None)
        self.host = HostSampler()
        self.config = ConfigFile(config_path or settings.bench_config)
        self.schedule = ProbeSchedule(self._probes_wanted(), now=time.monotonic(), seed=node)
        self.beats = 0
        self.results = 0
        self.probe_reports = 0
        self.busy: str | None = None  # the request being measured
        self.expected_devices: int | None = None  # from the inventory, via requests
        self._last_device: tuple[str, int, str] | None = None  # for probe reports
        self._answered: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: TurnGate | None = None
        self.page: PageSample | None = None  # the last telemetry sample, for /metrics
        self._results_total: Counter | None = None
        self._probe_runs_total: Counter | None = None
        self._probe_reports_total: Counter | None = None
        self._log = get_logger(node=node)
        if self.config.error:
            self._log.error("bench config refused", error=self.config.error)

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self._loop = asyncio.get_running_loop()
        self._log = get_logger(node=self.node)  # bound after run_service configured logging
        self._tasks = [
            asyncio.create_task(self._heartbeat()),
            asyncio.create_task(self._telemetry()),
            asyncio.create_task(self._probe_loop()),
        ]
        if self.pod_logs is not None:
            self._tasks.append(asyncio.create_task(self.pod_logs.run(bus)))
        # Read before the events are: they start a few minutes back (replay_s)
        # and are applied over what was read, which only an event can undo.
        await self._rebuild_placements()
        await self._placements_changed()
        await wire(bus, AGENT, self, node=self.node)

    async def _publish(self, event: Event) -> None:
        assert self.bus is not None
        await self.bus.publish(event)

    async def _placements_changed(self) -> None:
        if self.checkpoints is not None:
            try:
                await self.checkpoints.sync(self.placements.leading())
            except Exception as exc:  # a watch that cannot start must not stop the agent
                self._log.warning("checkpoint watch not started", error=repr(exc))

    async def _rebuild_placements(self) -> None:
        """The placements on this node that the scheduler's job records hold
        now, oldest placement first (the GPUs are packed in that order)."""
        assert self.bus is not None
        try:
            records = await (await self.bus.records(JOBS)).load()
        except Exception as exc:  # the events alone tell from now on
            self._log.warning("job records unreadable; GPUs attributed from new placements",
                              error=repr(exc))
            return
        self.placements.read(records.values())
        self._log.info("placements read", held=self.placements.snapshot())

    async def _heartbeat(self) -> None:
        assert self.bus is not None
        interval = self.settings.heartbeat_interval_s
        while True:
            self.beats += 1
            with contextlib.suppress(Exception):
                await self.bus.publish(NodeHeartbeat(
                    source=self.source, node=self.node,
                    data=HeartbeatData(seq=self.beats, pid=os.getpid(), interval_s=interval),
                ))
            await asyncio.sleep(interval)

    async def _telemetry(self) -> None:
        """One NodeTelemetry per interval, on a fixed schedule (see node_sampler)."""
        assert self.bus is not None
        interval = self.settings.telemetry_interval_s
        sampler = NodeSampler(host=self.host, gpus=self.gpus)
        due = time.monotonic()
        while True:
            due += interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due = max(due, time.monotonic() - interval)  # after a stall, do not burst
            with contextlib.suppress(Exception):
                data = await sampler.sample()
                owners = self.placements.owners([g.index for g in data.gpus])
                data = attributed(data, owners)
                self.page = PageSample(data=data, identities=sampler.identities,
                                       tool=data.gpu_tool, taken_at=time.monotonic())
                await self.bus.publish(NodeTelemetry(source=self.source, node=self.node,
                                                     data=data))

    # ------------------------------------------------------------------ placements

    async def on_job_placed(self, event: JobPlaced) -> None:
        if self.placements.placed(event.job, event.data.attempt, event.data.workers):
            self._log.info("gpus placed", job=event.job, attempt=event.data.attempt,
                           held=self.placements.snapshot())
            await self._placements_changed()

    async def on_worker_exited(self, event: WorkerExited) -> None:
        if event.node == self.node and self.placements.exited(
                event.job, event.data.attempt, event.data.rank):
            self._log.info("gpus freed: worker exited", job=event.job,
                           attempt=event.data.attempt, rank=event.data.rank)
            await self._placements_changed()

    async def on_job_ended(self, event: JobCompleted | JobFailed | JobStopped | JobCancelled
                           | JobDeleted) -> None:
        if self.placements.ended(event.job, event.data.attempt):
            self._log.info("gpus freed: job ended", job=event.job, event=event.type)
            await self._placements_changed()

    # ------------------------------------------------------------------ bench requests

    async def on_bench_request(self, event: BenchRequest) -> None:
        assert self.bus is not None
        if event.id in self._answered:
            return  # redelivered after we published: the result is out already
        data = event.data
        if data.expires_at is not None and data.expires_at < datetime.now(UTC):
            # A re-bench its asker has superseded (this agent was away): the
            # next one, or none, stands; running each stale one would only delay.
            self._log.info("bench request expired; skipped", request=event.id,
                           expired_at=data.expires_at.isoformat())
            return
        log = self._log.bind(request=event.id, level=data.level, attempt=data.attempt)
        log.info("bench started", reason=data.reason)
        self.busy = event.id
        if data.expected_devices is not None:
            self.expected_devices = data.expected_devices
        t0 = time.monotonic()
        try:
            if data.rendezvous is not None:
                run = await self._measure_multi_node(event.id, data.rendezvous)
            else:
                run = await self._measure(event, pair_tag=event.id)
                if run.outcome == "failed":
                    log.info("bench failed once; repeating", reason=run.reason)
                    self._progress(event.id, "repeating after a failure")
                    again = await self._measure(event, pair_tag=f"{event.id}-again")
                    outcome, reason = confirm((run.outcome, run.reason),
                                              (again.outcome, again.reason))
                    run = again
                    run.outcome, run.reason = outcome, reason
        finally:
            self.busy = None
        rdv = data.rendezvous
        result = BenchResult(  # deterministic id: a redelivery repeats it
            id=f"{event.id}-result", source=self.source, node=self.node,
            data=BenchResultData(
                level=data.level, request_id=event.id, passed=run.outcome != "failed",
                reason=run.reason, device=run.device, device_count=run.device_count,
                gpu_model=run.device_name, dtype=run.dtype, figures=run.figures,
                duration_s=round(time.monotonic() - t0, 3), outcome=run.outcome,
                attempt=data.attempt, retry_of=data.retry_of, checks=run.checks,
                session=rdv.session if rdv else None,
                peers=[n for n in rdv.nodes if n != self.node] if rdv else [],
                sweep=data.sweep.session if data.sweep else None,
            ),
        )
        if rdv is not None:  # a share of a multi-node test: for the coordinator only
            await self.bus.send(SHARE, result, session=rdv.session)
        else:
            await self.bus.publish(result)
        self._answered.add(event.id)
        self.results += 1
        _count(self._results_total, data.level, run.outcome)
        self._progress(event.id, "done")
        log.info("bench finished", outcome=run.outcome, reason=run.reason)

    async def _measure(self, event: BenchRequest, *, pair_tag: str) -> levels.LevelRun:
        config = self.config.current
        expected = event.data.expected_devices
        if expected is None:  # a retry or an operator's request: what bootstrap said last
            expected = self.expected_devices

        sweep = event.data.sweep
        gate = None
        if sweep is not None and sweep.turn_subject and self.bus is not None \
                and self._loop is not None:
            gate = TurnGate(self.bus, self._loop, sweep.turn_subject, sweep.session, self.node)

        self._gate = gate

        def measure(progress: levels.Progress, between: Callable[[], None]) -> levels.LevelRun:
            def turn() -> None:  # between timed samples
                between()
                if gate is not None:
                    gate.pass_turn()

            if gate is None:
                return levels.run_level(event.data.level, config=config,
                                        expected_devices=expected, progress=progress, turn=turn)
            gate.acquire()
            try:
                return levels.run_level(event.data.level, config=config,
                                        expected_devices=expected, progress=progress, turn=turn)
            finally:
                gate.leave()

        try:
            run = await self._in_thread(event.id, measure)
        finally:
            self._gate = None
        if gate is not None and gate.broken:
            self._log.warning("turn-taking failed; measured without turns", why=gate.broken)
        if event.data.level == "full":
            rdv, why = await self._pairing(pair_tag)
            if rdv is None:
                run.checks.append(BenchCheck(name="inter_node_collectives",
                                             status="unavailable", detail=why))
            else:
                pair = await self._in_thread(event.id, lambda progress, _: levels.multi_node(
                    rdv, self.node, config=config, progress=progress))
                run.figures += pair.figures
                run.checks += pair.checks
            run.judge()
        return run

    async def _measure_multi_node(self, request_id: str, rdv: BenchRendezvous
                                  ) -> levels.LevelRun:
        config = self.config.current
        return await self._in_thread(request_id, lambda progress, _: levels.multi_node(
            rdv, self.node, config=config, progress=progress))

    async def _in_thread(self, request_id: str, work: Measuring) -> levels.LevelRun:
        """Measure in a worker thread, which reports each step as it starts
        and calls ``between`` after each timed sample. A thread cannot be
        cancelled; when the awaiting task is (the agent stops), the thread
        raises `Interrupted` at its next step or sample rather than measure on
        for minutes and hold the process's exit."""
        cancelled = threading.Event()

        def between() -> None:
            if cancelled.is_set():
                raise Interrupted("the measurement was cancelled")

        def progress(step: str) -> None:
            between()
            self._progress(request_id, step)

        try:
            return await asyncio.to_thread(work, progress, between)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def _pairing(self, request_id: str) -> tuple[BenchRendezvous | None, str]:
        """Ask the coordinator for a known-healthy partner and a rendezvous."""
        assert self.bus is not None
        try:
            reply = await self.bus.ask(PAIR, PairRequest(node=self.node, request_id=request_id),
                                       timeout_s=10)
        except Exception as exc:
            return None, f"no coordinator to pair with ({type(exc).__name__})"
        if not reply.ok or reply.rendezvous is None:
            return None, reply.error or "no partner"
        return reply.rendezvous, ""

    def _progress(self, request_id: str, step: str) -> None:
        """Tell whoever listens (``bench run``) which step runs; callable from
        worker threads, never blocks, never fails the bench."""
        if self.bus is None or self._loop is None or not self._loop.is_running():
            return
        line = BenchProgress(request_id=request_id, node=self.node, step=step, time=time.time())
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.bus.send(PROGRESS, line, node=self.node),
                                             self._loop)

    # ------------------------------------------------------------------ health probes

    async def _probe_loop(self) -> None:
        last_error = self.config.error
        while True:
            try:
                last_error = await self._probe_turn(last_error)
            except Exception:
                # The loop outlives any one turn: without it the node keeps
                # beating, looks healthy, and is never probed again.
                self._log.exception("probe loop turn failed; going on")
                await asyncio.sleep(1.0)

    async def _probe_turn(self, last_error: str | None) -> str | None:
        """Reload the configuration, report what is due, start what is due,
        then sleep until the next probe is; the configuration error seen."""
        now = time.monotonic()
        if self.config.reload():
            wanted = self._probes_wanted()
            self.schedule.reconfigure(wanted, now=now)
            self._log.info("bench config loaded", path=str(self.config.path),
                           probes=[c.name for c in wanted])
        if self.config.error and self.config.error != last_error:
            self._log.error("bench config refused; keeping the last good one",
                            error=self.config.error)
        last_error = self.config.error
        for report in self.schedule.expire(now):
            await self._report_probe(report)
        if self.busy is None:  # never perturb a measurement
            for action in self.schedule.due(now):
                if isinstance(action, Start):
                    task = asyncio.create_task(self._run_probe(action))
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)
                elif isinstance(action, Skip):
                    self._log.warning("probe skipped", check=action.name,
                                      reason=action.reason)
                else:
                    await self._report_probe(action)
        wait = self.schedule.next_wake(now) - time.monotonic()
        await asyncio.sleep(min(max(wait, 0.05 if self.busy is None else 0.5),
                                CONFIG_POLL_S))
        return last_error

    def _probes_wanted(self) -> list[CheckConfig]:
        """The configured probes and the node-health catalogue's (unless the
        agent's setting or the configuration turns the catalogue off)."""
        return self.config.current.scheduled_probes(
            catalogue=self.settings.bench_health_catalogue)

    async def _run_probe(self, start: Start) -> None:
        state = self.schedule.states.get(start.name)
        if state is None:
            return
        spec = state.spec
        if spec.kind in SKIPPED_WHILE_TRAINING and (busy := await self._training_here()):
            report = self.schedule.finished(start.name, start.run, "unavailable",
                                            f"skipped: {busy}")
            self._log.info("probe skipped: training runs here", check=start.name, why=busy)
            _count(self._probe_runs_total, start.name, "unavailable")
            if report is not None:
                await self._report_probe(report)
            return
        try:
            check = await asyncio.to_thread(
                probes.run_check, spec.kind, expected=self.expected_devices,
                limits=self.config.current.gpu_limits, timeout_s=spec.timeout_s,
                name=start.name, options=spec.options)
            status, detail = check.status, check.detail
        except Exception as exc:
            status, detail = "failed", f"{type(exc).__name__}: {exc}"[:300]
        _count(self._probe_runs_total, start.name, status)
        if status == "skipped":  # not applicable here: no streak either way
            status = "unavailable"
        report = self.schedule.finished(start.name, start.run, status,  # type: ignore[arg-type]
                                        detail)
        if report is not None:
            await self._report_probe(report)

    async def _training_here(self) -> str:
        """Why this node must not be disturbed now ("" when it may be): the
        driver's word, through the scheduler, on whether workers run here.
        No answer means it cannot be told, and the heavy probe waits."""
        assert self.bus is not None
        try:
            reply = await self.bus.ask(NODE_WORKERS, NodeWorkersRequest(node=self.node),
                                       timeout_s=2.0)
        except Exception:
            return "no scheduler said whether a job runs here"
        if not reply.ok or not isinstance(reply, NodeWorkers):
            return f"the scheduler could not say whether a job runs here ({reply.error})"
        return f"{reply.workers} worker(s) of a job run here" if reply.workers else ""

    async def _report_probe(self, report: Report) -> None:
        """A probe failed N times in a row: say so once, as a failed bench result
        with trigger ``probe`` (failover opens a probe_failed fault, which
        quarantines the node). A recovery is only logged: the node returns to
        service by passing a bench again."""
        assert self.bus is not None
        if not report.failed:
            self._log.info("probe recovered", check=report.name, after=report.consecutive)
            _count(self._probe_reports_total, report.name, "recovered")
            return
        _count(self._probe_reports_total, report.name, "failed")
        state = self.schedule.states.get(report.name)
        spec = state.spec if state is not None else None
        fault = spec.fault_kind if spec is not None else None
        severity = spec.severity if spec is not None else "critical"
        self._log.warning("probe failing", check=report.name, consecutive=report.consecutive,
                          detail=report.detail, fault=fault, severity=severity,
                          action=spec.action if spec is not None else "quarantine")
        if spec is not None and spec.action == "report":
            return  # logged and counted: the operator's alerting decides
        kind, count, name = await self._device_for_report()
        what = f" ({fault}, {severity})" if fault else ""
        reason = (f"health probe {report.name}{what} failed {report.consecutive} time(s) in a "
                  f"row: {report.detail}")
        try:
            await self.bus.publish(BenchResult(
                source=self.source, node=self.node,
                data=BenchResultData(
                    level="quick", passed=False, reason=reason, device=kind, device_count=count,
                    gpu_model=name, duration_s=0.0, outcome="failed", trigger="probe",
                    fault_kind=fault,
                    checks=[BenchCheck(name=report.name, status="failed", detail=report.detail)],
                ),
            ))
        except Exception as exc:
            # Not said, so the node is not quarantined: the next failure of
            # the streak says it again.
            self._log.error("probe failure not reported; reporting it at the next failure",
                            check=report.name, error=repr(exc))
            self.schedule.unreport(report.name)
            return
        self.probe_reports += 1
        _count(self._results_total, "quick", "failed")

    async def _device_for_report(self) -> tuple[str, int, str]:
        """The node's devices for a failed-probe report. A faulted GPU can
        fail the very query that names it: then the last answer (or an
        unknown device), so the report still goes out."""
        try:
            kind, count, name, _ = await asyncio.to_thread(probes.detect_device)
        except Exception as exc:
            self._log.warning("devices not detected for the probe report", error=repr(exc))
            return self._last_device or ("unknown", self.expected_devices or 0, "")
        self._last_device = (kind, count, name)
        return self._last_device

    async def stop(self) -> None:
        if self._gate is not None:
            self._gate.abort()
        await cancel_and_wait([*self._tasks, *self._probes])
        if self.checkpoints is not None:
            await self.checkpoints.close()
        # Said after the last heartbeat went out (a beat behind it would mean
        # "back"): the node and its workers run on while this agent restarts,
        # and failover waits for it rather than evacuating them.
        if self.bus is not None:
            try:
                await asyncio.wait_for(self.bus.publish(NodeAgentStopping(
                    source=self.source, node=self.node, data=AgentStoppingData(
                        back_within_s=self.settings.agent_restart_grace_s,
                        reason="agent stopping (SIGTERM)"))), 2.0)
            except Exception as exc:  # the bus is away: failover's deadline applies
                self._log.warning("could not announce the stop", error=repr(exc))

    def metrics(self, metrics: ServiceMetrics) -> Callable[[], None]:
        """The agent's counts, and the node's GPU and host readings rendered
        at scrape time from the last telemetry sample (on the scraping
        thread: it takes the reference to that immutable sample, nothing more)."""
        self._results_total = metrics.counter(
            "bench_results", "bench results this agent sent, by level and outcome "
            "(a probe's failing streak is a failed quick result)", ("level", "outcome"))
        self._probe_runs_total = metrics.counter(
            "bench_probe_runs", "health probe runs, by check and status", ("check", "status"))
        self._probe_reports_total = metrics.counter(
            "bench_probe_reports", "probe streaks reported (failed) and recoveries logged, "
            "by check", ("check", "status"))
        choice = self.settings.agent_exporter_names

        def node_page() -> list[Any]:
            return render(self.page, self.node, choice=choice, now=time.monotonic())

        return metrics.add_source(node_page)

    def health(self) -> dict[str, Any]:
        return {"heartbeats": self.beats, "bench_results": self.results,
                "busy": self.busy, "probe_reports": self.probe_reports,
                "placements": self.placements.snapshot(),
                "pod_logs": self.pod_logs.snapshot() if self.pod_logs else None,
                "checkpoint_watches": (self.checkpoints.snapshot() if self.checkpoints
                                       else None),
                "probes": self.schedule.snapshot(),
                "config": str(self.config.path) if self.config.path else None,
                "config_error": self.config.error}


def _count(counter: Counter | None, *labels: str) -> None:
    """Count once the shell gave the agent its metrics (never, with PRIMUS_METRICS off)."""
    if counter is not None:
        counter.labels(*labels).inc()
