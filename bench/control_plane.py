"""The control plane at scale: N simulated nodes against the real services.

Each size starts the embedded stack afresh (real nats-server with
JetStream, bootstrap, scheduler, failover, lens-collector with chDB, the
bench coordinator and ``--real-nodes`` local nodes with their agents). This
process then stands in for N more nodes, from one lean publisher
(``libs.natsfast``, raw frames, no acks awaited):

- every node's heartbeat (core NATS, ``safe.live``) and its agent-shaped
  node telemetry (8 GPUs, NICs, disks: 2.1 KB) once a second, spread over
  the second;
- its registration and state as bootstrap announces them (ready, cordoned,
  so the scheduler holds them but places nothing there), then a trickle of
  state changes (``--state-changes`` a second);
- a trickle of real jobs (one GPU, a second of work, one every
  ``--job-every`` seconds) that the real scheduler places on the real
  nodes: placements, worker starts and exits, completions.

Once failover watches every node and the consumers have caught up, the
measured window runs ``--seconds``; halfway through, ``--kill`` simulated
nodes fall silent at once (their beats and telemetry stop). Reported:

- every durable consumer's pending count and lag p50/p99 over the window,
  sampled each second (lag: the age of the oldest message it has not acked
  yet, found per filter subject after its ack floor; 0 when nothing is
  pending);
- detection latency of the killed nodes (kill to ``fault.opened``,
  median/p99), and faults opened for nodes that were not killed (must be
  none);
- CONTROL and TELEMETRY bytes per hour and per day at this rate;
- CPU seconds per second of nats-server, each service and the publisher.

The goal (issue 21): at 12,500 nodes every consumer's lag p99 ≤ 2 s,
detection p99 ≤ 3 s, CONTROL growth ≤ 1 GB/day; and the largest N each
service keeps up with on this machine (``--sizes``).

    python bench/control_plane.py [--sizes 2500,5000,12500] [--seconds 30] [--kill 40]

Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import takewhile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nats.js.errors  # noqa: E402

from bench.failover_mttr import pct  # noqa: E402
from bench.lens_ingest import Template, cpu_seconds, iso_stamp, node_event  # noqa: E402
from cli.catalog import SERVICES  # noqa: E402
from cli.client import read_bucket  # noqa: E402
from libs.bus import Bus  # noqa: E402
from libs.embedded import EmbeddedStack  # noqa: E402
from libs.events import (  # noqa: E402
    HeartbeatData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    NodeDescription,
    NodeHeartbeat,
    NodeRegistered,
    NodeStateChanged,
    NodeStateData,
    encode_event,
    parse_event,
)
from libs.natsfast import FastPublisher  # noqa: E402
from libs.records import NODES  # noqa: E402
from libs.settings import Settings  # noqa: E402
from libs.topology import CONTROL, TELEMETRY  # noqa: E402

SLICES = 20  # bursts a second: each node beats in its own twentieth of the second
GOAL_LAG_P99_S = 2.0
GOAL_DETECTION_P99_S = 3.0
GOAL_JUDGE_DELAY_P99_S = 0.25  # failover keeps up: faults open this soon after the deadline
GOAL_CONTROL_BYTES_PER_DAY = 1e9
GB = 1e9
# The stack runs the default settings: a node is down after interval x missed.
DEADLINE_S = Settings().heartbeat_interval_s * Settings().heartbeat_missed


def _print(*args: object) -> None:
    print(*args, flush=True)


# --------------------------------------------------------------------------- the load


@dataclass
class Fleet:
    """N simulated nodes: their names and their messages, rendered once."""

    names: list[str]
    beats: list[bytes]  # one heartbeat frame per node (the judge reads its subject)
    telemetry: list[Template]
    killed: set[int] = field(default_factory=set)
    sent_at: list[float] = field(default_factory=lambda: [0.0] * SLICES)  # per twentieth

    @classmethod
    def make(cls, n: int) -> Fleet:
        names = [f"sim-{i:05d}" for i in range(n)]
        beats = []
        for name in names:
            beat = NodeHeartbeat(source=f"bench-agent:{name}", node=name,
                                 data=HeartbeatData(seq=1, pid=1, interval_s=1.0))
            beats.append(FastPublisher.frame(beat.subject.encode(), encode_event(beat),
                                             beat.id.encode()))
        return cls(names, beats, [Template(node_event(name)) for name in names])

    def burst(self, second: int, part: int, due: float) -> tuple[bytes, bytes]:
        """Beats and telemetry of the nodes of one twentieth of a second."""
        stamp = iso_stamp(due)
        alive = [i for i in range(part, len(self.names), SLICES) if i not in self.killed]
        # Each telemetry id is 32 characters, unique in the stream.
        return (b"".join(self.beats[i] for i in alive),
                b"".join(self.telemetry[i].frame(f"cp{second:08d}{i:022d}", stamp)
                         for i in alive))


async def agents(url: str, fleet: Fleet, stop: asyncio.Event) -> None:
    """Every simulated agent at 1 Hz until ``stop``: each burst when due.
    Beats and telemetry go over connections of their own: real agents each
    have theirs, and one shared socket would queue every beat behind
    megabytes of telemetry (head-of-line blocking no real node has)."""
    beats = FastPublisher(url, name="bench-agents-beats")
    telemetry = FastPublisher(url, name="bench-agents-telemetry")
    await beats.start()
    await telemetry.start()
    try:
        start, second = time.time() + 0.2, 0
        while not stop.is_set():
            for part in range(SLICES):
                due = start + second + part / SLICES
                await asyncio.sleep(max(0.0, due - time.time()))
                b, t = fleet.burst(second, part, due)
                beats.write(b)
                fleet.sent_at[part] = time.time()
                telemetry.write(t)
                await beats.flush()
                await telemetry.flush()
            second += 1
    finally:
        await beats.stop()
        await telemetry.stop()


def description(name: str, i: int) -> NodeDescription:
    return NodeDescription(ip=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                           labels={"rack": f"r{i // 32:04d}", "pool": "sim"},
                           gpu_model="MI300X", gpu_count=8)


def cordoned(name: str, reason: str) -> NodeStateChanged:
    return NodeStateChanged(source="bootstrap", node=name, data=NodeStateData(
        state="ready", reason=reason, schedulable=False))


async def register(url: str, fleet: Fleet) -> None:
    """As bootstrap would announce them: registered, then ready (cordoned)."""
    out = FastPublisher(url, name="bench-bootstrap")
    await out.start()
    try:
        for chunk in _chunks(list(enumerate(fleet.names)), 500):
            frames = []
            for i, name in chunk:
                for event in (NodeRegistered(source="bootstrap", node=name,
                                             data=description(name, i).registered()),
                              cordoned(name, "simulated by bench/control_plane.py")):
                    frames.append(FastPublisher.frame(event.subject.encode(),
                                                      encode_event(event), event.id.encode()))
            out.write(b"".join(frames))
            await out.flush()
            await asyncio.sleep(0.05)
    finally:
        await out.stop()


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


async def trickle(bus: Bus, fleet: Fleet, state_changes: float, job_every_s: float,
                  stop: asyncio.Event) -> dict[str, int]:
    """Node state changes and real jobs, until ``stop``."""
    rng, sent = random.Random(21), {"state_changes": 0, "jobs": 0}
    next_job = time.monotonic()
    period = 1.0 / max(state_changes, 1e-3)
    while not stop.is_set():
        i = rng.randrange(len(fleet.names))
        if i not in fleet.killed:
            await bus.publish(cordoned(fleet.names[i], f"bench trickle {sent['state_changes']}"))
            sent["state_changes"] += 1
        if time.monotonic() >= next_job:
            job = f"cp-{sent['jobs']:05d}"
            spec = JobSpec(name=job, workers=1, gpus_per_worker=1,
                           command=[sys.executable, "-c", "import time; time.sleep(1)"],
                           workdir=str(ROOT), ttl_after_finished_s=60)
            await bus.publish(JobSubmitted(source="bench", job=job,
                                           data=JobSubmittedData(spec=spec)))
            sent["jobs"] += 1
            next_job += job_every_s
        await asyncio.sleep(period)
    return sent


# --------------------------------------------------------------------------- what is measured


@dataclass
class ConsumerSeries:
    stream: str
    pending: list[int] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)


async def _oldest_unacked(bus: Bus, stream: str, info: Any) -> float | None:
    """The time of the oldest message the consumer has not acked: the first
    one after its ack floor on each of its filter subjects (a filtered
    consumer's floor may sit far behind its next message)."""
    config = info.config
    filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    oldest = None
    for subject in filters:
        try:
            msg = await bus.js.get_msg(stream, seq=floor + 1, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            continue
        stamp = msg.time.timestamp() if isinstance(msg.time, datetime) else None
        if stamp is not None and (oldest is None or stamp < oldest):
            oldest = stamp
    return oldest


async def sample_consumers(bus: Bus, series: dict[str, ConsumerSeries],
                           stop: asyncio.Event) -> None:
    while not stop.is_set():
        for name, (stream, pending, lag) in (await consumer_lags(bus)).items():
            s = series.setdefault(name, ConsumerSeries(stream))
            s.pending.append(pending)
            s.lag_s.append(lag)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def stream_bytes(bus: Bus) -> dict[str, int]:
    return {name: (await bus.js.stream_info(name)).state.bytes
            for name in (CONTROL.name, TELEMETRY.name)}


async def parts(bus: Bus) -> dict[str, tuple[int, int]]:
    """Each Lens table's active parts: (rows, bytes on disk), ClickHouse's
    own count (parts a merge replaced and not yet deleted are not in it)."""
    reply = await bus.request("safe.query.lens.query", {
        "query": "table_rows", "params": {"database": "primus"}}, timeout_s=30)
    if not reply.get("ok"):
        raise RuntimeError(reply)
    at = {c: reply["columns"].index(c) for c in ("table", "rows", "bytes_on_disk")}
    return {row[at["table"]]: (int(row[at["rows"]]), int(row[at["bytes_on_disk"]]))
            for row in reply["rows"]}


def stored_bytes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                 ) -> int:
    """Bytes the rows added between two ``parts`` readings take, at each
    table's bytes per row at the end: steadier than the bytes' own growth,
    which swings with the merges under way."""
    total = 0.0
    for table, (rows, size) in after.items():
        added = rows - before.get(table, (0, 0))[0]
        if rows and added > 0:
            total += added * size / rows
    return round(total)


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (ClickHouse's parts; merges make it
    move in steps, so it is read over the whole window)."""
    total = 0
    for f in path.rglob("*"):
        with contextlib.suppress(OSError):  # a part merged away meanwhile
            if f.is_file():
                total += f.stat().st_size
    return total


def service_of(durable: str) -> str:
    """The service whose route table declares the durable (a per-node one,
    ``bench-agent-{node}``, by the part before its node)."""
    for routes in SERVICES:
        for c in routes.consumes:
            if durable == c.durable or (c.per_node and durable.startswith(c.name(""))):
                return routes.service
    return durable


# --------------------------------------------------------------------------- one size


async def one_size(n: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    stack = EmbeddedStack(tmp / f"stack-{n}", nodes=args.real_nodes,
                          env={"PRIMUS_LOG_LEVEL": "warning"}, nats_cluster=args.nats_cluster)
    stack.start()
    assert stack.nats is not None
    fleet = Fleet.make(n)
    stop_agents, stop_window = asyncio.Event(), asyncio.Event()
    bus = await Bus.connect(stack.nats.url, "bench", token=stack.nats.token)
    beating: asyncio.Task[None] | None = None
    try:
        await _until(lambda: _real_nodes_ready(bus, stack), 240, "the real nodes to be ready")
        _print(f"[{n} nodes] stack up; registering the simulated nodes")
        beating = asyncio.create_task(agents(stack.nats.url, fleet, stop_agents))
        await register(stack.nats.url, fleet)
        watched = n + len(stack.node_names)
        await _until(lambda: _failover_watches(bus, watched), 300,
                     f"failover to watch {watched} nodes")
        # A size past what the collector keeps up with never catches up:
        # measured all the same, after a while, and marked.
        caught_up = await _until(lambda: _caught_up(bus), 180, "the consumers to catch up",
                                 fail=False, every_s=2.0)
        _print(f"[{n} nodes] every node watched, consumers "
               f"{'caught up' if caught_up else 'STILL BEHIND after 180 s'}; measuring "
               f"{args.seconds} s")

        opened: dict[str, float] = {}

        async def on_fault(msg: Any) -> None:
            with contextlib.suppress(Exception):
                event = parse_event(msg.data)
                if event.type == "fault.opened" and event.node is not None:
                    # Failover's own stamp (same host clock): when it opened
                    # the fault, not when this busy process got to read it.
                    opened.setdefault(event.node, event.time.timestamp())

        sub = await bus.nc.subscribe("safe.fault.*.opened", cb=on_fault)
        series: dict[str, ConsumerSeries] = {}
        # Every nats-server of a cluster counts as one figure (their sum).
        pids = {"nats-server": [m.proc.pid for m in stack.nats_members.values() if m.proc],
                **{name: [p.pid] for name, p in stack.procs.items()}}
        store = stack.state_dir / "clickhouse"
        cpu0 = {k: sum(map(cpu_seconds, ps)) for k, ps in pids.items()}
        bytes0, disk0, parts0 = await stream_bytes(bus), du(store), await parts(bus)
        t0, me0 = time.time(), time.process_time()
        sampler = asyncio.create_task(sample_consumers(bus, series, stop_window))
        trickler = asyncio.create_task(trickle(bus, fleet, args.state_changes, args.job_every,
                                               stop_window))
        await asyncio.sleep(args.seconds / 2)
        victims = random.Random(n).sample(range(n), min(args.kill, n))
        killed_at = time.time()
        fleet.killed.update(victims)  # between two bursts: no beat of theirs goes out after
        last_beat = {fleet.names[i]: fleet.sent_at[i % SLICES] for i in victims}
        await asyncio.sleep(args.seconds / 2)
        stop_window.set()
        sent = await trickler
        await sampler
        elapsed = time.time() - t0
        cpu = {k: (sum(map(cpu_seconds, ps)) - cpu0[k]) / elapsed for k, ps in pids.items()}
        cpu["publisher (this process)"] = (time.process_time() - me0) / elapsed
        grown = {k: v - bytes0[k] for k, v in (await stream_bytes(bus)).items()}
        grown["ClickHouse (on disk)"] = du(store) - disk0
        grown["ClickHouse (rows stored)"] = stored_bytes(parts0, await parts(bus))
        collector = await bus.request("safe.health.lens-collector", timeout_s=10)
        # Detection may still be under way for the last ones: give it the deadline again.
        names = {fleet.names[i] for i in victims}
        await _until(lambda: asyncio.sleep(0, names <= set(opened)), 15, "every kill detected",
                     fail=False)
        await sub.unsubscribe()
    finally:
        stop_agents.set()
        stop_window.set()
        if beating is not None:
            with contextlib.suppress(Exception):
                await beating
        await bus.close()
        stack.stop()
    detections = sorted(opened[name] - killed_at for name in names if name in opened)
    # The judge's own delay: from the moment the deadline passed (the last
    # beat sent plus interval x missed) to the fault.
    late = sorted(opened[name] - last_beat[name] - DEADLINE_S for name in names if name in opened)
    wrong = sorted(set(opened) - names)
    consumers = {
        name: {"stream": s.stream, "service": service_of(name),
               "pending_p50": pct(s.pending, 0.5), "pending_max": max(s.pending, default=0),
               "lag_p50_s": round(pct(s.lag_s, 0.5), 3), "lag_p99_s": round(pct(s.lag_s, 0.99), 3),
               # A consumer past the goal: its samples (1 s apart), to see a burst from a backlog.
               **({"pending_samples": s.pending, "lag_samples_s": [round(x, 2) for x in s.lag_s]}
                  if pct(s.lag_s, 0.99) > GOAL_LAG_P99_S else {})}
        for name, s in sorted(series.items())}
    per_day = {k: v / elapsed * 86400 for k, v in grown.items()}
    result = {
        "nodes": n, "gpus": 8 * n, "seconds": round(elapsed, 1), "caught_up_before": caught_up,
        "consumers": consumers,
        "detection": {"killed": len(names), "detected": len(detections),
                      "p50_s": round(statistics.median(detections), 3) if detections else None,
                      "p99_s": round(pct(detections, 0.99), 3) if detections else None,
                      "max_s": round(max(detections), 3) if detections else None,
                      "deadline_s": DEADLINE_S,
                      "after_deadline_p50_s": round(statistics.median(late), 3) if late else None,
                      "after_deadline_p99_s": round(pct(late, 0.99), 3) if late else None,
                      "wrongly_faulted": len(wrong), "wrongly_faulted_nodes": wrong[:10]},
        "stream_bytes_per_hour": {k: round(v / 24) for k, v in per_day.items()},
        "stream_bytes_per_day": {k: round(v) for k, v in per_day.items()},
        "cpu_s_per_s": {k: round(v, 3) for k, v in cpu.items()},
        "trickle": sent,
        "collector": {k: collector.get(k) for k in ("inserts", "insert_s", "store_s")},
    }
    lags = [c["lag_p99_s"] for c in consumers.values()]
    result["goals"] = {
        "lag_p99_le_2s": bool(lags) and max(lags) <= GOAL_LAG_P99_S,
        "detection_p99_le_3s": bool(detections) and len(detections) == len(names)
        and pct(detections, 0.99) <= GOAL_DETECTION_P99_S,
        "no_wrong_faults": not wrong,
        "control_le_1gb_per_day": per_day[CONTROL.name] <= GOAL_CONTROL_BYTES_PER_DAY,
    }
    return result


async def _until(fn: Any, timeout: float, what: str, *, fail: bool = True,
                 every_s: float = 0.5) -> bool:
    """Whether ``fn()`` came true in time (an exception counts as not yet:
    a service may still be starting); raises unless ``fail`` is off."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if await fn():
                return True
        await asyncio.sleep(every_s)
    if fail:
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
    return False


async def _real_nodes_ready(bus: Bus, stack: EmbeddedStack) -> bool:
    nodes = await read_bucket(bus, NODES, missing_ok=True)
    return all(nodes.get(n) is not None and nodes[n].state == "ready" for n in stack.node_names)


async def _failover_watches(bus: Bus, count: int) -> bool:
    health = await bus.request("safe.health.failover", timeout_s=5)
    return int(health.get("watched_nodes", 0)) >= count


async def consumer_lags(bus: Bus) -> dict[str, tuple[str, int, float]]:
    """Every durable: (its stream, pending, lag in seconds) now."""
    out = {}
    for stream in (CONTROL.name, TELEMETRY.name):
        for info in await bus.js.consumers_info(stream):
            pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
            lag = 0.0
            if pending:
                oldest = await _oldest_unacked(bus, stream, info)
                lag = max(0.0, time.time() - oldest) if oldest is not None else 0.0
            out[info.name] = (stream, pending, lag)
    return out


async def _caught_up(bus: Bus) -> bool:
    """Every consumer within the lag goal (what setting up left behind is done)."""
    behind = {k: v for k, v in (await consumer_lags(bus)).items() if v[2] > GOAL_LAG_P99_S}
    if behind:
        _print("  still behind: " + ", ".join(f"{k} {p:,} pending, {lag:.1f} s"
                                              for k, (_, p, lag) in sorted(behind.items())))
    return not behind


# --------------------------------------------------------------------------- report


def keeps_up(results: list[dict[str, Any]]) -> dict[str, int]:
    """Per service, the largest N up to which it kept up at every size tried:
    every consumer of it with lag p99 within the goal (failover also: every
    kill detected, no healthy node faulted, and its judge no more than
    GOAL_JUDGE_DELAY_P99_S past the deadline: how far past 3 s detection
    lands is the deadline's doing, not load's). 0: not even the smallest."""
    kept: dict[str, list[tuple[int, bool]]] = {}
    for r in sorted(results, key=lambda r: r["nodes"]):
        ok: dict[str, bool] = {}
        for c in r["consumers"].values():
            ok[c["service"]] = ok.get(c["service"], True) and c["lag_p99_s"] <= GOAL_LAG_P99_S
        d = r["detection"]
        ok["failover"] = ok.get("failover", True) and r["goals"]["no_wrong_faults"] \
            and d["detected"] == d["killed"] \
            and (d["after_deadline_p99_s"] or 0.0) <= GOAL_JUDGE_DELAY_P99_S
        for service, good in ok.items():
            kept.setdefault(service, []).append((r["nodes"], good))
    return {service: max((n for n, _ in takewhile(lambda run: run[1], runs)), default=0)
            for service, runs in kept.items()}


def table(r: dict[str, Any]) -> str:
    lines = [f"\n{r['nodes']:,} nodes ({r['gpus']:,} GPUs), {r['seconds']} s measured",
             f"  {'consumer':<30} {'stream':<10} {'pending p50':>11} {'max':>8} "
             f"{'lag p50':>8} {'lag p99':>8}"]
    for name, c in r["consumers"].items():
        lines.append(f"  {name:<30} {c['stream']:<10} {c['pending_p50']:>11,} "
                     f"{c['pending_max']:>8,} {c['lag_p50_s']:>7.2f}s {c['lag_p99_s']:>7.2f}s")
    d = r["detection"]
    lines.append(f"  detection of {d['killed']} killed nodes: {d['detected']} detected, "
                 f"median {d['p50_s']} s, p99 {d['p99_s']} s, max {d['max_s']} s from the kill "
                 f"(deadline {d['deadline_s']} s after the last beat, passed by "
                 f"{d['after_deadline_p50_s']} s median, {d['after_deadline_p99_s']} s p99); "
                 f"{d['wrongly_faulted']} healthy nodes faulted")
    for k, v in r["stream_bytes_per_day"].items():
        lines.append(f"  {k}: {v / GB:.2f} GB/day ({r['stream_bytes_per_hour'][k] / GB:.3f} GB/h)")
    lines.append("  CPU s/s: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s_per_s"].items()))
    lines.append("  goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                         for k, v in r["goals"].items()))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="12500",
                        help="simulated node counts, comma-separated (default 12500)")
    parser.add_argument("--seconds", type=int, default=30, help="the measured window")
    parser.add_argument("--kill", type=int, default=40, help="simulated nodes killed halfway")
    parser.add_argument("--real-nodes", type=int, default=2, help="local nodes with real agents")
    parser.add_argument("--state-changes", type=float, default=5.0, help="node state changes/s")
    parser.add_argument("--job-every", type=float, default=2.0, help="seconds between jobs")
    parser.add_argument("--nats-cluster", type=int, choices=(1, 3), default=1,
                        help="3: a 3-server NATS cluster, every stream at 3 replicas (the "
                        "nats-server figure is then the three servers' sum)")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="control-plane-"))
    results = []
    try:
        for n in sizes:
            r = asyncio.run(one_size(n, args, tmp))
            _print(table(r))
            results.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    largest = keeps_up(results)
    _print("\nlargest N kept up with (lag p99 ≤ 2 s; failover: faults within 0.25 s of the "
           "deadline): "
           + ", ".join(f"{k} {v:,}" for k, v in sorted(largest.items())))
    _print(json.dumps({"control_plane": results, "largest_nodes_kept_up": largest,
                       "goals_met_at_largest": all(results[-1]["goals"].values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
