"""Scheduler policy at cluster scale: gang decisions per second and latency.

A simulated 12,500-node x 8-GPU cluster (100,000 GPUs) in 100 racks under 10
switches, two GPU models, four workspaces (FIFO and balance queues, two with
quotas), already loaded to about 70% by running jobs, and 10,000 queued jobs
mixing 1- to 1,024-GPU gangs over three priorities (some with rack-scoped
parallelism units, GPU-model constraints, excluded nodes or runtime
estimates). One scheduling cycle decides every queued job; each decision is
timed on its own. The same queue goes through a plain FIFO first-fit
scheduler (``services.scheduler.policy.baseline``) on the same cluster.

Two more scenarios run the same queue on a heterogeneous cluster of about
as many GPUs: the node shapes of a real one, Alibaba's 2026 spot GPU trace
(``../shared/traces/alibaba-spot-gpu-v2026-node_info_df.csv``: 4,278 nodes
of 1, 4 or 8 GPUs over six models, two thirds of them 1-GPU nodes),
repeated in the trace's node order, racks of the same size. There a job
pinned to a model is pinned to one of those six; without the file they are
left out, with a note.

Both schedulers run with Python's cyclic garbage collector paused, as the
scheduler service runs a cycle (``libs/gc_pause.py``): with it running, its
passes over the process's heap were a third to half of a cycle.

Run: ``python bench/scheduler_scale.py`` (``--quick`` for a 10x smaller run).
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.gc_pause import paused_gc  # noqa: E402
from services.scheduler.policy import (  # noqa: E402
    Allocation,
    Cycle,
    Job,
    Node,
    SchedulerConfig,
    Snapshot,
    Workspace,
    schedule,
)
from services.scheduler.policy.baseline import FirstFit  # noqa: E402

SIZES = [(1, 30), (2, 10), (4, 10), (8, 20), (16, 10), (32, 8), (64, 6), (128, 3),
         (256, 1.5), (512, 1.0), (1024, 0.5)]
PRIORITIES = [("low", 60), ("medium", 30), ("high", 10)]
SPOT_NODES = (Path(__file__).resolve().parents[2] / "shared" / "traces"
              / "alibaba-spot-gpu-v2026-node_info_df.csv")
SPOT_COLUMNS = ("gpu_model", "gpu_capacity_num", "node_name")
WORKSPACES = [
    Workspace("train-a", queue_policy="fifo"),
    Workspace("train-b", queue_policy="balance"),
    Workspace("research", queue_policy="balance", quota_gpus=20_000),
    Workspace("eval", queue_policy="fifo", quota_gpus=8_000),
]


def build_cluster(racks: int, per_rack: int, *, switches: int, seed: int) -> list[Node]:
    rng = random.Random(seed)
    nodes = []
    for r in range(racks):
        model = "MI300X" if r < racks * 4 // 5 else "MI325X"
        for i in range(per_rack):
            state = "ready" if rng.random() > 0.01 else "quarantined"
            nodes.append(Node(f"gpu-{r:03d}-{i:03d}", 8, model, rack=f"r{r:03d}",
                              switch=f"s{r % switches:02d}", ip=f"10.{r // 200}.{r % 200}.{i + 1}",
                              state=state))
    rng.shuffle(nodes)
    return nodes


def spot_cluster(path: Path, *, gpus: int, per_rack: int, switches: int,
                 seed: int) -> list[Node]:
    """The nodes of ``path`` (the spot trace's node list) repeated until
    they have at least ``gpus`` GPUs, ``per_rack`` to a rack in file order."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in SPOT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"{path}: no column {', '.join(missing)}; pass the node list "
                             f"of Alibaba's cluster-trace-v2026-spot-gpu")
        shapes = []
        for row in reader:
            try:
                shapes.append((row["node_name"], row["gpu_model"], int(row["gpu_capacity_num"])))
            except ValueError:
                raise SystemExit(f"{path}:{reader.line_num}: gpu_capacity_num="
                                 f"{row['gpu_capacity_num']!r} is not a whole number; "
                                 f"correct that row or delete it") from None
    per_copy = sum(g for _, _, g in shapes)
    if per_copy <= 0:
        raise SystemExit(f"{path}: no node with GPUs; pass the spot trace's node list")
    rng = random.Random(seed)
    nodes: list[Node] = []
    for copy in range(-(-gpus // per_copy)):
        for name, model, count in shapes:
            i = len(nodes)
            r = i // per_rack
            state = "ready" if rng.random() > 0.01 else "quarantined"
            nodes.append(Node(f"spot{copy}-{name}", count, model, rack=f"r{r:04d}",
                              switch=f"s{r % switches:02d}",
                              ip=f"10.{r // 200}.{r % 200}.{i % per_rack + 1}", state=state))
    return nodes


def make_jobs(n: int, *, seed: int, prefix: str, now: float, nodes: list[Node],
              pins: tuple[str, ...] = ("MI325X",)) -> list[Job]:
    """``n`` queued jobs; one in ten is pinned to a GPU model of ``pins``
    (in turn, so the random draws are the same for any ``pins``)."""
    rng = random.Random(seed)
    sizes, size_w = zip(*SIZES, strict=True)
    prios, prio_w = zip(*PRIORITIES, strict=True)
    jobs = []
    for k in range(n):
        gpus = rng.choices(sizes, size_w)[0]
        workers, per = (1, gpus) if gpus <= 8 else (gpus // 8, 8)
        unit, scope = 1, "node"
        if workers >= 8 and rng.random() < 0.3:
            unit, scope = 4, "rack"
        elif gpus >= 16 and rng.random() < 0.2:
            workers, per, unit = gpus // 4, 4, 2
        recovering = rng.random() < 0.01
        jobs.append(Job(
            id=f"{prefix}{k:05d}", workspace=rng.choice(WORKSPACES).name,
            workers=workers, gpus_per_worker=per, priority=rng.choices(prios, prio_w)[0],
            submitted_at=now - rng.uniform(0, 3600), min_runtime_s=600,
            gpu_models=frozenset({pins[k % len(pins)]}) if rng.random() < 0.1 else frozenset(),
            unit_workers=unit, unit_scope=scope, recovering=recovering,
            exclude_nodes=frozenset(rng.choice(nodes).name for _ in range(2)) if recovering
            else frozenset(),
            expected_runtime_s=rng.uniform(600, 36_000) if rng.random() < 0.5 else None))
    return jobs


def warm_cluster(nodes: list[Node], *, load: float, seed: int, now: float,
                 pins: tuple[str, ...] = ("MI325X",)) -> list[Allocation]:
    """Running jobs filling about ``load`` of the cluster, placed by the policy."""
    capacity = sum(n.gpus for n in nodes if n.state == "ready")
    jobs = make_jobs(12_000, seed=seed + 1, prefix="run-", now=now - 7200, nodes=nodes,
                     pins=pins)
    spaces = [Workspace(w.name, queue_policy="balance") for w in WORKSPACES]
    result = schedule(Snapshot(nodes, spaces, (), jobs), SchedulerConfig(), now - 7200)
    rng = random.Random(seed + 2)
    by_id = {j.id: j for j in jobs}
    running, used = [], 0
    for job_id, slots in result.placements.items():
        if used >= load * capacity:
            break
        job = by_id[job_id]
        started = now - rng.uniform(0, 7200)
        running.append(Allocation(replace(job, started_at=started), slots))
        used += job.gpus
    return running


def run_policy(snapshot: Snapshot, now: float) -> dict[str, Any]:
    gc.collect()
    with paused_gc():  # as the scheduler service runs a cycle
        start = time.perf_counter()
        cycle = Cycle(snapshot, SchedulerConfig(), now, clock=time.perf_counter)
        latencies = []
        codes: dict[str, int] = {}
        for job in cycle.queue:
            t0 = time.perf_counter()
            code = cycle.decide(job)
            latencies.append(time.perf_counter() - t0)
            codes[code] = codes.get(code, 0) + 1
        t0 = time.perf_counter()
        result = cycle.explain()
        explain_s = time.perf_counter() - t0
        total = time.perf_counter() - start
        placed_gpus = sum(g for slots in result.placements.values() for _, g in slots)
        return {**_latency_figures(latencies), "cycle_s": total, "explain_s": explain_s,
                "snapshot_s": cycle.step_seconds["snapshot"], "placed": len(result.placements),
                "placed_gpus": placed_gpus, "preemptions": len(result.preemptions),
                "codes": codes}


def run_baseline(snapshot: Snapshot) -> dict[str, Any]:
    gc.collect()
    with paused_gc():  # as the scheduler service runs a cycle
        start = time.perf_counter()
        ff = FirstFit(snapshot.nodes, snapshot.running)
        latencies = []
        placed = placed_gpus = 0
        for job in sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id)):
            t0 = time.perf_counter()
            slots = ff.decide(job)
            latencies.append(time.perf_counter() - t0)
            if slots is not None:
                placed += 1
                placed_gpus += job.gpus
        return {**_latency_figures(latencies), "cycle_s": time.perf_counter() - start,
                "placed": placed, "placed_gpus": placed_gpus}


def _latency_figures(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"decisions": len(ordered), "decisions_per_s": len(ordered) / sum(ordered),
            "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": ordered[-1] * 1e3}


def peak_mib(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    with paused_gc():  # what a cycle holds in the service, its cyclic garbage included
        fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def report(name: str, fig: dict[str, Any], base: dict[str, Any], shape: dict[str, Any]) -> None:
    rows = [("gang decisions/s", "decisions_per_s", "{:,.0f}"), ("p50 latency (ms)", "p50_ms",
            "{:.3f}"), ("p99 latency (ms)", "p99_ms", "{:.3f}"), ("max latency (ms)", "max_ms",
            "{:.2f}"), ("whole cycle (s)", "cycle_s", "{:.2f}"), ("jobs placed", "placed",
            "{:,}"), ("GPUs placed", "placed_gpus", "{:,}"), ("peak memory (MiB)", "peak_mib",
            "{:.1f}")]
    title = (f"{name}: {shape['nodes']:,} nodes / {shape['gpus']:,} GPUs / {shape['racks']} "
             f"racks, {shape['running']:,} running, {shape['queued']:,} queued")
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for col in ("figure", "policy", "fifo first-fit"):
            table.add_column(col, justify="right")
        for label, key, fmt in rows:
            table.add_row(label, fmt.format(fig[key]), fmt.format(base[key]))
        Console(width=100).print(table)
    except ImportError:
        print(title)
        for label, key, fmt in rows:
            print(f"  {label:20} {fmt.format(fig[key]):>14} {fmt.format(base[key]):>14}")
    print(f"  policy: snapshot {fig['snapshot_s'] * 1e3:.0f} ms, explain "
          f"{fig['explain_s'] * 1e3:.0f} ms, preemptions {fig['preemptions']}, "
          f"outcomes {fig['codes']}")


def scenarios(args: argparse.Namespace, now: float) -> dict[str, Snapshot]:
    nodes = build_cluster(args.racks, args.nodes_per_rack, switches=10, seed=args.seed)
    pending = make_jobs(args.jobs, seed=args.seed + 3, prefix="job-", now=now, nodes=nodes)
    running = warm_cluster(nodes, load=args.load, seed=args.seed, now=now)
    balance = [replace(w, queue_policy="balance") for w in WORKSPACES]
    out = {
        f"loaded {args.load:.0%}, FIFO and balance queues":
            Snapshot(nodes, WORKSPACES, running, pending),
        "empty cluster, every queue balance (every job searches)":
            Snapshot(nodes, balance, (), pending),
    }
    if not args.spot_nodes.exists():
        print(f"note: {args.spot_nodes} not found; the heterogeneous scenarios are left out",
              file=sys.stderr)
        return out
    spot = spot_cluster(args.spot_nodes, gpus=sum(n.gpus for n in nodes),
                        per_rack=args.nodes_per_rack, switches=10, seed=args.seed)
    pins = tuple(sorted({n.gpu_model for n in spot}))
    pending = make_jobs(args.jobs, seed=args.seed + 3, prefix="job-", now=now, nodes=spot,
                        pins=pins)
    running = warm_cluster(spot, load=args.load, seed=args.seed, now=now, pins=pins)
    out[f"heterogeneous (spot trace shapes), loaded {args.load:.0%}"] = \
        Snapshot(spot, WORKSPACES, running, pending)
    out["heterogeneous (spot trace shapes), empty, every queue balance"] = \
        Snapshot(spot, balance, (), pending)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--nodes-per-rack", type=int, default=125)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--load", type=float, default=0.7, help="fraction already running")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10x smaller cluster and queue")
    parser.add_argument("--spot-nodes", type=Path, default=SPOT_NODES,
                        help="node list of the heterogeneous scenarios")
    args = parser.parse_args()
    if args.quick:
        args.racks, args.jobs = 10, 1_000
    now = 1_000_000.0
    results = {}
    for name, snap in scenarios(args, now).items():
        fig = run_policy(snap, now)
        base = run_baseline(snap)
        fig["peak_mib"] = peak_mib(lambda snap=snap: schedule(snap, SchedulerConfig(), now))
        base["peak_mib"] = peak_mib(lambda snap=snap: run_baseline(snap))
        shape = {"nodes": len(snap.nodes), "gpus": sum(n.gpus for n in snap.nodes),
                 "racks": len({n.rack for n in snap.nodes}), "running": len(snap.running),
                 "queued": len(snap.pending)}
        report(name, fig, base, shape)
        results[name] = (fig, base, shape)
    # The headline is the worse scenario for each figure.
    worst = min(results.values(), key=lambda r: r[0]["decisions_per_s"])
    fig, base, shape = worst
    p99 = max(r[0]["p99_ms"] for r in results.values())
    cycle_s = max(r[0]["cycle_s"] for r in results.values())
    print(json.dumps({
        "name": "scheduler_scale_gang_decisions_per_s", "value": round(fig["decisions_per_s"], 1),
        "unit": "decisions/s", "baseline": round(base["decisions_per_s"], 1),
        "ratio": round(fig["decisions_per_s"] / base["decisions_per_s"], 3),
        "p99_ms": round(p99, 4), "cycle_s": round(cycle_s, 3),
        "goal": {"decisions_per_s": 10_000, "p99_ms": 5, "cycle_s": 1.0},
        "meets_goal": fig["decisions_per_s"] >= 10_000 and p99 <= 5 and cycle_s < 1.0,
        "scenarios": {name: {"policy": _rounded(f), "fifo_first_fit": _rounded(b), **sh}
                      for name, (f, b, sh) in results.items()},
    }))


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


if __name__ == "__main__":
    main()
