"""Replay a real Alibaba GPU cluster trace through the scheduler policy.

Virtual time, whole-GPU tasks only (``num_gpu >= 1`` and ``gpu_milli == 1000``,
or ``num_gpu > 1``); each task is one worker of ``num_gpu`` GPUs on one node.
QoS maps to priority (LS -> high, Guaranteed/Burstable -> medium, BE -> low);
arrival = ``creation_time``, run time = ``deletion_time - scheduled_time``
(tasks never scheduled in the trace are skipped, and so are tasks no kept
node could hold: pinned to GPU models the kept nodes lack, or larger than
any of them; both are counted in the output). Racks are synthesised from
the sorted node names (32 nodes a rack, 8 racks a switch), IPs from the
rack and slot. The same arrivals go through two plain FIFO baselines,
first-fit (first node in name order) and best-fit (tightest node), in the
same run. All three are measured on GPU allocation over time, over the
whole arrival window and over its contended part (while tasks queue),
queueing delay per priority and per size class (1, 2-4, 5-7, 8, >8 GPUs),
GPU-weighted wait, job completion time (arrival to end), fragmentation
(free GPUs stranded on partly used nodes, over the whole window, while
tasks queue, and while tasks queue under all three), GPUs held idle for
blocked jobs (the policy's reservations) and preemptions, and drawn in one
PNG (needs matplotlib). The JSON line holds every figure with its ratio to each
baseline.

The trace's whole-GPU tasks ask for far less than its 6,212 GPUs (peak ~60
GPUs in real time), so by default arrivals are compressed 1,000x and every
4th node is kept: the replay then has real contention. ``--speedup 1
--node-fraction 1`` replays it as recorded. Pod lists without time or QoS
columns (the ``multigpu50`` resample) borrow them by pod name from the
``..._default.csv`` list next to them.

``--load L`` divides every arrival time by L (L times the arrival rate), so
the cluster is contended for most of the replay.

Run: ``python bench/scheduler_trace.py [NODES.csv PODS.csv] [--load 2]``. The
last line printed is one JSON object with every figure. A file it cannot
use (missing, a column missing, a cell that is not a number, a pod listed
twice, nothing to replay) stops it with one line on stderr that names the
file, the line or column and the fix, and exit status 2.
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.alibaba_trace import (  # noqa: E402
    WORKSPACE,
    Task,
    TraceError,
    load_nodes,
    load_tasks,
    placeable,
)
from services.scheduler.policy import (  # noqa: E402
    Allocation,
    Job,
    Node,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from services.scheduler.policy.baseline import BestFit, FirstFit  # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
RESULTS = Path(__file__).resolve().parent / "results"
NODES_CSV = TRACES / "alibaba-gpu-v2023-openb_node_list_gpu_node.csv"
PODS_CSV = TRACES / "alibaba-gpu-v2023-openb_pod_list_default.csv"
PRIORITIES = ("high", "medium", "low")
SIZES = (("1", 1, 1), ("2-4", 2, 4), ("5-7", 5, 7), ("8", 8, 8), (">8", 9, 1 << 30))
SCHEDULERS = {"policy": None, "fifo first-fit": FirstFit, "fifo best-fit": BestFit}


@dataclass
class Metrics:
    samples: list[tuple[float, float, float, int, float, float]] = field(default_factory=list)
    """(time, allocated fraction, stranded fraction of free GPUs, queue length,
    fraction of free GPUs held for blocked jobs, free GPUs held for blocked
    jobs as a fraction of all GPUs)."""
    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    cycles: int = 0
    decide_s: float = 0.0
    reservations: dict[str, tuple[str, ...]] = field(default_factory=dict)


def replay(nodes: list[Node], tasks: list[Task], *, policy: bool | str,
           cycle_s: float) -> Metrics:
    """``policy``: True or "policy" for the scheduler's policy, False or
    "fifo first-fit", or "fifo best-fit"."""
    name = "policy" if policy is True else "fifo first-fit" if policy is False else policy
    baseline = SCHEDULERS[name]
    policy = baseline is None
    capacity = {n.name: n.gpus for n in nodes}
    total = sum(capacity.values())
    used = dict.fromkeys(capacity, 0)
    left = {t.job.id: t.duration for t in tasks}
    pending: dict[str, Job] = {}
    live: dict[str, Allocation] = {}
    ends: list[tuple[float, str, int]] = []
    generation: dict[str, int] = {}
    first_fit = baseline(nodes) if baseline is not None else None
    config = SchedulerConfig()
    m = Metrics()
    now, i = 0.0, 0
    while i < len(tasks) or pending or live:
        changed = False
        while ends and ends[0][0] <= now:
            _, jid, gen = heapq.heappop(ends)
            if generation.get(jid) == gen and jid in live:
                _release(live.pop(jid), used, first_fit)
                m.finished[jid] = now
                changed = True
        for jid in [j for j, a in live.items() if a.terminating]:
            _release(live.pop(jid), used, first_fit)
            changed = True
        while i < len(tasks) and tasks[i].arrival <= now:
            pending[tasks[i].job.id] = tasks[i].job
            i += 1
            changed = True
        if changed and pending:
            m.cycles += 1
            t0 = time.perf_counter()
            if policy:
                placed = _policy_cycle(nodes, live, pending, config, now, left, m)
            else:
                placed = _fifo_cycle(first_fit, pending)  # type: ignore[arg-type]
            m.decide_s += time.perf_counter() - t0
            for jid, slots in placed.items():
                job = replace(pending.pop(jid), started_at=now)
                live[jid] = Allocation(job, slots)
                for node, g in slots:
                    used[node] += g
                m.started.setdefault(jid, now)
                generation[jid] = generation.get(jid, 0) + 1
                heapq.heappush(ends, (now + left[jid], jid, generation[jid]))
        held = {n for names in m.reservations.values() for n in names}
        stranded, reserved = _stranded(used, capacity, held)
        m.samples.append((now, sum(used.values()) / total, stranded, len(pending),
                          reserved, sum(capacity[n] - used[n] for n in held) / total))
        upcoming = [t for t in (tasks[i].arrival if i < len(tasks) else None,
                                ends[0][0] if ends else None) if t is not None]
        if any(a.terminating for a in live.values()):
            upcoming.append(now)
        if not upcoming:
            break
        now = max(now + cycle_s, min(upcoming))
    m.samples.append((now, 0.0, 0.0, len(pending), 0.0, 0.0))
    return m


def _policy_cycle(nodes: list[Node], live: dict[str, Allocation], pending: dict[str, Job],
                  config: SchedulerConfig, now: float, left: dict[str, float],
                  m: Metrics) -> dict[str, tuple[tuple[str, int], ...]]:
    snap = Snapshot(nodes, [WORKSPACE], list(live.values()), list(pending.values()),
                    m.reservations)
    result = schedule(snap, config, now)
    m.reservations = dict(result.reservations)
    for p in result.preemptions:
        victim = live[p.victim]
        left[p.victim] -= now - (victim.job.started_at or now)
        live[p.victim] = replace(victim, terminating=True)
        pending[p.victim] = p.requeue
        m.preemptions += 1
    return dict(result.placements)


def _fifo_cycle(ff: FirstFit, pending: dict[str, Job]) -> dict[str, tuple[tuple[str, int], ...]]:
    placed = {}
    for job in sorted(pending.values(), key=lambda j: (j.submitted_at, j.id)):
        slots = ff.decide(job)
        if slots is not None:
            placed[job.id] = slots
    return placed


def _release(alloc: Allocation, used: dict[str, int], ff: FirstFit | None) -> None:
    for node, g in alloc.slots:
        used[node] -= g
    if ff is not None:
        ff.release(alloc.slots)


def _stranded(used: dict[str, int], capacity: dict[str, int],
              held: set[str]) -> tuple[float, float]:
    """Fractions of the free GPUs that sit on partly used nodes (stranded
    for whole-node tasks), and that sit on nodes held for a blocked job."""
    free = stranded = reserved = 0
    for node, u in used.items():
        f = capacity[node] - u
        free += f
        if node in held:
            reserved += f
        elif 0 < u < capacity[node]:
            stranded += f
    return (stranded / free, reserved / free) if free else (0.0, 0.0)


def _mean_p99(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0]
    return statistics.fmean(values), statistics.quantiles(values, n=100,
                                                          method="inclusive")[98]


def scheduling_window(m: Metrics, tasks: list[Task]) -> float:
    """From the first arrival until the last task has started (or the last
    arrival, if later): the part of the replay in which a scheduler decides
    anything. After it the cluster only drains the trace's month-long tasks."""
    last_arrival = tasks[-1].arrival if tasks else 0.0
    return max(last_arrival, max(m.started.values(), default=0.0))


