"""Does the standard bench level find a node that is 10% slow?

Starts a real nats-server, the bench coordinator and N bench agents (local
"nodes", each its own process group) with the shipped standard-level
configuration, slows one node down, and runs the standard level on every
node, one node at a time (a real fleet runs them in parallel on separate
hardware; here they share two cores), for R repetitions after one warm-up
sweep that gives the coordinator its fleet. Each run ends with the
coordinator's verdict, which includes the retry of a run that looked bad.

Slowing a node: a CPU-share throttle. The slowed agent's process group is
stopped (SIGSTOP) and continued (SIGCONT) so that for every second of CPU it
uses it stands still for s/(1-s) seconds (s = 0.10): the node does 10% less
work per second of its time, whatever else the machine runs. Its CPU time is
read from a cgroup-v1 ``cpuacct`` group made for it when the machine allows
(root), else summed over the group's threads from /proc. (A CFS quota would
only bite when the node could otherwise get more than the quota, which on a
shared, busy machine it often cannot.)

Recall: runs in which the slowed node's verdict is degraded or failed.
False-positive rate: healthy nodes' runs with such a verdict.

    .venv/bin/python bench/bench_detection.py [--nodes 8] [--reps 20] [--slowdown 0.10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libs.bus import Bus  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.events import BenchRequest, BenchRequestData, BenchResult, parse_event  # noqa: E402
from libs.service import health_subject  # noqa: E402

CGROUP = Path("/sys/fs/cgroup/cpuacct")
KEY_FIGURES = ("gemm_fp32_512_tflops", "membw_triad_gbps", "train_tokens_per_s",
               "allreduce_1MiB_busbw_gbps")


# --------------------------------------------------------------------------- throttle


class CpuMeter:
    """CPU seconds used so far by a process group."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.group: Path | None = None
        self._pids: list[int] = []
        self._refreshed = 0.0
        with contextlib.suppress(OSError):
            group = CGROUP / f"primus-bench-{os.getpid()}"
            group.mkdir()
            (group / "cgroup.procs").write_text(str(pgid))
            self.group = group
        self.method = "cgroup-v1 cpuacct" if self.group else "/proc schedstat"

    def seconds(self) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        if time.monotonic() - self._refreshed > 0.25:
            self._pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                          and _pgid(p) == self.pgid]
            self._refreshed = time.monotonic()
        total = 0
        for pid in self._pids:
            for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(stat.read_text().split()[0])
        return total / 1e9

    def close(self) -> None:
        if self.group is None:
            return
        with contextlib.suppress(OSError):
            for pid in (self.group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CGROUP / "cgroup.procs").write_text(pid)
            self.group.rmdir()


def _pgid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


class Throttle(threading.Thread):
    """Stops a process group s/(1-s) seconds per CPU second it uses."""

    def __init__(self, pgid: int, share: float, tick_s: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.pgid, self.share, self.tick_s = pgid, share, tick_s
        self.meter = CpuMeter(pgid)
        self.stopped_s = 0.0
        self.cpu_s = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        last = self.meter.seconds()
        debt = 0.0
        while not self._done.wait(self.tick_s):
            now = self.meter.seconds()
            self.cpu_s += now - last
            debt += (now - last) * self.share / (1 - self.share)
            last = now
            if debt < 0.0005:
                continue
            t0 = time.perf_counter()
            try:
                os.killpg(self.pgid, signal.SIGSTOP)
                time.sleep(debt)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, signal.SIGCONT)
            held = time.perf_counter() - t0
            debt -= held
            self.stopped_s += held

    def stop(self) -> None:
        self._done.set()
        self.join(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGCONT)
        self.meter.close()


# --------------------------------------------------------------------------- the fleet


class Fleet:
    def __init__(self, workdir: Path, nodes: int, config: Path | None) -> None:
        self.workdir = workdir
        self.nodes = [f"node-{i}" for i in range(1, nodes + 1)]
        self.nats = NatsServer(workdir / "nats")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.config = config
        self.results: dict[str, list[BenchResult]] = {}
        self.arrived = asyncio.Event()
        self.bus: Bus | None = None

    def start(self) -> None:
        self.nats.start(self.workdir / "nats.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        env.update(PRIMUS_NATS_URL=self.nats.url, PRIMUS_STATE_DIR=str(self.workdir / "state"),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PRIMUS_LOG_LEVEL="warning")
        if self.config is not None:
            env["PRIMUS_BENCH_CONFIG"] = str(self.config)
        verbs = [("coordinator", ["bench-coordinator"])] + [
            (n, ["bench-agent", "--node", n]) for n in self.nodes]
        for name, args in verbs:
            with (self.workdir / f"{name}.log").open("wb") as log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    async def connect(self) -> None:
        self.bus = await Bus.connect(self.nats.url, "bench-detection")
        await self.bus.nc.subscribe("safe.bench.*.result", cb=self._on_result)
        for name in ["bench-coordinator", *self.nodes]:
            service, node = ("bench-agent", name) if name.startswith("node-") else (name, None)
            deadline = time.monotonic() + 120
            while True:
                try:
                    await self.bus.request(health_subject(service, node), timeout_s=1)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)

    async def _on_result(self, msg: Any) -> None:
        event = parse_event(msg.data)
        if isinstance(event, BenchResult):
            key = event.data.retry_of or event.data.request_id or ""
            self.results.setdefault(key, []).append(event)
            self.arrived.set()

    async def standard(self, node: str, timeout_s: float = 300) -> dict[str, Any]:
        """One standard run on ``node`` up to the coordinator's verdict."""
        assert self.bus is not None
        request = BenchRequest(source="bench-detection", node=node,
                               data=BenchRequestData(level="standard", reason="detection bench"))
        t0 = time.monotonic()
        await self.bus.publish(request)
        while True:
            got = self.results.get(request.id, [])
            verdict = next((e for e in got if e.data.judged_by == "coordinator"), None)
            if verdict is not None:
                break
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no verdict for {node} within {timeout_s} s")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 1.0)
        runs = [e for e in got if e.data.judged_by == "agent"]
        first = min(runs, key=lambda e: e.data.attempt)
        score = next((f.value for f in verdict.data.figures if f.name == "node_score_vs_fleet"),
                     None)
        return {"node": node, "outcome": verdict.data.outcome, "reason": verdict.data.reason,
                "retried": len(runs) > 1, "seconds": first.data.duration_s,
                "wall_s": time.monotonic() - t0, "score": score,
                "figures": {f.name: f.value for f in first.data.figures}}

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.nats.stop()


