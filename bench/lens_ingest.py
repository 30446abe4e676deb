"""Lens ingest end to end: simulated GPUs through real NATS JetStream into one
lens-collector and chDB.

A real nats-server (JetStream, file storage) and a real lens-collector
process (its own chDB under a temp dir, migrations, roll-up views, the alert
loop) run on this machine. This process stands in for the agents: it
publishes one agent-shaped ``telemetry.node`` message per simulated node
per second, holding that node's 8 GPUs (all readings, NICs with an RDMA
port, disks, filesystems), spread over the second, with ``Nats-Msg-Id``.
The messages are real encodings of the pydantic event with only the id and
time patched, rendered as wire frames before the run, so that the load
generator's CPU stays out of the way.

Two phases, and the engine alone, in the same run:

- at the target (``--gpus`` at 1 s, ``--seconds``): whether the pipeline
  keeps up (every published row stored, once; the stored rate over the
  run's steady part equals the offered one) and the end-to-end lag p50/p99
  (a row's insert time minus its sample time);
- capacity: the offered rate raised step by step (``--steps`` of
  ``--step-seconds``, each ``--step-factor`` times the target more): the
  highest stored rate over a step's steady part is the sustained
  GPU-rows/s end to end; once the offered rate is past it, the stored rate
  stays there while the backlog (and the lag) grows;
- the raw engine ceiling: the same GPU and node rows inserted directly as
  columns (Arrow) into a chDB with the same schema and views, in this
  process before the pipeline starts; and the ratio of capacity to it;
- the engine alone on the collector's path: the same messages' JSON into
  the ingest table, its rate and CPU per row beside the Arrow insert's.

    python bench/lens_ingest.py [--gpus 100000] [--seconds 20] [--steps 5]
    python bench/lens_ingest.py --collectors 3   # 1, 2 and 3 replicas: the scaling

Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.bus import Bus  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.events import (  # noqa: E402
    DiskMetrics,
    FsMetrics,
    GpuMetrics,
    NicMetrics,
    NodeTelemetry,
    NodeTelemetryData,
    encode_event,
)
from libs.natsfast import FastPublisher  # noqa: E402
from services.lens_collector.rows import COLUMNS, rows_for  # noqa: E402

GPUS_PER_NODE = 8
SLICES = 20  # publish bursts per second
WARMUP_S = 3.0  # a phase's stored rate is taken after this (the first insert, a stream to fill)
DB = "primus"


def node_event(node: str) -> NodeTelemetry:
    gpus = [GpuMetrics(index=g, util_pct=97.5 - g, vram_used_bytes=150_000_000_000 + g,
                       vram_total_bytes=206_158_430_208, temp_c=71.0 + g,
                       temp_junction_c=88.0 + g, temp_hbm_c=79.0, power_w=690.5 - g,
                       power_cap_w=750.0, sclk_mhz=2100.0, mclk_mhz=1300.0,
                       ecc_correctable=3, ecc_uncorrectable=0, pcie_rx_bytes_s=2.1e9,
                       pcie_tx_bytes_s=1.7e9) for g in range(GPUS_PER_NODE)]
    return NodeTelemetry(source=f"bench-agent/{node}", node=node, data=NodeTelemetryData(
        cpu_pct=37.5, mem_used_bytes=812_000_000_000, mem_total_bytes=2_164_000_000_000,
        load1=48.2, gpus=gpus, gpu_tool="amd-smi",
        nics=[NicMetrics(name="eth0", rx_bytes_s=1.2e8, tx_bytes_s=9.1e7)]
        + [NicMetrics(name=f"mlx5_{i}/1", rx_bytes_s=2.3e10, tx_bytes_s=2.2e10, rdma=True)
           for i in range(8)],
        disks=[DiskMetrics(name="nvme0n1", read_bytes_s=4.1e8, write_bytes_s=1.2e8)],
        filesystems=[FsMetrics(mount="/", free_bytes=1_200_000_000_000,
                               total_bytes=3_800_000_000_000),
                     FsMetrics(mount="/dev/shm", free_bytes=900_000_000_000,
                               total_bytes=1_000_000_000_000)]))


class Template:
    """One node's encoded message with the id and time cut out, to patch per send."""

    def __init__(self, event: NodeTelemetry) -> None:
        raw = encode_event(event)
        id_at = raw.index(event.id.encode())
        stamp = event.time.isoformat().replace("+00:00", "Z").encode()
        t_at = raw.index(stamp)
        self.head, self.mid, self.tail = raw[:id_at], raw[id_at + 32:t_at], raw[t_at + len(stamp):]
        self.subject = event.subject
        self.subject_bytes = event.subject.encode()

    def render(self, event_id: str, stamp: str) -> bytes:
        return b"".join((self.head, event_id.encode(), self.mid, stamp.encode(), self.tail))

    def frame(self, event_id: str, stamp: str) -> bytes:
        """The publish frame of this node's message with ``event_id`` (32
        characters) and ``stamp`` (``iso_stamp``), the id also its Nats-Msg-Id."""
        return FastPublisher.frame(self.subject_bytes, self.render(event_id, stamp),
                                   event_id.encode())


