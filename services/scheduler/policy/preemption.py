"""Choosing whom to preempt for a blocked job. Deciding only: nothing here
acts (the shell's ``issue_preemptions`` checkpoints and requeues the victims).

A victim must have a strictly lower priority than the preemptor, be marked
preemptible, have run at least its ``min_runtime_s``, hold no more GPUs than
the preemptor asks for (unless ``preempt_larger_jobs``: evicting an 8-GPU
gang for a 1-GPU job hands seven GPUs to other small jobs and sends the gang
back to wait for a whole node), and (unless the config allows preemption
across workspaces) belong to the preemptor's workspace.
Because priorities never change and victims are strictly lower, a victim
can never evict its preemptor in return: preemption cannot cycle.

The set is the fewest victims, then the cheapest (lowest priority, then
no larger than the preemptor, then least GPU-seconds lost): one victim
is tried first, cheapest first; otherwise victims are released lowest
priority and largest first until the job fits, then every victim that is
not needed after all is spared, most expensive first: those the placement
found does not need at once (no search, so even a search out of budget
evicts only what that placement needs), then, while the search budget lasts,
any without which the job still fits somewhere. Within the budget the result
is minimal (no victim can be dropped), a bounded-cost stand-in for the
NP-hard minimum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .model import SchedulerConfig
from .placement import Found
from .request import Request
from .state import RUNNING, Alloc, ClusterState


@dataclass(frozen=True, slots=True)
class VictimChoice:
    victims: tuple[Alloc, ...]
    found: Found
    """Where the preemptor goes once the victims have released their GPUs."""


Fits = Callable[[], "Found | None"]


def eligible(alloc: Alloc, req: Request, *, now: float, config: SchedulerConfig,
             state: ClusterState) -> bool:
    """Whether ``alloc``'s job may be preempted for ``req``."""
    victim = alloc.job
    if alloc.kind != RUNNING or not victim.preemptible or victim.started_at is None:
        return False
    if config.priorities.get(victim.priority, -1) >= req.priority:
        return False
    if now - victim.started_at < victim.min_runtime_s:
        return False
    if alloc.gpus > req.need and not config.preempt_larger_jobs:
        # The victim's GPUs would mostly go to other small jobs, and the
        # victim would wait for a whole block again: a net loss of capacity.
        return False
    if victim.workspace == req.job.workspace:
        return True
    ws = state.workspaces.get(victim.workspace)
    return config.cross_workspace_preemption and ws is not None and ws.preemption


def gpu_seconds(alloc: Alloc, now: float) -> float:
    started = alloc.job.started_at
    return alloc.gpus * max(0.0, now - started) if started is not None else 0.0


def select_victims(state: ClusterState, req: Request, candidates: Sequence[Alloc], *,
                   now: float, priorities: Mapping[str, int], fits: Fits, max_checks: int,
                   quota_short: int = 0) -> VictimChoice | None:
    """Pick victims among ``candidates`` (already ``eligible``) so that
    ``fits()`` succeeds once they are gone. ``quota_short``: GPUs the
    preemptor's workspace must give back before its quota has room. Pure:
    every change is undone."""
    usable = _usable_gpus(state, req, candidates)
    ws = req.job.workspace
    quota = {a.job.id: a.gpus if a.job.workspace == ws else 0 for a in candidates}
    pool = [a for a in candidates if usable[a.job.id] or (quota_short and quota[a.job.id])]
    free = state.free_gpus(req.models, req.pools)
    need = req.need

    def may_fit(freed: int, returned: int) -> bool:
        """Necessary, cheap: enough usable GPUs and enough quota back."""
        return free + freed >= need and returned >= quota_short

    if not pool or not may_fit(sum(usable[a.job.id] for a in pool),
                               sum(quota[a.job.id] for a in pool)):
        return None
    cost = {a.job.id: (priorities.get(a.job.priority, 0), gpu_seconds(a, now), a.job.id)
            for a in pool}
    checks = 0
    # One victim: lowest priority, then one no larger than the job (with
    # ``preempt_larger_jobs``, evicting an 8-GPU gang for a 1-GPU job leaves
    # the gang waiting for a whole node again), then least work lost.
    single = sorted(pool, key=lambda a: (cost[a.job.id][0], max(0, usable[a.job.id] - need),
                                         cost[a.job.id][1], a.job.id))
    for alloc in single:
        if checks >= max_checks // 2:
            break
        if not may_fit(usable[alloc.job.id], quota[alloc.job.id]):
            continue
        checks += 1
        with state.what_if():
            state.release(alloc.job.id)
            found = fits()
        if found is not None:
            return VictimChoice((alloc,), found)
    order = sorted(pool, key=lambda a: (cost[a.job.id][0], -usable[a.job.id],
                                        cost[a.job.id][1], a.job.id))
    return _greedy(state, order, cost, usable, quota, fits=fits, budget=max_checks - checks,
                   may_fit=may_fit, quota_short=quota_short)


