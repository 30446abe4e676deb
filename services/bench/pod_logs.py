"""Workers' stdout and stderr on Kubernetes: the node's agent reads its job
pods' container logs where the kubelet keeps them and ships them to Lens
as the same ``WorkerLog`` batches the local driver's supervisor sends.

Why the agent tails files rather than the driver streaming the pods' logs
through the API server: a stream per worker pod, through the apiserver and
the kubelet, loads the control plane with every byte a thousand nodes'
workers print, and it would live in the scheduler (whose driver holds the
pods), so it would stop whenever the scheduler restarts or changes leader.
A tail on each node reads what the kubelet has written anyway, scales with
the nodes, needs no API access and survives scheduler restarts (as
fluent-bit and vector collect container logs).

The kubelet keeps a pod's logs in ``<root>/<namespace>_<pod>_<uid>/``
(``pod_log_reader`` reads one; ``cri_log`` parses its records). Only the
training container of pods the platform created is read: pod names are
``k8s_manifests.pod_name(job, attempt, rank)``, a DNS label that may be a
digest of the job id, so the job is found by computing that name for the
ids in the scheduler's ``jobs`` bucket (``match_pod``); the pod's labels
are not in the directory.

Delivery is at least once, and a restarted agent never starts a file over:
after each round's batches are acknowledged by JetStream, each worker's
position (``pod_log_reader.Cursor``) is written to the agent's state
directory; before they are sent, where the round ends is written too, so an
agent that dies in between reads exactly the same lines again after its
restart and makes the same batches, which their ids turn into no-ops.

The agent's heartbeat and telemetry never wait for this: the files are read
in a worker thread, and a slow bus only delays the next round (the
kubelet's files are the buffer). What a worker prints beyond its job's log
rate is dropped and counted (``libs.log_shipper``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from libs.bus import Bus, MessageTooLarge
from libs.drivers.k8s_manifests import pod_name
from libs.events import WorkerLog
from libs.log_shipper import LogLimits
from libs.logs import get_logger
from libs.records import JOBS
from libs.settings import Settings
from services.bench.pod_log_reader import Cursor, PodLog, Position

# Polling with os.stat (inode, size) rather than inotify (the watchdog
# package): it works on whatever filesystem holds the kubelet's directory,
# needs no watch per pod directory (inotify's per-user watch limit is
# shared with everything else on the node), and half a second is the
# batcher's own flush time: lines would wait that long anyway.
POLL_S = 0.5
RESOLVE_FIRST_S, RESOLVE_MAX_S = 2.0, 120.0  # a pod no job record names yet: asked again
PUBLISH_RETRY_MAX_S = 10.0
POSITIONS_VERSION = 1
POSITIONS_DIR = "pod-logs"  # under state_dir; the chart mounts a node directory there

_POD_SUFFIX = re.compile(r"^(?P<head>.+)-a(?P<attempt>[1-9][0-9]*)-r(?P<rank>0|[1-9][0-9]*)$")


# --------------------------------------------------------------------------- pods (pure)


@dataclass(frozen=True)
class WorkerId:
    job: str
    attempt: int
    rank: int


def pod_of_dir(name: str, namespace: str) -> str | None:
    """The pod of a kubelet pod log directory (``<namespace>_<pod>_<uid>``)
    when it is in ``namespace`` and named like a worker pod. Pure."""
    parts = name.split("_")
    if len(parts) != 3 or parts[0] != namespace or not _POD_SUFFIX.match(parts[1]):
        return None
    return parts[1]


def match_pod(pod: str, jobs: Iterable[str]) -> WorkerId | None:
    """The job, attempt and rank whose worker pod is named ``pod``, among
    the job ids ``jobs``. Pure. The name may be a digest of the id, so it is
    computed for each id (``k8s_manifests.pod_name``), never parsed back."""
    m = _POD_SUFFIX.match(pod)
    if m is None:
        return None
    attempt, rank = int(m["attempt"]), int(m["rank"])
    for job in jobs:
        if pod_name(job, attempt, rank) == pod:
            return WorkerId(job, attempt, rank)
    return None


# --------------------------------------------------------------------------- the node's pods


class Positions(BaseModel):
    """The positions file: each followed pod's worker and cursors."""

    model_config = ConfigDict(extra="ignore")
    version: int = POSITIONS_VERSION
    pods: dict[str, Position] = {}


