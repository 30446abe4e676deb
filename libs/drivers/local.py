"""LocalDriver: "nodes" are names on this machine and workers are real
subprocesses, so the whole platform runs on a laptop with real training.

Each worker runs under a small supervisor (``local_worker``) that forwards
SIGTERM and records the exit code in a file, so a restarted scheduler can
adopt workers that outlived it and still learn how they ended.

Every worker gets the torchrun-style environment (MASTER_ADDR, MASTER_PORT,
WORLD_SIZE, RANK, LOCAL_RANK) plus the PRIMUS_* variables the training SDK
reads. Each worker runs in its own session (process group), its pid is kept in
``<state>/pids/<node>/`` so a whole "node" can be killed for fault tests and
leftovers can be reaped after a crash.

A rank whose executable (or workdir) does not exist never starts: it ends at
once with the shell's code, 127 and "command not found: X" (126 when the file
is not executable), in its log and in its ``worker.exited`` event, instead of
a supervisor that dies with a traceback and reads as killed (-9).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from libs.checkpoint_layouts import Found, discover, resume_step
from libs.checkpoint_watch import CheckpointWatch, checkpoint_event
from libs.drivers.base import EventSink, NodeWorkers
from libs.drivers.local_worker import write_atomic, write_exit
from libs.events import (
    JobCheckpoint,
    JobSpec,
    WorkerExited,
    WorkerExitedData,
    WorkerSlot,
    WorkerStarted,
    WorkerStartedData,
)
from libs.job_credentials import credential
from libs.log_shipper import LogLimits
from libs.logs import get_logger
from libs.resume import RESUME_ENV, render
from libs.tasks import cancel_and_wait
from libs.worker_env import WorkerEnv
from libs.workload import kubernetes_only

# How long a relaunch waits for a rank that an earlier driver was starting.
INTENT_WAIT_S = 5.0
LOST_REASON = "killed while no driver watched (the stack or its node stopped)"


def without_userinfo(url: str) -> str:
    """``url`` (or a comma-separated list) without ``user:password@``."""
    return ",".join(re.sub(r"^(\w+://)?[^/@]*@", r"\1", u.strip()) for u in url.split(","))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ExitNote(BaseModel):
    """Why the driver itself ended a rank, kept beside its exit code."""
    model_config = ConfigDict(frozen=True)
    reason: str | None = None
    lost: bool = False
    node_down: bool = False


@dataclass
class _Worker:
    job: str
    attempt: int
    rank: int
    node: str
    pid: int
    pid_file: Path
    exit_file: Path
    proc: asyncio.subprocess.Process | None = None  # None when adopted after a restart
    watcher: asyncio.Task[None] | None = None


class LocalDriver:
    def __init__(self, state_dir: Path, sink: EventSink, *, nats_url: str,
                 source: str = "scheduler/local-driver", nats_token: str | None = None,
                 job_credential_key: bytes | None = None,
                 log_limits: LogLimits | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.log_limits = log_limits or LogLimits()
        self.sink = sink
        # A worker never gets the platform's own login (the embedded stack's
        # URL carries it): with a key, its job's credential instead.
        self.nats_url = without_userinfo(nats_url)
        self.nats_token = nats_token
        self.job_credential_key = job_credential_key
        self.source = source
        self._workers: dict[str, list[_Worker]] = {}
        self._watches: dict[str, CheckpointWatch] = {}  # job -> its checkpoint directory's
        self._watch_attempt: dict[str, int] = {}
        self._log = get_logger(component="local-driver")

    def _env(self, job: str, attempt: int, spec: JobSpec, slot: WorkerSlot, world: int,
             port: int, resume: int | None = None) -> dict[str, str]:
        # Not the platform's PRIMUS_* (its NATS login, its store's DSN):
        # a worker's come from WorkerEnv alone.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        env.update(spec.env)
        cred = credential(self.job_credential_key, job) if self.job_credential_key else None
        env.update(WorkerEnv(
            # Every local node is this machine; loopback is where rank 0 listens.
            master_addr="127.0.0.1", master_port=port, world_size=world, rank=slot.rank,
            local_rank=0, job=job, attempt=attempt, node=slot.node, nats_url=self.nats_url,
            checkpoint_dir=self.state_dir / "checkpoints" / job,
            checkpoint_interval=spec.checkpoint_interval, device_slots=slot.gpus,
            nats_token=None if cred else (self.nats_token or None),
            nats_user=cred.user if cred else None,
            nats_password=cred.password if cred else None).as_env())
        if resume is not None:
            env[RESUME_ENV] = str(resume)
        return env

    def _checkpoints(self, job: str) -> Path:
        return self.state_dir / "checkpoints" / job

    def _resume_step(self, job: str, world: int) -> int | None:
        """The step the newest complete checkpoint of the job holds, whatever
        framework wrote it (None: none, the job starts from scratch). Read
        once per launch: every rank resumes from the same step."""
        return resume_step(discover(self._checkpoints(job), world_size=world))

    def _argv(self, job: str, spec: JobSpec, resume: int | None = None) -> list[str]:
        # "python" means the interpreter the platform runs on, so the job
        # sees the same installed packages (torch, the SDK).
        head, *rest = render(spec.command, checkpoint_dir=str(self._checkpoints(job)),
                             resume_step=resume)
        return [sys.executable if head in ("python", "python3") else head, *rest]

    def _exit_file(self, job: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "exits" / f"{job}-a{attempt}-r{rank}"

    def _launched_ranks(self, job: str, attempt: int) -> set[int]:
        """Ranks of this attempt that started: alive (pid file) or ended (exit file)."""
        ranks = {w.rank for w in self._workers.get(job, []) if w.attempt == attempt}
        ranks |= {int(p.name.rsplit("-r", 1)[1])
                  for p in (self.state_dir / "exits").glob(f"{job}-a{attempt}-r*")
                  if not p.name.startswith(".")}
        return ranks

    async def _settle(self, job: str, attempt: int, ranks: list[int]) -> set[int]:
        """Ranks a previous driver decided to start may still be starting:
        wait briefly for their supervisors' pid files before starting them
        again (which would run a rank twice)."""
        intents = {r for r in ranks if self._intent_file(job, attempt, r).exists()}
        deadline = time.monotonic() + INTENT_WAIT_S
        while intents - self._launched_ranks(job, attempt) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            await self.adopt()
        return self._launched_ranks(job, attempt)

    def _node_file(self, job: str, attempt: int, rank: int) -> Path:
        path = self.state_dir / "ranks" / f"{job}-a{attempt}-r{rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _exit_note_file(self, job: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "exit-notes" / f"{job}-a{attempt}-r{rank}.json"

    def _note_exit(self, job: str, attempt: int, rank: int, note: ExitNote) -> None:
        """What an exit the driver decided itself means (a refusal, a loss),
        written before its exit file: a later driver that reports the exit
        unheard says the same, or a lost gang would spend a retry."""
        path = self._exit_note_file(job, attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, note.model_dump_json())

    def _exit_note(self, job: str, attempt: int, rank: int) -> ExitNote:
        """The note of an exit the driver decided, or an empty one (a worker's
        own exit; a note that cannot be read says nothing more than that)."""
        try:
            return ExitNote.model_validate_json(
                self._exit_note_file(job, attempt, rank).read_text())
        except (OSError, ValueError):
            return ExitNote()

    def _exit_reported_file(self, job: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "announced" / f"{job}-a{attempt}-r{rank}-exited"

    async def _report_exit(self, job: str, attempt: int, rank: int, node: str, code: int,
                           reason: str | None = None, *, lost: bool = False,
                           node_down: bool = False) -> None:
        """Publish a rank's exit until it is out, then mark it reported: an
        exit recorded while no one could hear it (the bus down, then the
        stack stopped) is reported by the next driver's ``adopt``."""
        await self._emit(WorkerExited(
            id=f"{job}-a{attempt}-r{rank}-exited", source=self.source, job=job, node=node,
            data=WorkerExitedData(attempt=attempt, rank=rank, exit_code=code, reason=reason,
                                  lost=lost, node_down=node_down)))
        marker = self._exit_reported_file(job, attempt, rank)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    async def _report_unheard_exits(self) -> int:
        """Exits recorded (exit files) but never reported, of ranks no watcher
        follows now; returns how many were reported."""
        watched = {(w.job, w.attempt, w.rank) for ws in self._workers.values() for w in ws}
        reported = 0
        for exit_file in sorted((self.state_dir / "exits").glob("*-a*-r*")):
            if exit_file.name.startswith("."):
                continue
            job, rest = exit_file.name.rsplit("-a", 1)
            attempt_s, rank_s = rest.split("-r", 1)
            try:
                attempt, rank = int(attempt_s), int(rank_s)
                code = int(exit_file.read_text())
                node = self._node_file(job, attempt, rank).read_text().strip()
            except (ValueError, OSError):
                # Not ours, still being written, from before ranks/ was kept,
                # or unreadable: its watcher, if any, reports it.
                continue
            if (job, attempt, rank) in watched \
                    or self._exit_reported_file(job, attempt, rank).exists():
                continue
            note = self._exit_note(job, attempt, rank)
            self._log.info("reporting an exit no one heard", job=job, attempt=attempt,
                           rank=rank, node=node, exit_code=code, reason=note.reason)
            await self._report_exit(job, attempt, rank, node, code, note.reason,
                                    lost=note.lost, node_down=note.node_down)
            reported += 1
        return reported

    async def _report_lost_ranks(self) -> int:
        """Ranks that started (their start was announced) but are neither
        followed nor recorded as ended: killed with their supervisor while no
        driver watched (the stack stopped and reaped them). Each gets an exit
        file, so it is never started again under the same attempt (whose
        events de-duplication would swallow), and a ``lost`` exit, so the
        scheduler runs the gang again as a new, visible attempt."""
        watched = {(w.job, w.attempt, w.rank) for ws in self._workers.values() for w in ws}
        lost = 0
        for marker in sorted((self.state_dir / "announced").glob("*-a*-r*")):
            if marker.name.endswith("-exited"):
                continue
            job, rest = marker.name.rsplit("-a", 1)
            try:
                attempt, rank = (int(x) for x in rest.split("-r", 1))
                node = self._node_file(job, attempt, rank).read_text().strip()
            except (ValueError, FileNotFoundError):
                continue
            exit_file = self._exit_file(job, attempt, rank)
            if (job, attempt, rank) in watched or exit_file.exists():
                continue
            code = -int(signal.SIGKILL)
            exit_file.parent.mkdir(parents=True, exist_ok=True)
            self._note_exit(job, attempt, rank, ExitNote(reason=LOST_REASON, lost=True))
            write_exit(exit_file, code)
            self._log.warning("worker lost: gone with no exit recorded", job=job,
                              attempt=attempt, rank=rank, node=node)
            await self._report_exit(job, attempt, rank, node, code, LOST_REASON, lost=True)
            lost += 1
        return lost

    def _intent_file(self, job: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "intents" / f"{job}-a{attempt}-r{rank}"

    async def launch(self, job: str, attempt: int, spec: JobSpec, slots: list[WorkerSlot]) -> None:
        """Start the ranks of this attempt that never started; the rest is a
        no-op, so a restarted scheduler can call it again safely."""
        run_dir = self.state_dir / "jobs" / job / f"attempt-{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "exits").mkdir(parents=True, exist_ok=True)
        # Every rank of an attempt must meet at the same rendezvous port.
        port_file = run_dir / "master_port"
        if not port_file.exists():
            port_file.write_text(str(free_port()))
        port = int(port_file.read_text())
        started = await self._settle(job, attempt, [s.rank for s in slots])
        resume = self._resume_step(job, len(slots))
        await self._watch_checkpoints(job, attempt, len(slots))
        (self.state_dir / "intents").mkdir(parents=True, exist_ok=True)
        for slot in sorted(slots, key=lambda s: s.rank):
            if slot.rank in started:
                continue
            exit_file = self._exit_file(job, attempt, slot.rank)
            self._intent_file(job, attempt, slot.rank).write_text(f"{time.time()}\n")
            # Where the rank runs, for an exit reported after a restart.
            write_atomic(self._node_file(job, attempt, slot.rank), f"{slot.node}\n")
            pid_dir = self.state_dir / "pids" / slot.node
            env = self._env(job, attempt, spec, slot, len(slots), port, resume)
            cwd = spec.workdir or os.getcwd()
            log_path = run_dir / f"rank-{slot.rank}.log"
            argv = self._argv(job, spec, resume)
            unrunnable = cannot_run(argv, cwd, env.get("PATH", os.defpath))
            node_down = node_down_file(self.state_dir, slot.node).exists()
            if node_down:
                unrunnable = (-int(signal.SIGKILL), f"node {slot.node} is down")
            if unrunnable is not None:
                await self._refuse(job, attempt, slot, log_path, *unrunnable,
                                   node_down=node_down)
                continue
            with log_path.open("ab") as log_file:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "libs.drivers.local_worker", str(exit_file),
                    str(pid_dir), f"{job} {attempt} {slot.rank}",
                    # The supervisor writes the rank's output (rotated) and ships it.
                    "--log", str(log_path), "--log-limits", self.log_limits.model_dump_json(),
                    "--",
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own group: a node kill takes it whole
                )
            pid_dir.mkdir(parents=True, exist_ok=True)
            pid_file = pid_dir / f"{proc.pid}"
            write_atomic(pid_file, f"{job} {attempt} {slot.rank}\n")  # the supervisor does too
            worker = _Worker(job, attempt, slot.rank, slot.node, proc.pid, pid_file, exit_file,
                             proc=proc)
            self._workers.setdefault(job, []).append(worker)
            self._log.info("worker started", job=job, node=slot.node, rank=slot.rank, pid=proc.pid)
            await self._announce_start(worker)
            worker.watcher = asyncio.create_task(self._watch(worker))

    async def _watch_checkpoints(self, job: str, attempt: int, world: int) -> None:
        """While the job runs here: its newest complete checkpoint, as the
        framework wrote it, told as ``job.checkpoint`` (failover's lost-work
        accounting, Lens). One watch per job; a new attempt takes it over."""
        self._watch_attempt[job] = attempt
        if job in self._watches:
            return

        async def tell(found: Found, step: int, saved_at: datetime) -> None:
            await self._emit(checkpoint_event(job, self._watch_attempt.get(job, attempt), found,
                                              step, saved_at, source=self.source))

        watch = CheckpointWatch(self._checkpoints(job), tell, world_size=world)
        self._watches[job] = watch
        await watch.start()

    async def _unwatch(self, job: str) -> None:
        watch = self._watches.pop(job, None)
        self._watch_attempt.pop(job, None)
        if watch is not None:
            await watch.stop()

    async def _refuse(self, job: str, attempt: int, slot: WorkerSlot, log_path: Path,
                      code: int, reason: str, *, node_down: bool = False) -> None:
        """A rank that cannot start (its executable or workdir is missing)
        ends at once with the shell's code (127, 126) and says why: in its
        log, in the exit file (a relaunch sees the rank ran) and in the event.
        One whose node is down (``node_down``) is the platform's loss."""
        with log_path.open("a") as log_file:
            log_file.write(f"primus-safe local driver: {reason} (exit {code})\n")
        self._note_exit(job, attempt, slot.rank, ExitNote(reason=reason, node_down=node_down))
        write_exit(self._exit_file(job, attempt, slot.rank), code)
        self._log.warning("worker cannot start", job=job, node=slot.node, rank=slot.rank,
                          exit_code=code, reason=reason, log=str(log_path))
        await self._report_exit(job, attempt, slot.rank, slot.node, code, reason,
                                node_down=node_down)

    async def adopt(self) -> int:
        """After a restart: watch the workers a previous driver started (their
        pid files remain), so their exits are reported, and report the exits
        that were recorded but never heard (the bus was down when they came,
        then the stack stopped). Returns how many workers it adopted."""
        adopted = 0
        known = {w.pid for workers in self._workers.values() for w in workers}
        for pid_file in sorted((self.state_dir / "pids").glob("*/[0-9]*")):
            try:
                job, attempt, rank = pid_file.read_text().split()
                pid = int(pid_file.name)
            except (ValueError, FileNotFoundError):
                continue
            if pid in known:
                continue
            worker = _Worker(job, int(attempt), int(rank), pid_file.parent.name, pid, pid_file,
                             self._exit_file(job, int(attempt), int(rank)))
            self._workers.setdefault(job, []).append(worker)
            # The old driver may have died before announcing the start: say
            # it then. Not again otherwise: JetStream forgets an id after its
            # de-duplication window, and a worker outlives that.
            if not self._announced_file(worker).exists():
                await self._announce_start(worker)
            worker.watcher = asyncio.create_task(self._watch(worker))
            adopted += 1
            gang = len(list((self.state_dir / "ranks").glob(f"{job}-a{attempt}-r*")))
            await self._watch_checkpoints(job, int(attempt), gang or 1)
        await self._report_unheard_exits()
        await self._report_lost_ranks()
        return adopted

    async def _emit(self, event: WorkerStarted | WorkerExited | JobCheckpoint) -> None:
        """Publish until it is out. A bus outage longer than a request waits
        must not lose a worker's start or exit (the scheduler holds a gang
        until every rank's exit is known), nor kill the watcher that owns
        the pid file; the event id makes a repeat that got through a no-op."""
        delay = 0.25
        while True:
            try:
                await self.sink(event)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._log.warning("publish failed; retrying", event_id=event.id, error=repr(exc))
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    def _announced_file(self, worker: _Worker) -> Path:
        return self.state_dir / "announced" / f"{worker.job}-a{worker.attempt}-r{worker.rank}"

    async def _announce_start(self, worker: _Worker) -> None:
        await self._emit(
            WorkerStarted(
                id=f"{worker.job}-a{worker.attempt}-r{worker.rank}-started",
                source=self.source, job=worker.job, node=worker.node,
                data=WorkerStartedData(attempt=worker.attempt, rank=worker.rank, pid=worker.pid),
            )
        )
        announced = self._announced_file(worker)
        announced.parent.mkdir(parents=True, exist_ok=True)
        announced.touch()

    async def _watch(self, worker: _Worker) -> None:
        if worker.proc is not None:
            # The supervisor records the exit, then may still send the last
            # of the output to Lens: the exit is reported from its record.
            ended = asyncio.ensure_future(worker.proc.wait())
            while not ended.done() and not worker.exit_file.exists():
                await asyncio.wait([ended], timeout=0.2)
        else:
            while _alive(worker.pid) and not worker.exit_file.exists():
                await asyncio.sleep(0.25)
        code: int | None = None
        try:
            code = int(worker.exit_file.read_text())
        except (FileNotFoundError, ValueError):
            pass  # no record: the supervisor itself was killed
        except OSError as e:
            # Reported all the same, or the gang would wait for this rank for ever.
            self._log.warning("exit record unreadable", job=worker.job, rank=worker.rank,
                              path=str(worker.exit_file), error=str(e))
        if code is None:
            # Killed by the signal in the supervisor's own return code when it
            # is our child; with its node (-9) when adopted.
            own = worker.proc.returncode if worker.proc is not None else None
            code = own if own is not None and own < 0 else -int(signal.SIGKILL)
        self._log.info("worker exited", job=worker.job, node=worker.node, rank=worker.rank,
                       exit_code=code)
        if not worker.exit_file.exists():
            try:
                write_exit(worker.exit_file, code)  # so a relaunch knows this rank ran
            except OSError as e:
                self._log.warning("exit record not written", job=worker.job, rank=worker.rank,
                                  path=str(worker.exit_file), error=str(e))
        await self._report_exit(worker.job, worker.attempt, worker.rank, worker.node, code)
        # Only now: a crash before this line leaves the pid file, and the
        # next driver reports this exit again (same event id, de-duplicated).
        with contextlib.suppress(FileNotFoundError):
            worker.pid_file.unlink()
        with contextlib.suppress(ValueError):
            self._workers.get(worker.job, []).remove(worker)
        if not self._workers.get(worker.job):
            await self._unwatch(worker.job)  # its last rank ended: nothing more to save

    def ignored(self, spec: JobSpec) -> list[str]:
        """Processes on this machine: no image, pod resources, volumes,
        secrets or node constraints; only ``env`` (network defaults
        included) reaches the workers."""
        return kubernetes_only(spec)

    async def stop(self, job: str, *, grace_s: float = 10.0) -> None:
        workers = list(self._workers.get(job, []))
        for worker in workers:
            _signal_group(worker.pid, signal.SIGTERM)
        watchers = [w.watcher for w in workers if w.watcher is not None]
        if not watchers:
            return
        _, pending = await asyncio.wait(watchers, timeout=grace_s)
        if pending:
            for worker in workers:
                _signal_group(worker.pid, signal.SIGKILL)
            await asyncio.wait(pending, timeout=5)

    async def node_workers(self, node: str) -> NodeWorkers:
        """A local node's workers are processes here: alive while their pid
        lives and no exit is recorded."""
        if node_down_file(self.state_dir, node).exists():
            return NodeWorkers(node=node, workers=0, alive=False, detail="node is down")
        running = [w for ws in self._workers.values() for w in ws
                   if w.node == node and not w.exit_file.exists() and _alive(w.pid)]
        return NodeWorkers(node=node, workers=len(running), alive=bool(running),
                           detail=f"{len(running)} worker process(es) alive")

    async def close(self) -> None:
        for job in list(self._workers):
            await self.stop(job, grace_s=5.0)
        for job in list(self._watches):
            await self._unwatch(job)

    async def detach(self) -> None:
        """Stop watching without stopping the workers (a scheduler restart
        adopts them again)."""
        watchers = [w.watcher for workers in self._workers.values() for w in workers]
        self._workers.clear()
        await cancel_and_wait(watchers)
        for job in list(self._watches):
            await self._unwatch(job)


