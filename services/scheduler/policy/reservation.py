"""Holding capacity for a blocked queue head so that backfill cannot starve it.

When the head of a queue does not fit, jobs behind it (balance queues) and
jobs of other queues may still start, but not on the GPUs the head needs.
We pick where the head will wait, on a *capacity* view (as if every job on
the candidate nodes had ended): fewest racks first, then the racks whose
nodes already have the most free GPUs (least left to drain). The free GPUs of
those nodes are held; the rest of each node drains as its jobs end and
nothing new lands there. Across cycles the GPUs still to drain never grow
(the previous choice stays available and only gets emptier), so the head
starts once enough of the jobs in its way have ended.

The one exception is EASY-style backfill: a job whose ``expected_runtime_s``
ends before the hold's ``until`` (the latest expected end of the jobs it waits
for; infinite when any is unknown) may borrow held GPUs, since it will be
gone before the head could have used them.
"""

from __future__ import annotations

from .domains import ChoiceKey, RackCap, choose_racks
from .request import Request
from .state import NOMINATED, PLACED, RESERVATION, ClusterState
from .topology import Cell


def reservation_name(job_id: str) -> str:
    return f"reserve:{job_id}"


def reserve(state: ClusterState, req: Request, *, now: float) -> bool:
    """Hold free GPUs for ``req`` where it will fit soonest; False if the
    ready nodes could not hold it even empty (nothing to wait for)."""
    with state.what_if():
        for i in req.exclude:
            state.mask(i)
        for held in state.holds.values():
            if held.kind == RESERVATION:
                for i in held.per_node:
                    state.mask(i)
        plan = _shadow(state, req)
        if plan is None:
            return False
        per_node = {i: min(state.eff_free(i), slots * req.slot_gpus)
                    for i, slots in plan.items()}
        until = _until(state, req, plan, now)
    state.hold(reservation_name(req.job.id), RESERVATION, req.job.id, per_node, until)
    return True


def _shadow(state: ClusterState, req: Request) -> dict[int, int] | None:
    sg, ru, pools = req.slot_gpus, req.rack_unit, req.pools
    best: tuple[ChoiceKey, list[tuple[RackCap, int]]] | None = None
    for model in req.models:
        caps: list[RackCap] = []
        for rack_id, cells in state.model_racks[model]:
            usable = [c for c in cells if pools is None or c.pool in pools]
            units = sum(c.capacity_slots(sg) for c in usable) // ru
            if units:
                free_now = sum(c.slots(sg) for c in usable) * sg
                caps.append(RackCap(rack_id, state.rack_switch[rack_id], units, -free_now,
                                    0, usable))
        chosen = choose_racks(caps, req.units)
        if chosen is not None and (best is None or chosen[0] < best[0]):
            best = chosen
    if best is None:
        return None
    taken: dict[int, int] = {}
    for rack, units in best[1]:
        _drain_order_pick(state, rack.cells, units * ru, sg, taken)
    return taken


def _drain_order_pick(state: ClusterState, cells: list[Cell], slots: int, sg: int,
                      taken: dict[int, int]) -> None:
    """Nodes with the most free GPUs first (then IP order), by capacity."""
    top = max(len(c.hist) for c in cells) - 1
    remaining = slots
    for f in range(top, -1, -1):
        nodes = sorted(i for c in cells if f < len(c.buckets) for i in c.buckets[f])
        for i in nodes:
            k = min(state.gpus[i] // sg, remaining)
            if k > 0:
                taken[i] = k
                remaining -= k
                if remaining == 0:
                    return


def _until(state: ClusterState, req: Request, plan: dict[int, int], now: float) -> float:
    """Latest expected end of the jobs holding GPUs the head still needs."""
    until = now
    for i, slots in plan.items():
        if slots * req.slot_gpus <= state.eff_free(i):
            continue
        for job_id in state.node_jobs(i):
            alloc = state.allocs.get(job_id)
            if alloc is None:
                continue
            job = alloc.job
            if job.expected_runtime_s is None:
                return float("inf")
            start = now if alloc.kind in (PLACED, NOMINATED) or job.started_at is None \
                else job.started_at
            until = max(until, start + job.expected_runtime_s)
    return until