def _greedy(state: ClusterState, order: list[Alloc], cost: dict[str, tuple[int, float, str]],
            usable: dict[str, int], quota: dict[str, int], *, fits: Fits, budget: int,
            may_fit: Callable[[int, int], bool], quota_short: int) -> VictimChoice | None:
    """Release in ``order`` until the job fits, then spare every victim
    that turns out not to be needed: first, without a search, each one the
    placement found does not need; then, while the budget lasts, each one
    without which the job still fits somewhere, most expensive first."""
    checks = 0
    with state.what_if():
        released: list[Alloc] = []
        found: Found | None = None
        enough = False
        freed = returned = 0
        for alloc in order:
            state.release(alloc.job.id)
            released.append(alloc)
            freed += usable[alloc.job.id]
            returned += quota[alloc.job.id]
            enough = enough or may_fit(freed, returned)
            if enough and checks < budget:
                checks += 1
                found = fits()
                if found is not None:
                    break
        if found is None and enough and checks >= budget:
            found = fits()
        if found is None:
            return None
        _spare_outside(state, released, found, cost, quota, returned, quota_short)
        for alloc in sorted(released, key=lambda a: cost[a.job.id], reverse=True):
            if checks >= budget or len(released) == 1:
                break
            checks += 1
            with state.what_if() as spare:
                state.allocate(alloc.job, alloc.per_node, alloc.kind)
                kept = fits()
                if kept is not None:
                    spare.commit()
                    found = kept
                    released.remove(alloc)
        victims = tuple(sorted(released, key=lambda a: cost[a.job.id]))
    return VictimChoice(victims, found)


def _spare_outside(state: ClusterState, released: list[Alloc], found: Found,
                   cost: dict[str, tuple[int, float, str]], quota: dict[str, int],
                   returned: int, quota_short: int) -> None:
    """Give back their GPUs to the victims ``found`` can do without, most
    expensive first: the placement keeps the free GPUs it takes on each of
    its nodes, and the quota it needs back (``returned`` of ``quota_short``
    so far). Exact and cheap (no search), so a search that ran out of budget
    with many victims released still evicts only what the placement needs."""
    for alloc in sorted(released, key=lambda a: cost[a.job.id], reverse=True):
        if len(released) == 1:
            break
        back = quota[alloc.job.id]
        if returned - back < quota_short:
            continue
        with state.what_if() as spare:
            state.allocate(alloc.job, alloc.per_node, alloc.kind)
            if all(state.eff_free(i) >= g for i, g in found.per_node.items()):
                spare.commit()
                released.remove(alloc)
                returned -= back


def _usable_gpus(state: ClusterState, req: Request,
                 candidates: Sequence[Alloc]) -> dict[str, int]:
    """GPUs each candidate holds on nodes the request could use."""
    models = set(req.models)
    pools = req.pools
    exclude = set(req.exclude)
    out: dict[str, int] = {}
    for alloc in candidates:
        total = 0
        for i, g in alloc.per_node.items():
            cell = state.cell_of[i]
            if cell is None or cell.model not in models or i in exclude:
                continue
            if pools is not None and cell.pool not in pools:
                continue
            total += g
        out[alloc.job.id] = total
    return out