def iso_stamp(t: float) -> str:
    """An event's time as the envelope writes it (UTC, microseconds, Z)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace(
        "+00:00", "Z")


def ceiling(dsn: str, nodes: int, rounds: int) -> dict[str, float]:
    """The engine alone, in this process, on the same rows: inserted as Arrow
    columns (the ceiling), and as the collector inserts them (the messages'
    JSON into the ingest table, spread by its views). Each: the best GPU rows
    per second of one insert, and the CPU per GPU row of all its inserts and
    the merges they cause (chDB's threads are this process's)."""
    import pyarrow as pa

    from libs.store import migrate, open_store
    from services.lens_collector.ingest import SETTINGS
    from services.lens_collector.schema import MIGRATIONS

    client = open_store(dsn)
    events = [node_event(f"gpu-{i:05d}") for i in range(nodes)]
    rows = nodes * GPUS_PER_NODE
    out: dict[str, float] = {}

    def measure(name: str, db: str, insert: Callable[[int], None]) -> None:
        migrate(client, db, MIGRATIONS)
        best, cpu0 = 0.0, time.process_time()
        for k in range(rounds):
            t0 = time.perf_counter()
            insert(k)
            best = max(best, rows / (time.perf_counter() - t0))
        while client.query(f"SELECT count() FROM system.merges WHERE database = '{db}'"
                           ).result_rows[0][0]:
            time.sleep(0.05)
        out[f"{name}_insert_gpu_rows_per_s"] = best
        out[f"{name}_cpu_us_per_gpu_row"] = 1e6 * (time.process_time() - cpu0) / (rows * rounds)
        client.command(f"DROP DATABASE {db} SYNC")

    arrow = []
    for k in range(rounds):  # built before the clock starts: the engine alone is timed
        copies = [e.model_copy(update={"id": f"c{k}-{i}"}) for i, e in enumerate(events)]
        arrow.append({t: _arrow(pa, t, r) for t, r in rows_for([(e, 0) for e in copies]).items()})
    measure("arrow", "ceiling", lambda k: [client.insert_arrow(f"ceiling.{t}", data)
                                           for t, data in arrow[k].items()])
    arrow.clear()  # memory for the next part
    templates = [Template(e) for e in events]
    stamp = events[0].time.isoformat().replace("+00:00", "Z")
    payloads = [b"\n".join(t.render(f"j{k}-{i:030d}", stamp) for i, t in enumerate(templates))
                for k in range(rounds)]
    measure("json", "ceiling_json", lambda k: client.raw_insert(
        "ceiling_json.ingest_node", None, payloads[k], fmt="JSONEachRow",
        settings={**SETTINGS, "insert_deduplication_token": f"ceiling-{k}"}))
    client.close()
    return out


def _arrow(pa: object, table: str, rows: list[list[object]]) -> object:
    """Rows as an Arrow table; maps need their type spelled out."""
    columns = {}
    for j, name in enumerate(COLUMNS[table]):
        values = [r[j] for r in rows]
        if isinstance(values[0], dict):
            kind = pa.uint64() if name.startswith("fs_") else pa.float64()  # type: ignore[attr-defined]
            columns[name] = pa.array([list(v.items()) for v in values],  # type: ignore[attr-defined]
                                     type=pa.map_(pa.string(), kind))  # type: ignore[attr-defined]
        else:
            columns[name] = pa.array(values)  # type: ignore[attr-defined]
    return pa.table(columns)  # type: ignore[attr-defined]


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def start_collector(nats_url: str, chdb: Path, log: Path, instance: str | None = None
                    ) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_CLICKHOUSE_DSN=f"chdb://{chdb}",
               PRIMUS_CLICKHOUSE_DATABASE=DB, PRIMUS_LOG_LEVEL="warning",
               **({"PRIMUS_INSTANCE": instance} if instance else {}))
    root = Path(__file__).resolve().parents[1]
    with log.open("ab") as out:  # a restarted replica goes on in the same log
        return subprocess.Popen([sys.executable, "-m", "cli.main", "lens-collector"], env=env,
                                cwd=root, stdout=out, stderr=subprocess.STDOUT)


async def lens(bus: Bus, query: str, **params: object) -> list[dict[str, object]]:
    reply = await bus.request("safe.query.lens.query", {"query": query, "params": params},
                              timeout_s=60)
    if not reply.get("ok"):
        raise RuntimeError(reply)
    return [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]


async def stored_messages(bus: Bus, instances: list[str] | None = None) -> int:
    """Node messages the collectors have stored: each one's health counter
    (``instances``: the replicas, each asked on its own subject), which costs
    the engine nothing (counting the table while it ingests would)."""
    total = 0
    for instance in instances or [""]:
        try:
            health = await bus.request("safe.health.lens-collector"
                                       + (f".{instance}" if instance else ""), timeout_s=10)
        except Exception:
            return -1
        total += int(health.get("rows_written", {}).get("ingest_node", 0))
    return total


def message_id(phase: int, second: int, burst: int, n: int) -> str:
    """The id (32 characters, unique in the stream) of the ``n``-th message
    of a burst of a phase's second."""
    return f"{phase:02d}{second:06d}{burst:04d}{n:020d}"