def cannot_run(argv: list[str], cwd: str, path: str) -> tuple[int, str] | None:
    """Why ``argv`` cannot start in ``cwd`` with this PATH, as a shell would
    say it (exit code, reason), or None when it can (pure but for the file
    system look-up). A relative executable with a slash is taken from ``cwd``."""
    if not Path(cwd).is_dir():
        return 127, f"workdir not found: {cwd}"
    head = argv[0]
    if "/" in head:
        exe = Path(cwd, head)
        if not exe.exists():
            return 127, f"command not found: {head} (no {exe})"
        if exe.is_dir() or not os.access(exe, os.X_OK):
            return 126, f"command not executable: {head} ({exe})"
        return None
    if shutil.which(head, path=path) is None:
        return 127, f"command not found: {head} (not on PATH)"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by a dead parent's init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def node_down_file(state_dir: Path, node: str) -> Path:
    """While this file exists the local node is powered off: the driver starts
    no worker there and reports none alive (a real dead machine runs nothing)."""
    return state_dir.resolve() / "down" / node


def power_off(state_dir: Path, node: str) -> None:
    path = node_down_file(state_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def power_on_all(state_dir: Path) -> None:
    for path in (state_dir.resolve() / "down").glob("*"):
        path.unlink(missing_ok=True)


def kill_node_workers(state_dir: Path, node: str,
                      sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Kill every worker the LocalDriver started on ``node`` (a node failure)."""
    pid_dir = state_dir.resolve() / "pids" / node
    killed = []
    for pid_file in sorted(pid_dir.glob("[0-9]*")) if pid_dir.exists() else []:
        pid = int(pid_file.name)
        _signal_group(pid, sig)
        killed.append(pid)
    return killed


def reap_all(state_dir: Path) -> list[int]:
    """Kill workers left behind by a crashed driver (their pid files remain)."""
    root = state_dir.resolve() / "pids"
    killed = []
    for node_dir in sorted(root.glob("*")) if root.exists() else []:
        killed += kill_node_workers(state_dir, node_dir.name)
        for pid_file in node_dir.glob("*"):
            pid_file.unlink(missing_ok=True)
    return killed