@dataclass
class _Unknown:
    pod: str
    next_at: float
    wait_s: float = RESOLVE_FIRST_S


@dataclass
class Round:
    """One round's batches, and where each pod that moved now stands."""

    batches: list[WorkerLog] = field(default_factory=list)
    ends: dict[str, Cursor] = field(default_factory=dict)


class PodLogs:
    """This node's worker pods (directories under ``root``): one reader
    each, and the positions file. Blocking file I/O: run in a thread, one
    call at a time."""

    def __init__(self, root: Path, positions: Path, *, namespace: str, node: str,
                 limits: LogLimits, source: str) -> None:
        self.root, self.positions = root, positions
        self.namespace, self.node, self.limits, self.source = namespace, node, limits, source
        self.pods: dict[str, PodLog] = {}
        self.unknown: dict[str, _Unknown] = {}
        self.finished = 0  # pods read to their end and forgotten
        self._unreadable = False
        self._log = get_logger(component="pod-logs", node=node)

    def _reader(self, name: str, position: Position) -> PodLog:
        return PodLog(self.root / name, position, node=self.node, limits=self.limits,
                      source=self.source)

    def load(self) -> None:
        """Follow the pods the positions file names, from where it says."""
        try:
            doc = Positions.model_validate_json(self.positions.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self._log.error("pod log positions unreadable: logs are read from their start",
                            path=str(self.positions), error=str(exc)[:300])
            return
        for name, position in doc.pods.items():
            if (self.root / name).is_dir():
                self.pods[name] = self._reader(name, position)
            else:
                self._log.warning("a worker pod went while the agent was away; the rest of "
                                  "its output is lost", pod_dir=name, job=position.job,
                                  rank=position.rank)

    def scan(self, now: float) -> list[tuple[str, str]]:
        """Look for new and removed pod directories; the new ones whose job
        is to be looked up now, as (directory, pod name)."""
        try:
            names = set(os.listdir(self.root))
        except OSError as exc:  # not "every pod is gone": nothing is known this round
            if not self._unreadable:
                self._log.error("the pod log directory is unreadable", root=str(self.root),
                                error=str(exc))
            self._unreadable = True
            return []
        self._unreadable = False
        for name, reader in self.pods.items():
            reader.gone = name not in names
        for name in names - self.pods.keys() - self.unknown.keys():
            pod = pod_of_dir(name, self.namespace)
            if pod is not None:
                self.unknown[name] = _Unknown(pod, now)
        for name in self.unknown.keys() - names:
            del self.unknown[name]
        return [(name, u.pod) for name, u in self.unknown.items() if u.next_at <= now]

    def adopt(self, name: str, worker: WorkerId, workers: int) -> None:
        self.unknown.pop(name, None)
        self.pods[name] = self._reader(name, Position(
            job=worker.job, attempt=worker.attempt, rank=worker.rank, workers=workers))

    def not_found(self, name: str, now: float) -> None:
        u = self.unknown.get(name)
        if u is not None:
            u.next_at, u.wait_s = now + u.wait_s, min(u.wait_s * 2, RESOLVE_MAX_S)

    def poll(self) -> Round:
        """Read every pod once; where the round ends is written down before
        its batches are sent."""
        out = Round()
        for name, reader in self.pods.items():
            batches = reader.poll()
            cursor = reader.cursor()
            last = reader.position.acked or Cursor()
            if batches or reader.done or (cursor.restart, cursor.inode, cursor.offset) != (
                    last.restart, last.inode, last.offset):
                out.batches += batches
                out.ends[name] = cursor
        if out.batches:
            self._write(out.ends)
        return out

    def commit(self, done: Round) -> None:
        """The round's batches are stored: its ends are where each pod resumes."""
        for name, cursor in done.ends.items():
            reader = self.pods.get(name)
            if reader is None:
                continue
            reader.position.acked, reader.position.sent = cursor, None
            if reader.done:
                reader.close()
                del self.pods[name]
                self.finished += 1
        self._write({})

    def _write(self, sent: dict[str, Cursor]) -> None:
        doc = Positions(pods={
            name: r.position.model_copy(update={"sent": sent.get(name, r.position.sent)})
            for name, r in self.pods.items()})
        self.positions.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.positions.with_name(f".{self.positions.name}.tmp")
        # No fsync: it is the agent's crash this guards against; a node
        # that loses its page cache loses its pods' logs as well.
        tmp.write_text(doc.model_dump_json())
        os.replace(tmp, self.positions)

    def snapshot(self) -> dict[str, Any]:
        readers = list(self.pods.values())
        return {"pods": len(readers), "unknown_pods": len(self.unknown),
                "finished_pods": self.finished,
                "dropped_lines": sum(r.batcher.total_dropped_lines for r in readers),
                "cut_lines": sum(r.batcher.cut_lines for r in readers),
                "malformed_records": sum(r.malformed for r in readers),
                "lost_files": sum(r.lost_files for r in readers)}


# --------------------------------------------------------------------------- the agent's task


class PodLogShipper:
    """The bench agent's task (``Settings.agent_pod_logs_dir``): every
    ``poll_s`` a round over this node's worker pods, its batches published
    with their ids as ``Nats-Msg-Id`` (JetStream drops a batch it has)."""

    def __init__(self, settings: Settings, node: str, *, poll_s: float = POLL_S) -> None:
        root = settings.agent_pod_logs_dir
        if root is None:
            raise ValueError("agent_pod_logs_dir is not set")
        self.poll_s = poll_s
        self.pods = PodLogs(root, settings.state_dir / POSITIONS_DIR / "positions.json",
                            namespace=settings.k8s_namespace, node=node,
                            limits=settings.worker_log_limits, source=f"bench-agent/{node}")
        self.sent = 0
        self.unsendable = 0  # batches the server would not take (over its max_payload)
        self._log = get_logger(component="pod-logs", node=node)

    async def run(self, bus: Bus) -> None:
        await asyncio.to_thread(self.pods.load)
        self._log.info("following worker pod logs", root=str(self.pods.root),
                       namespace=self.pods.namespace, resumed=len(self.pods.pods))
        while True:
            try:
                await self._round(bus)
            except Exception as exc:  # a bug: said, and the next round tried
                self._log.exception("pod log round failed", error=repr(exc))
            await asyncio.sleep(self.poll_s)

    async def _round(self, bus: Bus) -> None:
        due = await asyncio.to_thread(self.pods.scan, time.time())
        if due:
            await self._resolve(bus, due)
        done = await asyncio.to_thread(self.pods.poll)
        if done.ends:
            await self._send(bus, done.batches)
            await asyncio.to_thread(self.pods.commit, done)

    async def _resolve(self, bus: Bus, due: list[tuple[str, str]]) -> None:
        """Which job, attempt and rank each new pod runs, from the job records."""
        now = time.time()
        try:
            records = await bus.records(JOBS)
            jobs = await records.keys()
        except Exception as exc:
            self._log.warning("job records unreadable; new pods' logs wait", error=repr(exc))
            for name, _ in due:
                self.pods.not_found(name, now)
            return
        for name, pod in due:
            worker = match_pod(pod, jobs)
            record = None
            if worker is not None:
                with contextlib.suppress(Exception):
                    record = await records.get(worker.job)
            if worker is None or record is None:
                self.pods.not_found(name, now)
                continue
            self.pods.adopt(name, worker, record.spec.workers)
            self._log.info("following a worker's output", job=worker.job,
                           attempt=worker.attempt, rank=worker.rank, pod_dir=name)

    async def _send(self, bus: Bus, batches: list[WorkerLog]) -> None:
        """Publish each batch until JetStream has it; the positions move only
        after, so a bus that is away holds the round (the files wait)."""
        for batch in batches:
            wait = 0.5
            while True:
                try:
                    await bus.publish(batch)
                    self.sent += 1
                    break
                except MessageTooLarge as exc:
                    self.unsendable += 1
                    self._log.error("worker output batch too large for the bus; skipped",
                                    batch=batch.id, error=str(exc))
                    break
                except Exception as exc:
                    self._log.warning("worker output not sent; trying again", batch=batch.id,
                                      error=repr(exc), retry_s=wait)
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, PUBLISH_RETRY_MAX_S)

    def snapshot(self) -> dict[str, Any]:
        return {**self.pods.snapshot(), "batches_sent": self.sent,
                "batches_unsendable": self.unsendable}