def render(templates: list[Template], seconds: int, start: float, phase: int = 0
           ) -> list[tuple[float, bytes]]:
    """Every burst of a phase as wire frames, each message stamped with the
    time its burst is due (the agents' sample time): (due, frames).

    Made before the phase, so that during it the load generator costs the
    machine only its socket writes: on this machine the collector and
    nats-server need every cycle the simulated agents would otherwise take."""
    per_slice = [templates[i::SLICES] for i in range(SLICES)]
    plan = []
    for second in range(seconds):
        for s, batch in enumerate(per_slice):
            due = start + second + s / SLICES
            stamp = iso_stamp(due)
            plan.append((due, b"".join(
                t.frame(message_id(phase, second, s, n), stamp)
                for n, t in enumerate(batch))))
    return plan


def plan_run(templates: list[Template], seconds: int, phase: int = 0
             ) -> tuple[list[tuple[float, bytes]], float]:
    """A phase's bursts, due from a start time far enough ahead to render them."""
    t0 = time.perf_counter()
    render(templates[:SLICES * 50], 1, time.time())  # how fast rendering goes here
    estimate = (time.perf_counter() - t0) * len(templates) / (SLICES * 50) * seconds
    first = time.time() + 1.5 * estimate + 1.0
    return render(templates, seconds, first, phase), first


async def publish(url: str, plan: list[tuple[float, bytes]], name: str = "bench-agents"
                  ) -> None:
    """Each burst when it is due (raw HPUB frames, no per-message ack wait),
    so that the load generator takes little of the CPU the collector needs;
    the stream's message count afterwards says whether JetStream stored them
    all. A burst sent late still carries its due time, so the lag measured
    includes any delay of the load generator itself."""
    out = FastPublisher(url, name=name)
    await out.start()
    try:
        for due, frames in plan:
            await asyncio.sleep(max(0.0, due - time.time()))
            out.write(frames)
            await out.flush()
    finally:
        await out.stop()