# --------------------------------------------------------------------------- main


async def campaign(fleet: Fleet, args: argparse.Namespace, slow: str) -> list[dict[str, Any]]:
    await fleet.connect()
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    for rep in range(-args.warmup, args.reps):
        order = list(fleet.nodes)
        rng.shuffle(order)
        t0 = time.monotonic()
        for node in order:
            run = await fleet.standard(node)
            run.update(rep=rep, slowed=node == slow)
            if rep >= 0:
                runs.append(run)
        if rep < 0:
            print(f"warm-up sweep {rep + args.warmup + 1}/{args.warmup} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            continue
        flagged = [r["node"] for r in runs if r["rep"] == rep and r["outcome"] != "healthy"]
        print(f"rep {rep + 1:2d}/{args.reps}: flagged {flagged or '-'} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    return runs


def summarise(runs: list[dict[str, Any]], nodes: list[str], slow: str) -> dict[str, Any]:
    print(f"\n{'node':8} {'slowed':6} {'flagged':>7} {'retried':>7} {'score':>6} "
          + " ".join(f"{k[:22]:>22}" for k in KEY_FIGURES))
    for node in nodes:
        mine = [r for r in runs if r["node"] == node]
        flagged = sum(r["outcome"] != "healthy" for r in mine)
        scores = [r["score"] for r in mine if r["score"] is not None]
        figs = [statistics.median(r["figures"].get(k, float("nan")) for r in mine)
                for k in KEY_FIGURES]
        print(f"{node:8} {'yes' if node == slow else '':6} {flagged:>4}/{len(mine):<2} "
              f"{sum(r['retried'] for r in mine):>7} "
              f"{statistics.median(scores) if scores else float('nan'):6.3f} "
              + " ".join(f"{v:22.4g}" for v in figs))
    slow_runs = [r for r in runs if r["slowed"]]
    healthy_runs = [r for r in runs if not r["slowed"]]
    recall = sum(r["outcome"] != "healthy" for r in slow_runs) / max(1, len(slow_runs))
    fpr = sum(r["outcome"] != "healthy" for r in healthy_runs) / max(1, len(healthy_runs))
    return {"recall": recall, "fpr": fpr,
            "seconds_per_node": statistics.mean(r["seconds"] for r in runs),
            "wall_s_per_node": statistics.mean(r["wall_s"] for r in runs),
            "slow_runs": len(slow_runs), "healthy_runs": len(healthy_runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=1, help="sweeps before counting")
    parser.add_argument("--slowdown", type=float, default=0.10)
    parser.add_argument("--slow-node", default=None, help="default: the middle node")
    parser.add_argument("--config", type=Path, default=None, help="bench config YAML")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    slow = args.slow_node or f"node-{(args.nodes + 1) // 2}"
    with tempfile.TemporaryDirectory(prefix="bench-detection-") as tmp:
        fleet = Fleet(Path(tmp), args.nodes, args.config)
        fleet.start()
        throttle = Throttle(fleet.procs[slow].pid, args.slowdown)
        throttle.start()
        t0 = time.monotonic()
        try:
            runs = asyncio.run(campaign(fleet, args, slow))
        finally:
            throttle.stop()
            fleet.stop()
        total_s = time.monotonic() - t0
    result = summarise(runs, fleet.nodes, slow)
    stopped = throttle.stopped_s / max(throttle.cpu_s, 1e-9)
    print(f"\nthrottle ({throttle.meter.method}): {slow} stood still {throttle.stopped_s:.1f} s "
          f"per {throttle.cpu_s:.1f} s of CPU ({stopped:.3f}; target "
          f"{args.slowdown / (1 - args.slowdown):.3f})")
    print(f"recall {result['recall']:.2%} (goal >= 95%), false-positive rate "
          f"{result['fpr']:.2%} (goal <= 1%), standard level {result['seconds_per_node']:.1f} s "
          f"per node (goal <= 60 s); {total_s / 60:.1f} min in all")
    print(json.dumps({
        "name": "bench_detection_recall", "value": round(result["recall"], 4), "unit": "ratio",
        "recall": round(result["recall"], 4), "fpr": round(result["fpr"], 4),
        "seconds_per_node": round(result["seconds_per_node"], 2),
        "wall_s_per_node_with_retries": round(result["wall_s_per_node"], 2),
        "nodes": args.nodes, "reps": args.reps, "slowdown": args.slowdown, "slow_node": slow,
        "slow_runs": result["slow_runs"], "healthy_runs": result["healthy_runs"],
        "throttle": f"SIGSTOP/SIGCONT per CPU second ({throttle.meter.method})",
        "stopped_per_cpu_s": round(stopped, 4), "goal": {"recall": 0.95, "fpr": 0.01}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
