"""Holding capacity for a blocked queue head so that backfill cannot starve it.

When the head of a queue does not fit, jobs behind it (balance queues) and
jobs of other queues may still start, but not on the GPUs the head needs.
We pick where the head will wait, on a *capacity* view (as if every job on
the candidate nodes had ended): fewest racks first, then the racks whose
nodes already have the most free GPUs (least left to drain). Within them
the nodes expected to drain soonest win; a head that fits on one node waits,
across every node it may use, where enough GPUs for it are expected to free
up soonest (a 4-GPU head next to a job about to end, not on the node that
empties first). A job with an ``expected_runtime_s``
ends when that says; a job without one is expected to run about as long
again as it has run so far (job run times are heavy-tailed: a job that has
run for a day is likely to run for another, one that started a minute ago
likely ends soon). The free GPUs of the chosen nodes are held; the rest of
each node drains as its jobs end and nothing new lands there. The choice is
made again every cycle, so a head moves to a node expected to be ready in
under half the time its own still needs (``MOVE_WHEN``).

The one exception is EASY-style backfill: a job whose ``expected_runtime_s``
ends before the hold's ``until`` (the latest expected end of the jobs it waits
for; infinite when any is unknown) may borrow held GPUs, since it will be
gone before the head could have used them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from .domains import ChoiceKey, RackCap, choose_racks
from .request import Request
from .state import INF, NOMINATED, PLACED, RESERVATION, Alloc, ClusterState
from .topology import Cell


def reservation_name(job_id: str) -> str:
    return f"reserve:{job_id}"


def reserve(state: ClusterState, req: Request, *, now: float,
            carried: Collection[int] = ()) -> bool:
    """Hold free GPUs for ``req`` where it will fit soonest; False if the
    ready nodes could not hold it even empty (nothing to wait for).
    ``carried``: the nodes it held last cycle (see ``MOVE_WHEN``)."""
    with state.what_if():
        for i in req.exclude:
            state.mask(i)
        for held in state.holds.values():
            if held.kind == RESERVATION:
                for i in held.per_node:
                    state.mask(i)
        plan = _shadow(state, req, now, carried)
        if plan is None:
            return False
        per_node = {i: min(state.eff_free(i), slots * req.slot_gpus)
                    for i, slots in plan.items()}
        until = _until(state, req, plan, now)
    state.hold(reservation_name(req.job.id), RESERVATION, req.job.id, per_node, until)
    return True


def _shadow(state: ClusterState, req: Request, now: float,
            carried: Collection[int]) -> dict[int, int] | None:
    sg, ru, pools = req.slot_gpus, req.rack_unit, req.pools
    drain = _Drain(state, now, carried)
    if req.slots == 1:
        return _one_node(state, req, drain)
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
        _drain_order_pick(state, rack.cells, units * ru, sg, taken, drain)
    return taken


MOVE_WHEN = 0.5
"""A reservation leaves the nodes it held last cycle only for nodes
expected to hold the job in less than this share of the time those still
need (for a gang: within the racks chosen, a node held last cycle counts
this share of its expected drain time). Expected run times grow with a
job's age (as long again as it has run), so the nodes being drained look
later every cycle while nodes that just took young jobs look soon: without
this the hold could follow young jobs from node to node and give what a
held node had already freed to the next job."""


class _Drain:
    """Expected seconds until each node's jobs have ended (cached per call),
    and until enough of them have ended to free a given number of GPUs;
    for the nodes held last cycle, scaled by ``MOVE_WHEN``."""

    def __init__(self, state: ClusterState, now: float,
                 carried: Collection[int] = ()) -> None:
        self.state = state
        self.now = now
        self.carried = carried
        self.cache: dict[int, list[tuple[float, int]]] = {}

    def _left(self, alloc: Alloc) -> float:
        """Expected seconds left: as declared, else as long again as it ran."""
        started = _started(alloc, self.now)
        runtime = alloc.job.expected_runtime_s
        return started + runtime - self.now if runtime is not None else self.now - started

    def _ends(self, i: int) -> list[tuple[float, int]]:
        ends = self.cache.get(i)
        if ends is None:
            ends = self.cache[i] = _ends(self.state, i, self._left)
        return ends

    def __call__(self, i: int) -> float:
        ends = self._ends(i)
        return self._kept(i, max(0.0, ends[-1][0]) if ends else 0.0)

    def _kept(self, i: int, seconds: float) -> float:
        return seconds * MOVE_WHEN if i in self.carried else seconds

    def until_free(self, i: int, gpus: int) -> float:
        """Expected seconds until node ``i`` has ``gpus`` free: a 2-GPU slot
        waits for the first two GPUs to free up, not for the whole node to
        drain."""
        free = self.state.eff_free(i)
        if free >= gpus:
            return 0.0
        at = _freed_at(self._ends(i), free, gpus)
        return INF if at is None else self._kept(i, max(0.0, at))


def _ends(state: ClusterState, i: int, end: Callable[[Alloc], float]) -> list[tuple[float, int]]:
    """(``end`` of the job, GPUs it holds on node ``i``) of each job there,
    soonest first."""
    out = []
    for job_id in state.node_jobs(i):
        alloc = state.allocs.get(job_id)
        if alloc is not None:
            out.append((end(alloc), alloc.per_node.get(i, 0)))
    out.sort()
    return out


def _freed_at(ends: list[tuple[float, int]], free: int, need: int) -> float | None:
    """When ``need`` GPUs are free on a node with ``free`` free now, as its
    jobs end in ``ends`` order; None if even all of them ending is too few."""
    for at, gpus in ends:
        free += gpus
        if free >= need:
            return at
    return None


def _nodes(cells: list[Cell]) -> list[int]:
    return [i for c in cells for bucket in c.buckets for i in bucket]


def _one_node(state: ClusterState, req: Request, drain: _Drain) -> dict[int, int] | None:
    """The node that will hold the slot soonest, of every node that can."""
    sg, pools = req.slot_gpus, req.pools
    best: tuple[float, int, int] | None = None
    for model in req.models:
        for _, cells in state.model_racks[model]:
            for i in _nodes([c for c in cells if pools is None or c.pool in pools]):
                if state.gpus[i] >= sg:
                    key = (drain.until_free(i, sg), -state.eff_free(i), i)
                    if best is None or key < best:
                        best = key
    return None if best is None else {best[2]: 1}


def _drain_order_pick(state: ClusterState, cells: list[Cell], slots: int, sg: int,
                      taken: dict[int, int], drain: _Drain) -> None:
    """Nodes expected to drain soonest first, then the most free GPUs, then
    IP order, by capacity."""
    remaining = slots
    for i in sorted(_nodes(cells), key=lambda i: (drain(i), -state.eff_free(i), i)):
        k = min(state.gpus[i] // sg, remaining)
        if k > 0:
            taken[i] = k
            remaining -= k
            if remaining == 0:
                return


def _until(state: ClusterState, req: Request, plan: dict[int, int], now: float) -> float:
    """When the head is expected to fit on its nodes: on each node, the
    expected end of the last of the jobs that must end to free the GPUs it
    needs there (the soonest-ending first); infinite when one of those has
    no ``expected_runtime_s``."""

    def declared_end(alloc: Alloc) -> float:
        runtime = alloc.job.expected_runtime_s
        return INF if runtime is None else _started(alloc, now) + runtime

    until = now
    for i, slots in plan.items():
        free, need = state.eff_free(i), slots * req.slot_gpus
        if need <= free:
            continue
        ends = _ends(state, i, declared_end)
        at = _freed_at(ends, free, need)
        if at is None:  # never enough (GPUs held by others): when all have ended
            at = ends[-1][0] if ends else now
        until = max(until, at)
        if until == INF:
            return INF
    return until


def _started(alloc: Alloc, now: float) -> float:
    """When a job holding GPUs started: now for one placed this cycle."""
    job = alloc.job
    if alloc.kind in (PLACED, NOMINATED) or job.started_at is None:
        return now
    return job.started_at