async def phase(bus: Bus, url: str, nodes: int, seconds: int, number: int,
                pids: dict[str, list[int]], instances: list[str] | None = None
                ) -> dict[str, object]:
    """Offer ``nodes`` × 8 GPUs at 1 s for ``seconds``; what was stored, how fast
    over the steady part (after WARMUP_S, until the last publish), and the lag
    of the rows sampled in this phase."""
    templates = [Template(node_event(f"p{number}-{i:05d}")) for i in range(nodes)]
    plan, first = plan_run(templates, seconds, number)
    sent = seconds * nodes
    before = await stored_messages(bus, instances)

    async def stored_now() -> int:
        return await stored_messages(bus, instances) - before

    done = await offer(url, plan, stored_now, sent, first, pids)
    del plan
    stored, rate = done.stored, done.rate * GPUS_PER_NODE
    if instances:  # one store per replica: the lag is read from all of them afterwards
        lag: dict[str, object] = {"p50_s": float("nan"), "p99_s": float("nan"),
                                  "max_s": float("nan")}
    else:
        lag = (await lens(bus, "ingest_lag_between", since_ms=int(first * 1000),
                          until_ms=int((first + seconds) * 1000)))[0]
    return {"seconds": seconds, "window_ms": [int(first * 1000), int((first + seconds) * 1000)],
            "messages_published": sent,
            "messages_stored": stored, "offered_gpu_rows_per_s": nodes * GPUS_PER_NODE,
            "stored_gpu_rows_per_s": round(rate), "drained_s": done.drained_s,
            "lag_p50_s": lag["p50_s"], "lag_p99_s": lag["p99_s"], "lag_max_s": lag["max_s"],
            **{f"cpu_us_per_gpu_row_{k}": round(1e6 * v / max(1, stored * GPUS_PER_NODE), 3)
               for k, v in done.cpu.items()}}


@dataclass
class Offered:
    """What a phase's publishing measured."""

    stored: int  # what the collector stored of it
    rate: float  # stored per second over the steady part (least squares)
    drained_s: float  # from the last publish until the count stopped moving
    cpu: dict[str, float]  # CPU seconds each process spent


async def offer(url: str, plan: list[tuple[float, bytes]], stored: Callable[[], Awaitable[int]],
                expected: int, first: float, pids: dict[str, list[int]], *,
                publisher: str = "bench-agents") -> Offered:
    """Publish ``plan`` while sampling ``stored()`` every 0.25 s, then wait
    until ``expected`` is stored or the count has not moved for 30 s. The
    rate is the least-squares slope over the steady part (after WARMUP_S
    from ``first``, until the last publish): the count moves in steps of one
    insert (about a second of data), so two end points would be off by up
    to one insert."""
    cpu0 = {k: sum(map(cpu_seconds, ps)) for k, ps in pids.items()}
    samples: list[tuple[float, int]] = []

    async def watch() -> None:
        while True:
            samples.append((time.time(), await stored()))
            await asyncio.sleep(0.25)

    watcher = asyncio.create_task(watch())
    await publish(url, plan, publisher)
    published_at = time.time()
    await asyncio.sleep(0.5)
    watcher.cancel()
    count, last_change, last = 0, time.time(), -1
    while count < expected and time.time() - last_change < 30:
        count = await stored()
        if count != last:
            last, last_change = count, time.time()
        await asyncio.sleep(0.1)
    cpu = {k: sum(map(cpu_seconds, ps)) - cpu0[k] for k, ps in pids.items()}
    steady = [(t, n) for t, n in samples if first + WARMUP_S <= t <= published_at]
    try:
        rate = statistics.linear_regression([t for t, _ in steady],
                                            [n for _, n in steady]).slope
    except statistics.StatisticsError:  # fewer than two samples in the window
        rate = float("nan")
    return Offered(count, rate, round(last_change - published_at, 3), cpu)


async def wait_answering(bus: Bus) -> None:
    """Until the collector answers queries (its store is migrated)."""
    for _ in range(600):
        try:
            await lens(bus, "table_counts")
            return
        except Exception:
            await asyncio.sleep(0.2)