def summarise(m: Metrics, tasks: list[Task], window: float | None = None) -> dict[str, Any]:
    """Time-weighted means over the scheduling window (``window``: its end;
    by default this run's own, see ``scheduling_window``; runs compared
    with each other share the latest). The contended window is the part of
    it with tasks queued: there a policy shows what it does with GPUs that
    something is waiting for."""
    if window is None:
        window = scheduling_window(m, tasks)
    span = [(min(b[0], window) - a[0], a) for a, b in zip(m.samples, m.samples[1:], strict=False)
            if a[0] < window]
    weight = sum(w for w, _ in span) or 1.0
    contended = [(w, s) for w, s in span if s[3] > 0]
    contended_weight = sum(w for w, _ in contended)
    out: dict[str, Any] = {
        "window_s": window,
        "mean_allocation": sum(w * s[1] for w, s in span) / weight,
        "contended_share": contended_weight / weight,
        "contended_allocation": (sum(w * s[1] for w, s in contended) / contended_weight
                                 if contended_weight else None),
        "peak_allocation": max((s[1] for _, s in span), default=0.0),
        "mean_stranded_free": sum(w * s[2] for w, s in span) / weight,
        "contended_stranded_free": (sum(w * s[2] for w, s in contended) / contended_weight
                                    if contended_weight else None),
        "mean_reserved_free": sum(w * s[4] for w, s in span) / weight,
        "reserved_idle_share": sum(w * s[5] for w, s in span) / weight,
        "mean_queue": sum(w * s[3] for w, s in span) / weight,
        "preemptions": m.preemptions, "cycles": m.cycles,
        "ms_per_cycle": 1e3 * m.decide_s / max(1, m.cycles),
        "unstarted": sum(1 for t in tasks if t.job.id not in m.started)}
    started = [t for t in tasks if t.job.id in m.started]
    gpus = sum(t.job.gpus_per_worker for t in started)
    out["gpu_weighted_mean_wait_s"] = (sum((m.started[t.job.id] - t.arrival)
                                           * t.job.gpus_per_worker for t in started) / gpus
                                       if gpus else 0.0)
    classes = [(prio, lambda t, p=prio: t.job.priority == p) for prio in PRIORITIES]
    classes += [(f"{label}gpu", lambda t, lo=lo, hi=hi: lo <= t.job.gpus_per_worker <= hi)
                for label, lo, hi in SIZES]
    for name, member in classes:
        waits = [m.started[t.job.id] - t.arrival for t in started if member(t)]
        if waits:
            out[f"{name}_mean_wait_s"], out[f"{name}_p99_wait_s"] = _mean_p99(waits)
            out[f"{name}_tasks"] = len(waits)
        jct = [m.finished[t.job.id] - t.arrival for t in started
               if member(t) and t.job.id in m.finished]
        if jct:
            out[f"{name}_mean_jct_s"], out[f"{name}_p99_jct_s"] = _mean_p99(jct)
    eight = [m.started[t.job.id] - t.arrival for t in started if t.job.gpus_per_worker >= 8]
    out["8gpu_mean_wait_s"] = statistics.fmean(eight) if eight else 0.0
    return out


