"""Turning a job into a placement request, or into the reason it never fits.

A job speaks in workers, parallelism units and GPU models; the placement
engine speaks in *slots* (what must sit on one node), *rack units* (slots that
must share a rack) and node indices. Doing the translation once per job, with
the checks that do not depend on free capacity (unknown workspace, malformed
gang, no ready node of the wanted model, a unit larger than any node), keeps
the engine small and gives those jobs a precise reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Job, SchedulerConfig, Workspace
from .state import ClusterState


@dataclass(frozen=True, slots=True)
class Request:
    job: Job
    priority: int
    slots: int
    slot_gpus: int
    workers_per_slot: int
    rack_unit: int
    models: tuple[str, ...]
    pools: frozenset[str] | None
    exclude: tuple[int, ...]
    prefer: frozenset[int]

    @property
    def need(self) -> int:
        return self.slots * self.slot_gpus

    @property
    def units(self) -> int:
        return self.slots // self.rack_unit

    @property
    def shape(self) -> tuple[object, ...] | None:
        """Requests with the same shape fit or fail together for the same
        size; None when excluded nodes make the request one of a kind."""
        if self.exclude:
            return None
        return (self.models, self.pools, self.slot_gpus, self.rack_unit)


class Invalid(Exception):
    """The job can never be placed as specified; ``code`` classifies why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def slot_layout(job: Job) -> tuple[int, int, int, int]:
    """(slots, GPUs per slot, workers per slot, slots per rack unit): a
    node-scoped unit is one slot; a rack-scoped one is ``unit_workers``
    slots that share a rack. A job whose workers are not a whole number of
    units is laid out per worker (``build_request`` refuses it)."""
    unit = max(1, job.unit_workers)
    if job.workers % unit:
        unit = 1
    if job.unit_scope == "node":
        return job.workers // unit, unit * job.gpus_per_worker, unit, 1
    return job.workers, job.gpus_per_worker, 1, unit


def build_request(job: Job, state: ClusterState, config: SchedulerConfig) -> Request:
    """Translate ``job``; raises ``Invalid`` with a human reason."""
    ws = state.workspaces.get(job.workspace)
    if ws is None:
        raise Invalid("invalid", f"unknown workspace {job.workspace!r}")
    if job.priority not in config.priorities:
        known = ", ".join(sorted(config.priorities))
        raise Invalid("invalid", f"unknown priority class {job.priority!r} (known: {known})")
    if job.workers < 1 or job.gpus_per_worker < 1:
        raise Invalid("invalid", "a job needs at least 1 worker with at least 1 GPU")
    unit = max(1, job.unit_workers)
    if job.workers % unit:
        raise Invalid("invalid", f"workers ({job.workers}) is not a multiple of "
                                 f"unit_workers ({unit})")
    slots, slot_gpus, per_slot, rack_unit = slot_layout(job)
    models = _models(job, ws, state)
    pools = ws.node_pools or None
    if not models:
        raise Invalid("no-node", _no_node_reason(job, ws))
    biggest = max(state.model_max_gpus[m] for m in models)
    if slot_gpus > biggest:
        what = (f"a unit of {unit} workers x {job.gpus_per_worker} GPUs" if per_slot > 1
                else f"a worker of {job.gpus_per_worker} GPUs")
        raise Invalid("too-big", f"{what} needs {slot_gpus} GPUs on one node; the largest "
                                 f"ready node{_model_phrase(models)} has {biggest}")
    exclude = tuple(i for name in job.exclude_nodes
                    if (i := state.index.get(name)) is not None and state.usable(i))
    prefer = frozenset(i for name in job.prefer_nodes
                       if (i := state.index.get(name)) is not None and state.usable(i))
    return Request(job, config.priorities[job.priority], slots, slot_gpus, per_slot,
                   rack_unit, models, pools, exclude, prefer)


def _models(job: Job, ws: Workspace, state: ClusterState) -> tuple[str, ...]:
    models = []
    for model in sorted(state.model_racks):
        if job.gpu_models and model not in job.gpu_models:
            continue
        if ws.quota_by_model and model not in ws.quota_by_model:
            continue
        if ws.node_pools and not any(c.pool in ws.node_pools
                                     for _, cells in state.model_racks[model] for c in cells):
            continue
        models.append(model)
    return tuple(models)


def _no_node_reason(job: Job, ws: Workspace) -> str:
    parts = []
    if job.gpu_models:
        parts.append(f"GPU model {' or '.join(sorted(job.gpu_models))}")
    if ws.quota_by_model:
        parts.append(f"a GPU model in workspace {ws.name}'s quota "
                     f"({', '.join(sorted(ws.quota_by_model))})")
    if ws.node_pools:
        parts.append(f"pool {' or '.join(sorted(ws.node_pools))}")
    return "no ready node" + (" with " + " and ".join(parts) if parts else "")


def _model_phrase(models: tuple[str, ...]) -> str:
    return f" with GPU model {' or '.join(models)}" if len(models) <= 3 else ""