def stop_collector(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.asynccontextmanager
async def collector_stack(tmp: Path, collectors: int = 1
                          ) -> AsyncIterator[tuple[str, Bus, dict[str, list[int]], list[str]]]:
    """A nats-server and ``collectors`` lens-collector processes answering,
    under ``tmp``: (the server's URL, a bus connection, the pids whose CPU a
    phase counts, the replicas' instance names: none for a lone collector).
    Replicas share the consumers; each has a chDB store of its own (chDB is
    one engine per process), as shards of one ClickHouse would."""
    server = NatsServer(tmp / "nats").start(tmp / "nats.log")
    # (instance, store): a lone collector keeps the single-collector names.
    replicas = ([(f"lens-{i}", tmp / f"lens-{i}") for i in range(collectors)]
                if collectors > 1 else [(None, tmp / "chdb")])
    procs = [start_collector(server.url, store, tmp / f"{name or 'collector'}.log", name)
             for name, store in replicas]
    instances = [name for name, _ in replicas if name]
    bus = await Bus.connect(server.url, "bench")
    try:
        await bus.ensure_topology()
        await wait_answering(bus)
        for name in instances:
            while await stored_messages(bus, [name]) < 0:
                await asyncio.sleep(0.2)
        assert server.proc is not None
        yield server.url, bus, {"collector": [p.pid for p in procs],
                                "nats_server": [server.proc.pid],
                                "publisher": [os.getpid()]}, instances
    finally:
        await bus.close()
        for proc in procs:
            stop_collector(proc)
        server.stop()


STORE_FIGURES = """
import json, sys
import clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
windows = json.loads(sys.argv[2])
lag = [dict(client.query(
    "SELECT intDiv(dateDiff('millisecond', time, received), 10), count() "
    "FROM primus.gpu_metrics WHERE time >= fromUnixTimestamp64Milli({a:Int64}, 'UTC') "
    "AND time < fromUnixTimestamp64Milli({b:Int64}, 'UTC') GROUP BY 1",
    parameters={"a": a, "b": b}).result_rows) for a, b in windows]
rows, distinct = client.query(
    "SELECT count(), uniqExact(event_id, gpu) FROM primus.gpu_metrics").result_rows[0]
print(json.dumps({"lag": lag, "rows": rows, "distinct": distinct}))
"""


def quantile_10ms(histogram: dict[int, int], q: float) -> float:
    """The ``q`` quantile, in seconds, of a histogram of 10 ms buckets."""
    total, seen = sum(histogram.values()), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= q * total:
            return bucket / 100
    return float("nan")


def store_figures(tmp: Path, instances: list[str], phases: list[dict[str, object]]
                  ) -> tuple[int, int]:
    """After the replicas stopped: each phase's lag over every store (merged
    10 ms histograms), and the GPU rows stored and distinct over all stores
    (nothing is killed here, so no row is in two stores)."""
    windows = json.dumps([p["window_ms"] for p in phases])
    root = Path(__file__).resolve().parents[1]
    found = [json.loads(subprocess.run(
        [sys.executable, "-c", STORE_FIGURES, str(tmp / name), windows], cwd=root, check=True,
        capture_output=True, text=True).stdout) for name in instances]
    for k, figures in enumerate(phases):
        merged: dict[int, int] = {}
        for store in found:
            for bucket, count in store["lag"][k].items():
                merged[int(bucket)] = merged.get(int(bucket), 0) + count
        figures.update(lag_p50_s=quantile_10ms(merged, 0.5), lag_p99_s=quantile_10ms(merged, 0.99),
                       lag_max_s=max(merged, default=0) / 100)
    return sum(s["rows"] for s in found), sum(s["distinct"] for s in found)


async def pipeline(gpus: int, seconds: int, steps: int, step_seconds: int, step_factor: float,
                   tmp: Path, collectors: int = 1) -> dict[str, object]:
    nodes = gpus // GPUS_PER_NODE
    async with collector_stack(tmp, collectors) as (url, bus, pids, instances):
        load0 = os.getloadavg()[0]
        target = await phase(bus, url, nodes, seconds, 0, pids, instances)
        ramp = []
        for k in range(1, steps + 1):
            ramp.append(await phase(bus, url, round(nodes * step_factor ** k),
                                    step_seconds, k, pids, instances))
        if not instances:
            counts = {r["table"]: r for r in await lens(bus, "table_counts")}
            rows, distinct = counts["gpu_metrics"]["rows"], counts["gpu_metrics"]["distinct_ids"]
            health = await bus.request("safe.health.lens-collector", timeout_s=30)
        else:
            health = {}
        stream = await bus.js.stream_info("TELEMETRY")
    if instances:
        rows, distinct = store_figures(tmp, instances, [target, *ramp])
    published = sum(int(p["messages_published"]) for p in [target, *ramp])  # type: ignore[call-overload]
    return {
        "collectors": collectors,
        "target": target, "ramp": ramp,
        "sustained_gpu_rows_per_s": max(int(p["stored_gpu_rows_per_s"])  # type: ignore[call-overload]
                                        for p in [target, *ramp]),
        "messages_published": published, "messages_in_stream": stream.state.messages,
        "gpu_rows_expected": published * GPUS_PER_NODE,
        "gpu_rows_stored": rows, "gpu_rows_distinct": distinct,
        "message_bytes": len(Template(node_event("gpu-00000")).render(
            "0" * 32, "2026-01-01T00:00:00.000000Z")),
        "load1_at_start": round(load0, 2), "cpus": os.cpu_count(),
        "collector_inserts": health.get("inserts"),
        "collector_insert_s": health.get("insert_s"),
        "collector_redelivered": health.get("redelivered"),
    }


def stops_at(rates: list[int], gain: float = 1.1) -> int | None:
    """The replica count after which one more adds less than ``gain``
    (``rates[i]``: the sustained rate with i + 1 replicas); None: it scales
    through the last count."""
    for n, (a, b) in enumerate(zip(rates, rates[1:], strict=False), start=1):
        if b < gain * a:
            return n
    return None


def scaling(args: argparse.Namespace, tmp: Path) -> int:
    """``--collectors N``: the same phases with 1, 2, ... N replicas, each
    run on a fresh server and stores; the sustained rate of each against one
    replica's, measured in the same run, and where adding one stops paying."""
    runs = []
    for n in range(1, args.collectors + 1):
        run = asyncio.run(pipeline(args.gpus, args.seconds, args.steps, args.step_seconds,
                                   args.step_factor, tmp / f"n{n}", n))
        runs.append(run)
    one = int(runs[0]["sustained_gpu_rows_per_s"])  # type: ignore[call-overload]
    stops = stops_at([int(r["sustained_gpu_rows_per_s"]) for r in runs])  # type: ignore[call-overload]
    figures = []
    for run in runs:
        target: dict = run["target"]  # type: ignore[type-arg, assignment]
        value = int(run["sustained_gpu_rows_per_s"])  # type: ignore[call-overload]
        complete = run["gpu_rows_stored"] == run["gpu_rows_expected"] == run["gpu_rows_distinct"]
        cpu = float(target["cpu_us_per_gpu_row_collector"])
        figures.append({"collectors": run["collectors"], "sustained_gpu_rows_per_s": value,
                        "ratio_to_one": round(value / one, 3), "complete": complete,
                        "target_kept_up": target["messages_stored"] == target["messages_published"],
                        "target_lag_p99_s": target["lag_p99_s"],
                        "collector_cpu_us_per_gpu_row": cpu,
                        **{k: run[k] for k in ("gpu_rows_expected", "gpu_rows_stored",
                                               "gpu_rows_distinct", "messages_published",
                                               "messages_in_stream")},
                        "drained_s": [p["drained_s"] for p in [target, *run["ramp"]]]})  # type: ignore[attr-defined]
        print(f"{run['collectors']} collector(s): sustained {value:>7} GPU-rows/s "
              f"({value / one:.2f}x one), target {target['offered_gpu_rows_per_s']} GPU-rows/s "
              f"{'kept up' if figures[-1]['target_kept_up'] else 'FELL BEHIND'}, lag p99 "
              f"{target['lag_p99_s']:.2f} s, collectors' CPU {cpu} µs per GPU row"
              + ("" if complete else f"  <-- INCOMPLETE: {run['gpu_rows_stored']} GPU rows "
                 f"stored ({run['gpu_rows_distinct']} distinct) of {run['gpu_rows_expected']}, "
                 f"{run['messages_in_stream']} of {run['messages_published']} messages in "
                 "the stream"))
    print(f"scaling stops at           {stops or args.collectors} collector(s) on "
          f"{os.cpu_count()} CPUs (the next one adds under 10%)" if stops else
          f"scaling holds up to        {args.collectors} collectors on {os.cpu_count()} CPUs")
    best = max(f["sustained_gpu_rows_per_s"] for f in figures)
    print(json.dumps({"name": "lens_ingest_scaling", "value": best, "unit": "GPU-rows/s",
                      "baseline": one, "baseline_name": "one collector, same run",
                      "ratio": round(best / one, 3), "stops_at": stops, "runs": figures}))
    return 0 if all(f["complete"] for f in figures) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100_000, help="simulated GPUs (8 per node)")
    parser.add_argument("--seconds", type=int, default=20, help="how long to publish the target")
    parser.add_argument("--steps", type=int, default=5, help="capacity steps above the target")
    parser.add_argument("--step-seconds", type=int, default=12)
    parser.add_argument("--step-factor", type=float, default=1.15)
    parser.add_argument("--ceiling-rounds", type=int, default=3)
    parser.add_argument("--collectors", type=int, default=1,
                        help="above 1: the phases with 1, 2, ... this many replicas sharing "
                        "the consumers, and where adding one stops paying")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lens-ingest-") as tmp_dir:
        tmp = Path(tmp_dir)
        if args.collectors > 1:
            return scaling(args, tmp)
        raw = ceiling(f"chdb://{tmp / 'ceiling'}", args.gpus // GPUS_PER_NODE,
                      args.ceiling_rounds)
        run = asyncio.run(pipeline(args.gpus, args.seconds, args.steps, args.step_seconds,
                                   args.step_factor, tmp))
    value = int(run["sustained_gpu_rows_per_s"])  # type: ignore[call-overload]
    base = round(raw["arrow_insert_gpu_rows_per_s"])
    target: dict = run["target"]  # type: ignore[type-arg, assignment]
    complete = run["gpu_rows_stored"] == run["gpu_rows_expected"] == run["gpu_rows_distinct"]
    kept_up = target["messages_stored"] == target["messages_published"]
    print(f"message                    {run['message_bytes']} bytes per 8-GPU node message")
    for name, p in [("target", target), *((f"step {k}", p) for k, p in
                                          enumerate(run["ramp"], 1))]:  # type: ignore[arg-type]
        print(f"{name:8s} offered {p['offered_gpu_rows_per_s']:>7} GPU-rows/s for {p['seconds']} s:"
              f" stored {p['stored_gpu_rows_per_s']:>7}/s, lag p50 {p['lag_p50_s']:.2f} s"
              f" p99 {p['lag_p99_s']:.2f} s, drained {p['drained_s']:.1f} s after the last"
              f" publish; CPU per GPU row collector {p['cpu_us_per_gpu_row_collector']} µs,"
              f" nats-server {p['cpu_us_per_gpu_row_nats_server']} µs,"
              f" publisher {p['cpu_us_per_gpu_row_publisher']} µs")
    print(f"stored                     {run['gpu_rows_stored']} GPU rows "
          f"({run['gpu_rows_distinct']} distinct, {run['gpu_rows_expected']} expected, "
          f"{run['messages_in_stream']} of {run['messages_published']} messages in the stream)"
          f"{'' if complete else '  <-- INCOMPLETE'}")
    print(f"at the target              {'kept up' if kept_up else 'FELL BEHIND'}: lag p50 "
          f"{target['lag_p50_s']:.3f} s, p99 {target['lag_p99_s']:.3f} s "
          f"(load average {run['load1_at_start']} on {run['cpus']} CPUs at the start)")
    print(f"sustained end to end       {value} GPU-rows/s (highest stored rate of a phase)")
    print(f"raw engine ceiling         {base} GPU-rows/s (Arrow column insert, same schema)")
    print(f"ratio                      {value / base:.2f}")
    print(f"engine alone, JSON path    {round(raw['json_insert_gpu_rows_per_s'])} GPU-rows/s one "
          f"insert; CPU per GPU row with merges {raw['json_cpu_us_per_gpu_row']:.2f} µs "
          f"(Arrow {raw['arrow_cpu_us_per_gpu_row']:.2f} µs)")
    print(json.dumps({"name": "lens_ingest_gpu_rows_per_s", "value": value, "unit": "GPU-rows/s",
                      "baseline": base, "baseline_name": "direct Arrow column insert into chDB",
                      "ratio": round(value / base, 3), "complete": complete, "kept_up": kept_up,
                      **run, **{k: round(v, 3) for k, v in raw.items()}}))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