def plot(path: Path, runs: dict[str, Metrics], window: float) -> str:
    """Allocation, stranded free GPUs and queue length over the scheduling
    window (and a quarter beyond), one line per scheduler."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for label, m in runs.items():
        samples = [s for s in m.samples if s[0] <= window * 1.25]
        t = [s[0] / 3600 for s in samples]
        axes[0].step(t, [100 * s[1] for s in samples], where="post", label=label, lw=0.8)
        axes[1].step(t, [100 * s[2] for s in samples], where="post", label=label, lw=0.8)
        axes[2].step(t, [s[3] for s in samples], where="post", label=label, lw=0.8)
    axes[0].set_ylabel("GPUs allocated (%)")
    axes[1].set_ylabel("free GPUs stranded\non partly used nodes (%)")
    axes[2].set_ylabel("queued tasks")
    axes[2].set_xlabel("virtual time (h)")
    axes[0].legend()
    axes[0].set_title("Alibaba GPU trace replay: policy vs FIFO first-fit and best-fit")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


GOALS = {
    "contended_allocation": "allocation while tasks queue >= the better baseline",
    "high_mean_wait_s": "high-priority mean wait <= the better baseline",
    "high_p99_wait_s": "high-priority p99 wait <= the better baseline",
    "gpu_weighted_mean_wait_s": "GPU-weighted mean wait <= 1.1 x the better baseline",
    "8gpu_mean_wait_s": "tasks of >= 8 GPUs: mean wait <= 1.25 x FIFO first-fit's",
    "reserved_idle_share": "GPUs held idle for blocked jobs <= 2% of all",
    "contended_stranded_free":
        "free GPUs stranded on partly used nodes while tasks queue < FIFO first-fit's",
}


def goals(pol: dict[str, Any], ff: dict[str, Any], bf: dict[str, Any]) -> dict[str, bool]:
    """Issue 20's goals for one replay: figure -> met."""
    def low(key: str) -> float:
        return min(ff[key], bf[key])

    return {
        # None: no task ever queued under that scheduler. Under the policy
        # that meets both contended goals (no GPU sat idle or stranded
        # while anything waited); a baseline's sets no bar for allocation
        # and a bar of zero for stranded GPUs.
        "contended_allocation": pol["contended_allocation"] is None
        or pol["contended_allocation"]
        >= max(ff["contended_allocation"] or 0.0, bf["contended_allocation"] or 0.0),
        "high_mean_wait_s": pol.get("high_mean_wait_s", 0.0) <= low("high_mean_wait_s")
        if "high_mean_wait_s" in ff else True,
        "high_p99_wait_s": pol.get("high_p99_wait_s", 0.0) <= low("high_p99_wait_s")
        if "high_p99_wait_s" in ff else True,
        "gpu_weighted_mean_wait_s":
            pol["gpu_weighted_mean_wait_s"] <= 1.1 * low("gpu_weighted_mean_wait_s"),
        "8gpu_mean_wait_s": pol["8gpu_mean_wait_s"] <= 1.25 * ff["8gpu_mean_wait_s"],
        "reserved_idle_share": pol["reserved_idle_share"] <= 0.02,
        "contended_stranded_free": pol["contended_stranded_free"] is None
        or pol["contended_stranded_free"] < (ff["contended_stranded_free"] or 0.0),
    }


