"""Which job, attempt and rank holds each GPU of this node (pure: no I/O,
no clock), so the agent's telemetry says whose work a GPU is doing.

The agent feeds it the scheduler's facts about this node: ``placed`` (a
job's gang was placed; the slots on this node are kept), ``exited`` (one
worker of this node ended: its GPUs are free, which is also how a retried
or preempted attempt gives its GPUs back, since requeueing publishes no
event of its own) and ``ended`` (a job completed, failed, stopped, was
cancelled or deleted). On start it is filled from the scheduler's job
records (the ``jobs`` bucket) and then the same events are applied again
from a little before the records were read.

Every rule is ordered by the attempt, never by arrival: a fact about an
older attempt than the one held is ignored, a placement of a newer attempt
replaces the older one, and an end frees the attempt it names or older.
Redelivered events, and events the bucket already reflects, change nothing.

A slot says how many GPUs a worker got, not which: the device plugin (or,
locally, nobody) picks the devices. A worker's GPUs are therefore the
lowest-numbered free ones when it is first seen in telemetry, in the
order the workers were placed (rank order within a gang), and they stay
its own until it ends. That is exact for the usual training node, one
worker holding every GPU; where several workers share a node each has the
right number of GPUs but maybe not the devices the plugin gave it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from libs.events import GpuMetrics, NodeTelemetryData, WorkerSlot
from libs.records import JobRecord

# Jobs whose newest attempt here is remembered after its workers are gone
# (so that a placement delivered again is not taken again); the oldest are
# forgotten beyond this many.
REMEMBERED = 1024


@dataclass(frozen=True)
class Owner:
    """The worker a GPU is placed with."""

    job: str
    attempt: int
    rank: int


@dataclass
class _Worker:
    owner: Owner
    gpus: int  # how many it was given
    order: int  # when it was placed (the packing order)
    devices: tuple[int, ...] | None = None  # which, once telemetry saw the GPUs


@dataclass
class Placements:
    """This node's workers and the GPUs each holds."""

    node: str
    _workers: dict[tuple[str, int], _Worker] = field(default_factory=dict)  # (job, rank)
    _newest: dict[str, int] = field(default_factory=dict)  # job -> newest attempt placed/ended
    _placed: int = 0

    def placed(self, job: str, attempt: int, slots: Iterable[WorkerSlot],
               exited: Iterable[int] = ()) -> bool:
        """A gang of ``job`` was placed (its ``attempt``); only the slots on
        this node with GPUs are kept, less the ranks in ``exited`` (a job
        record's exits). True when what is held changed."""
        if attempt <= max(self._newest.get(job, 0), self._held(job)):
            return False  # this attempt (delivered again), an older one, or one that ended
        changed = self._drop(job)  # an older attempt's workers, whose exits were missed
        gone = set(exited)
        mine = sorted((s for s in slots if s.node == self.node and s.gpus > 0
                       and s.rank not in gone), key=lambda s: s.rank)
        if mine:
            self._remember(job, attempt)
        for slot in mine:
            self._placed += 1
            self._workers[(job, slot.rank)] = _Worker(Owner(job, attempt, slot.rank),
                                                      slot.gpus, self._placed)
        return changed or bool(mine)

    def read(self, records: Iterable[JobRecord]) -> None:
        """The placements the scheduler's job records hold (the agent's
        start), oldest first: the GPUs are packed in that order."""
        for r in sorted((r for r in records if r.holds_gpus),
                        key=lambda r: (r.started_at or 0.0, r.id)):
            self.placed(r.id, r.attempt, r.slots, exited=r.exits)

    def exited(self, job: str, attempt: int, rank: int) -> bool:
        """The worker ``rank`` of ``job`` on this node ended (``attempt``)."""
        worker = self._workers.get((job, rank))
        if worker is None or worker.owner.attempt > attempt:
            return False
        del self._workers[(job, rank)]
        return True

    def ended(self, job: str, attempt: int) -> bool:
        """``job`` ended after ``attempt`` placements: its GPUs here are free."""
        if self._held(job) > attempt:
            return False  # a newer attempt runs here
        if job in self._newest or self._held(job):
            self._remember(job, attempt)
        return self._drop(job)

    def owners(self, devices: Sequence[int]) -> dict[int, Owner]:
        """GPU index -> the worker holding it, for the GPUs telemetry sees
        now. Workers seen for the first time take the lowest free indices,
        in placement order; a worker that finds too few free takes them from
        the workers placed before it (whose end this node missed), which are
        then forgotten."""
        present = set(devices)
        for worker in sorted(self._workers.values(), key=lambda w: w.order):
            if worker.devices is not None or not present:
                continue
            free = sorted(present - self._taken())
            if len(free) < worker.gpus:
                self._evict(worker, worker.gpus - len(free), present)
                free = sorted(present - self._taken())
            worker.devices = tuple(free[:worker.gpus])
        return {d: w.owner for w in self._workers.values() if w.devices
                for d in w.devices if d in present}

    def leading(self) -> dict[str, int]:
        """job -> attempt, for the jobs whose rank 0 runs on this node."""
        return {w.owner.job: w.owner.attempt for w in self._workers.values()
                if w.owner.rank == 0}

    def snapshot(self) -> dict[str, dict[str, int | list[int] | None]]:
        """What is held, for the agent's health reply: ``job/rank`` -> its
        attempt, GPU count and devices (None until telemetry saw them)."""
        return {f"{w.owner.job}/{w.owner.rank}": {
            "attempt": w.owner.attempt, "gpus": w.gpus,
            "devices": list(w.devices) if w.devices is not None else None}
            for w in sorted(self._workers.values(), key=lambda w: w.order)}

    def _held(self, job: str) -> int:
        """The attempt of ``job`` whose workers are here (0: none)."""
        return max((w.owner.attempt for (j, _), w in self._workers.items() if j == job),
                   default=0)

    def _taken(self) -> set[int]:
        return {d for w in self._workers.values() if w.devices for d in w.devices}

    def _remember(self, job: str, attempt: int) -> None:
        attempt = max(attempt, self._newest.pop(job, 0))  # re-inserted: kept longest
        self._newest[job] = attempt
        while len(self._newest) > REMEMBERED:
            del self._newest[next(iter(self._newest))]

    def _drop(self, job: str) -> bool:
        keys = [k for k in self._workers if k[0] == job]
        for key in keys:
            del self._workers[key]
        return bool(keys)

    def _evict(self, newer: _Worker, needed: int, present: set[int]) -> None:
        for older in sorted(self._workers.values(), key=lambda w: w.order):
            if needed <= 0 or older.order >= newer.order:
                return
            if older.devices:
                needed -= len(set(older.devices) & present)
                del self._workers[(older.owner.job, older.owner.rank)]


def attributed(data: NodeTelemetryData, owners: dict[int, Owner]) -> NodeTelemetryData:
    """``data`` with each GPU's job, attempt and rank from ``owners`` (GPU
    index -> worker); unchanged when no GPU is held."""
    if not owners:
        return data
    gpus = [_owned(g, owners.get(g.index)) for g in data.gpus]
    return data.model_copy(update={"gpus": gpus})


def _owned(gpu: GpuMetrics, owner: Owner | None) -> GpuMetrics:
    if owner is None:
        return gpu
    return gpu.model_copy(update={"job": owner.job, "attempt": owner.attempt,
                                  "rank": owner.rank})
