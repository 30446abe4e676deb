"""Whether a job can ever run here, can run only once the cluster grows, or
may simply queue: decided once at submit (and again every cycle), so a job
that can never run is refused with its reason instead of queueing forever,
and one that cannot run on today's nodes never blocks the jobs behind it.

Pure: configuration and the registered nodes in, a verdict out.

What the cluster "can ever give" is decided on what is knowable:

* **Configuration** is a promise about the future. A workspace's quota
  (``quota_gpus``, ``quota_by_model``) and a pool's declared capacity
  (``pools:`` in the scheduler file: the most GPUs of each model the pool
  will ever hold) are hard limits: a job beyond them is *refused*.
* **A node's GPU count** is a property of its hardware type: nodes of one
  GPU model carry one board size. A worker (or node-scoped unit) needing
  more GPUs on one node than the largest registered node of its model has
  is *refused*.
* **The registered nodes** (every state: a quarantined node comes
  back) are only what the cluster has today. Where no pool declares a
  capacity, a job needing more GPUs of a model than those nodes hold, or a
  rack-scoped unit larger than any rack, might run after nodes join, so it
  is accepted as *unschedulable* with the reason, re-checked every cycle,
  and kept out of the queue so a FIFO workspace's later jobs still run.
  Refusing it would be wrong the day the cluster grows; leaving it at the
  head of a FIFO queue would block everyone until then.
* With no node registered at all nothing about the fleet is known yet
  (a scheduler that started before bootstrap): model and size checks then
  answer *unschedulable*, never *refused*.

Every workspace requires GPUs: the placement engine places GPU gangs only,
so a job with ``gpus_per_worker: 0`` is refused everywhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from .model import Job, Node, Snapshot, Workspace

Verdict = Literal["ok", "refused", "unschedulable"]
PoolCapacity = Mapping[str, Mapping[str, int]]
"""pool name -> GPU model -> the most GPUs of that model the pool will hold."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer for one job. ``field`` names the job-file field to change
    (empty when the fix is in the cluster or its configuration)."""

    verdict: Verdict
    reason: str = ""
    field: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


OK = Admission("ok")


@dataclass(frozen=True, slots=True)
class _Model:
    """What one GPU model can hold, now and ever, for one set of pools."""

    verdict: Verdict
    reason: str = ""
    field: str = ""


@dataclass(slots=True)
class Fleet:
    """The registered nodes summarised for admission: per (pool, model) the
    GPU counts of its nodes, per rack too. The shell keeps one until a node
    registers (node states do not change what a job can ever get); answers
    are cached per job shape, so screening 10,000 queued jobs costs little."""

    capacity: PoolCapacity = field(default_factory=dict)
    boards: dict[str, int] = field(default_factory=dict)  # model -> largest node's GPUs
    racks: dict[tuple[str, str], dict[tuple[str, str], Counter[int]]] = field(
        default_factory=dict)
    """(pool, model) -> (switch, rack) -> how many nodes have each GPU count
    (counts, not lists: a shape's capacity is then a few multiplications)."""
    _cache: dict[tuple[object, ...], _Model] = field(default_factory=dict)
    _jobs: dict[tuple[object, ...], Admission] = field(default_factory=dict)
    _models: frozenset[str] = frozenset()
    _pools: frozenset[str] = frozenset()
    _slots: dict[tuple[object, ...], tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Iterable[Node], capacity: PoolCapacity | None = None) -> Fleet:
        fleet = cls(capacity=dict(capacity or {}))
        for n in nodes:
            if n.gpus <= 0:
                continue
            fleet.boards[n.gpu_model] = max(fleet.boards.get(n.gpu_model, 0), n.gpus)
            racks = fleet.racks.setdefault((n.pool, n.gpu_model), {})
            racks.setdefault((n.switch, n.rack), Counter())[n.gpus] += 1
        declared = {m for caps in fleet.capacity.values() for m, g in caps.items() if g > 0}
        fleet._models = frozenset(set(fleet.boards) | declared)
        fleet._pools = frozenset({p for p, _ in fleet.racks} | set(fleet.capacity))
        return fleet

    @property
    def empty(self) -> bool:
        return not self.boards and not self.capacity

    def models(self) -> frozenset[str]:
        """Every GPU model the cluster has or is configured to have."""
        return self._models

    def pools(self) -> frozenset[str]:
        return self._pools

    def slots_per_rack(self, pools: Sequence[str], model: str, gpus: int) -> tuple[int, ...]:
        """Per rack of ``model`` in ``pools``: how many ``gpus``-GPU slots
        its nodes hold (cached: a handful of slot sizes per cycle)."""
        key = (tuple(pools), model, gpus)
        out = self._slots.get(key)
        if out is None:
            out = self._slots[key] = tuple(
                sum(g // gpus * k for g, k in rack.items())
                for p in pools for rack in self.racks.get((p, model), {}).values())
        return out


def admit(job: Job, workspaces: Mapping[str, Workspace], fleet: Fleet,
          priorities: Iterable[str] = ()) -> Admission:
    """Whether ``job`` can run: ok, refused (never, by configuration or
    hardware) or unschedulable (not on the nodes registered today)."""
    ws = workspaces.get(job.workspace)
    # Jobs of one shape get one answer: a cycle screens every queued job.
    key = (ws, job.workspace, job.priority, job.workers, job.gpus_per_worker, job.unit_workers,
           job.unit_scope, job.gpu_models, tuple(priorities))
    answer = fleet._jobs.get(key)
    if answer is None:
        answer = fleet._jobs[key] = _admit(job, ws, workspaces, fleet, key[-1])
    return answer


def _admit(job: Job, ws: Workspace | None, workspaces: Mapping[str, Workspace], fleet: Fleet,
           priorities: tuple[str, ...]) -> Admission:
    if ws is None:
        known = ", ".join(sorted(workspaces)) or "none"
        return Admission("refused", f"unknown workspace {job.workspace!r}; the scheduler's "
                                    f"workspaces are: {known}", "workspace")
    if priorities and job.priority not in priorities:
        return Admission("refused", f"unknown priority class {job.priority!r}; known: "
                                    f"{', '.join(sorted(priorities))}", "priority")
    if job.gpus_per_worker < 1:
        return Admission("refused", f"gpus_per_worker is {job.gpus_per_worker}: workspace "
                                    f"{ws.name} runs GPU jobs only; set gpus_per_worker to 1 "
                                    f"or more", "gpus_per_worker")
    if job.workers < 1:
        return Admission("refused", "a job needs at least 1 worker", "workers")
    unit = max(1, job.unit_workers)
    if job.workers % unit:
        return Admission("refused", f"workers ({job.workers}) is not a multiple of "
                                    f"unit_workers ({unit}): a unit is {unit} consecutive "
                                    f"ranks; make workers a multiple of it", "unit_workers")
    if ws.quota_gpus is not None and job.gpus > ws.quota_gpus:
        return Admission("refused", f"needs {job.gpus} GPUs; workspace {ws.name}'s whole quota "
                                    f"is {ws.quota_gpus}", "workers")
    models = _candidates(job, ws, fleet)
    if isinstance(models, Admission):
        return models
    answers = [_for_model(job, ws, m, fleet) for m in models]
    if any(a.verdict == "ok" for a in answers):
        return OK
    later = [a for a in answers if a.verdict == "unschedulable"]
    first = (later or answers)[0]
    reason = first.reason if len(answers) == 1 else "; ".join(a.reason for a in answers)
    return Admission(first.verdict, reason, first.field)


def screen(snapshot: Snapshot, fleet: Fleet, priorities: Iterable[str] = (),
           ) -> tuple[Snapshot, dict[str, Admission]]:
    """The snapshot without the pending jobs that cannot run (so they hold
    no queue), and the verdict for each job taken out."""
    by_name = {w.name: w for w in snapshot.workspaces}
    priorities = tuple(priorities)
    keep: list[Job] = []
    out: dict[str, Admission] = {}
    for job in snapshot.pending:
        verdict = admit(job, by_name, fleet, priorities)
        if verdict.ok:
            keep.append(job)
        else:
            out[job.id] = verdict
    if not out:
        return snapshot, out
    return replace(snapshot, pending=keep), out


# -- the steps -----------------------------------------------------------------


def _candidates(job: Job, ws: Workspace, fleet: Fleet) -> Sequence[str] | Admission:
    """The GPU models the job may run on, or why there is none."""
    allowed = set(ws.quota_by_model)  # empty: every model
    known = fleet.models() | allowed
    if job.gpu_models:
        wanted = sorted(job.gpu_models)
        if allowed and not job.gpu_models & allowed:
            return Admission("refused", f"gpu_model {' or '.join(wanted)} is not allowed in "
                                        f"workspace {ws.name}; its quota_by_model allows "
                                        f"{', '.join(sorted(allowed))}", "gpu_model")
        models = [m for m in wanted if not allowed or m in allowed]
        if not any(m in known for m in models):
            if fleet.empty:
                return Admission("unschedulable", f"no node is registered yet; gpu_model "
                                                  f"{' or '.join(wanted)} is not known")
            return Admission("refused", f"unknown gpu_model {' or '.join(wanted)}; the cluster "
                                        f"has {', '.join(sorted(known))}", "gpu_model")
        return [m for m in models if m in known]
    models = sorted(allowed or known)
    if not models:
        return Admission("unschedulable", "no node is registered yet")
    return models


def _for_model(job: Job, ws: Workspace, model: str, fleet: Fleet) -> _Model:
    key = (model, ws.name, ws.node_pools, ws.quota_by_model.get(model), job.workers,
           job.gpus_per_worker, max(1, job.unit_workers), job.unit_scope)
    answer = fleet._cache.get(key)
    if answer is None:
        answer = fleet._cache[key] = _decide_model(job, ws, model, fleet)
    return answer


def _decide_model(job: Job, ws: Workspace, model: str, fleet: Fleet) -> _Model:
    need = job.gpus
    cap = ws.quota_by_model.get(model) if ws.quota_by_model else None
    if cap is not None and need > cap:
        return _Model("refused", f"needs {need} GPUs; workspace {ws.name}'s quota for {model} "
                                 f"is {cap}", "workers")
    unit = max(1, job.unit_workers)
    node_scoped = job.unit_scope == "node"
    slot_gpus = unit * job.gpus_per_worker if node_scoped else job.gpus_per_worker
    board = fleet.boards.get(model)
    if board is not None and slot_gpus > board:
        what = (f"a unit of {unit} workers x {job.gpus_per_worker} GPUs" if node_scoped
                and unit > 1 else f"a worker of {job.gpus_per_worker} GPUs")
        return _Model("refused", f"{what} needs {slot_gpus} GPUs on one node; {model} nodes "
                                 f"have {board}", "unit_workers" if unit > 1 and node_scoped
                      else "gpus_per_worker")
    pools = sorted(ws.node_pools) if ws.node_pools else sorted(fleet.pools())
    where = (f" in pool {' or '.join(pools)}" if ws.node_pools else "")
    declared = _declared(pools, model, fleet)
    if declared is not None and declared < need:
        return _Model("refused", f"needs {need} {model} GPUs; pool(s) {', '.join(pools)} "
                                 f"are configured to hold at most {declared}", "workers")
    if not any((p, model) in fleet.racks for p in pools):
        return _Model("unschedulable", f"no {model} node is registered{where} yet")
    if node_scoped:
        slots = sum(fleet.slots_per_rack(pools, model, slot_gpus))
        held = slots * slot_gpus
        if slots < job.workers // unit:
            return _Model("unschedulable", _later(need, held, model, where))
        return _Model("ok")
    per_rack = fleet.slots_per_rack(pools, model, job.gpus_per_worker)
    units = sum(workers // unit for workers in per_rack)
    if units < job.workers // unit:
        most = max(per_rack)
        if job.workers // unit == 1 or most < unit:
            return _Model("unschedulable", f"a unit of {unit} workers x {job.gpus_per_worker} "
                                           f"GPUs must sit in one rack; the largest {model} "
                                           f"rack{where} holds {most} such workers")
        return _Model("unschedulable", _later(need, units * unit * job.gpus_per_worker, model,
                                              where))
    return _Model("ok")


def _declared(pools: Sequence[str], model: str, fleet: Fleet) -> int | None:
    """GPUs of ``model`` the pools are configured to hold; None unless
    every one of them declares its capacity."""
    if not pools or any(p not in fleet.capacity for p in pools):
        return None
    return sum(fleet.capacity[p].get(model, 0) for p in pools)


def _later(need: int, have: int, model: str, where: str) -> str:
    return (f"needs {need} {model} GPUs; the registered {model} nodes{where} can give at most "
            f"{have} in this shape")
