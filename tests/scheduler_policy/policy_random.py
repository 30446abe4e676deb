"""Seeded random clusters and workloads for the policy's property tests."""

from __future__ import annotations

import random
from dataclasses import replace

from services.scheduler.policy import Allocation, Job, Node, Snapshot, Workspace

PRIOS = ["low", "medium", "high"]


def random_nodes(rng: random.Random) -> list[Node]:
    nodes = []
    models = ["MI300X", "MI250X"][: rng.randint(1, 2)]
    for r in range(rng.randint(1, 5)):
        model = rng.choice(models)
        switch = f"s{rng.randint(0, 1)}"
        for i in range(rng.randint(1, 6)):
            gpus = rng.choice([8, 8, 8, 4])
            state = rng.choices(["ready", "quarantined", "unready"], [12, 2, 1])[0]
            nodes.append(Node(f"r{r}-n{i}", gpus, model, rack=f"r{r}", switch=switch,
                              ip=f"10.0.{r}.{rng.randint(1, 250)}", state=state,  # type: ignore[arg-type]
                              pool=rng.choice(["default", "default", "spot"])))
    return nodes


def random_workspaces(rng: random.Random) -> list[Workspace]:
    out = []
    for name in ["a", "b", "c"][: rng.randint(1, 3)]:
        quota = rng.choice([None, None, rng.randint(8, 96)])
        by_model = {"MI300X": rng.randint(8, 64)} if rng.random() < 0.15 else {}
        pools = frozenset({"default"}) if rng.random() < 0.2 else frozenset()
        out.append(Workspace(name, quota_gpus=quota, quota_by_model=by_model, node_pools=pools,
                             queue_policy=rng.choice(["fifo", "balance"]),
                             preemption=rng.random() < 0.8))
    return out


def random_job(rng: random.Random, id: str, spaces: list[Workspace], nodes: list[Node],
               now: float) -> Job:
    per = rng.choice([1, 2, 4, 8, 8])
    workers = rng.choice([1, 1, 2, 3, 4, 6, 8])
    unit, scope = 1, "node"
    if rng.random() < 0.25:
        unit = rng.choice([2, 4])
        scope = rng.choice(["node", "rack"])
        if rng.random() < 0.9:
            workers = unit * rng.randint(1, 3)
    names = [n.name for n in nodes]
    recovering = rng.random() < 0.1
    return Job(
        id=id, workspace=rng.choice([s.name for s in spaces] + ["a"]), workers=workers,
        gpus_per_worker=per, priority=rng.choices(PRIOS + ["urgent"], [5, 4, 2, 0.2])[0],
        submitted_at=now - rng.randint(0, 1000), min_runtime_s=rng.choice([0, 100, 600]),
        preemptible=rng.random() < 0.85,
        gpu_models=frozenset({rng.choice(["MI300X", "MI250X", "H100"])})
        if rng.random() < 0.2 else frozenset(),
        unit_workers=unit, unit_scope=scope,  # type: ignore[arg-type]
        recovering=recovering,
        exclude_nodes=frozenset(rng.sample(names, min(2, len(names)))) if recovering
        else frozenset(),
        prefer_nodes=frozenset(rng.sample(names, 1)) if rng.random() < 0.1 else frozenset(),
        expected_runtime_s=rng.uniform(10, 5000) if rng.random() < 0.5 else None)


def random_running(rng: random.Random, nodes: list[Node], spaces: list[Workspace],
                   now: float) -> list[Allocation]:
    free = {n.name: n.gpus for n in nodes}
    out = []
    for k in range(rng.randint(0, 2 * len(nodes))):
        j = random_job(rng, f"run{k}", spaces, nodes, now)
        if j.priority == "urgent" or j.workspace not in {s.name for s in spaces}:
            continue
        slots = []
        for _ in range(j.workers):
            options = [n for n in free if free[n] >= j.gpus_per_worker]
            if not options:
                break
            node = rng.choice(options)
            free[node] -= j.gpus_per_worker
            slots.append((node, j.gpus_per_worker))
        if len(slots) < j.workers:
            for node, g in slots:
                free[node] += g
            continue
        started = now - rng.uniform(0, 2000)
        out.append(Allocation(replace(j, started_at=started), tuple(slots),
                              terminating=rng.random() < 0.08))
    return out


def random_snapshot(seed: int, now: float) -> Snapshot:
    rng = random.Random(seed)
    nodes = random_nodes(rng)
    spaces = random_workspaces(rng)
    run = random_running(rng, nodes, spaces, now)
    pending = [random_job(rng, f"p{k}", spaces, nodes, now) for k in range(rng.randint(1, 25))]
    return Snapshot(nodes, spaces, run, pending)
