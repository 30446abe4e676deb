"""Builders and checks shared by the scheduling policy tests.

Scenarios are data: racks of nodes, running jobs, queued jobs and a config
go in; the expected binds, evictions and reasons come out. ``check_cycle``
asserts the invariants every cycle must keep, whatever the workload.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from services.scheduler.policy import (
    Allocation,
    CycleResult,
    Job,
    Node,
    SchedulerConfig,
    Snapshot,
    Workspace,
    schedule,
)

NOW = 100_000.0


def rack(name: str, count: int, *, gpus: int = 8, model: str = "MI300X", switch: str = "s0",
         subnet: int = 0, first: int = 1, state: str = "ready", pool: str = "default",
         prefix: str | None = None) -> list[Node]:
    """``count`` nodes named <rack>-n<i> with IPs 10.<subnet>.<rack#>.<first+i>."""
    base = prefix or name
    rack_no = int("".join(ch for ch in name if ch.isdigit()) or 0)
    return [Node(f"{base}-n{i}", gpus, model, rack=name, switch=switch,
                 ip=f"10.{subnet}.{rack_no}.{first + i}", state=state, pool=pool)  # type: ignore[arg-type]
            for i in range(count)]


def job(id: str, workers: int = 1, gpus: int = 8, *, ws: str = "ws", prio: str = "medium",
        at: float = 0.0, **kw: Any) -> Job:
    for key in ("gpu_models", "exclude_nodes", "prefer_nodes"):
        if key in kw and not isinstance(kw[key], frozenset):
            kw[key] = frozenset(kw[key])
    return Job(id=id, workspace=ws, workers=workers, gpus_per_worker=gpus, priority=prio,
               submitted_at=at, **kw)


def running(j: Job, nodes: list[str] | list[tuple[str, int]], *, started: float = 0.0,
            terminating: bool = False) -> Allocation:
    slots = tuple(n if isinstance(n, tuple) else (n, j.gpus_per_worker) for n in nodes)
    from dataclasses import replace

    return Allocation(replace(j, started_at=started), slots, terminating)


@dataclass
class Scenario:
    name: str
    nodes: list[Node]
    pending: list[Job]
    running: list[Allocation] = field(default_factory=list)
    workspaces: list[Workspace] = field(default_factory=lambda: [Workspace("ws")])
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    placed: dict[str, list[str] | set[str]] = field(default_factory=dict)
    """job -> node per rank (list), or the set of racks it must use."""
    pending_codes: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    """job -> substring its pending reason must contain."""
    preempted: set[tuple[str, str]] | None = None
    """(victim, preemptor) pairs; None: not checked."""
    nominated: dict[str, set[str]] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    carried: dict[str, list[str]] = field(default_factory=dict)
    """Reservations carried over from the previous cycle."""
    reserved: dict[str, set[str]] | None = None
    """job -> nodes this cycle holds for it; None: not checked."""

    def snapshot(self) -> Snapshot:
        return Snapshot(self.nodes, self.workspaces, self.running, self.pending, self.carried)


def run(s: Scenario) -> CycleResult:
    result = schedule(s.snapshot(), s.config, NOW)
    check_cycle(s.snapshot(), s.config, result)
    return result


def racks_of(nodes: list[Node], names: list[str]) -> set[str]:
    by_name = {n.name: n for n in nodes}
    return {by_name[n].rack for n in names}


def check_cycle(snap: Snapshot, config: SchedulerConfig, result: CycleResult) -> None:
    """Invariants of any cycle, on any input."""
    nodes = {n.name: n for n in snap.nodes}
    jobs = {j.id: j for j in snap.pending}
    used: dict[str, int] = defaultdict(int)
    victims = {p.victim for p in result.preemptions}
    for alloc in snap.running:
        for name, g in alloc.slots:
            used[name] += g
    ws_used: dict[tuple[str, str], int] = defaultdict(int)
    for alloc in snap.running:
        if not alloc.terminating and alloc.job.id not in victims:
            for name, g in alloc.slots:
                if name in nodes:
                    ws_used[(alloc.job.workspace, nodes[name].gpu_model)] += g
    grew: set[str] = set()
    grew_models: set[tuple[str, str]] = set()
    for plan in (result.placements, result.nominations):
        for job_id, slots in plan.items():
            j = jobs[job_id]
            assert len(slots) == j.workers, f"{job_id}: gang not whole"
            models = {nodes[n].gpu_model for n, _ in slots}
            assert len(models) == 1, f"{job_id}: mixed GPU models {models}"
            assert not j.gpu_models or models <= j.gpu_models
            for rank, (name, g) in enumerate(slots):
                node = nodes[name]
                assert node.state == "ready", f"{job_id} on {node.state} node {name}"
                assert name not in j.exclude_nodes, f"{job_id} on excluded {name}"
                assert g == j.gpus_per_worker
                if rank and j.unit_workers > 1 and rank % j.unit_workers:
                    prev = nodes[slots[rank - 1][0]]
                    if j.unit_scope == "node":
                        assert prev.name == name, f"{job_id}: node unit straddles nodes"
                    else:
                        assert prev.rack == node.rack, f"{job_id}: rack unit straddles racks"
            ws_used[(j.workspace, next(iter(models)))] += j.gpus
            grew.add(j.workspace)
            grew_models.add((j.workspace, next(iter(models))))
    for name, g in (s for slots in result.placements.values() for s in slots):
        used[name] += g
    for name, total in used.items():
        if name in nodes:
            assert total <= nodes[name].gpus, f"{name} over-committed: {total}"
    spaces = {w.name: w for w in snap.workspaces}
    for ws in grew:
        space = spaces[ws]
        total = sum(g for (w, _), g in ws_used.items() if w == ws)
        cap = space.quota_gpus
        assert cap is None or total <= cap, f"{ws} over quota: {total}/{cap}"
        for w, model in grew_models:
            if w == ws and space.quota_by_model:
                g = ws_used[(w, model)]
                assert g <= space.quota_by_model.get(model, 0), f"{ws} over {model} quota"
    for p in result.preemptions:
        assert p.victim != p.preemptor
        assert p.requeue.preempted and p.requeue.started_at is None
    placed = set(result.placements)
    assert placed.isdisjoint(result.pending)
    assert placed | set(result.pending) == set(jobs) - {a.job.id for a in snap.running}
    per_ws: dict[str, list[int]] = defaultdict(list)
    for job_id, pend in result.pending.items():
        assert pend.reason, f"{job_id} has no reason"
        per_ws[jobs[job_id].workspace].append(pend.position)
    for positions in per_ws.values():
        assert sorted(positions) == list(range(1, len(positions) + 1))