def shared_contention(runs: dict[str, Metrics], window: float) -> dict[str, dict[str, Any]]:
    """Per run, over the part of the window in which every run has tasks
    queued: that part's share of the window, and the run's allocation and
    stranded share of free GPUs there (None when there is no such part).

    Each run's own "while tasks queue" figures weigh a different stretch of
    the replay: a scheduler that queues less, and at busier times, is
    measured where fewer GPUs are free and more of those are stranded. Over
    the stretch they all queue, the figures compare placement alone."""
    names = list(runs)
    samples = {n: [s for s in runs[n].samples if s[0] < window] for n in names}
    times = sorted({s[0] for n in names for s in samples[n]} | {window})
    at = dict.fromkeys(names, -1)
    shared = 0.0
    sums = {n: [0.0, 0.0] for n in names}
    for start, end in zip(times, times[1:], strict=False):
        now: dict[str, tuple[float, ...]] = {}
        for n in names:
            seq = samples[n]
            while at[n] + 1 < len(seq) and seq[at[n] + 1][0] <= start:
                at[n] += 1
            if at[n] >= 0:
                now[n] = seq[at[n]]
        if len(now) < len(names) or not all(s[3] > 0 for s in now.values()):
            continue
        w = end - start
        shared += w
        for n, s in now.items():
            sums[n][0] += w * s[1]
            sums[n][1] += w * s[2]
    span = window - min((s[0] for seq in samples.values() for s in seq[:1]), default=window)
    return {n: {"shared_contended_share": shared / span if span > 0 else 0.0,
                "shared_contended_allocation": sums[n][0] / shared if shared else None,
                "shared_contended_stranded_free": sums[n][1] / shared if shared else None}
            for n in names}


def compare(nodes_csv: Path, pods_csv: Path, *, speedup: float, load: float,
            node_fraction: float, rack_size: int, cycle_s: float, min_runtime_s: float,
            plot_to: Path | None) -> dict[str, Any]:
    """The policy and both baselines over one trace at one load: every
    figure, its ratios to both baselines, and the goals met."""
    nodes = load_nodes(nodes_csv, rack_size=rack_size, fraction=node_fraction)
    tasks, skipped = load_tasks(pods_csv, speedup=speedup, min_runtime_s=min_runtime_s,
                                load=load)
    tasks, never = placeable(nodes, tasks)
    skipped["no_node_can_hold"] = len(never)
    if not tasks:
        raise TraceError(f"{pods_csv}: no task fits any of the {len(nodes)} nodes kept from "
                         f"{nodes_csv} (GPU models or sizes differ); pass the node list of "
                         f"the same trace or a larger --node-fraction")
    runs, wall = {}, {}
    for name in SCHEDULERS:
        t0 = time.perf_counter()
        runs[name] = replay(nodes, tasks, policy=name, cycle_s=cycle_s)
        wall[name] = time.perf_counter() - t0
    window = max(scheduling_window(m, tasks) for m in runs.values())
    shared = shared_contention(runs, window)
    figures = {name: {**summarise(m, tasks, window), **shared[name]} for name, m in runs.items()}
    pol, ff, bf = (figures[n] for n in SCHEDULERS)
    where = plot(plot_to, runs, window) if plot_to is not None else "not drawn"
    ratios = {key: {"first_fit": _ratio(value, ff.get(key)),
                    "best_fit": _ratio(value, bf.get(key))}
              for key, value in pol.items() if isinstance(value, float)}
    return {
        "trace": pods_csv.name.rsplit("_pod_list_", 1)[-1].removesuffix(".csv"),
        "policy": _rounded(pol), "fifo_first_fit": _rounded(ff), "fifo_best_fit": _rounded(bf),
        "ratios": ratios, "goals": goals(pol, ff, bf), "plot": where,
        "replay_s": {k: round(v, 1) for k, v in wall.items()},
        "nodes": len(nodes), "gpus": sum(n.gpus for n in nodes),
        "racks": len({n.rack for n in nodes}),
        "tasks": len(tasks), "skipped": skipped, "speedup": speedup, "load": load,
        "node_fraction": node_fraction, "pods_csv": pods_csv.name}


def _print_one(r: dict[str, Any]) -> None:
    pol, ff, bf = r["policy"], r["fifo_first_fit"], r["fifo_best_fit"]
    print(f"{r['pods_csv']}: {r['nodes']} nodes / {r['gpus']} GPUs in {r['racks']} racks; "
          f"{r['tasks']} whole-GPU tasks (skipped {r['skipped']}); speedup {r['speedup']:g}x, "
          f"load {r['load']:g}x")
    print(f"  {'':28} {'policy':>12} {'first-fit':>12} {'best-fit':>12}")
    for key in pol:
        mark = "" if key not in r["goals"] else "  goal met" if r["goals"][key] else "  GOAL MISSED"
        print(f"  {key:28} {_fmt(pol[key]):>12} {_fmt(ff.get(key, '')):>12} "
              f"{_fmt(bf.get(key, '')):>12}{mark}")
    print(f"plot: {r['plot']}; policy replay took {r['replay_s']['policy']:.1f}s")


def _compare_star(kw: dict[str, Any]) -> dict[str, Any]:
    return compare(**kw)


def table(results: list[dict[str, Any]]) -> str:
    """A Markdown table: per trace and load, policy / first-fit / best-fit."""
    cols = [("contended allocation", "contended_allocation", "{:.3f}"),
            ("high mean wait s", "high_mean_wait_s", "{:,.0f}"),
            ("high p99 wait s", "high_p99_wait_s", "{:,.0f}"),
            ("GPU-weighted wait s", "gpu_weighted_mean_wait_s", "{:,.0f}"),
            (">=8-GPU mean wait s", "8gpu_mean_wait_s", "{:,.0f}"),
            ("stranded free while queued", "contended_stranded_free", "{:.3f}"),
            ("stranded free while all queue", "shared_contended_stranded_free", "{:.3f}"),
            ("reserved idle", "reserved_idle_share", "{:.4f}")]
    out = ["| trace | load | " + " | ".join(c[0] for c in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for r in results:
        cells = []
        for _, key, fmt in cols:
            vals = [r[k].get(key) for k in ("policy", "fifo_first_fit", "fifo_best_fit")]
            text = " / ".join("-" if v is None else fmt.format(v) for v in vals)
            cells.append(text + ("" if r["goals"].get(key, True) else " ✗"))
        out.append(f"| {r['trace']} | {r['load']:g} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes_csv", nargs="?", type=Path, default=NODES_CSV)
    parser.add_argument("pods_csv", nargs="?", type=Path, default=PODS_CSV)
    parser.add_argument("--speedup", type=_positive, default=1000.0)
    parser.add_argument("--load", type=_positive, default=1.0,
                        help="arrivals this many times as fast (contention for most of the run)")
    parser.add_argument("--all", action="store_true",
                        help="every pod list next to PODS.csv at every --loads; writes "
                             "bench/results/scheduler_trace.md and one plot per trace")
    parser.add_argument("--loads", type=_loads, default="1,2,4",
                        help="loads for --all (comma separated)")
    parser.add_argument("--jobs", type=_at_least_one, default=os.cpu_count() or 1,
                        help="replays run at once with --all")
    parser.add_argument("--node-fraction", type=_fraction, default=0.25,
                        help="keep every 1/F-th node of the sorted node list (0 < F <= 1)")
    parser.add_argument("--rack-size", type=_at_least_one, default=32)
    parser.add_argument("--cycle-s", type=_positive, default=10.0)
    parser.add_argument("--min-runtime-s", type=float, default=600.0)
    parser.add_argument("--plot", type=Path, default=RESULTS / "scheduler_trace.png",
                        help="where one replay draws its plot (--all draws one per trace, "
                             "bench/results/scheduler_trace_<trace>.png)")
    args = parser.parse_args()
    try:
        _run(args)
    except TraceError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def _positive(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0")
    return value


def _fraction(text: str) -> float:
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1]")
    return value


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return value


def _loads(text: str) -> list[float]:
    loads = [_positive(x.strip()) for x in text.split(",") if x.strip()]
    if not loads:
        raise argparse.ArgumentTypeError("no load given (e.g. 1,2,4)")
    return loads


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None


def _run(args: argparse.Namespace) -> None:
    common = {"speedup": args.speedup, "node_fraction": args.node_fraction,
              "rack_size": args.rack_size, "cycle_s": args.cycle_s,
              "min_runtime_s": args.min_runtime_s}
    if not args.all:
        r = compare(args.nodes_csv, args.pods_csv, load=args.load, plot_to=args.plot, **common)
        _print_one(r)
        pol, ff, bf = r["policy"], r["fifo_first_fit"], r["fifo_best_fit"]
        print(json.dumps({
            "name": "scheduler_trace_contended_gpu_allocation",
            "value": pol["contended_allocation"], "unit": "fraction",
            "baseline": ff["contended_allocation"], "baseline_name": "FIFO first-fit",
            "ratio": _ratio(pol["contended_allocation"], ff["contended_allocation"]),
            "ratio_best_fit": _ratio(pol["contended_allocation"], bf["contended_allocation"]),
            **r}))
        return
    pod_lists = sorted(args.pods_csv.parent.glob("*_pod_list_*.csv"))
    if not pod_lists:
        raise TraceError(f"{args.pods_csv.parent}: no *_pod_list_*.csv to replay; pass a pod "
                         f"list in the folder that holds the trace's pod lists")
    loads = args.loads
    work = [{"nodes_csv": args.nodes_csv, "pods_csv": pods, "load": load,
             "plot_to": RESULTS / f"scheduler_trace_{_variant(pods)}.png" if load == loads[0]
             else None, **common} for pods in pod_lists for load in loads]
    with multiprocessing.Pool(max(1, min(args.jobs, len(work)))) as pool:
        results = pool.map(_compare_star, work, chunksize=1)
    for r in results:
        _print_one(r)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scheduler_trace.md").write_text(table(results))
    met = sum(v for r in results for v in r["goals"].values())
    total = sum(len(r["goals"]) for r in results)
    missed = {f"{r['trace']}@{r['load']:g}": [k for k, v in r["goals"].items() if not v]
              for r in results if not all(r["goals"].values())}
    print(f"goals met: {met}/{total}; table: {RESULTS / 'scheduler_trace.md'}")
    print(json.dumps({
        "name": "scheduler_trace_goals_met", "value": met, "unit": "goals", "of": total,
        "missed": missed,
        "runs": [{k: r[k] for k in ("trace", "load", "goals", "ratios", "policy",
                                    "fifo_first_fit", "fifo_best_fit")} for r in results]}))


def _variant(pods: Path) -> str:
    return pods.name.rsplit("_pod_list_", 1)[-1].removesuffix(".csv")


def _ratio(value: Any, base: Any) -> float | None:
    """value / base, rounded; None where either is missing or base is 0."""
    if not isinstance(value, int | float) or not isinstance(base, int | float) or not base:
        return None
    return round(value / base, 4)


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _fmt(v: object) -> str:
    return f"{v:,.3f}" if isinstance(v, float) else "-" if v is None else str(v)


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _round(v) for k, v in d.items()}


if __name__ == "__main__":
    main()
